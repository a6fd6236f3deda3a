"""Every loss as sums and counts, one definition for the models and every training engine.

    sums = pretraining_loss_sums(mlm_logits, nsp_logits, labels, nsp_labels, nsp_weights)
    loss = sums.mlm_loss_sum / global_masked_tokens + sums.nsp_loss_sum / global_sequences

A loss is a sum divided by a global count of valid items (masked tokens, sequences, label tokens) taken across
micro-batches and data-parallel ranks, never a mean per micro-batch, so packing, gradient accumulation and
parallelism never change the weight of a token or a sequence. The records are named (no tuples read by
position). Sums are in at least float32, also under bf16 autocast. Labels use `IGNORE_INDEX` (-100) for
"no label", as Hugging Face does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..data.layout import IGNORE_INDEX

LOSS_MODES = ("token", "sequence", "sum")


def whole(x: torch.Tensor) -> torch.Tensor:
    """Under tensor parallelism (bert_ipu/engine/tensor.py) the logits are split along the vocabulary (a DTensor)
    and so is what is computed from them: a cross-entropy (under loss_parallel, a replicated DTensor: the same
    value on every rank) or an argmax. Returned whole as a plain tensor (differentiable), so that it adds to the
    rest of a loss; any other tensor passes unchanged."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


@dataclass(frozen=True)
class LossSums:
    """A loss summed over the items that have a label, and how many items that is."""
    loss_sum: torch.Tensor
    count: torch.Tensor


@dataclass(frozen=True)
class PretrainingSums:
    """BERT pretraining: MLM cross-entropy summed over masked tokens, NSP cross-entropy over present sequences."""
    mlm_loss_sum: torch.Tensor
    mlm_count: torch.Tensor      # masked tokens
    nsp_loss_sum: torch.Tensor
    nsp_count: torch.Tensor      # present sequences (NSP weight 1)


@dataclass(frozen=True)
class CausalLMSums:
    """The next-token loss for every loss mode (`causal_lm_loss` picks one)."""
    token_loss_sum: torch.Tensor      # cross-entropy summed over label tokens     (token: / label_tokens)
    label_tokens: torch.Tensor        # tokens with a label
    sequence_loss_sum: torch.Tensor   # sum over sequences of their mean cross-entropy (sequence: / labelled_sequences)
    labelled_sequences: torch.Tensor  # sequences with at least one label token


def pretraining_loss_sums(mlm_logits, nsp_logits, masked_lm_labels, next_sentence_labels,
                          next_sentence_weights) -> PretrainingSums:
    """mlm_logits (B, M, V), nsp_logits (B, K, 2), masked_lm_labels (B, M) (-100 = none), next_sentence_labels
    (B, K), next_sentence_weights (B, K) (1 where the slot holds a sequence)."""
    loss_dtype = torch.promote_types(mlm_logits.dtype, torch.float32)
    mlm_sum = whole(F.cross_entropy(mlm_logits.flatten(0, 1).to(loss_dtype), masked_lm_labels.flatten(),
                                    ignore_index=IGNORE_INDEX, reduction="sum"))
    weights = next_sentence_weights.flatten().to(loss_dtype)
    nsp_each = F.cross_entropy(nsp_logits.flatten(0, 1).to(loss_dtype), next_sentence_labels.flatten(),
                               reduction="none")
    return PretrainingSums(mlm_sum, (masked_lm_labels != IGNORE_INDEX).sum(), (nsp_each * weights).sum(),
                           weights.sum())


def span_loss_sums(start_logits, end_logits, start_positions, end_positions) -> LossSums:
    """The SQuAD loss: the sum over labelled slots of (start CE + end CE) / 2, and the number of labelled slots.
    An empty slot has label -100 (ignored) and all-lowest logits: a uniform softmax, never NaN."""
    ce_start = F.cross_entropy(start_logits.flatten(0, 1), start_positions.flatten(), reduction="sum",
                               ignore_index=IGNORE_INDEX)
    ce_end = F.cross_entropy(end_logits.flatten(0, 1), end_positions.flatten(), reduction="sum",
                             ignore_index=IGNORE_INDEX)
    return LossSums((ce_start + ce_end) / 2, (start_positions != IGNORE_INDEX).sum())


