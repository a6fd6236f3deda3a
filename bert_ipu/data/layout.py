"""The packed layout: how the sequences of one pack are arranged in its fixed-length row.

Inside a pack of length S holding k <= K sequences (K = max_sequences_per_pack):

    positions 0 .. M-1        the masked tokens of all k sequences (then other tokens if there are fewer)
    positions M .. S-k-1      the remaining non-[CLS] tokens, then padding
    positions S-k .. S-1      the k [CLS] tokens, sequence j (1-based) at S - k + j - 1

so the MLM head runs on the fixed slice [0, M) and the NSP head on the fixed slice [S-K, S): NSP slot i
(0-based) is position S - K + i, and holds a [CLS] token iff i >= K - k (weight 1), else an ordinary token or
padding (weight 0). Each token keeps its position inside its own sequence (`position_ids`, [CLS] = 0) and
carries its sequence's id 1..k (`sequence_ids`, 0 = padding). Attention is permutation-equivariant given
positions, so moving tokens inside a pack changes nothing that the model computes.

numpy only, so that data preparation does not need torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100
PAD_ID = 0


@dataclass(frozen=True)
class Instance:
    """One unpacked pretraining instance: [CLS] A [SEP] B [SEP], with its MLM and NSP labels."""
    input_ids: np.ndarray          # (L,) token ids; input_ids[0] is [CLS]; masked tokens already replaced
    token_type_ids: np.ndarray     # (L,)
    masked_lm_labels: np.ndarray   # (L,) original token at masked positions, IGNORE_INDEX elsewhere
    next_sentence_label: int       # 0 = B follows A, 1 = B is random (HF convention)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class PackLayout:
    pack_len: int                  # S
    mlm_slots: int                 # M
    max_sequences_per_pack: int    # K


FIELDS = ("input_ids", "position_ids", "token_type_ids", "sequence_ids", "masked_lm_labels",
          "next_sentence_labels", "next_sentence_weights")


def pack_instances(instances: list[Instance], layout: PackLayout) -> dict[str, np.ndarray]:
    """Arrange up to K instances in one pack. Returns the arrays of FIELDS for this pack:
    (S,) for the four token fields, (M,) masked_lm_labels, (K,) NSP labels and weights."""
    S, M, K = layout.pack_len, layout.mlm_slots, layout.max_sequences_per_pack
    k = len(instances)
    if not 1 <= k <= K:
        raise ValueError(f"a pack holds 1..{K} sequences, got {k}")
    total = sum(len(x) for x in instances)
    if total > S:
        raise ValueError(f"the sequences hold {total} tokens, more than the pack length {S}")
    ids, pos, types, seq, labels = [], [], [], [], []
    for j, x in enumerate(instances, start=1):
        n = len(x)
        ids.append(x.input_ids[1:])
        pos.append(np.arange(1, n))
        types.append(x.token_type_ids[1:])
        seq.append(np.full(n - 1, j))
        labels.append(x.masked_lm_labels[1:])
    ids, pos, types, seq, labels = map(np.concatenate, (ids, pos, types, seq, labels))
    masked = labels != IGNORE_INDEX
    if masked.sum() > M:
        raise ValueError(f"the pack has {int(masked.sum())} masked tokens but only {M} MLM slots")
    order = np.concatenate([np.nonzero(masked)[0], np.nonzero(~masked)[0]])  # masked first, stable
    body = len(order)

    out = {
        "input_ids": np.full(S, PAD_ID, dtype=np.int64),
        "position_ids": np.zeros(S, dtype=np.int64),
        "token_type_ids": np.zeros(S, dtype=np.int64),
        "sequence_ids": np.zeros(S, dtype=np.int64),
    }
    for name, values in (("input_ids", ids), ("position_ids", pos), ("token_type_ids", types),
                         ("sequence_ids", seq)):
        out[name][:body] = values[order]
    token_labels = np.full(S, IGNORE_INDEX, dtype=np.int64)
    token_labels[:body] = labels[order]
    for j, x in enumerate(instances, start=1):
        at = S - k + j - 1
        out["input_ids"][at] = x.input_ids[0]
        out["token_type_ids"][at] = x.token_type_ids[0]
        out["sequence_ids"][at] = j
    out["masked_lm_labels"] = token_labels[:M].copy()
    out["next_sentence_labels"] = np.zeros(K, dtype=np.int64)
    out["next_sentence_weights"] = np.zeros(K, dtype=np.float32)
    out["next_sentence_labels"][K - k:] = [x.next_sentence_label for x in instances]
    out["next_sentence_weights"][K - k:] = 1.0
    return out


def stack_packs(packs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A micro-batch: each field stacked to (B, ...)."""
    return {name: np.stack([p[name] for p in packs]) for name in FIELDS}
