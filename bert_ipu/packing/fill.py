"""Minimum-slack fill: each pack takes the longest sequence left and then the subset of the others that fills
it most (Gupta and Ho's minimum bin slack, as in Fleszar and Hindi's MBS'), with at most `depth` sequences.

Best fit (LPFHP) places one sequence at a time and on small, sparse histograms often ends one pack above the
bound: its last packs hold what fitted nowhere. Filling each pack as full as its subsets allow leaves the
short sequences for the last packs, where they fill the gaps. On 2,000 log-normal SFT lengths at 2,048
(831 distinct) it meets the token bound (415 packs) in 0.1 s, where best fit took 416 and column generation
did not prove either in minutes (docs/results/packing-scale.md, "Small and sparse histograms").

The subset search is subset sum over the lengths left, in bitsets (Python integers: bit c set = total c
reachable), with copies of a length split in binary chunks (1, 2, 4, ... copies) so that any count is one
choice per chunk; under a depth limit there is one bitset per number of sequences. A pack found is repeated
while its sequences last: the search would find the same fill again. With `shuffle` the subset search takes the
lengths in a random order instead of longest first: under a depth limit longest first can leave the last packs
only short sequences, too few to fill them, and a random order keeps the lengths' mix to the end. Cost: about
(distinct packs) x (chunks) x (depth) x (pack length / 64) words of bitset work, capped by a budget.
"""

from __future__ import annotations

import numpy as np

from .bounds import past
from .effort import FILL_WORD_SECONDS, spend
from .mixture import Mixture

# The most bitset work `fill` spends before it gives up, in 64-bit words shifted and or-ed (an operation on a
# pack-wide integer costs pack length / 64 of them; 20-40 ns a word on this project's CPU, so 1.3-2.5 s):
# it is a second heuristic, tried where best fit missed the bound, and must stay cheap beside column generation
# at any pack length.
FILL_WORDS = 64_000_000


def _chunks(lengths: list[int], counts: list[int]):
    """(length, copies) chunks, longest length first: 1, 2, 4, ... copies and the rest (a generator: the
    search mostly stops after a few)."""
    for length, count in zip(lengths, counts):
        k = 1
        while count > 0:
            take = min(k, count)
            yield length, take
            count -= take
            k *= 2


def _best_subset(chunks, cap: int, items: int | None) -> tuple[list[int], int]:
    """The lengths of a subset of `chunks` ((length, copies) pairs) with the largest total <= cap and at most
    `items` sequences (None: any number), longer chunks preferred among equal totals; and the bitset
    operations it took. A chunk longer than `cap` in all is passed over: shifted, it made an integer of
    length x copies bits before the mask cut it (a billion copies of a length: gigabytes and tens of seconds)."""
    mask = (1 << (cap + 1)) - 1
    used = []
    if items is None:
        reach, history = 1, [1]
        for length, copies in chunks:
            if length * copies > cap:
                continue
            reach = (reach | (reach << (length * copies))) & mask
            history.append(reach)
            used.append((length, copies))
            if reach >> cap & 1:
                break
        target = reach.bit_length() - 1
        taken = []
        for i in range(len(history) - 1, 0, -1):
            if not history[i - 1] >> target & 1:
                length, copies = used[i - 1]
                taken += [length] * copies
                target -= length * copies
        return taken, len(history)
    # reach[k]: totals reachable with exactly k sequences
    reach = [1] + [0] * items
    history = [reach]
    for length, copies in chunks:
        if copies > items or length * copies > cap:
            continue
        shift = length * copies
        reach = reach[:copies] + [(reach[k] | (reach[k - copies] << shift)) & mask
                                  for k in range(copies, items + 1)]
        history.append(reach)
        used.append((length, copies))
        if any(r >> cap & 1 for r in reach):
            break
    k = max(range(items + 1), key=lambda j: reach[j].bit_length())
    target = reach[k].bit_length() - 1
    taken = []
    for i in range(len(history) - 1, 0, -1):
        if not history[i - 1][k] >> target & 1:
            length, copies = used[i - 1]
            taken += [length] * copies
            target -= length * copies
            k -= copies
    return taken, len(history) * items


def subset_sums(lengths: np.ndarray, cap: int, most: int) -> list[list[int]]:
    """The subset sums of `lengths` up to `cap`, in bitsets (Python integers): `history[i][k]` has bit t set where
    some k of the first i lengths (k <= `most`) total t. Its last entry is over all of them."""
    mask = (1 << (cap + 1)) - 1
    reach = [1] + [0] * most
    history = [reach]
    for length in lengths.tolist():
        reach = [reach[0]] + [(reach[k] | (reach[k - 1] << length)) & mask for k in range(1, most + 1)]
        history.append(reach)
    return history


def subset_with(history: list[list[int]], lengths: np.ndarray, k: int, total: int) -> np.ndarray:
    """Which of `lengths` (a mask) make a subset of k of them totalling `total`, reachable in `history`
    (`subset_sums`): back through it, the last length is in where the total needs it."""
    taken = np.zeros(len(lengths), dtype=bool)
    for i in range(len(lengths), 0, -1):
        if not history[i - 1][k] >> total & 1:
            taken[i - 1] = True
            total -= int(lengths[i - 1])
            k -= 1
    return taken


def fill(histogram: np.ndarray, depth: int, budget: float = FILL_WORDS,
         deadline: float | None = None, shuffle: np.random.Generator | None = None) -> Mixture | None:
    """Minimum-slack fill of `histogram` with at most `depth` sequences a pack (see the module docstring), or
    None when it would take more than `budget` words of bitset work or `deadline` passes first (the budget, not
    a clock, bounds it by default, so the same histogram always packs the same way). `shuffle`: the subset search
    takes the lengths in an order drawn from it, not longest first (see the module docstring)."""
    max_len = len(histogram)
    left = histogram.astype(np.int64).copy()
    shortest = int(np.argmax(left > 0)) + 1
    items = None if depth >= max_len // shortest else depth - 1
    patterns, counts, spent = [], [], 0
    while left.any():
        if spent > budget or past(deadline):
            spend(spent * FILL_WORD_SECONDS)
            return None
        top = int(np.nonzero(left)[0][-1]) + 1
        left[top - 1] -= 1
        cap = max_len - top
        taken: list[int] = []
        if cap >= shortest and items == 1:  # one more sequence: the longest that fits
            fits = np.nonzero(left[:cap])[0]
            taken = [int(fits[-1]) + 1] if len(fits) else []
        elif cap >= shortest and items != 0:
            lengths = np.nonzero(left[:cap])[0][::-1] + 1
            if len(lengths):
                chunks = _chunks(lengths.tolist(), left[lengths - 1].tolist())
                if shuffle is not None:
                    chunks = list(chunks)
                    chunks = [chunks[i] for i in shuffle.permutation(len(chunks))]
                taken, ops = _best_subset(chunks, cap, items)
                spent += ops * (cap // 64 + 1)
        pattern = np.array([top] + taken, dtype=np.int64)
        used, need = np.unique(pattern, return_counts=True)
        left[top - 1] += 1
        repeat = int((left[used - 1] // need).min())
        left[used - 1] -= need * repeat
        patterns.append(pattern.tolist())
        counts.append(repeat)
    spend(spent * FILL_WORD_SECONDS)
    return Mixture.from_lists(patterns, counts)
