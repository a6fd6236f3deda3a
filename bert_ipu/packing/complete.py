"""Bin completion (Korf, 2002): an exact search for a packing of a few dozen sequences into a given number of packs.

CGHP's dive fixes packs from a fractional LP solution until a few dozen sequences are left; on histograms whose
bound is the token bound (packs must be almost full), fixing one pack wrongly there costs a pack. This search
decides such a residual exactly:

    packs = complete(histogram, bins, depth)   # a Mixture of at most `bins` packs, INFEASIBLE, or None

Each pack in turn takes the longest sequence left and one of its *completions*: a set of the other sequences
left that fits beside it with at most `depth` in all and wastes at most what is still to spare (bins x
max_len - tokens, less the waste of the packs made so far); completions are tried fullest first, and the
search backtracks over them. Where packs must be almost full, few completions waste so little, so the tree is
narrow: on 35 sequences (983 lengths uniform in 16-58% of 4,096, depth 16, 6 tokens to spare) it proved that
10 packs are impossible in 44,559 nodes (0.03 s; above the default limit), where the integer program of `repack.py` took 0.7 s to
prove 6 packs impossible for 22 of them. Where much is to spare the tree is wide, and a node limit (a count,
not a clock: the same histogram always gets the same answer) stops it with None. Completions are sets of
lengths (copies of a length are interchangeable), searched longest first, pruned where even every shorter
sequence left could not fill the pack; Fenwick trees over the lengths left give the tokens and the longest
sequence left below any length in O(log lengths), so a node costs about as much on 1,400 lengths as on 30
(2.5-5 us), and the search is a loop over packs (no recursion limit on the packs).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from .bounds import past
from .effort import spend
from .mixture import Mixture
from .repack import INFEASIBLE  # (one answer for "no packing exists", whichever search gives it)

# Search nodes (completion steps) before `complete` gives up: about 0.1 s in CPython on this project's 2-core
# machine (NODE_SECONDS each, counted to the packing call's effort: `effort.py`). The searches that succeeded on
# the dive's residuals of benchmarks/packing_small.py took a few thousand; each one that decided nothing cost
# the whole limit (0.3 s at 100,000).
NODE_LIMIT = 30_000
NODE_SECONDS = 3e-6
# The most sequences one completion may hold: its search nests one generator a sequence. Beyond it (short
# sequences at unlimited depth) `complete` decides nothing (None).
MAX_SLOTS = 64


class _OutOfNodes(Exception):
    pass


def complete(histogram: np.ndarray, bins: int, depth: int | None, node_limit: int = NODE_LIMIT,
             deadline: float | None = None):
    """A Mixture packing `histogram` into at most `bins` packs of len(histogram) tokens with at most `depth`
    sequences each (None: any number); INFEASIBLE where the search proves that none exists; None where it
    decides neither within `node_limit` nodes, or before `deadline` (a `time.perf_counter()` value, checked
    every 1,024 nodes), or the sequences beside a pack's longest could be more than MAX_SLOTS."""
    sequences = int(histogram.sum())
    if sequences < 1:
        raise ValueError("complete packs at least 1 sequence, not 0")
    max_len = len(histogram)
    present = np.nonzero(histogram)[0]
    lengths = (present + 1).tolist()                  # ascending
    counts = histogram[present].astype(np.int64).tolist()
    n = len(lengths)
    limit = depth or max_len
    spare = bins * max_len - int(np.dot(lengths, counts))
    if spare < 0 or sequences > bins * limit:
        return INFEASIBLE
    if min(limit, max_len // lengths[0]) - 1 > MAX_SLOTS:
        return None

    # Fenwick trees over the present lengths: sequences left and their tokens at or below an index
    left_tree, token_tree = [0] * (n + 1), [0] * (n + 1)
    high = 1 << n.bit_length()

    def add(j: int, copies: int) -> None:
        i, tokens = j + 1, copies * lengths[j]
        while i <= n:
            left_tree[i] += copies
            token_tree[i] += tokens
            i += i & -i

    def tokens_to(j: int) -> int:  # tokens of the sequences left at index <= j
        i, total = j + 1, 0
        while i > 0:
            total += token_tree[i]
            i -= i & -i
        return total

    def longest_to(j: int) -> int:  # the largest index <= j with a sequence left, or -1
        i, k = j + 1, 0
        while i > 0:
            k += left_tree[i]
            i -= i & -i
        if k == 0:
            return -1
        pos, step = 0, high  # the k-th sequence left, counting from the shortest
        while step:
            if pos + step <= n and left_tree[pos + step] < k:
                pos += step
                k -= left_tree[pos]
            step >>= 1
        return pos

    for j, copies in enumerate(counts):
        add(j, copies)

    nodes = 0

    def completions(i: int, room: int, slots: int, got: int, at_least: int, chosen: list[int]):
        """The sets of the sequences left with lengths at index <= i, at most `slots` of them, whose tokens
        with `got` are in [at_least, got + room], as (tokens, indices beside `chosen`, this pack's so far); a set
        comes after the sets that extend it (so the greedy, fullest, first), each while the sequences left are
        without it."""
        nonlocal nodes
        nodes += 1
        if nodes > node_limit or (deadline is not None and not nodes & 1023 and past(deadline)):
            raise _OutOfNodes
        j = longest_to(min(i, bisect_right(lengths, room) - 1)) if slots else -1
        while j >= 0 and got + tokens_to(j) >= at_least:  # else not even every shorter one fills the pack
            add(j, -1)
            chosen.append(j)
            yield from completions(j, room - lengths[j], slots - 1, got + lengths[j], at_least, chosen)
            chosen.pop()
            add(j, 1)
            j = longest_to(j - 1)
        if got >= at_least:
            yield got, list(chosen)

    packs: list[list[int]] = []
    stack = []  # one frame a pack under way: (its completions, its longest sequence, room, spare, bins, left)

    def open_pack(spare: int, bins: int, left: int) -> None:
        top = longest_to(n - 1)
        add(top, -1)
        room = max_len - lengths[top]
        stack.append((completions(top, room, limit - 1, 0, room - spare, []), top, room, spare, bins, left))

    try:
        open_pack(spare, bins, sequences)
        while stack:
            options, top, room, spare, bins, left = stack[-1]
            option = next(options, None)
            if option is None:  # every completion of this pack failed: back to the previous one's next
                stack.pop()
                add(top, 1)
                if stack:
                    packs.pop()
                continue
            got, members = option
            packs.append([lengths[top]] + [lengths[j] for j in members])
            rest = left - 1 - len(members)
            if rest == 0:
                break
            if bins == 1 or rest > (bins - 1) * limit:
                packs.pop()
                continue
            open_pack(spare - (room - got), bins - 1, rest)
        found = bool(stack)
    except _OutOfNodes:
        found = None
    spend(min(nodes, node_limit) * NODE_SECONDS)
    if found is None:
        return None
    return Mixture.from_lists(packs, [1] * len(packs)) if found else INFEASIBLE
