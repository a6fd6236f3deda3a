"""Pack any sequence dataset: token-id lists (or a Hugging Face `datasets.Dataset`) -> fixed-length rows.

    from bert_ipu.packing.sequences import pack_token_lists, pack_dataset
    rows = pack_token_lists([[5, 6, 7], [8, 9], ...], pack_length=2048, algorithm="cghp")
    rows.input_ids, rows.position_ids, rows.sequence_ids     # (packs, pack_length) each
    rows.sources(p)                                          # the source rows in pack p, in order
    packed = pack_dataset(dataset, 2048)                     # a datasets.Dataset with those columns

Every row carries `input_ids`, `position_ids` (0, 1, ... restarting in every sequence, 0 on padding),
`sequence_ids` (1..k for the k sequences of the pack, 0 = padding: what the packed attention mask and a
decoder's block-diagonal causal mask are built from), `labels` where the source has per-token labels
(`label_pad` on padding), and the indices of the source rows it holds. A token is never dropped or split
across packs: a sequence longer than the pack length is a ValueError naming it, or, with too_long="drop",
left out and listed in `dropped`. Any algorithm of `bert_ipu.packing` decides which sequences share a pack;
the core is numpy only (`datasets` is imported only by `pack_dataset` and `to_dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import PackingResult, assign_ragged, histogram_of, pack


@dataclass(frozen=True)
class PackedRows:
    """Packed rows; every array is (packs, pack_length) except the ragged source index."""
    input_ids: np.ndarray       # source token ids, pad_token_id on padding
    position_ids: np.ndarray    # int32, restarting at 0 in every sequence; 0 on padding
    sequence_ids: np.ndarray    # int32, 1..k within a pack, 0 on padding
    labels: np.ndarray | None   # per-token labels where the source has them, label_pad on padding
    source_offsets: np.ndarray  # (packs + 1,) int64: pack p holds source_indices[offsets[p]:offsets[p + 1]]
    source_indices: np.ndarray  # (packed sequences,) int64 rows of the source, in pack order
    dropped: np.ndarray         # rows left out because they were longer than the pack length (too_long="drop")
    result: PackingResult       # the packing of the length histogram (packs, bound, efficiency, ...)

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


def pack_token_lists(input_ids, pack_length: int, algorithm: str = "lpfhp",
                     max_sequences_per_pack: int | None = None, *, labels=None, pad_token_id: int = 0,
                     label_pad: int = -100, too_long: str = "error", seed: int = 0,
                     time_limit: float | None = None) -> PackedRows:
    """Pack token-id sequences (a list of lists or 1-D arrays) into rows of `pack_length` tokens.

    labels: per-token labels, one list per sequence of the same length as its input_ids, or None.
    too_long: "error" (a ValueError naming the first sequence longer than pack_length) or "drop".
    seed: which sequence of a length goes into which slot, and the order of the packs (`assign`).
    """
    if isinstance(pack_length, bool) or not isinstance(pack_length, (int, np.integer)) or pack_length < 1:
        raise ValueError(f"pack_length must be a whole number >= 1, got {pack_length!r}")
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
    long = np.nonzero(lengths > pack_length)[0]
    if len(long) and too_long == "error":
        i = int(long[0])
        raise ValueError(f"sequence {i} has {lengths[i]} tokens, more than the pack length {pack_length} "
                         f"({len(long)} such sequences); raise pack_length, truncate them, or pass too_long='drop'")
    keep = np.nonzero(lengths <= pack_length)[0]
    if len(keep) == 0:
        raise ValueError(f"every sequence is longer than the pack length {pack_length}; nothing to pack")
    kept_lengths = lengths[keep]
    result = pack(histogram_of(kept_lengths, pack_length), algorithm, max_sequences_per_pack, seed=seed,
                  time_limit=time_limit)
    offsets, order = assign_ragged(kept_lengths, result.mixture, pack_length, seed=seed)
    order_src = keep[order]                                     # source row of each packed sequence
    n_packs = len(offsets) - 1
    sizes = np.diff(offsets)
    pack_of = np.repeat(np.arange(n_packs), sizes)              # pack of each packed sequence
    seq_len = lengths[order_src]
    seq_end = np.cumsum(seq_len)
    seq_begin = seq_end - seq_len                               # in the concatenation of all packs
    pack_begin = np.concatenate([[0], seq_end])[offsets[:-1]]  # first token of each pack
    column = seq_begin - pack_begin[pack_of]                    # where each sequence starts in its row
    total = int(seq_end[-1])
    position = np.arange(total) - np.repeat(seq_begin, seq_len)
    rows = np.repeat(pack_of, seq_len)
    cols = np.repeat(column, seq_len) + position

    src_starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate(seqs)
    src = np.repeat(src_starts[order_src], seq_len) + position  # each packed token's place in `tokens`
    dtype = tokens.dtype if np.issubdtype(tokens.dtype, np.integer) else np.int64
    out_ids = np.full((n_packs, pack_length), pad_token_id, dtype=dtype)
    out_ids[rows, cols] = tokens[src]
    out_pos = np.zeros((n_packs, pack_length), dtype=np.int32)
    out_pos[rows, cols] = position
    out_seq = np.zeros((n_packs, pack_length), dtype=np.int32)
    out_seq[rows, cols] = np.repeat(np.arange(len(order)) - offsets[pack_of] + 1, seq_len)
    out_labels = None
    if labels is not None:
        flat_labels = np.concatenate(labels)
        out_labels = np.full((n_packs, pack_length), label_pad, dtype=flat_labels.dtype)
        out_labels[rows, cols] = flat_labels[src]
    return PackedRows(out_ids, out_pos, out_seq, out_labels, offsets, order_src, long if too_long == "drop"
                      else np.zeros(0, dtype=np.int64), result)


def pack_dataset(dataset, pack_length: int, algorithm: str = "lpfhp", max_sequences_per_pack: int | None = None,
                 *, column: str = "input_ids", label_column: str = "labels", **kwargs):
    """Pack a Hugging Face `datasets.Dataset` (rows with `column` token ids and, if present, per-token
    `label_column`) and return a `datasets.Dataset` of packs (see `PackedRows.to_dataset`). Keyword arguments
    go to `pack_token_lists`."""
    if column not in dataset.column_names:
        raise ValueError(f"the dataset has no column {column!r} (columns: {', '.join(dataset.column_names)})")
    labels = dataset[label_column] if label_column in dataset.column_names else None
    return pack_token_lists(dataset[column], pack_length, algorithm, max_sequences_per_pack, labels=labels,
                            **kwargs).to_dataset()
