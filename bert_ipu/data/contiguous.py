"""Packing whole sequences one after another: the layout of fine-tuning tasks (SQuAD features, GLUE examples,
and any dataset of token sequences).

    packed = pack_sequences(lengths, {"input_ids": ids, "token_type_ids": types}, max_len=128,
                            algorithm="cghp", max_sequences_per_pack=3)
    packed.rows["input_ids"]      # (P, S): each pack's sequences back to back, then padding (0)
    packed.rows["position_ids"]   # (P, S): restarting at 0 in every sequence
    packed.rows["sequence_ids"]   # (P, S): 1..k in slot order, 0 = padding
    packed.row[i], packed.slot[i], packed.offset[i]   # where sequence i went: its tokens are
                                                      # rows[...][row[i], offset[i]:offset[i] + lengths[i]]

Any algorithm of bert_ipu.packing packs the length histogram and `assign` puts every sequence into exactly
one pack (no token is dropped or split). `max_sequences_per_pack` slots per row are kept (with "none" only the
first is used), so one model takes packed and unpacked rows alike. Vectorised: no Python loop over sequences
or tokens. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..packing import PackingInputError, PackingResult, assign, pack
from ..packing.histogram import histogram_of


@dataclass
class PackedSequences:
    rows: dict[str, np.ndarray]    # token fields (P, S), plus position_ids and sequence_ids
    row: np.ndarray                # (N,) pack of each sequence
    slot: np.ndarray               # (N,) its slot 0..K-1 (sequence id slot + 1)
    offset: np.ndarray             # (N,) where it starts in its row
    result: PackingResult          # the packing of the length histogram
    max_sequences_per_pack: int    # K: slots per row

    @property
    def packing_factor(self) -> float:  # sequences per row
        return self.result.packing_factor

    @property
    def efficiency(self) -> float:      # real tokens / row tokens
        return self.result.efficiency

    @property
    def packs(self) -> int:
        return len(self.rows["sequence_ids"])

    def slot_values(self, values: np.ndarray, fill) -> np.ndarray:
        """A per-sequence value (N, ...) laid out per slot: (P, K, ...), `fill` where a slot is empty."""
        values = np.asarray(values)
        out = np.full((self.packs, self.max_sequences_per_pack, *values.shape[1:]), fill, dtype=values.dtype)
        out[self.row, self.slot] = values
        return out


def pack_sequences(lengths: np.ndarray, token_fields: dict[str, np.ndarray], max_len: int, algorithm: str = "cghp",
                   max_sequences_per_pack: int = 3, seed: int = 0, fill: dict | None = None) -> PackedSequences:
    """Pack N sequences (`lengths`, and each token field as one flat array of sum(lengths) tokens) into rows of
    `max_len` with any packing algorithm ("none": one per row). Padding is 0, or `fill[name]` for a field
    (e.g. -100 for labels)."""
    if algorithm == "sort":
        raise PackingInputError("sort makes batches of changing width; packed rows have a fixed length: use none "
                                "(unpacked) or a packing algorithm")
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        raise PackingInputError("no sequences to pack")
    result = pack(histogram_of(lengths, max_len), algorithm, max_sequences_per_pack, seed=seed)
    groups = assign(lengths, result.mixture, max_len, seed=seed)            # (P, D <= K) indices, -1 = empty
    K = max_sequences_per_pack if max_sequences_per_pack is not None else groups.shape[1]
    groups = np.pad(groups, ((0, 0), (0, K - groups.shape[1])), constant_values=-1)
    P = len(groups)
    present = groups >= 0
    slot_len = np.where(present, lengths[np.maximum(groups, 0)], 0)
    slot_offset = np.cumsum(slot_len, axis=1) - slot_len                     # where each slot starts in its row
    index = groups[present]
    row = np.empty(len(lengths), dtype=np.int64)
    slot = np.empty(len(lengths), dtype=np.int64)
    offset = np.empty(len(lengths), dtype=np.int64)
    r_idx, s_idx = np.nonzero(present)
    row[index], slot[index], offset[index] = r_idx, s_idx, slot_offset[present]

    # token t of sequence i goes to flat position row[i] * S + offset[i] + (t - start of i)
    starts = np.cumsum(lengths) - lengths
    owner = np.repeat(np.arange(len(lengths)), lengths)
    within = np.arange(len(owner)) - np.repeat(starts, lengths)
    dest = row[owner] * max_len + offset[owner] + within
    rows = {}
    fields = dict(token_fields) | {"position_ids": within, "sequence_ids": slot[owner] + 1}
    for name, src in fields.items():
        src = np.asarray(src)
        if len(src) != len(owner):
            raise ValueError(f"token field {name} has {len(src)} tokens, the lengths sum to {len(owner)}")
        dtype = src.dtype if src.dtype == bool else np.int64
        flat = np.full(P * max_len, (fill or {}).get(name, 0), dtype=dtype)
        flat[dest] = src
        rows[name] = flat.reshape(P, max_len)
    return PackedSequences(rows, row, slot, offset, result, K)
