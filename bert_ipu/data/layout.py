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
STORAGE = {"input_ids": np.int32, "position_ids": np.int16, "token_type_ids": np.int8, "sequence_ids": np.int16,
           "masked_lm_labels": np.int32, "next_sentence_labels": np.int8, "next_sentence_weights": np.int8,
           "sequence_lengths": np.int32}
"""the dtype each field is stored in (data.shards writes and reads them)"""
MAX_PACK_LEN = int(np.iinfo(STORAGE["position_ids"]).max) + 1  # positions 0 .. S - 1 are stored as int16


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


def lengths_of(sequence_ids: np.ndarray) -> np.ndarray:
    """Tokens of each row's sequence(s): (N, S) ids -> (N,) non-padding counts."""
    return (np.asarray(sequence_ids) > 0).sum(axis=1)


def sequence_lengths_per_id(sequence_ids: np.ndarray, max_id: int) -> np.ndarray:
    """Tokens of each row's sequence of id j, dense: (N, S) ids -> (N, max_id) counts, column j - 1 for
    id j (0 = the row has no sequence j). Ids must lie in 0..max_id (0 = padding): a ValueError otherwise."""
    ids = np.asarray(sequence_ids)
    N = len(ids)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > max_id):
        raise ValueError(f"sequence ids {int(ids.min())}..{int(ids.max())} are outside 0..{max_id}")
    if max_id <= 16:  # a few sequences a row: one comparison pass per id, on the stored dtype (beats the bincount)
        return np.stack([(ids == k).sum(axis=1) for k in range(1, max_id + 1)], axis=1).reshape(N, max_id)
    flat = np.arange(N)[:, None] * (max_id + 1) + ids.astype(np.int64)
    return np.bincount(flat.ravel(), minlength=N * (max_id + 1)).reshape(N, max_id + 1)[:, 1:]


def pack_rows(src: dict[str, np.ndarray], groups: np.ndarray, layout: PackLayout) -> dict[str, np.ndarray]:
    """The fast path of `pack_instances`: combine packs of one into packs, vectorised over many packs.

    src: the FIELDS of N packs of one (each row one instance, laid out by `pack_instances` with K = 1).
    groups: (P, K) int row indices into src, -1 for an empty slot (empty slots last in each row).
    Returns the FIELDS of P packs in `layout`, identical to calling `pack_instances` pack by pack.
    """
    S, M, K = layout.pack_len, layout.mlm_slots, layout.max_sequences_per_pack
    groups = np.asarray(groups, dtype=np.int64)
    P = len(groups)
    if groups.shape[1] > K:
        raise ValueError(f"groups have {groups.shape[1]} slots but the layout allows {K} sequences")
    width = groups.shape[1]
    present = groups >= 0                                              # (P, w)
    rows = np.where(present, groups, 0)
    seq_src = src["sequence_ids"][rows.ravel()].reshape(P, width, -1)  # (P, w, S0)
    S0 = seq_src.shape[2]
    n = np.where(present, (seq_src > 0).sum(axis=2), 0)                # tokens per instance
    lab_src = src["masked_lm_labels"][rows.ravel()].reshape(P, width, -1)
    m = np.where(present, (lab_src != IGNORE_INDEX).sum(axis=2), 0)    # masked tokens per instance
    body = np.maximum(n - 1, 0)                                        # non-[CLS] tokens
    k = present.sum(axis=1)                                            # sequences per pack
    if (n.sum(axis=1) > S).any():
        raise ValueError(f"a pack's sequences hold more than {S} tokens")
    if (m.sum(axis=1) > M).any():
        raise ValueError(f"a pack has more masked tokens than its {M} MLM slots")
    masked_at = np.cumsum(m, axis=1) - m                               # where each instance's masked run starts
    plain_at = m.sum(axis=1, keepdims=True) + np.cumsum(body - m, axis=1) - (body - m)
    t = np.arange(S0)
    dest = np.where(t < m[..., None], masked_at[..., None] + t,
                    plain_at[..., None] + t - m[..., None])            # (P, w, S0)
    valid = t < body[..., None]
    cls_dest = S - k[:, None] + np.arange(width)[None, :]              # (P, w)
    pack_index = np.broadcast_to(np.arange(P)[:, None, None], dest.shape)

    out = {"input_ids": np.full((P, S), PAD_ID, dtype=np.int64)}
    for name in ("position_ids", "token_type_ids", "sequence_ids"):
        out[name] = np.zeros((P, S), dtype=np.int64)
    seq_ids = np.broadcast_to(np.arange(1, width + 1)[None, :, None], dest.shape)
    for name in ("input_ids", "position_ids", "token_type_ids", "sequence_ids"):
        values = seq_ids if name == "sequence_ids" else src[name][rows.ravel()].reshape(P, width, -1)
        out[name][pack_index[valid], dest[valid]] = values[valid]
        cls_values = np.arange(1, width + 1)[None, :].repeat(P, 0) if name == "sequence_ids" else values[..., S0 - 1]
        if name == "position_ids":
            cls_values = np.zeros_like(cls_values)
        out[name][np.nonzero(present)[0], cls_dest[present]] = cls_values[present]
    labels = np.full((P, M), IGNORE_INDEX, dtype=np.int64)
    masked = t[: lab_src.shape[2]] < m[..., None]                      # (P, w, M0)
    labels[pack_index[..., : lab_src.shape[2]][masked], dest[..., : lab_src.shape[2]][masked]] = lab_src[masked]
    out["masked_lm_labels"] = labels
    nsp = np.zeros((P, K), dtype=np.int64)
    weights = np.zeros((P, K), dtype=np.float32)
    slot = K - k[:, None] + np.arange(width)[None, :]
    nsp_src = src["next_sentence_labels"][rows.ravel(), 0].reshape(P, width)
    nsp[np.nonzero(present)[0], slot[present]] = nsp_src[present]
    weights[np.nonzero(present)[0], slot[present]] = 1.0
    out["next_sentence_labels"], out["next_sentence_weights"] = nsp, weights
    return out


def unpack(packs: dict[str, np.ndarray]) -> list[list[Instance]]:
    """The inverse of packing: for every pack, its instances in sequence order (canonical: tokens by
    position, labels per position)."""
    K = packs["next_sentence_labels"].shape[1]
    out = []
    for p in range(len(packs["input_ids"])):
        seq, pos = packs["sequence_ids"][p], packs["position_ids"][p]
        k = int(seq.max())
        M = packs["masked_lm_labels"].shape[1]
        instances = []
        for j in range(1, k + 1):
            where = np.nonzero(seq == j)[0]
            where = where[np.argsort(pos[where], kind="stable")]
            labels = np.full(len(where), IGNORE_INDEX, dtype=np.int64)
            slots = np.nonzero((seq[:M] == j) & (packs["masked_lm_labels"][p] != IGNORE_INDEX))[0]
            labels[pos[slots]] = packs["masked_lm_labels"][p][slots]
            instances.append(Instance(packs["input_ids"][p][where].astype(np.int64),
                                      packs["token_type_ids"][p][where].astype(np.int64), labels,
                                      int(packs["next_sentence_labels"][p][K - k + j - 1])))
        out.append(instances)
    return out
