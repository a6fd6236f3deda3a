"""The paper's histogram packers: SPFHP (shortest-pack-first) and LPFHP (longest-pack-first).

Both walk the histogram from the longest length down and place a whole *count* of equal-length sequences
at once into existing partial packs (splitting a pack group's count when only part of it receives the
length), so the work is proportional to the number of pack groups created, not to the number of sequences.
They differ in which partial pack receives a length:

- SPFHP: the pack with the most space left (worst fit; "shortest pack first").
- LPFHP: the pack with the least space left that still fits (best fit; "longest pack first"), and it places
  several copies of a length at once when they fit ("distribute"), which is what lets it fill packs with
  many short sequences.

They follow Algorithm 1 of Krell et al. and the reference code published with it, including the order in
which equal candidates are taken (last added first), so the pack counts reproduce the paper's.

The reference code finds the best (or worst) fit by scanning every possible space left, one dictionary
look-up per token of pack length, which makes it O(distinct lengths x max_len): seconds at 8K tokens and
minutes at 128K. Here the spaces that some open pack has are kept in a sorted list, so a fit is one bisection
(O(log L)), the same answer as the scan. Packs are kept as a persistent linked list of (parent, length,
copies) nodes, so extending a pack group costs O(1) whatever its depth, and packs that share a prefix share
its nodes.
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort

import numpy as np

from .mixture import Mixture


class _Packs:
    """Open and closed pack groups: space left -> [(count, node), ...] (last added is taken first), and a
    sorted list of the spaces that have at least one open group."""

    def __init__(self, depth: int):
        self.depth = depth
        self.open: dict[int, list] = {}
        self.spaces: list[int] = []       # sorted keys of self.open
        self.closed: list = []            # (count, node): full, or at the depth limit
        self.parent = [-1]                # node 0 is the empty pack
        self.length = [0]
        self.copies = [0]
        self.size = [0]                   # sequences in the pack ending at this node

    def extend(self, node: int, length: int, copies: int) -> int:
        self.parent.append(node)
        self.length.append(length)
        self.copies.append(copies)
        self.size.append(self.size[node] + copies)
        return len(self.parent) - 1

    def add(self, node: int, count: int, space_left: int) -> None:
        if self.size[node] >= self.depth or space_left == 0:
            self.closed.append((count, node))
            return
        groups = self.open.get(space_left)
        if groups is None:
            self.open[space_left] = [(count, node)]
            insort(self.spaces, space_left)
        else:
            groups.append((count, node))

    def take(self, index: int) -> tuple[int, int, int]:
        """Pop the last-added group with space self.spaces[index]: (space, count, node)."""
        space = self.spaces[index]
        groups = self.open[space]
        count, node = groups.pop()
        if not groups:
            del self.open[space]
            del self.spaces[index]
        return space, count, node

    def put_back(self, space: int, count: int, node: int) -> None:
        """Return part of a group just taken to where it was (the top of its space's stack)."""
        self.add(node, count, space)

    def mixture(self) -> Mixture:
        groups = self.closed + [g for space in self.spaces for g in self.open[space]]
        strategies = []
        for _, node in groups:
            row = []
            while node > 0:
                row.extend([self.length[node]] * self.copies[node])
                node = self.parent[node]
            strategies.append(row)
        return Mixture.from_lists(strategies, [count for count, _ in groups])


def _late(deadline: float | None) -> bool:
    """Checked once a length: a clock read costs far less than a length's placements."""
    return deadline is not None and time.perf_counter() > deadline


def _fresh_packs(histogram: np.ndarray, lengths: np.ndarray, depth: int) -> Mixture:
    """The sequences of `lengths` in new packs, as many of one length a pack as fit (what both heuristics do
    with the rest of the histogram once the time limit has passed: still a valid packing). Vectorised: a
    Python step per length took 3 s past the limit on a histogram of a million lengths."""
    max_len = len(histogram)
    todo = histogram[lengths - 1]
    repeat = np.maximum(1, np.minimum(np.minimum(max_len // lengths, depth), todo))
    sizes = np.concatenate([repeat, todo % repeat])                  # full packs, then one short pack a length
    counts = np.concatenate([todo // repeat, (todo % repeat > 0).astype(np.int64)])
    keep = (sizes > 0) & (counts > 0)
    sizes, counts = sizes[keep], counts[keep]
    flat = np.repeat(np.concatenate([lengths, lengths])[keep], sizes)
    return Mixture.from_ragged(flat, np.concatenate([[0], np.cumsum(sizes)]), counts)


def _with_rest(packs: _Packs, histogram: np.ndarray, rest: np.ndarray | None, depth: int) -> Mixture:
    """The packs made, plus `_fresh_packs` of the lengths `rest` not reached before the deadline (None: all)."""
    if rest is None:
        return packs.mixture()
    return Mixture.concat([packs.mixture(), _fresh_packs(histogram, rest, depth)])


def spfhp(histogram: np.ndarray, depth: int, deadline: float | None = None) -> Mixture:
    """Shortest-pack-first histogram packing. `depth` is the most sequences in a pack. See `run_spfhp`."""
    return run_spfhp(histogram, depth, deadline)[0]


def run_spfhp(histogram: np.ndarray, depth: int, deadline: float | None = None) -> tuple[Mixture, bool]:
    """SPFHP, and whether `deadline` (a `time.perf_counter()` value) passed: then the lengths not yet placed
    went into packs of their own (`_fresh_packs`), so the result is valid but worse."""
    max_len = len(histogram)
    packs = _Packs(depth)
    lengths, rest = np.nonzero(histogram)[0][::-1] + 1, None
    for k, length in enumerate(lengths.tolist()):
        if _late(deadline):
            rest = lengths[k:]
            break
        todo = int(histogram[length - 1])
        while todo > 0:
            if packs.spaces and packs.spaces[-1] >= length:  # worst fit: the most space left
                space, count, node = packs.take(len(packs.spaces) - 1)
                placed = min(count, todo)
                if count > todo:
                    packs.put_back(space, count - todo, node)
                todo -= placed
                packs.add(packs.extend(node, length, 1), placed, space - length)
            else:  # fits in no open pack: start new packs
                packs.add(packs.extend(0, length, 1), todo, max_len - length)
                todo = 0
    return _with_rest(packs, histogram, rest, depth), rest is not None


def lpfhp(histogram: np.ndarray, depth: int, distribute: bool = True, deadline: float | None = None) -> Mixture:
    """Longest-pack-first histogram packing. `depth` is the most sequences in a pack. See `run_lpfhp`."""
    return run_lpfhp(histogram, depth, distribute, deadline)[0]


def run_lpfhp(histogram: np.ndarray, depth: int, distribute: bool = True,
              deadline: float | None = None) -> tuple[Mixture, bool]:
    """LPFHP, and whether `deadline` passed (as `run_spfhp`)."""
    max_len = len(histogram)
    packs = _Packs(depth)
    lengths, rest = np.nonzero(histogram)[0][::-1] + 1, None
    for k, length in enumerate(lengths.tolist()):
        if _late(deadline):
            rest = lengths[k:]
            break
        todo = int(histogram[length - 1])
        while todo > 0:
            index = bisect_left(packs.spaces, length)  # best fit: the least space left that fits
            if index < len(packs.spaces):
                space, count, node = packs.take(index)
                offset = space - length
                size = packs.size[node]
                # how many copies of `length` fit into this pack, and that we have enough of
                repeat = min(1 + offset // length, depth - size) if distribute else 1
                repeat = max(1, min(repeat, todo))
                placed = min(count, todo // repeat)
                if count > placed:
                    packs.put_back(space, count - placed, node)
                todo -= placed * repeat
                packs.add(packs.extend(node, length, repeat), placed, offset - (repeat - 1) * length)
            else:  # fits in no open pack: start new packs
                repeat = min(max_len // length, depth) if distribute else 1
                repeat = max(1, min(repeat, todo))
                placed = todo // repeat
                packs.add(packs.extend(0, length, repeat), placed, max_len - length * repeat)
                todo -= placed * repeat
                if todo:  # the reference scan does not look back: the rest starts one more pack
                    packs.add(packs.extend(0, length, todo), 1, max_len - length * todo)
                    todo = 0
    return _with_rest(packs, histogram, rest, depth), rest is not None
