"""Baselines that packing is measured against: NONE, SORT and GREEDY.

- NONE: one sequence per row, padded to max_len; what vanilla BERT does.
- SORT: no packing; sequences sorted by length and batched, each batch padded to its longest sequence.
  Little padding, but every batch has its own shape (dynamic shapes, recompilation on compilers).
- GREEDY: the T5/RoBERTa recipe: shuffle, concatenate in arrival order, close the pack when the next
  sequence does not fit (or the depth limit is reached). Simple and online, but it wastes the tail of
  many packs.
"""

from __future__ import annotations

import numpy as np

from .bounds import past
from .histogram import PackingInputError
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
    # Counted per length, not per sequence (a histogram of 4e18 sequences cannot be expanded): longest first,
    # as sorted batching usually runs, the sequences of length l sit at positions [start_l, end_l), and a batch
    # starts at every multiple of batch_size; its first sequence is its longest.
    present = np.nonzero(histogram)[0][::-1]
    ends = np.cumsum(histogram[present])
    n = int(ends[-1])
    size = min(batch_size, n)  # a larger batch is one batch of them all
    starts_in = -(-ends // size) - (-(-(ends - histogram[present]) // size))  # batches whose longest is l
    batches = -(-n // size)
    last_longest = int(present[np.searchsorted(ends, size * (batches - 1), side="right")]) + 1
    short = size * batches - n  # rows the last batch lacks
    # Python integers: padded tokens can pass 2^63 where the tokens themselves do not
    computed = size * int(((present + 1).astype(object) * starts_in.astype(object)).sum()) - short * last_longest
    return none(histogram), computed


GREEDY_CHUNK = 1 << 18        # sequences drawn, shuffled and packed at a time; the time limit is checked between
GREEDY_MAX_SEQUENCES = 10**9  # numpy's multivariate hypergeometric draws from fewer items than this


def greedy(histogram: np.ndarray, depth: int, seed: int = 0, deadline: float | None = None):
    """Shuffle the sequences, then fill packs in arrival order (next fit), closing a pack when the next
    sequence does not fit or the pack holds `depth` sequences. Returns (mixture, time limit reached).

    The shuffle is drawn a chunk at a time: a uniformly random GREEDY_CHUNK of the sequences not yet drawn
    (multivariate hypergeometric counts per length), in random order, which is one uniform shuffle of them
    all; the pack still open at the end of a chunk continues into the next. So memory and the time between
    two looks at `deadline` (a `time.perf_counter()` value) are a chunk's, not the whole histogram's (a
    single shuffle of 32M sequences once took 24 s past a 1 s limit). Past the deadline the open pack is
    closed and every sequence not yet drawn gets a pack of its own."""
    max_len = len(histogram)
    small = np.int16 if max_len < 2**15 else np.int32
    present = np.nonzero(histogram)[0]
    left = histogram[present].astype(np.int64)
    if int(left.sum()) >= GREEDY_MAX_SEQUENCES:
        raise PackingInputError(f"greedy shuffles every sequence and handles fewer than {GREEDY_MAX_SEQUENCES:,}; "
                                f"this histogram has {int(left.sum()):,}: use a histogram packer (spfhp, lpfhp, "
                                "cghp) or fewer sequences")
    rng = np.random.default_rng(seed)
    done: list[Mixture] = []
    carry = np.zeros(0, dtype=small)  # the open pack: the sequences after the last pack start so far
    late = False
    while (remaining := int(left.sum())) > 0:
        if past(deadline):
            late = True
            break
        take = min(GREEDY_CHUNK, remaining)
        drawn = rng.multivariate_hypergeometric(left, take) if take < remaining else left.copy()
        left -= drawn
        lengths = np.concatenate([carry, rng.permutation(np.repeat((present + 1).astype(small), drawn))])
        first = _next_fit_starts(lengths, max_len, depth)
        done.append(_packs(lengths[:first[-1]], first[:-1]))
        carry = lengths[first[-1]:]
        if len(done) >= 64:  # merge now and then: a chunk's mixture is small, 4,000 of them are not
            done = [Mixture.concat(done)]
    done.append(_packs(carry, np.zeros(1, dtype=np.int64)))
    if late:  # a pack of its own for every sequence not yet drawn
        done.append(Mixture.from_matrix((present + 1)[:, None], left))
    return Mixture.concat(done), late


def _next_fit_starts(lengths: np.ndarray, max_len: int, depth: int) -> np.ndarray:
    """The index of the first sequence of every pack that next fit makes of `lengths` in this order."""
    n = len(lengths)
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = ends - lengths
    # A pack starting at sequence i takes sequences i..j-1: the longest run that fits and respects depth.
    nxt = np.searchsorted(ends, starts + max_len, side="right")
    nxt = np.minimum(nxt, np.arange(n) + depth).tolist()
    first = []
    i = 0
    while i < n:  # the chain of pack starts is inherently sequential; a list walk is ~0.1 us a step
        first.append(i)
        i = nxt[i]
    return np.asarray(first, dtype=np.int64)


def _packs(lengths: np.ndarray, first: np.ndarray) -> Mixture:
    """The mixture of the packs lengths[first[k]:first[k + 1]] (the last one runs to the end)."""
    if len(first) == 0 or len(lengths) == 0:
        return Mixture.from_matrix(np.zeros((0, 1), dtype=np.int64), np.zeros(0, dtype=np.int64))
    n = len(lengths)
    sizes = np.diff(np.append(first, n))
    pack_of = np.repeat(np.arange(len(first)), sizes)
    packs = np.zeros((len(first), int(sizes.max())), dtype=lengths.dtype)
    packs[pack_of, np.arange(n) - first[pack_of]] = lengths
    return Mixture.from_packs(packs)
