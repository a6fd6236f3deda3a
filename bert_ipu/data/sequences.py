"""Pack any sequence dataset: token-id lists (or a Hugging Face `datasets.Dataset`) -> fixed-length rows.

    from bert_ipu.data.sequences import pack_token_lists, pack_dataset
    rows = pack_token_lists([[5, 6, 7], [8, 9], ...], pack_length=2048, algorithm="cghp")
    rows.input_ids, rows.position_ids, rows.sequence_ids     # (packs, pack_length) each
    rows.sources(p)                                          # the source rows in pack p, in order
    packed = pack_dataset(dataset, 2048)                     # a datasets.Dataset with those columns

    multi = pack_token_lists(token_lists, pack_length=[4096, 8192], max_sequences_per_pack=8)
    multi[4096].input_ids, multi[8192].input_ids             # (packs of 4096, 4096), (packs of 8192, 8192)
    multi.result                                             # MultiSizeResult: packs per length, bound, gap

Every row carries `input_ids`, `position_ids` (0, 1, ... restarting in every sequence, 0 on padding),
`sequence_ids` (1..k for the k sequences of the pack, 0 = padding: what the packed attention mask and a
decoder's block-diagonal causal mask are built from), `labels` where the source has per-token labels
(`label_pad` on padding), and the indices of the source rows it holds. A token is never dropped or split
across packs: a sequence longer than the pack length is a ValueError naming it, or, with too_long="drop",
left out and listed in `dropped`. Any algorithm of `bert_ipu.packing` decides which sequences share a pack;
with several pack lengths, the multi-size packer (`multisize.pack_multi_size`) decides which sequences share
a pack and how long each pack is, and `assign.assign_multi_size` puts every sequence into exactly one pack of
one length (the rows of each length are exactly as for one length). The rows are made by the one row packer,
`bert_ipu.data.contiguous.rows_from_packs`. The core is numpy only (`datasets` is imported only by `pack_dataset`
and `to_dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..packing.api import PackingResult, pack
from ..packing.assign import assign_multi_size, assign_ragged
from ..packing.histogram import histogram_of
from ..packing.multisize import MultiSizeResult, check_pack_lengths, pack_multi_size
from .contiguous import rows_from_packs


@dataclass(frozen=True)
class PackedRows:
    """Packed rows; every array is (packs, pack_length) except the ragged source index."""
    input_ids: np.ndarray       # source token ids, pad_token_id on padding
    position_ids: np.ndarray    # int32, restarting at 0 in every sequence; 0 on padding
    sequence_ids: np.ndarray    # int32, 1..k within a pack, 0 on padding
    labels: np.ndarray | None   # per-token labels where the source has them, label_pad on padding
    source_offsets: np.ndarray  # (packs + 1,) int64: pack p holds source_indices[offsets[p]:offsets[p + 1]]
    source_indices: np.ndarray  # (packed sequences,) int64 rows of the source, in pack order
    dropped: np.ndarray         # rows left out because they were longer than the (largest) pack length
                                # (too_long="drop")
    result: PackingResult | MultiSizeResult  # the packing of the length histogram (packs, bound, efficiency,
                                # ...); with several pack lengths the one MultiSizeResult of all of them

    def __len__(self) -> int:
        return len(self.input_ids)

    def sources(self, p: int) -> np.ndarray:
        """The source rows in pack p, in the order they appear in it."""
        return self.source_indices[self.source_offsets[p]:self.source_offsets[p + 1]]

    def to_dataset(self):
        """A `datasets.Dataset` with one row per pack (columns input_ids, position_ids, sequence_ids,
        labels if any, source_rows)."""
        import datasets

        columns = {"input_ids": self.input_ids, "position_ids": self.position_ids,
                   "sequence_ids": self.sequence_ids}
        if self.labels is not None:
            columns["labels"] = self.labels
        columns["source_rows"] = [self.sources(p).tolist() for p in range(len(self))]
        return datasets.Dataset.from_dict(columns)


@dataclass(frozen=True)
class MultiSizePackedRows:
    """The packs of several lengths (`pack_token_lists(..., pack_length=[S1, S2, ...])`): one PackedRows per
    pack length, each exactly as for one length (its rows are (packs of that length, S)); every source row
    that is not in `dropped` is in exactly one pack of one length. A length the packer did not use has
    0 packs. `multi[S]` is length S's rows; iterate with `items()`."""
    by_length: dict             # pack length (int, ascending) -> PackedRows of that length
    dropped: np.ndarray         # rows left out because they were longer than the largest pack length
    result: MultiSizeResult     # packs per length, computed tokens, proven lower bound, gap

    def __getitem__(self, pack_length: int) -> PackedRows:
        return self.by_length[pack_length]

    def __iter__(self):
        return iter(self.by_length)

    def __len__(self) -> int:
        """The number of pack lengths."""
        return len(self.by_length)

    def items(self):
        return self.by_length.items()

    @property
    def pack_lengths(self) -> list[int]:
        return list(self.by_length)

    @property
    def packs(self) -> dict:
        """{pack length: packs}, every requested length (0 where none)."""
        return {s: len(rows) for s, rows in self.by_length.items()}

    def to_datasets(self) -> dict:
        """{pack length: datasets.Dataset} (see `PackedRows.to_dataset`)."""
        return {s: rows.to_dataset() for s, rows in self.by_length.items()}


