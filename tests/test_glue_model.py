"""The packed sequence-classification head equals Hugging Face's BertForSequenceClassification on the same
examples unpacked: logits, loss and every gradient, for classification and regression, at every depth; and no
example of a pack sees another."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertForSequenceClassification

from bert_ipu.data.contiguous import pack_sequences
from bert_ipu.data.layout import IGNORE_INDEX
from bert_ipu.models.bert import PackedBertForSequenceClassification

from packed_bert_helpers import tiny_config

S = 64


def _examples(rng, n, vocab):
    lengths = rng.integers(3, 21, size=n)
    ids = [np.concatenate([[2], rng.integers(5, vocab, size=k - 1)]) for k in lengths]  # [CLS] first
    types = [np.concatenate([np.zeros(k // 2, np.int64), np.ones(k - k // 2, np.int64)]) for k in lengths]
    return lengths, ids, types


def _models(num_labels, dtype):
    config = tiny_config(num_labels=num_labels, max_position_embeddings=S)
    torch.manual_seed(0)
    hf = BertForSequenceClassification(config).to(dtype).eval()
    ours = PackedBertForSequenceClassification(config, 8).to(dtype).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


def _packed_inputs(lengths, ids, types, labels, depth, algorithm, no_label):
    packed = pack_sequences(lengths, {"input_ids": np.concatenate(ids), "token_type_ids": np.concatenate(types)},
                            S, algorithm, depth)
    rows = {k: torch.from_numpy(v) for k, v in packed.rows.items()}
    rows["cls_positions"] = torch.from_numpy(packed.slot_values(packed.offset, 0))
    rows["labels"] = torch.from_numpy(packed.slot_values(labels, no_label))
    return packed, rows


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
@pytest.mark.parametrize("depth", [1, 2, 3, 5, 8])
def test_packed_classifier_equals_huggingface(dtype, tol, num_labels, depth):
    """Per example, our logits at its slot equal HF's on the example alone (padded batch); the loss (mean over
    examples: summed over slots, divided by the count) and every gradient match. float64 to 1e-10; float32 to
    1e-5 relative for logits and loss and 1e-4 relative to each gradient's largest entry: the sums run over
    different numbers of padded positions, and HF's own float32 gradients differ from float64 by ~1e-5.
    Gradients whose true value is 0 (the attention key bias: a softmax ignores a constant) are rounding noise
    of ~1e-22, so each gradient is compared relative to max(its largest entry, 1e-6)."""
    rng = np.random.default_rng(depth)
    hf, ours = _models(num_labels, dtype)
    n = 12
    lengths, ids, types = _examples(rng, n, hf.config.vocab_size)
    if num_labels == 1:
        labels = rng.uniform(0, 5, size=n).astype(np.float64 if dtype == torch.float64 else np.float32)
        no_label = np.nan
    else:
        labels = rng.integers(0, num_labels, size=n)
        no_label = IGNORE_INDEX
    # Hugging Face on the examples unpacked, padded to the longest
    L = int(lengths.max())
    pad = lambda xs: torch.tensor(np.stack([np.pad(x, (0, L - len(x))) for x in xs]))  # noqa: E731
    mask = torch.tensor(np.stack([np.arange(L) < k for k in lengths]).astype(np.int64))
    ref = hf(input_ids=pad(ids), token_type_ids=pad(types), attention_mask=mask, labels=torch.tensor(labels))
    ref.loss.backward()
    packed, rows = _packed_inputs(lengths, ids, types, labels, depth, "none" if depth == 1 else "cghp", no_label)
    if depth > 1:
        assert packed.packs < n and (rows["sequence_ids"].amax(1) <= depth).all()
    out = ours(**rows, normalizer=n)
    out.loss.backward()
    got = out.logits[torch.from_numpy(packed.row), torch.from_numpy(packed.slot)]  # (n, num_labels) in order
    scale = ref.logits.abs().max()
    assert ((got - ref.logits).abs().max() / scale).item() < tol
    assert abs(out.loss.item() - ref.loss.item()) / ref.loss.item() < tol
    grads = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g = grads[name].grad
        assert ((p.grad - g).abs().max() / g.abs().max().clamp_min(1e-6)).item() < (tol if dtype == torch.float64
                                                                                    else 1e-4), name


def test_changing_one_example_changes_no_other():
    """In a pack of several examples, new tokens in one change its logits and leave every other's exactly."""
    rng = np.random.default_rng(7)
    _, ours = _models(2, torch.float64)
    lengths, ids, types = _examples(rng, 10, 97)
    packed, rows = _packed_inputs(lengths, ids, types, np.zeros(10, np.int64), 4, "cghp", IGNORE_INDEX)
    with torch.no_grad():
        before = ours(**rows).logits
        row = int(np.argmax(np.bincount(packed.row)))
        first = rows["sequence_ids"][row] == 1
        changed = {k: v.clone() for k, v in rows.items()}
        changed["input_ids"][row][first] = torch.randint(5, 97, (int(first.sum()),))
        after = ours(**changed).logits
    k = int((rows["sequence_ids"][row].unique() > 0).sum())
    assert k >= 2
    assert torch.equal(before[row, 1:k], after[row, 1:k])
    assert not torch.allclose(before[row, 0], after[row, 0])
    others = torch.ones(len(before), dtype=torch.bool)
    others[row] = False
    assert torch.equal(before[others], after[others])
