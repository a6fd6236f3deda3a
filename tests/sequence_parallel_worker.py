"""Run under torchrun by tests/test_sequence_parallel.py: packed causal LMs with every row's tokens split over
the sequence-parallel ranks (DeepSpeed-Ulysses all-to-alls around attention) against the same model on whole
rows in this process, on the same packs. Rank 0 writes the largest relative differences to the JSON file given
as argv[1]; the test asserts on them.

    python -m torch.distributed.run --nproc-per-node 4 tests/sequence_parallel_worker.py OUT.json

The packs: a document that starts on one rank's share and ends on another's and is longer than a share, a
document boundary exactly at a share boundary, and padding at the end of a row; over 4 ranks and over pairs.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
from transformers import GPT2Config, LlamaConfig

from bert_ipu.engine.runtime import finish
from bert_ipu.models.attention import sequence_parallel
from bert_ipu.models.gpt2 import PackedGPT2LMHeadModel
from bert_ipu.models.llama import PackedLlamaForCausalLM
from bert_ipu.models.losses import causal_lm_loss, causal_lm_loss_sums, sequence_label_weights

V, L, K = 61, 24, 3


def packs(generator: torch.Generator) -> dict:
    """Two rows of 24 tokens: [5 | 14 | 5 padding] and [12 | 8 | 4]."""
    sequence_ids = torch.tensor([[1] * 5 + [2] * 14 + [0] * 5, [1] * 12 + [2] * 8 + [3] * 4])
    position_ids = torch.zeros_like(sequence_ids)
    for row in range(2):
        for k in range(1, K + 1):
            where = sequence_ids[row] == k
            position_ids[row, where] = torch.arange(int(where.sum()))
    input_ids = torch.randint(1, V, (2, L), generator=generator)
    labels = torch.where(sequence_ids > 0, torch.randint(1, V, (2, L), generator=generator), -100)
    labels[:, 2] = -100  # some positions carry no label (a prompt's tokens in SFT)
    labels[sequence_ids != torch.roll(sequence_ids, -1, 1)] = -100  # a sequence's last token predicts nothing
    weights = sequence_label_weights(labels, sequence_ids, K)
    return {"input_ids": input_ids, "position_ids": position_ids, "sequence_ids": sequence_ids, "labels": labels,
            "label_weights": weights}


def models(family: str, backend: str, dtype: torch.dtype):
    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=4, intermediate_size=48, max_position_embeddings=L,
                             attention_dropout=0.0)
        whole = PackedLlamaForCausalLM(config, backend, max_sequences_per_pack=K)
    else:
        config = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=48, n_positions=L,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        whole = PackedGPT2LMHeadModel(config, backend, max_sequences_per_pack=K)
    whole = whole.to(dtype)
    return whole, copy.deepcopy(whole)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def compare(family: str, backend: str, dtype: torch.dtype, group, mode: str, steps: int = 3) -> dict:
    """Logits, loss, every gradient, and the weights after `steps` AdamW steps: split rows vs whole rows."""
    rank, n = dist.get_rank(group), group.size()
    share = slice(rank * L // n, (rank + 1) * L // n)
    whole, split = models(family, backend, dtype)
    batch = packs(torch.Generator().manual_seed(1))
    mine = {k: v[:, share] for k, v in batch.items()}
    counts = {"label_tokens": float((batch["labels"] != -100).sum()),
              "labelled_sequences": float(batch["label_weights"].sum())}  # from the whole rows, as the engine
    train = backend != "flex"  # FlexAttention has no backward on the CPU: its forward is compared
    optimizers = {m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1) for m in (whole, split)}
    out = {"logits": 0.0, "loss": 0.0, "gradients": 0.0, "weights": 0.0}
    for _ in range(steps if train else 1):
        with torch.set_grad_enabled(train):
            reference = whole(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
            with sequence_parallel(group):
                logits = split(mine["input_ids"], mine["position_ids"], mine["sequence_ids"])
        out["logits"] = max(out["logits"], rel(logits, reference[:, share]))
        if not train:
            break
        ref_loss = causal_lm_loss(causal_lm_loss_sums(reference, batch["labels"], batch["label_weights"]), mode, counts)
        loss = causal_lm_loss(causal_lm_loss_sums(logits, mine["labels"], mine["label_weights"]), mode, counts)
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        out["loss"] = max(out["loss"], abs(total.item() - ref_loss.item()) / abs(ref_loss.item()))
        ref_loss.backward()
        loss.backward()
        for p in split.parameters():  # the engine's sum over the ranks that hold the same weights
            dist.all_reduce(p.grad, group=group)
        theirs = dict(whole.named_parameters())
        out["gradients"] = max(out["gradients"], max(rel(p.grad, theirs[k].grad) for k, p in split.named_parameters()))
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        out["weights"] = max(out["weights"], max(rel(p, theirs[k]) for k, p in split.named_parameters()))
    return out


def main() -> None:
    """Every case over all ranks (4: each rank holds 6 tokens of a row, the 14-token document spans three
    ranks), and over pairs of ranks (2: 12 tokens each, the pairs as two replicas)."""
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    results = {}
    cases = [("llama", "mask", "token"), ("llama", "reference", "sequence"), ("llama", "flex", "token"),
             ("gpt2", "mask", "sequence"), ("gpt2", "reference", "token")]
    for ranks, group in ((world, dist.group.WORLD), (2, pairs[rank // 2])):
        for family, backend, mode in cases:
            for dtype in (torch.float64, torch.float32):
                key = f"{ranks}/{family}/{backend}/{mode}/{str(dtype)[6:]}"
                results[key] = compare(family, backend, dtype, group, mode)
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    finish(0)


if __name__ == "__main__":
    main()