def pack_token_lists(input_ids, pack_length, algorithm: str | None = None,
                     max_sequences_per_pack: int | None = None, *, labels=None, pad_token_id: int = 0,
                     label_pad: int = -100, too_long: str = "error", seed: int = 0,
                     time_limit: float | None = None, costs=None):
    """Pack token-id sequences (a list of lists or 1-D arrays) into rows of `pack_length` tokens.

    pack_length: one length (returns PackedRows), or a list of several (returns MultiSizePackedRows: one
        PackedRows per length, chosen together by `multisize.pack_multi_size`).
    algorithm: for one pack length any of `bert_ipu.packing.ALGORITHMS` (None = "lpfhp"); for several, only
        "cghp" (None = "cghp"): the multi-size packer, column generation over the packs of every length with a
        proven bound, which also returns LPFHP-with-shrinking whenever that is cheaper. Any other name is a
        ValueError.
    labels: per-token labels, one list per sequence of the same length as its input_ids, or None.
    too_long: "error" (a ValueError naming the first sequence longer than the (largest) pack length) or "drop".
    seed: which sequence of a length goes into which slot (and, for several lengths, into which length's
        packs), and the order of the packs (`assign`).
    costs: several pack lengths only: the cost of a pack of each length, in the order given (default: its
        length, i.e. computed tokens); see `multisize.pack_multi_size`.
    """
    several = isinstance(pack_length, (list, tuple, np.ndarray))
    if several:
        sizes = check_pack_lengths(pack_length)
        if algorithm is None:
            algorithm = "cghp"
        if algorithm != "cghp":
            raise ValueError(f"algorithm {algorithm!r} with several pack lengths {sizes}: only 'cghp' (the "
                             "multi-size packer) packs into several lengths; pass one pack length for other algorithms")
        top = max(sizes)
    else:
        if isinstance(pack_length, bool) or not isinstance(pack_length, (int, np.integer)) or pack_length < 1:
            raise ValueError(f"pack_length must be a whole number >= 1 (or a list of them), got {pack_length!r}")
        if costs is not None:
            raise ValueError("costs apply to several pack lengths only (pack_length=[...]); with one length every "
                             "pack costs the same")
        if algorithm is None:
            algorithm = "lpfhp"
        top = int(pack_length)
    if too_long not in ("error", "drop"):
        raise ValueError(f"too_long must be 'error' or 'drop', got {too_long!r}")
    seqs = [np.asarray(s) for s in input_ids]
    if not seqs:
        raise ValueError("the dataset is empty: there is nothing to pack")
    lengths = np.array([s.size for s in seqs], dtype=np.int64)
    for i, s in enumerate(seqs):
        if s.ndim != 1 or (s.size and not np.issubdtype(s.dtype, np.integer)):
            raise ValueError(f"sequence {i}: input_ids must be a flat list of integer token ids")
    if (lengths == 0).any():
        raise ValueError(f"sequence {int(np.argmax(lengths == 0))} is empty (0 tokens); remove empty rows first")
    if labels is not None:
        labels = [np.asarray(l) for l in labels]
        if len(labels) != len(seqs):
            raise ValueError(f"{len(labels)} label lists for {len(seqs)} sequences")
        for i, (s, l) in enumerate(zip(seqs, labels)):
            if l.shape != s.shape:
                raise ValueError(f"sequence {i}: {l.size} labels for {s.size} tokens; labels must be per token")
    what = f"the largest pack length {top}" if several else f"the pack length {top}"
    long = np.nonzero(lengths > top)[0]
    if len(long) and too_long == "error":
        i = int(long[0])
        raise ValueError(f"sequence {i} has {lengths[i]} tokens, more than {what} "
                         f"({len(long)} such sequences); raise pack_length, truncate them, or pass too_long='drop'")
    keep = np.nonzero(lengths <= top)[0]
    if len(keep) == 0:
        raise ValueError(f"every sequence is longer than {what}; nothing to pack")
    dropped = long if too_long == "drop" else np.zeros(0, dtype=np.int64)
    kept_lengths = lengths[keep]
    tokens = np.concatenate(seqs)
    flat_labels = None if labels is None else np.concatenate(labels)
    fill = dict(pad_token_id=pad_token_id, label_pad=label_pad)
    if not several:
        result = pack(histogram_of(kept_lengths, top), algorithm, max_sequences_per_pack, seed=seed,
                      time_limit=time_limit)
        offsets, order = assign_ragged(kept_lengths, result.mixture, top, seed=seed)
        return _rows(tokens, flat_labels, lengths, offsets, keep[order], top, dropped, result, **fill)
    result = pack_multi_size(histogram_of(kept_lengths, top), sizes, max_sequences_per_pack, costs=costs,
                             time_limit=time_limit)
    assigned = assign_multi_size(kept_lengths, result, seed=seed)
    by_length = {}
    for s in sorted(sizes):
        offsets, order = assigned.get(s, (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)))
        by_length[s] = _rows(tokens, flat_labels, lengths, offsets, keep[order], s, dropped, result, **fill)
    return MultiSizePackedRows(by_length, dropped, result)


