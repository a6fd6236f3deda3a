"""Strategy mixtures: what every packing algorithm returns.

A *strategy* is a pack recipe: the multiset of sequence lengths that go into one pack. A *mixture* is a set
of strategies with repeat counts. It says nothing about which real sequences go where; that is
`bert_ipu.packing.assign`'s job.

Strategies are stored ragged, because at long context and unlimited depth a few strategies hold thousands
of sequences while most hold a handful (a padded matrix of 26,000 strategies x depth 2,494 is 0.5 GB):

    flat:    (total slots,)     int64 lengths, strategy after strategy, descending within each strategy
    offsets: (n_strategies + 1,) int64, strategy i is flat[offsets[i]:offsets[i + 1]]
    counts:  (n_strategies,)     int64, how many packs follow each strategy

`strategies` gives the same as one zero-padded (n_strategies, depth) matrix, 0 = empty slot (built on
first use; fine for depth-limited mixtures, avoid it for deep ones).
"""

from __future__ import annotations

import numpy as np


class Mixture:
    """Pack strategies with repeat counts; see the module docstring. Build with `from_matrix`, `from_lists`,
    `from_ragged` or `from_packs` (they normalise: rows sorted descending, equal strategies merged, zero
    counts dropped, strategies in lexicographic order); `Mixture(matrix, counts)` keeps rows as given."""

    __slots__ = ("flat", "offsets", "counts", "_dense")

    def __init__(self, strategies: np.ndarray, counts: np.ndarray):
        strategies = np.asarray(strategies)
        counts = np.asarray(counts, dtype=np.int64)
        if strategies.ndim != 2 or counts.shape != (strategies.shape[0],):
            raise ValueError("strategies must be (n, depth) and counts (n,)")
        filled = strategies > 0
        self.flat = strategies[filled].astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(filled.sum(axis=1))]).astype(np.int64)
        self.counts = counts
        self._dense = strategies.astype(np.int64)

    @classmethod
    def _raw(cls, flat: np.ndarray, offsets: np.ndarray, counts: np.ndarray, dense=None) -> "Mixture":
        self = cls.__new__(cls)
        self.flat, self.offsets, self.counts, self._dense = flat, offsets, counts, dense
        return self

    # --- construction -------------------------------------------------------------------------------

    @classmethod
    def from_lists(cls, strategies: list[list[int]], counts) -> "Mixture":
        """Build from ragged Python lists; merges duplicate strategies and drops zero counts."""
        sizes = np.array([len(s) for s in strategies], dtype=np.int64)
        flat = np.fromiter((x for s in strategies for x in s), dtype=np.int64, count=int(sizes.sum()))
        return cls.from_ragged(flat, np.concatenate([[0], np.cumsum(sizes)]), np.asarray(counts, dtype=np.int64))

    @classmethod
    def from_ragged(cls, flat, offsets, counts) -> "Mixture":
        """Normalise ragged strategies (flat lengths and offsets; zero lengths are empty slots)."""
        flat, offsets = np.asarray(flat, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("strategy counts must be non-negative")
        sizes = np.diff(offsets)
        width = int(sizes.max()) if len(sizes) else 0
        if len(sizes) * width <= 4 * len(flat) + 1024:  # not much padding: the vectorised matrix path
            mat = np.zeros((len(sizes), max(width, 1)), dtype=np.int64)
            row = np.repeat(np.arange(len(sizes)), sizes)
            mat[row, np.arange(len(flat)) - offsets[row]] = flat
            return cls.from_matrix(mat, counts)
        # Deep and ragged: few strategies, so a dictionary over each strategy's bytes is cheap.
        row = np.repeat(np.arange(len(sizes)), sizes)
        order = np.lexsort((-flat, row))              # descending within each strategy
        flat = flat[order]
        keep = flat > 0
        flat, row = flat[keep], row[order][keep]
        sizes = np.bincount(row, minlength=len(counts))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        merged: dict[bytes, list] = {}
        big_endian = flat.astype(">u4")               # bytes compare like the numbers, shorter prefix first
        for i in np.nonzero((counts > 0) & (sizes > 0))[0]:
            key = big_endian[offsets[i]:offsets[i + 1]].tobytes()
            entry = merged.get(key)
            if entry is None:
                merged[key] = [i, int(counts[i])]
            else:
                entry[1] += int(counts[i])
        keys = sorted(merged)
        first = np.array([merged[k][0] for k in keys], dtype=np.int64)
        new_counts = np.array([merged[k][1] for k in keys], dtype=np.int64)
        if len(first) == 0:
            return cls(np.zeros((0, 1), dtype=np.int64), new_counts)
        new_sizes = sizes[first]
        starts = np.repeat(offsets[first] - np.concatenate([[0], np.cumsum(new_sizes)[:-1]]), new_sizes)
        new_flat = flat[np.arange(int(new_sizes.sum())) + starts]
        return cls._raw(new_flat, np.concatenate([[0], np.cumsum(new_sizes)]), new_counts)

    @classmethod
    def concat(cls, mixtures: list["Mixture"]) -> "Mixture":
        """The union of several mixtures (normalised: equal strategies merged)."""
        sizes = np.concatenate([np.diff(m.offsets) for m in mixtures])
        return cls.from_ragged(np.concatenate([m.flat for m in mixtures]), np.concatenate([[0], np.cumsum(sizes)]),
                               np.concatenate([m.counts for m in mixtures]))

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
        mat = mat[first].astype(np.int64)
        filled = mat > 0
        offsets = np.concatenate([[0], np.cumsum(filled.sum(axis=1))]).astype(np.int64)
        return cls._raw(mat[filled], offsets, merged, mat)

    @classmethod
    def from_packs(cls, packs: np.ndarray) -> "Mixture":
        """Each row of `packs` (lengths, 0 = empty) is one pack with count 1; equal rows are merged."""
        return cls.from_matrix(packs, np.ones(len(packs), dtype=np.int64))

    # --- views ---------------------------------------------------------------------------------------

    @property
    def strategies(self) -> np.ndarray:
        """(n_strategies, depth) int64, 0 = empty slot: the ragged strategies padded into one matrix."""
        if self._dense is None:
            sizes = self.sizes
            mat = np.zeros((len(sizes), max(int(sizes.max()) if len(sizes) else 1, 1)), dtype=np.int64)
            row = np.repeat(np.arange(len(sizes)), sizes)
            mat[row, np.arange(len(self.flat)) - self.offsets[row]] = self.flat
            self._dense = mat
        return self._dense

    @property
    def sizes(self) -> np.ndarray:
        """Sequences in each strategy: (n_strategies,)."""
        return np.diff(self.offsets)

    def strategy(self, i: int) -> np.ndarray:
        """The lengths of strategy i, descending."""
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    # --- statistics ----------------------------------------------------------------------------------

    @property
    def n_packs(self) -> int:
        return int(self.counts.sum())

    @property
    def depth(self) -> int:
        """The largest number of sequences in any pack of the mixture."""
        if len(self.counts) == 0:
            return 0
        return int(self.sizes.max())

    def pack_lengths(self) -> np.ndarray:
        """Filled tokens of each strategy: (n_strategies,)."""
        cum = np.concatenate([[0], np.cumsum(self.flat)])
        return cum[self.offsets[1:]] - cum[self.offsets[:-1]]

    def coverage(self, max_len: int) -> np.ndarray:
        """The length histogram the mixture packs: element i counts sequences of length i+1."""
        weights = np.repeat(self.counts, self.sizes)
        if self.n_packs * max(self.depth, 1) < 2**53:  # float weights are exact below 2^53
            return np.bincount(self.flat - 1, weights=weights, minlength=max_len).astype(np.int64)
        out = np.zeros(max_len, dtype=np.int64)
        np.add.at(out, self.flat - 1, weights)
        return out

    def expand(self) -> np.ndarray:
        """One row per pack: (n_packs, depth) lengths, in strategy order (dense; see `expand_ragged`)."""
        return np.repeat(self.strategies, self.counts, axis=0)

    def expand_ragged(self) -> tuple[np.ndarray, np.ndarray]:
        """One pack per repeat, ragged: (flat lengths, offsets (n_packs + 1,)), in strategy order."""
        sizes = np.repeat(self.sizes, self.counts)
        # slot s of pack p is flat[offsets_of_its_strategy + s]
        strategy = np.repeat(np.arange(len(self.counts)), self.counts)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], sizes)
        return self.flat[np.repeat(self.offsets[strategy], sizes) + within], offsets

    def __repr__(self) -> str:
        return f"Mixture({len(self.counts)} strategies, {self.n_packs} packs, depth {self.depth})"


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


