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

from ..packing import PackingInputError, PackingResult, assign, assign_multi_size, pack
from ..packing.histogram import histogram_of
from ..packing.multisize import MultiSizeResult, pack_multi_size


@dataclass
class PackedSequences:
    rows: dict[str, np.ndarray]    # token fields (P, S), plus position_ids and sequence_ids
    row: np.ndarray                # (N,) pack of each sequence
    slot: np.ndarray               # (N,) its slot 0..K-1 (sequence id slot + 1)
    offset: np.ndarray             # (N,) where it starts in its row
    result: PackingResult | MultiSizeResult  # the packing of the length histogram (of every level's lengths)
    max_sequences_per_pack: int    # K: slots per row

    @property
    def packing_factor(self) -> float:  # sequences per row
        return len(self.row) / max(self.packs, 1)

    @property
    def efficiency(self) -> float:      # real tokens / row tokens
        ids = self.rows["sequence_ids"]
        return float((ids > 0).sum() / max(ids.size, 1))

    @property
    def packs(self) -> int:
        return len(self.rows["sequence_ids"])

    def slot_values(self, values: np.ndarray, fill) -> np.ndarray:
        """A per-sequence value (N, ...) laid out per slot: (P, K, ...), `fill` where a slot is empty."""
        values = np.asarray(values)
        out = np.full((self.packs, self.max_sequences_per_pack, *values.shape[1:]), fill, dtype=values.dtype)
        out[self.row, self.slot] = values
        return out


def rows_from_packs(lengths: np.ndarray, token_fields: dict[str, np.ndarray], max_len: int, offsets: np.ndarray,
                    order: np.ndarray, fill: dict | None = None, dtype=np.int64,
                    layout: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """The one row packer: rows of `max_len` whose pack p holds the sequences order[offsets[p]:offsets[p + 1]]
    back to back, then padding. `lengths` (N,) are every sequence's lengths and each token field one flat
    array of sum(lengths) tokens (sequence i's at its cumulative start); `order` may leave sequences out.
    Adds `position_ids` (restarting at 0) and `sequence_ids` (1..k in pack order, 0 = padding) unless `layout` is
    False (`pack_dataset` stores each pack's sequence lengths instead, from which they follow). Padding is 0,
    or `fill[name]`. Fields keep bool, else become `dtype` (int64 by default). Returns (rows, row, slot,
    column): for each packed sequence, in `order`'s order, its pack, its slot (0-based) and where it starts in
    its row. Vectorised: no Python loop over sequences or tokens.

    A pack's sequences fill its row from column 0 with no gap, so the packed tokens, in pack order, are exactly
    the row-major cells before each row's padding: they are written through that mask, with no index per token
    (`pack_dataset` writes hundreds of millions of tokens this way)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets, order = np.asarray(offsets, dtype=np.int64), np.asarray(order, dtype=np.int64)
    n_packs = len(offsets) - 1
    row = np.repeat(np.arange(n_packs), np.diff(offsets))       # pack of each packed sequence
    slot = np.arange(len(order)) - offsets[row]
    seq_len = lengths[order]
    seq_end = np.cumsum(seq_len)
    seq_begin = seq_end - seq_len                               # in the concatenation of all packs
    pack_end = np.concatenate([[0], seq_end])[offsets]          # (n_packs + 1,) token offsets of the packs
    column = seq_begin - pack_end[:-1][row]
    used = np.diff(pack_end)
    if (used > max_len).any():
        raise ValueError(f"pack {int(np.argmax(used > max_len))} holds {int(used.max())} tokens, more than {max_len}")
    n_tokens = int(pack_end[-1])
    position = np.arange(n_tokens, dtype=dtype) - np.repeat(seq_begin.astype(dtype), seq_len)
    total = int(lengths.sum())
    for name, values in token_fields.items():
        if len(values) != total:
            raise ValueError(f"token field {name} has {len(values)} tokens, the lengths sum to {total}")
    if len(order) == len(lengths) and np.array_equal(order, np.arange(len(lengths))):
        gather = slice(None)                                    # already in pack order: no gather
    else:
        gather = np.repeat((np.cumsum(lengths) - lengths)[order], seq_len) + position
    fields = {name: np.asarray(v)[gather] for name, v in token_fields.items()}
    if layout:
        fields |= {"position_ids": position, "sequence_ids": np.repeat((slot + 1).astype(dtype), seq_len)}
    filled = np.arange(max_len) < used[:, None]                  # (n_packs, max_len): the cells with tokens
    rows = {}
    for name, values in fields.items():
        kind = bool if values.dtype == bool else dtype
        out = np.full((n_packs, max_len), (fill or {}).get(name, 0), dtype=kind)
        out[filled] = values
        rows[name] = out
    return rows, row, slot, column


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
    groups = assign(lengths, result.mixture, max_len, seed=seed)            # (P, D <= K) indices, -1 = empty, last
    K = max_sequences_per_pack if max_sequences_per_pack is not None else groups.shape[1]
    present = groups >= 0
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))])
    rows, row, slot, column = rows_from_packs(lengths, token_fields, max_len, offsets, groups[present], fill)
    where = np.empty((3, len(lengths)), dtype=np.int64)
    where[:, groups[present]] = row, slot, column
    return PackedSequences(rows, where[0], where[1], where[2], result, K)


def pack_levels(lengths: np.ndarray, token_fields: dict[str, np.ndarray], pack_lengths: list[int],
                max_sequences_per_pack: int | None = None, seed: int = 0, fill: dict | None = None,
                costs: list[float] | None = None) -> dict[int, PackedSequences]:
    """Pack N sequences into rows of several lengths chosen together (Hierarchical Balance Packing's levels:
    `bert_ipu.packing.multisize.pack_multi_size`, the least computed tokens with a proven bound): {pack length:
    PackedSequences of that length} (only lengths that got packs), every sequence in exactly one row of one
    length. K (slots a row) is the depth limit, or the deepest pack of each length when unlimited. costs: of a
    full pack of each length (default its tokens; `bert_ipu.packing.levels.level_costs` gives modelled ones)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        raise PackingInputError("no sequences to pack")
    top = max(pack_lengths)
    result = pack_multi_size(histogram_of(lengths, top), pack_lengths, max_sequences_per_pack, costs=costs)
    out = {}
    for length, (offsets, order) in assign_multi_size(lengths, result, seed=seed).items():
        rows, row, slot, column = rows_from_packs(lengths, token_fields, length, offsets, order, fill)
        K = max_sequences_per_pack or max(int(np.diff(offsets).max(initial=1)), 1)
        where = np.full((3, len(lengths)), -1, dtype=np.int64)  # -1: in another length's rows
        where[:, order] = row, slot, column
        out[length] = PackedSequences(rows, where[0][order], where[1][order], where[2][order], result, K)
    return out