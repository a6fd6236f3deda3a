"""Strategy mixtures: what every packing algorithm returns.

A *strategy* is a pack recipe: the multiset of sequence lengths that go into one pack. A *mixture* is a set
of strategies with repeat counts. It says nothing about which real sequences go where; that is
`bert_ipu.packing.assign`'s job.

Strategies are stored as one padded integer matrix so that everything downstream is vectorised:

    strategies: (n_strategies, depth) int64, lengths sorted descending in each row, 0 = empty slot
    counts:     (n_strategies,)       int64, how many packs follow each strategy
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Mixture:
    strategies: np.ndarray
    counts: np.ndarray

    def __post_init__(self):
        if self.strategies.ndim != 2 or self.counts.shape != (self.strategies.shape[0],):
            raise ValueError("strategies must be (n, depth) and counts (n,)")

    # --- construction -------------------------------------------------------------------------------

    @classmethod
    def from_lists(cls, strategies: list[list[int]], counts) -> "Mixture":
        """Build from ragged Python lists; merges duplicate strategies and drops zero counts."""
        depth = max((len(s) for s in strategies), default=1)
        mat = np.zeros((len(strategies), max(depth, 1)), dtype=np.int64)
        for i, s in enumerate(strategies):
            mat[i, : len(s)] = s
        return cls.from_matrix(mat, np.asarray(counts, dtype=np.int64))

    @classmethod
    def from_matrix(cls, mat: np.ndarray, counts: np.ndarray) -> "Mixture":
        """Normalise: sort each row descending, drop empty columns, merge equal rows, drop zero counts."""
        mat = np.asarray(mat)
        counts = np.asarray(counts, dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("strategy counts must be non-negative")
        keep = (counts > 0) & (mat > 0).any(axis=1)
        mat, counts = mat[keep], counts[keep]
        if len(mat) == 0:
            return cls(np.zeros((0, 1), dtype=np.int64), counts)
        small = np.int16 if mat.max() < 2**15 else np.int64  # sorting small ints is several times faster
        mat = np.sort(mat.astype(small), axis=1)[:, ::-1]
        width = max(int((mat > 0).sum(axis=1).max()), 1)
        mat = np.ascontiguousarray(mat[:, :width])
        first, group = _group_equal_rows(mat)
        merged = np.zeros(len(first), dtype=np.int64)
        np.add.at(merged, group, counts)
        return cls(mat[first].astype(np.int64), merged)

    @classmethod
    def from_packs(cls, packs: np.ndarray) -> "Mixture":
        """Each row of `packs` (lengths, 0 = empty) is one pack with count 1; equal rows are merged."""
        return cls.from_matrix(packs, np.ones(len(packs), dtype=np.int64))

    # --- statistics ----------------------------------------------------------------------------------

    @property
    def n_packs(self) -> int:
        return int(self.counts.sum())

    @property
    def depth(self) -> int:
        """The largest number of sequences in any pack of the mixture."""
        if len(self.counts) == 0:
            return 0
        return int((self.strategies > 0).sum(axis=1).max())

    def pack_lengths(self) -> np.ndarray:
        """Filled tokens of each strategy: (n_strategies,)."""
        return self.strategies.sum(axis=1)

    def coverage(self, max_len: int) -> np.ndarray:
        """The length histogram the mixture packs: element i counts sequences of length i+1."""
        rows, cols = np.nonzero(self.strategies)
        lens = self.strategies[rows, cols]
        return np.bincount(lens - 1, weights=self.counts[rows], minlength=max_len).astype(np.int64)

    def expand(self) -> np.ndarray:
        """One row per pack: (n_packs, depth) lengths, in strategy order."""
        return np.repeat(self.strategies, self.counts, axis=0)


def _group_equal_rows(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group equal rows of a non-negative integer matrix: (index of each group's first row, group of each
    row), groups in lexicographic order of the rows.

    Rows are bit-packed into as few uint64 words as their values allow and sorted with `np.lexsort` on
    those words, which is much faster than `np.unique(axis=0)` on millions of rows.
    """
    n, width = mat.shape
    bits = max(int(mat.max()).bit_length(), 1)
    per_word = 64 // bits
    words = []
    for start in range(0, width, per_word):
        word = np.zeros(n, dtype=np.uint64)
        for c in range(start, min(start + per_word, width)):
            word = (word << np.uint64(bits)) | mat[:, c].astype(np.uint64)
        words.append(word)
    order = np.lexsort(words[::-1])  # the last key is the primary one
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    for word in words:
        w = word[order]
        changed[1:] |= w[1:] != w[:-1]
    group_sorted = np.cumsum(changed) - 1
    group = np.empty(n, dtype=np.int64)
    group[order] = group_sorted
    return order[changed], group


def trim_excess(strategies: np.ndarray, counts: np.ndarray, histogram: np.ndarray) -> Mixture:
    """Remove the slots that a mixture has beyond `histogram`, so that coverage <= histogram everywhere.

    LP-based packers over-cover lengths (their constraints are `A x >= h`) and NNLSHP pads leftovers with
    phantom partners; an over-covered slot is padding in the real packs. Trimming those slots keeps the
    padding where it is but makes the mixture describe only real sequences, which is what the assignment
    step and the conservation invariant need. Slots are taken from the most-used strategy first, splitting
    a strategy's count when only part of it has to change.
    """
    mat = np.array(strategies, dtype=np.int64)
    counts = np.array(counts, dtype=np.int64)
    excess = Mixture(mat, counts).coverage(len(histogram)) - histogram
    new_rows, new_counts = [], []
    for length in np.nonzero(excess > 0)[0] + 1:
        need = int(excess[length - 1])
        while need > 0:
            has = (mat == length).any(axis=1) & (counts > 0)
            i = int(np.argmax(np.where(has, counts, -1)))
            take = min(need, int(counts[i]))
            row = mat[i].copy()
            row[np.argmax(row == length)] = 0
            counts[i] -= take
            mat = np.vstack([mat, row[None]])
            counts = np.append(counts, take)
            need -= take
    return Mixture.from_matrix(mat, counts)


def trim_to_histogram(strategies: np.ndarray, counts: np.ndarray, histogram: np.ndarray) -> Mixture:
    """`trim_excess`, for a mixture that must then pack exactly the sequences of `histogram`."""
    mixture = trim_excess(strategies, counts, histogram)
    short = np.nonzero(mixture.coverage(len(histogram)) < histogram)[0]
    if len(short):
        raise ValueError(f"mixture does not cover every sequence (length {short[0] + 1} is short)")
    return mixture
