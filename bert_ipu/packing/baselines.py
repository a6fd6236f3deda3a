"""Baselines that packing is measured against: NONE, SORT and GREEDY.

- NONE: one sequence per row, padded to max_len; what vanilla BERT does.
- SORT: no packing; sequences sorted by length and batched, each batch padded to its longest sequence.
  Little padding, but every batch has its own shape (dynamic shapes, recompilation on compilers).
- GREEDY: the T5/RoBERTa recipe: shuffle, concatenate in arrival order, close the pack when the next
  sequence does not fit (or the depth limit is reached). Simple and online, but it wastes the tail of
  many packs.
"""

from __future__ import annotations

import time

import numpy as np

from .histogram import expand_histogram
from .mixture import Mixture


def none(histogram: np.ndarray) -> Mixture:
    """One pack per sequence."""
    lengths = np.nonzero(histogram)[0] + 1
    return Mixture.from_matrix(lengths[:, None], histogram[lengths - 1])


def sort_batches(histogram: np.ndarray, batch_size: int) -> tuple[Mixture, int]:
    """Sorted batching. Returns (one pack per sequence, tokens computed including padding).

    Sequences are sorted by length and cut into batches of `batch_size`; a batch is padded to its longest
    sequence, so the computed tokens are sum over batches of rows x longest. The last batch may be short.
    """
    lengths = expand_histogram(histogram)[::-1]  # longest first, as sorted batching usually runs
    longest = lengths[::batch_size]               # the first sequence of every batch is its longest
    rows = np.full(len(longest), batch_size, dtype=np.int64)
    rows[-1] = len(lengths) - batch_size * (len(longest) - 1)
    return none(histogram), int((longest * rows).sum())


def greedy(histogram: np.ndarray, depth: int, seed: int = 0, deadline: float | None = None):
    """Shuffle the sequences, then fill packs in arrival order (next fit), closing a pack when the next
    sequence does not fit or the pack holds `depth` sequences. Returns (mixture, time limit reached):
    past `deadline` (a `time.perf_counter()` value) every sequence not yet placed gets a pack of its own."""
    max_len = len(histogram)
    small = np.int16 if max_len < 2**15 else np.int32
    lengths = np.random.default_rng(seed).permutation(expand_histogram(histogram).astype(small))
    n = len(lengths)
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = ends - lengths
    # A pack starting at sequence i takes sequences i..j-1: the longest run that fits and respects depth.
    nxt = np.searchsorted(ends, starts + max_len, side="right")
    nxt = np.minimum(nxt, np.arange(n) + depth).tolist()
    first = []
    i, late = 0, False
    while i < n:  # the chain of pack starts is inherently sequential; a list walk is ~0.1 us a step
        first.append(i)
        i = nxt[i]
        if deadline is not None and len(first) % 65536 == 0 and time.perf_counter() > deadline:
            late = True
            first.extend(range(i, n))
            break
    first = np.asarray(first, dtype=np.int64)
    sizes = np.diff(np.append(first, n))
    width = int(sizes.max())
    pack_of = np.repeat(np.arange(len(first)), sizes)
    slot = np.arange(n) - first[pack_of]
    packs = np.zeros((len(first), width), dtype=small)
    packs[pack_of, slot] = lengths
    return Mixture.from_packs(packs), late