def pattern_matrix(patterns: list[np.ndarray]) -> np.ndarray:
    """Ragged patterns (0 entries allowed) as one zero-padded (n, width) matrix."""
    mat = np.zeros((len(patterns), max(len(p) for p in patterns)), dtype=np.int64)
    for i, p in enumerate(patterns):
        mat[i, : len(p)] = p
    return mat


def trim_excess(strategies: np.ndarray, counts: np.ndarray, histogram: np.ndarray, swap: bool = False) -> Mixture:
    """Remove the slots that a mixture has beyond `histogram`, so that coverage <= histogram everywhere.

    LP-based packers over-cover lengths (their constraints are `A x >= h`) and NNLSHP pads leftovers with
    phantom partners; an over-covered slot is padding in the real packs. Trimming those slots keeps the
    padding where it is but makes the mixture describe only real sequences, which is what the assignment
    step and the conservation invariant need. Slots are taken from the most-used strategy first, splitting
    a strategy's count when only part of it has to change.

    swap: an over-covered slot first takes the longest sequence shorter than it that no slot holds (what the
    LP's swap columns mean, `lp.MasterLP`: a slot of a longer length serves a shorter one), and is trimmed
    only when none is left. Slots are swapped longest first, each to the longest such sequence, which places
    as many sequences as any assignment of sequences to slots that fit them can.
    """
    mat = np.array(strategies, dtype=np.int64)
    counts = np.array(counts, dtype=np.int64)
    coverage = Mixture(mat, counts).coverage(len(histogram))
    excess = coverage - histogram
    unplaced = np.maximum(histogram - coverage, 0)
    for length in np.nonzero(excess > 0)[0][::-1] + 1:
        need = int(excess[length - 1])
        while need > 0:
            has = (mat == length).any(axis=1) & (counts > 0)
            i = int(np.argmax(np.where(has, counts, -1)))
            take, into = min(need, int(counts[i])), 0
            shorter = np.nonzero(unplaced[: length - 1])[0] if swap else ()
            if len(shorter):
                into = int(shorter[-1]) + 1
                take = min(take, int(unplaced[into - 1]))
                unplaced[into - 1] -= take
            row = mat[i].copy()
            row[np.argmax(row == length)] = into
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
