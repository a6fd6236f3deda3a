"""Plan-guided packing: long packs under a depth limit where the token bound binds.

Long-context data at 8K tokens with at most 8 sequences a pack is tight on both resources at once: the
packs must be full (the token bound binds) and the slots are scarce (7.3 sequences a pack on average, once
the sequences that fill a pack alone are set aside). Best fit from the longest sequence down (LPFHP, FFD)
fills packs 8 at a time with medium sequences and ends far above the bound there; column generation needs
the exact lengths to see what fits (on lengths rounded up to buckets the LP alone is further above the bound
than the plan's packing) and is slow to converge on thousands of exact lengths. Here the LP only *plans*:

1. lengths are grouped into classes of g = ceil(L / PLAN_CLASSES) tokens, and each class stands for its
   mean length (not its longest: the plan is no packing and no bound, only proportions), so the depth-
   limited cutting-stock LP over about 256 lengths says which classes go together, and how often;
2. each planned pack is realised with real sequences: slot by slot, the length of the slot's class
   nearest to its mean minus the deviation so far (so the running total tracks the plan), the last slot
   by best fit, then best fit while slots and room are left;
3. packs left with more than g / 2 tokens of room go back to the residual with what the plan did not use,
   and the residual is planned again (PLAN_ROUNDS rounds);
4. the last residual is packed by `quota_fill`, a best fit that keeps the number of sequences a pack at
   the ratio still needed (remaining sequences / remaining packs), so short sequences are not used up
   early.

The bound reported with it is the cheap one (tokens), which is what binds. Deterministic: no random choices.
Figures, against best fit and the LP on rounded-up buckets (`benchmarks/packing_planned.py`):
docs/results/packing-scale.md, "Plan-guided packing".
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from .bounds import past
from .lp import solve_relaxation
from .mixture import Mixture

PLAN_CLASSES = 256  # the plan's LP is over at most this many class lengths
PLAN_ROUNDS = 3
# Past this pack length the plan's LP works on the class means in units of ceil(L / PLAN_LP_TOKENS) tokens: its
# pricing is a knapsack over the pack's length, and at 4,194,304 tokens (300 lengths, depth 3) its 57 rounds took
# 33 s (0.6 s each) for a plan that is only proportions; 65,536 left 5,000 lengths at 131,072 at 6 s
# (docs/results/packing-scale.md, "The plan's LP at 4M")
PLAN_LP_TOKENS = 32_768
PLAN_MAX_PACKS = 1_000_000  # realising a pack is a Python loop (about 10 us): above this, CGHP does not plan
PLAN_MIN_DEPTH = 4           # CGHP tries the plan first where exact pricing is cheap only from this depth limit
PLAN_ENOUGH = 5e-4           # ... and keeps it when within this fraction of the cheap bound


class _Stock:
    """The sequences not yet placed: counts per length and a sorted list of the lengths present."""

    def __init__(self, histogram: np.ndarray):
        self.count = histogram.astype(np.int64).tolist()
        self.present = (np.nonzero(histogram)[0] + 1).tolist()

    def take(self, length: int, copies: int = 1) -> None:
        self.count[length - 1] -= copies
        if self.count[length - 1] == 0:
            del self.present[bisect_right(self.present, length) - 1]

    def put(self, length: int) -> None:
        if self.count[length - 1] == 0:
            self.present.insert(bisect_left(self.present, length), length)
        self.count[length - 1] += 1

    def largest_up_to(self, room: int) -> int | None:
        i = bisect_right(self.present, room) - 1
        return self.present[i] if i >= 0 else None

    def histogram(self) -> np.ndarray:
        return np.array(self.count, dtype=np.int64)


def _plan(histogram: np.ndarray, depth: int, g: int, deadline):
    """The depth-limited LP over class means: [(classes of a pattern, descending), copies], and the class
    means; None if the deadline stopped it."""

    max_len = len(histogram)
    present = np.nonzero(histogram)[0] + 1
    unit = -(-present // g)
    counts = np.bincount(unit, weights=histogram[present - 1], minlength=max_len // g + 2)
    tokens = np.bincount(unit, weights=histogram[present - 1] * present, minlength=max_len // g + 2)
    used = np.nonzero(counts)[0]
    mean = np.zeros(len(counts), dtype=np.int64)
    mean[used] = np.floor(tokens[used] / counts[used]).astype(np.int64)  # distinct: classes are disjoint
    # the LP prices patterns by a knapsack over the pack's tokens: past PLAN_LP_TOKENS, on the means in units of
    # `scale` tokens (each class a unit above the one below at least, so they stay apart)
    scale = -(-max_len // PLAN_LP_TOKENS)
    length = mean[used] // scale
    for i in range(len(length)):
        length[i] = max(length[i], length[i - 1] + 1 if i else 1)
    coarse = np.zeros(max(max_len // scale, int(length[-1])), dtype=np.int64)
    coarse[length - 1] = counts[used].astype(np.int64)
    patterns, x, *_ = solve_relaxation(coarse, depth, [], False, deadline)  # a warm start only slowed it
    if x is None:
        return None, mean
    class_of = np.zeros(len(coarse) + 1, dtype=np.int64)
    class_of[length] = used
    copies = np.floor(x + 1e-9).astype(np.int64)
    plan = [(sorted(class_of[p].tolist(), reverse=True), int(c)) for p, c in zip(patterns, copies) if c > 0]
    plan.sort(reverse=True)  # longest classes first, as best fit would place them
    return plan, mean


def _realise(stock: _Stock, plan, mean: np.ndarray, g: int, max_len: int, depth: int,
             deadline=None) -> list[list[int]]:
    """Real packs following the plan (see the module docstring, step 2); takes them out of `stock`. The hot
    loop of the planned path (a million slots at 8K): `_Stock`'s look-ups are inlined. Past `deadline` it
    stops (checked once a planned pattern) with the packs made so far."""
    mean = mean.tolist()
    present, count = stock.present, stock.count
    packs = []
    for classes, copies in plan:
        if past(deadline):
            return packs
        last = len(classes) - 1
        for _ in range(copies):
            if not present:
                return packs
            room, items, drift = max_len, [], 0
            for j, u in enumerate(classes):
                lo, hi = (u - 1) * g + 1, min(u * g, room)
                if lo > hi:
                    continue
                length = None
                if j == last:  # best fit, if it is in the slot's class or above
                    i = bisect_right(present, room) - 1
                    if i >= 0 and present[i] >= lo:
                        length = present[i]
                    target = mean[u]
                else:
                    target = mean[u] - drift
                if length is None:  # the present length of the class nearest to the target
                    i = bisect_left(present, lo if target < lo else hi if target > hi else target)
                    if i < len(present) and present[i] <= hi:
                        length = present[i]
                    if i > 0 and present[i - 1] >= lo and (length is None or target - present[i - 1] <= length - target):
                        length = present[i - 1]
                    if length is None:
                        continue
                count[length - 1] -= 1
                if count[length - 1] == 0:
                    del present[bisect_left(present, length)]
                room -= length
                items.append(length)
                drift += length - mean[u]
            while room > 0 and len(items) < depth:
                length = stock.largest_up_to(room)
                if length is None:
                    break
                stock.take(length)
                room -= length
                items.append(length)
            if items:
                packs.append(items)
    return packs


def quota_fill(histogram: np.ndarray, depth: int) -> list[list[int]]:
    """Best fit that keeps sequences a pack at the ratio still needed: every pack starts with the longest
    sequence left, and while it has k of its quota q (remaining sequences / remaining packs by tokens,
    rounded) still to place, takes the longest sequence up to room / k; its last slot and any further ones
    take best fit. Copies of a pack are made as long as the stock lasts. Returns packs (lists of lengths)."""
    max_len = len(histogram)
    stock = _Stock(histogram)
    count = stock.count
    n_left = int(histogram.sum())
    tokens_left = int((np.arange(1, max_len + 1) * histogram).sum())
    packs = []
    while stock.present:
        quota = max(1, min(depth, int(n_left / max(tokens_left / max_len, 1.0) + 0.5)))
        first = stock.present[-1]
        room, items, used = max_len - first, [first], {first: 1}
        while room > 0 and len(items) < depth:
            k = quota - len(items)
            target = room // k if k >= 2 else room
            length = _largest_unused(stock, target, used)
            if length is None and target < room:
                length = _largest_unused(stock, room, used)
            if length is None:
                break
            used[length] = used.get(length, 0) + 1
            items.append(length)
            room -= length
        repeat = min(count[length - 1] // n for length, n in used.items())
        for length, n in used.items():
            stock.take(length, n * repeat)
        packs.extend([items] * repeat)
        n_left -= len(items) * repeat
        tokens_left -= (max_len - room) * repeat
    return packs


def _largest_unused(stock: _Stock, room: int, used: dict) -> int | None:
    """The longest length up to `room` with a copy not already in the pack being built."""
    i = bisect_right(stock.present, room) - 1
    while i >= 0 and stock.count[stock.present[i] - 1] <= used.get(stock.present[i], 0):
        i -= 1
    return stock.present[i] if i >= 0 else None


def planned(histogram: np.ndarray, depth: int, deadline=None) -> Mixture:
    """Pack `histogram` (at most `depth` sequences a pack) by plan-guided rounds; see the module docstring.
    Past `deadline` the rounds stop and what is left goes to `quota_fill`: still a valid packing, a few
    tenths of a second late on a million sequences (quota fill of all of them takes about 0.1-0.3 s)."""
    max_len = len(histogram)
    g = max(1, -(-max_len // PLAN_CLASSES))
    stock = _Stock(histogram)
    kept: list[list[int]] = []
    for _ in range(PLAN_ROUNDS):
        if not stock.present or past(deadline):
            break
        plan, mean = _plan(stock.histogram(), depth, g, deadline)
        if plan is None:
            break
        for items in _realise(stock, plan, mean, g, max_len, depth, deadline):
            if max_len - sum(items) <= g // 2:
                kept.append(items)
            else:  # back into the stock for the next round
                for length in items:
                    stock.put(length)
    rest = stock.histogram()
    if rest.sum():
        kept += quota_fill(rest, depth)
    return _mixture(kept)


def _mixture(packs: list[list[int]]) -> Mixture:
    groups: dict[tuple, int] = {}
    for items in packs:
        key = tuple(sorted(items, reverse=True))
        groups[key] = groups.get(key, 0) + 1
    return Mixture.from_lists([list(k) for k in groups], list(groups.values()))
