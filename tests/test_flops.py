"""bert_ipu.engine.flops: a step's FLOPs counted on a meta-device twin (no memory, no kernels, any attention
backend), attention from the documents. Checked against torch.utils.flop_counter on the real model and against
the attention formula by hand."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig

from bert_ipu.engine.flops import StepFlops, document_pairs, meta_twin
from bert_ipu.models.bert import PackedBertForPreTraining

CFG = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def batch(ids: torch.Tensor, M: int = 10, K: int = 3) -> dict:
    B, S = ids.shape
    g = torch.Generator().manual_seed(0)
    return dict(input_ids=torch.randint(5, 1000, (B, S), generator=g), position_ids=torch.arange(S).repeat(B, 1),
                token_type_ids=torch.zeros(B, S, dtype=torch.long), sequence_ids=ids,
                masked_lm_labels=torch.randint(5, 1000, (B, M), generator=g),
                next_sentence_labels=torch.zeros(B, K, dtype=torch.long), next_sentence_weights=torch.ones(B, K))


def loss_of(model, b):
    return model(**b).loss


IDS = torch.tensor([[1] * 30 + [2] * 20 + [3] * 10 + [0] * 4, [1] * 64])  # documents of 30, 20, 10 and 64


def test_the_non_attention_flops_are_torchs_count_of_the_real_model():
    """With the whole row one document the useful attention is the dense one: the counted FLOPs minus the
    attention formula equal FlopCounterMode's count of a real step of the model on the CPU (whose fused SDPA op it
    does not count), and the attention term is 12 x heads x head_dim x L^2 a layer (forward 4 D a pair, backward
    twice that)."""
    model = PackedBertForPreTraining(CFG, 3, "reference")
    b = batch(torch.ones(2, 64, dtype=torch.long))
    with FlopCounterMode(display=False) as counter:
        loss_of(model, b).backward()
    attention = 2 * 12 * 4 * 16 * (2 * 64 ** 2)
    assert StepFlops(model, loss_of).of(b) == counter.get_total_flops() + attention
    assert all(p.grad is not None and p.device.type == "cpu" for p in model.parameters())  # the model untouched


def test_attention_counts_the_documents_and_every_backend_counts_alike():
    """Pairs within documents only (30^2 + 20^2 + 10^2 + 64^2, the padding none; causal L (L + 1) / 2); a flex or
    varlen model (whose kernels FlopCounterMode cannot count or run here) is credited as the mask model."""
    assert document_pairs(IDS, causal=False) == 30 ** 2 + 20 ** 2 + 10 ** 2 + 64 ** 2
    assert document_pairs(IDS, causal=True) == sum(n * (n + 1) / 2 for n in (30, 20, 10, 64))
    counts = {backend: StepFlops(PackedBertForPreTraining(CFG, 3, backend), loss_of).of(batch(IDS))
              for backend in ("mask", "flex", "varlen")}
    assert counts["mask"] == counts["flex"] == counts["varlen"]
    dense = StepFlops(PackedBertForPreTraining(CFG, 3, "mask"), loss_of).of(batch(torch.ones(2, 64, dtype=torch.long)))
    assert dense - counts["mask"] == 2 * 12 * 4 * 16 * (2 * 64 ** 2 - document_pairs(IDS, causal=False))


def test_the_meta_twin_keeps_tied_weights_and_costs_no_memory():
    model = PackedBertForPreTraining(CFG, 3)
    twin = meta_twin(model)
    assert all(p.device.type == "meta" for p in twin.parameters())
    assert twin.cls.predictions.decoder.weight is twin.bert.embeddings.word_embeddings.weight
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_a_training_run_logs_its_model_flops(dataset, tmp_path):
    """The application reports model TFLOP/s in every metrics row (and MFU where the device's bf16 peak is known:
    H100, H200, A100)."""
    from bert_ipu.tasks import run as main
    from training_helpers import tiny

    out = tmp_path / "run"
    main(tiny(dataset, out, "train.max_steps=2"), progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tflops_per_second"] > 0 and "mfu" not in r for r in rows if "loss" in r)


def test_activation_checkpointing_does_not_count_twice():
    """A level's checkpointed layers (an instance forward that recomputes in the backward pass) cost more time, not
    more model FLOPs: the count is the plain model's (the twin had counted every checkpointed layer twice)."""
    from bert_ipu.engine.parallel import checkpoint_layers

    model = PackedBertForPreTraining(CFG, 3)
    plain = StepFlops(model, loss_of).of(batch(IDS))
    checkpoint_layers(model, 2)
    assert StepFlops(model, loss_of).of(batch(IDS)) == plain
    assert "forward" in vars(model.bert.encoder.layer["0"])  # the model itself keeps its checkpointing
