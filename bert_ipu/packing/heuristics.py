"""The paper's histogram packers: SPFHP (shortest-pack-first) and LPFHP (longest-pack-first).

Both walk the histogram from the longest length down and place a whole *count* of equal-length sequences
at once into existing partial packs (splitting a pack group's count when only part of it receives the
length), so the work is proportional to max_len**2, not to the number of sequences. They differ in which
partial pack receives a length:

- SPFHP: the pack with the most space left (worst fit; "shortest pack first").
- LPFHP: the pack with the least space left that still fits (best fit; "longest pack first"), and it places
  several copies of a length at once when they fit ("distribute"), which is what lets it fill packs with
  many short sequences.

They follow Algorithm 1 of Krell et al. and the reference code published with it, including the order in
which equal candidates are taken (last added first), so the pack counts reproduce the paper's.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .mixture import Mixture


def _flatten(open_packs, closed_packs) -> Mixture:
    strategies, counts = [], []
    for groups in (open_packs, closed_packs):
        for entries in groups.values():
            for count, pack in entries:
                strategies.append(pack)
                counts.append(count)
    return Mixture.from_lists(strategies, counts)


def spfhp(histogram: np.ndarray, depth: int) -> Mixture:
    """Shortest-pack-first histogram packing. `depth` is the most sequences in a pack."""
    max_len = len(histogram)
    open_packs = defaultdict(list)    # space left -> [(count, lengths), ...]; last added is taken first
    closed_packs = defaultdict(list)  # full, or at the depth limit

    def add(pack, count, space_left):
        target = closed_packs if (len(pack) >= depth or space_left == 0) else open_packs
        target[space_left].append((count, pack))

    for length in range(max_len, 0, -1):
        todo = int(histogram[length - 1])
        offset = max_len - length + 1  # space left after placing; start above the largest possible
        while todo > 0:
            key = length + offset
            if key in open_packs:
                count, pack = open_packs[key].pop()
                placed = min(count, todo)
                if count > todo:
                    open_packs[key].append((count - todo, pack))
                todo -= placed
                add(pack + [length], placed, offset)
                if not open_packs[key]:
                    del open_packs[key]
            else:
                offset -= 1
            if offset < 0:  # fits in no open pack: start new packs
                add([length], todo, max_len - length)
                todo = 0
    return _flatten(open_packs, closed_packs)


def lpfhp(histogram: np.ndarray, depth: int, distribute: bool = True) -> Mixture:
    """Longest-pack-first histogram packing. `depth` is the most sequences in a pack."""
    max_len = len(histogram)
    open_packs = defaultdict(list)
    closed_packs = defaultdict(list)

    def add(pack, count, space_left):
        target = closed_packs if (len(pack) >= depth or space_left == 0) else open_packs
        target[space_left].append((count, pack))

    for length in range(max_len, 0, -1):
        todo = int(histogram[length - 1])
        offset = 0  # space left after placing one copy; 0 is a perfect fit
        while todo > 0:
            key = length + offset
            if key in open_packs:
                count, pack = open_packs[key].pop()
                # how many copies of `length` fit into this pack, and that we have enough of
                repeat = min(1 + offset // length, depth - len(pack)) if distribute else 1
                repeat = max(1, min(repeat, todo))
                placed = min(count, todo // repeat)
                if count > placed:
                    open_packs[key].append((count - placed, pack))
                todo -= placed * repeat
                add(pack + [length] * repeat, placed, offset - (repeat - 1) * length)
                if not open_packs[key]:
                    del open_packs[key]
                offset = 0  # the best fit may have changed
            else:
                offset += 1
            if offset > max_len - length:  # fits in no open pack: start new packs
                repeat = min(max_len // length, depth) if distribute else 1
                repeat = max(1, min(repeat, todo))
                placed = todo // repeat
                add([length] * repeat, placed, max_len - length * repeat)
                todo -= placed * repeat
    return _flatten(open_packs, closed_packs)