def classification_loss_sums(logits, labels) -> LossSums:
    """The sequence-classification loss as Hugging Face's BertForSequenceClassification defines it per example:
    cross-entropy for classes (labels int, -100 = no example), squared error for regression (one output;
    labels float, NaN = no example)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if logits.shape[-1] == 1:
        present = ~torch.isnan(labels)
        error = (logits[..., 0].to(dtype) - torch.nan_to_num(labels.to(dtype))) ** 2
        return LossSums((error * present).sum(), present.sum())
    loss_sum = F.cross_entropy(logits.flatten(0, 1).to(dtype), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    return LossSums(loss_sum, (labels != IGNORE_INDEX).sum())


def sequence_label_weights(labels, sequence_ids, slots: int) -> torch.Tensor:
    """Per token of packed rows (B, S): 1 / (the label tokens of its sequence) where it has a label, else 0. A
    sequence's weights sum to 1, so sum(weights x cross-entropy) is the sum over sequences of each one's mean, and
    sum(weights) the number of labelled sequences: both split over any cut of the tokens (sequence parallelism
    computes them on 1/S of every row). `slots` is K, the most sequences a pack holds (static shapes)."""
    B, S = labels.shape
    has = (labels != IGNORE_INDEX).to(torch.float64)
    ids = sequence_ids.long()
    count = torch.zeros(B, slots + 1, dtype=torch.float64, device=labels.device).scatter_add(1, ids, has)
    return has / count.gather(1, ids).clamp_min(1)


def causal_lm_loss_sums(logits, labels, label_weights) -> CausalLMSums:
    """The next-token loss of packed rows, logits (B, S, V), labels (B, S) (-100 = none) and their
    `sequence_label_weights` (B, S), for every loss mode. Every sum is over tokens, so a rank that holds a share of
    each row's tokens (sequence parallelism) computes its share of each."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    B, S = labels.shape
    each = whole(F.cross_entropy(logits.flatten(0, 1).to(dtype), labels.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="none")).view(B, S)
    weights = label_weights.to(dtype)
    return CausalLMSums(each.sum(), (labels != IGNORE_INDEX).sum(), (each * weights).sum(), weights.sum())


def causal_lm_loss(sums: CausalLMSums, mode: str, normalizers: dict | None = None):
    """The loss of a mode: token = mean over the label tokens of the update (pass the update's global count in
    `normalizers["label_tokens"]`: accumulation and ranks), sequence = mean over its sequences of each
    sequence's mean, sum = the plain sum over label tokens."""
    n = normalizers or {}
    if mode == "token":
        return sums.token_loss_sum / n.get("label_tokens", sums.label_tokens.clamp_min(1))
    if mode == "sequence":
        return sums.sequence_loss_sum / n.get("labelled_sequences", sums.labelled_sequences.clamp_min(1))
    if mode == "sum":
        return sums.token_loss_sum
    raise ValueError(f"unknown loss mode {mode!r}; choose from {', '.join(LOSS_MODES)}")


@dataclass(frozen=True)
class HiddenStates:
    """A causal LM's output when its LM head runs in the loss (`chunked_causal_lm_loss_sums`): the final hidden
    states (B, S, H) and the head's weight (V, H)."""
    hidden: torch.Tensor
    head_weight: torch.Tensor


def chunked_causal_lm_loss_sums(out: HiddenStates, labels, label_weights, chunk_tokens: int):
    """`causal_lm_loss_sums` and the count of correct next-token predictions, with the LM head applied
    `chunk_tokens` tokens at a time: each chunk's logits (in the autocast dtype) and their float32 cross-entropy
    are recomputed in the backward pass (activation checkpointing) instead of kept, so the (tokens x vocabulary)
    logits never exist whole. Static shapes: a fixed number of chunks for a micro-batch shape. Returns
    (CausalLMSums, correct)."""
    from torch.utils.checkpoint import checkpoint

    B, S = labels.shape
    hidden = out.hidden.reshape(B * S, -1)
    flat, weights = labels.reshape(-1), label_weights.reshape(-1)

    def chunk(h, y):
        logits = F.linear(h, out.head_weight)
        each = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y,
                               ignore_index=IGNORE_INDEX, reduction="none")
        return each, ((logits.argmax(-1) == y) & (y != IGNORE_INDEX)).sum()

    each, correct = [], []
    for lo in range(0, B * S, chunk_tokens):
        e, c = checkpoint(chunk, hidden[lo:lo + chunk_tokens], flat[lo:lo + chunk_tokens], use_reentrant=False)
        each.append(e)
        correct.append(c)
    each = torch.cat(each)
    w = weights.to(each.dtype)
    sums = CausalLMSums(each.sum(), (labels != IGNORE_INDEX).sum(), (each * w).sum(), w.sum())
    return sums, torch.stack(correct).sum()
