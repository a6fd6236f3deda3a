"""NNLSHP: non-negative least-squares histogram packing (Krell et al., Section 3 and Appendix).

Enumerate every strategy that fills a pack *exactly* with at most `depth` sequences, find non-negative
repeat counts whose packed histogram matches the data in weighted least squares (`scipy.optimize.nnls`),
round to integers, and put each sequence the rounded solution left over into a pack of its own (the
paper's "leftovers padded": a length-l leftover takes the strategy [l, max_len - l] with the partner slot
empty). Short lengths (<= 8) get weight 0.09 in the residual, as in the paper, because overshooting them
costs little padding.

The number of exact strategies grows like max_len**(depth-1), so this is offered for depth <= 3 only.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import optimize

from .bounds import past
from .histogram import PackingInputError
from .mixture import trim_to_histogram

MAX_DEPTH = 3
SHORT_LENGTH_CUTOFF = 8
SHORT_LENGTH_WEIGHT = 0.09
MAX_MATRIX_BYTES = 2 * 2**30  # the dense NNLS matrix: max_len x strategies float64 (Wikipedia-512: 90 MB)
# The NNLS solve took 1.4e-9 (pack length 256) to 2.7e-9 s x max_len^2 x strategies on this project's CPU at
# depth 3 (Wikipedia-512: 14 s, SQuAD-384: 4 s; 512 with only 20 lengths present: 8 s); used to skip a solve
# that would run past a time limit, as it cannot be interrupted.
NNLS_SECONDS_PER_ENTRY = 2.5e-9


def strategy_count(max_len: int, depth: int) -> int:
    """How many exact-fill strategies `exact_strategies` enumerates, without enumerating them."""
    n = 1 + (max_len // 2 if depth >= 2 else 0)
    if depth >= 3:  # a <= b <= c, a + b + c = max_len
        n += sum((max_len - a) // 2 - a + 1 for a in range(1, max_len // 3 + 1))
    return n


def exact_strategies(max_len: int, depth: int) -> np.ndarray:
    """All multisets of at most `depth` lengths that sum to `max_len`: (n, depth), descending, 0 = empty."""
    if depth > MAX_DEPTH:
        raise ValueError(f"NNLSHP enumerates strategies only up to depth {MAX_DEPTH}")
    rows = [np.array([[max_len, 0, 0]])]
    if depth >= 2:
        a = np.arange(1, max_len // 2 + 1)
        rows.append(np.stack([max_len - a, a, np.zeros_like(a)], axis=1))
    if depth >= 3:
        a, b = np.meshgrid(np.arange(1, max_len + 1), np.arange(1, max_len + 1), indexing="ij")
        c = max_len - a - b
        keep = (a <= b) & (b <= c)  # each multiset once
        rows.append(np.stack([c[keep], b[keep], a[keep]], axis=1))
    return np.concatenate(rows)[:, :depth]


def fits(max_len: int, depth: int) -> bool:
    """Whether NNLSHP's dense matrix at this pack length and depth fits in MAX_MATRIX_BYTES."""
    return 8 * max_len * strategy_count(max_len, depth) <= MAX_MATRIX_BYTES


def solve_seconds(max_len: int, depth: int) -> float:
    """About how long the NNLS solve takes (NNLS_SECONDS_PER_ENTRY)."""
    return NNLS_SECONDS_PER_ENTRY * max_len ** 2 * strategy_count(max_len, depth)


def nnlshp(histogram: np.ndarray, depth: int = 3, deadline: float | None = None):
    """Returns (the Mixture of the rounded NNLS solution plus padded leftovers, time limit reached). The
    NNLS solve cannot be interrupted: when `deadline` has passed before it, or the solve is estimated
    (`solve_seconds`) to end past it, every sequence gets a pack of its own instead."""
    max_len = len(histogram)
    needed = 8 * max_len * strategy_count(max_len, depth)
    if not fits(max_len, depth):
        raise PackingInputError(f"nnlshp at pack length {max_len} and depth {depth} needs a {needed / 2**30:.1f} GiB "
                                "matrix, more than this machine gives it; use cghp or lpfhp")
    if past(deadline) or (deadline is not None and time.perf_counter() + solve_seconds(max_len, depth) > deadline):
        lengths = np.nonzero(histogram)[0] + 1
        return trim_to_histogram(lengths[:, None], histogram[lengths - 1], histogram), True
    strategies = exact_strategies(max_len, depth)
    # packing matrix: A[l-1, s] = how often length l occurs in strategy s
    A = np.zeros((max_len, len(strategies)))
    for col in range(strategies.shape[1]):
        lens = strategies[:, col]
        used = lens > 0
        np.add.at(A, (lens[used] - 1, np.nonzero(used)[0]), 1)
    weight = np.ones(max_len)
    weight[:SHORT_LENGTH_CUTOFF] = SHORT_LENGTH_WEIGHT
    x, _ = optimize.nnls(weight[:, None] * A, weight * histogram, maxiter=50 * max_len)
    counts = np.rint(x).astype(np.int64)
    # in integers: a float product of counts near 1e18 rounds, leaving sequences uncovered
    residual = histogram - A.astype(np.int64) @ counts
    # leftovers: one pack each, the partner slot left as padding (trimmed below)
    left = np.nonzero(residual > 0)[0] + 1
    leftover_packs = np.zeros((len(left), strategies.shape[1]), dtype=np.int64)
    leftover_packs[:, 0] = left
    strategies = np.concatenate([strategies, leftover_packs])
    counts = np.concatenate([counts, residual[left - 1]])
    return trim_to_histogram(strategies, counts, histogram), past(deadline)