def _rows(tokens, flat_labels, lengths, offsets, order_src, pack_length, dropped, result, *, pad_token_id,
          label_pad) -> PackedRows:
    """PackedRows of `pack_length` whose pack p holds the source rows order_src[offsets[p]:offsets[p + 1]].

    tokens / flat_labels: every source row's ids / labels concatenated; lengths: (source rows,) their lengths."""
    fields = {"input_ids": tokens} | ({} if flat_labels is None else {"labels": flat_labels})
    rows, *_ = rows_from_packs(lengths, fields, pack_length, offsets, order_src,
                               fill={"input_ids": pad_token_id, "labels": label_pad})
    ids_dtype = tokens.dtype if np.issubdtype(tokens.dtype, np.integer) else np.int64
    labels = None if flat_labels is None else rows["labels"].astype(flat_labels.dtype)
    return PackedRows(rows["input_ids"].astype(ids_dtype), rows["position_ids"].astype(np.int32),
                      rows["sequence_ids"].astype(np.int32), labels, offsets, order_src, dropped, result)


def pack_dataset(dataset, pack_length, algorithm: str | None = None, max_sequences_per_pack: int | None = None,
                 *, column: str = "input_ids", label_column: str = "labels", **kwargs):
    """Pack a Hugging Face `datasets.Dataset` (rows with `column` token ids and, if present, per-token
    `label_column`) and return a `datasets.Dataset` of packs (see `PackedRows.to_dataset`); with several pack
    lengths (a list), {pack length: datasets.Dataset}. Keyword arguments go to `pack_token_lists`."""
    if column not in dataset.column_names:
        raise ValueError(f"the dataset has no column {column!r} (columns: {', '.join(dataset.column_names)})")
    labels = dataset[label_column] if label_column in dataset.column_names else None
    packed = pack_token_lists(dataset[column], pack_length, algorithm, max_sequences_per_pack, labels=labels,
                              **kwargs)
    return packed.to_datasets() if isinstance(packed, MultiSizePackedRows) else packed.to_dataset()
