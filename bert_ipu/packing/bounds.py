"""Cheap lower bounds on the number of packs, and the time limit every algorithm takes."""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from .histogram import PackingInputError


def lower_bound(histogram: np.ndarray, max_sequences_per_pack: int | None) -> int:
    """A cheap bound on the packs any packing needs: enough room for the tokens, one pack for each
    sequence longer than half a pack, and enough packs for the depth limit; sequences that fit beside no
    other (longer than max_len - the shortest) take a pack each, and the rest need room and depth of their
    own (at long context with a depth limit, the few sequences truncated to the pack length matter)."""
    max_len = len(histogram)
    sizes = np.arange(1, max_len + 1)
    tokens = int((sizes * histogram).sum())
    n = int(histogram.sum())
    bound = max(math.ceil(tokens / max_len), int(histogram[max_len // 2:].sum()))
    shortest = int(np.argmax(histogram > 0)) + 1
    alone = histogram[max_len - shortest:] if n > 1 else histogram[:0]  # lengths > max_len - shortest
    n_alone = int(alone.sum())
    if n_alone and n_alone < n:
        rest_tokens = tokens - int((sizes[max_len - shortest:] * alone).sum())
        bound = max(bound, n_alone + math.ceil(rest_tokens / max_len))
    if max_sequences_per_pack is not None:
        bound = max(bound, math.ceil(n / max_sequences_per_pack))
        if n_alone and n_alone < n:
            bound = max(bound, n_alone + math.ceil((n - n_alone) / max_sequences_per_pack))
    return bound


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
