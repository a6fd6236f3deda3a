"""Cheap lower bounds on the number of packs, and the time limit every algorithm takes."""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from .histogram import PackingInputError


def lower_bound(histogram: np.ndarray, max_sequences_per_pack: int | None) -> int:
    """A cheap bound on the packs any packing needs: Martello and Toth's L2 (`martello_toth`: enough room
    for the tokens, one pack for each sequence longer than half a pack, and the room those leave), and
    enough packs for the depth limit; sequences that fit beside no other (longer than max_len - the
    shortest) take a pack each, and the rest need room and depth of their own (at long context with a depth
    limit, the few sequences truncated to the pack length matter)."""
    max_len = len(histogram)
    sizes = np.arange(1, max_len + 1)
    tokens = int((sizes * histogram).sum())
    n = int(histogram.sum())
    bound = martello_toth(histogram)
    shortest = int(np.argmax(histogram > 0)) + 1
    alone = histogram[max_len - shortest:] if n > 1 else histogram[:0]  # lengths > max_len - shortest
    n_alone = int(alone.sum())
    if n_alone and n_alone < n:
        rest_tokens = tokens - int((sizes[max_len - shortest:] * alone).sum())
        bound = max(bound, n_alone + _ceil_div(rest_tokens, max_len))
    if max_sequences_per_pack is not None:
        bound = max(bound, _ceil_div(n, max_sequences_per_pack))
        if n_alone and n_alone < n:
            bound = max(bound, n_alone + _ceil_div(n - n_alone, max_sequences_per_pack))
    return bound


def tokens_bound(histogram: np.ndarray) -> int:
    """Enough packs for the tokens: ceil(tokens / max_len)."""
    max_len = len(histogram)
    return _ceil_div(int(np.arange(1, max_len + 1) @ histogram), max_len)


def _ceil_div(a: int, b: int) -> int:
    """ceil(a / b) in integers (a float division rounds counts past 2^53: a bound a pack above the optimum)."""
    return -(-int(a) // int(b))


def proven(value: float) -> int:
    """The packs an LP bound `value` proves, ceil(value), less a tolerance for the floating-point rounding of
    the value (its duals times the counts): 1e-6, and 1e-14 of the value (about 45 units in its last place), so
    that a bound of 3e10 packs that the LP computes as 30000000000.000004 (one unit in the last place above)
    proves 3e10, not one more (the optimum was 3e10)."""
    return math.ceil(value - 1e-6 - 1e-14 * abs(value))


def martello_toth(histogram: np.ndarray) -> int:
    """Martello and Toth's bound L2 for bin packing (1990), in O(max_len) on the histogram: for every
    K <= C/2 (C = max_len), the sequences longer than C - K each take a pack, so do those longer than C/2,
    and the sequences of K to C/2 tokens need the room those packs leave, or more packs:

        L(K) = |N1| + |N2| + max(0, ceil((sum N3 - (|N2| C - sum N2)) / C)),   L2 = max_K L(K)

    with N1 = {w > C - K}, N2 = {C/2 < w <= C - K}, N3 = {K <= w <= C/2}. L(0) is the larger of the token
    bound and the count of sequences longer than half a pack. On sparse histograms with many long sequences it
    is often the optimum where the token bound is far below (2,048 tokens, 18,427 log-normal lengths: 8,011
    packs against 8,002)."""
    C = len(histogram)
    count = np.concatenate([[0], np.cumsum(histogram, dtype=np.int64)])            # count[j]: lengths <= j
    tokens = np.concatenate([[0], np.cumsum(histogram * np.arange(1, C + 1, dtype=np.int64))])
    K = np.arange(0, C // 2 + 1)
    half = C // 2
    n1 = count[C] - count[C - K]
    n2 = count[C - K] - count[half]
    room = n2 * C - (tokens[C - K] - tokens[half])
    s3 = tokens[half] - tokens[np.maximum(K, 1) - 1]
    extra = np.maximum(0, -((room - s3) // C))                                       # ceil((s3 - room) / C)
    return int((n1 + n2 + extra).max())


def deadline_of(time_limit) -> float | None:
    """`time.perf_counter()` value at which a time limit of `time_limit` seconds (None = none) runs out.
    A limit that is not a number > 0 is a PackingInputError."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) or math.isnan(time_limit):
        raise PackingInputError(f"time limit {time_limit!r} is not a number of seconds")
    if time_limit <= 0:
        raise PackingInputError(f"time limit is {time_limit} s; it must be > 0 (or none)")
    return time.perf_counter() + float(time_limit)


def past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline
