"""Large-neighbourhood search: take a packing one or a few packs above its bound, gather its room into its
emptiest packs until one empties; where that saves no pack any more, a tabu search with a pool of unpacked
sequences (`tabu.py`); and where that ends above the bound too, repack groups of its emptiest packs into one
pack fewer, by bin completion (`complete.py`), gathering the room again between groups.

    improved = neighbourhood(mixture, histogram, bound, depth)   # a Mixture, never more packs

CGHP's last step where its packing is above the bound and not within 0.1% of it. On small histograms whose
exact pricing is dear (at most a few thousand sequences, most lengths distinct, a depth limit of 6 to 16 at
4,096-8,192 tokens) CGHP returns the plan or best fit at once, one or two packs above the bound: 29 of the 80
cases of `benchmarks/packing_small.py --family dear` (seeds 0 and 1) met the goal, 59 with the group search
alone, 70 with the gathering too, 77 with the pool, the slowest in 3.9 s (docs/results/packing-scale.md,
"Repacking the emptiest packs", "Gathering the room" and "A pool of unpacked sequences"). The pool comes before
the groups: where both reach the bound it is the faster, and on the 400 standard cases of that benchmark this
order took two more within 5 s (ranges seed 2, case 6: 358 in 3.7 s instead of 5.8 s; "The pool before the
groups").

Each round first gathers the room (`_concentrate`): every pack with room, fullest first, takes as many tokens
as any split of its sequences and those of one of the PARTNERS emptiest packs allows (subset sum in bitsets,
as `fill.py`), the partner keeping the rest. Room flows from fuller packs to emptier ones, and on histograms
that leave about a token of room a pack at the bound this is what empties a pack: no group of the emptiest
packs had a pack's worth of room while it was spread. The round ends at the first pack emptied, and the next
starts from the emptiest packs left (going on within the round instead gained some cases and lost others).
Where no pack empties, that round's moves are dropped (the groups below found more on the packing as it was).
The first time, the pool search runs (`tabu.py`, at most POOL_SECONDS); after it, the rounds go on and the
groups are tried where no pack empties: the packs ordered by how much room they leave, in one of a few ways
(free tokens; free tokens and free slots; free slots with a little free room counting as much as a lot; free
tokens with a seeded random nudge), and for m = 2, 3, ... (small groups first, in every ordering: the groups it
repacked were of 3 to 6 packs, and the search found them several times sooner) bin completion packs the
sequences of the first m packs into m - 1, where the cheap bound allows it. The first packing found replaces
those m packs and the next round starts. The search ends at the bound, when no ordering and m finds one, or
after SEARCH_SECONDS of estimated effort (the moves' bitsets, the pool's moves, bin completion's nodes and each
round's sorting, counted as the call's: `effort.py`; called outside a packing call, where nothing is counted,
only the group limits, the gathering running out of moves and the deadline end it). A packing of more than
MAX_PACKS packs is left as it is. A count, not a clock, and a seeded nudge: the same histogram always packs the
same way.
"""

from __future__ import annotations

import numpy as np

from .bounds import lower_bound, past
from .complete import complete
from .effort import effort, spend
from .fill import subset_sums, subset_with
from .mixture import Mixture
from .tabu import pool_search

# Bin completion's nodes for one group (about 0.06 s where it decides nothing) ...
GROUP_NODES = 20_000
# ... the most packs in a group (their sequences are repacked into one pack fewer) ...
MAX_GROUP = 60
# ... and the search's estimated seconds in all: bin completion's nodes, and each round's ordering of the packs
# (ROUND_SECONDS_A_PACK a pack: four sorts and the bookkeeping). A second more than the pool's, so that the
# groups keep what they had before the pool's budget grew.
SEARCH_SECONDS = 3.0
ROUND_SECONDS_A_PACK = 2e-6
ORDERINGS = 4
# Room is moved into the emptiest of these packs first (`_concentrate`) ...
PARTNERS = 8
# ... each move costing about MOVE_SECONDS and MOVE_WORD_SECONDS a 64-bit word of its bitsets (sequences x
# depth x pack length / 64 words; measured 0.01-0.16 ms a move, 4-30 sequences at 2,048-8,192 tokens)
MOVE_SECONDS = 1e-5
MOVE_WORD_SECONDS = 2e-9
# Packings of more packs are returned as they are: a round costs time in proportion to the packs, and 0.1% of
# them is more packs than the search gains in its time.
MAX_PACKS = 20_000
# Where the gathering saves no pack any more, the tabu search with a pool of unpacked sequences (`tabu.py`) has
# at most this many estimated seconds (they count to SEARCH_SECONDS too: the groups get what is left). With 1.5,
# dear seed 2, case 9 of benchmarks/packing_small.py (746 lengths at 8,192, 475 tokens of room at the bound) ended
# a pack above its bound in 3.1 s; with 2.5 it reaches it in 3.6 s, and no other of the 880 cases changed by more
# than 1 s (docs/results/packing-scale.md, "The pool's budget").
POOL_SECONDS = 2.5


def neighbourhood(mixture: Mixture, histogram: np.ndarray, bound: int, depth: int | None,
                  deadline: float | None = None, seconds: float | None = None, groups: bool = True,
                  pool: float | None = None) -> Mixture:
    """`mixture` (a packing of `histogram`, at most `depth` sequences a pack) with packs saved while it is above
    `bound`: room gathered until a pack empties, a pool search, or a group of packs repacked into one fewer;
    `mixture` itself where none saves a pack, or it has more than MAX_PACKS packs. `seconds`: the estimated
    seconds it may spend (default SEARCH_SECONDS); `groups` False: only gather the room (CGHP's early step on
    best fit's packing); `pool`: the pool search's estimated seconds (default POOL_SECONDS with the groups, else
    none; with `seconds` 0, the pool search alone: CGHP's early pool, `cghp.EARLY_POOL_SECONDS`)."""
    if mixture.n_packs > MAX_PACKS:
        return mixture
    max_len = len(histogram)
    packs = [np.sort(p)[::-1] for p in _packs(mixture)]  # (longest first as packs come in: the order only breaks ties)
    counted = effort()
    began = counted.spent
    rng = np.random.default_rng(0)
    seconds = SEARCH_SECONDS if seconds is None else seconds

    def spent() -> bool:
        return counted.spent - began >= seconds or past(deadline)

    pool = (POOL_SECONDS if groups else 0.0) if pool is None else pool
    gathered = packs = _rounds(packs, bound, max_len, depth, rng, spent, deadline, groups=False)
    if len(packs) > bound and pool > 0 and not past(deadline):
        pool_began = counted.spent
        packs = pool_search(packs, max_len, depth, bound,
                            lambda: counted.spent - pool_began >= pool or past(deadline))
    if groups:  # (where the pool saved nothing, the room is already gathered: the groups come first)
        packs = _rounds(packs, bound, max_len, depth, rng, spent, deadline, groups=True,
                        gathered=packs is gathered)
    if len(packs) == mixture.n_packs:  # no pack emptied, no group repacked
        return mixture
    return Mixture.from_ragged(np.concatenate(packs), np.concatenate([[0], np.cumsum([len(p) for p in packs])]),
                               np.ones(len(packs), dtype=np.int64))


def _rounds(packs: list[np.ndarray], bound: int, max_len: int, depth: int | None, rng: np.random.Generator,
            spent, deadline, groups: bool, gathered: bool = False) -> list[np.ndarray]:
    """Rounds of the search on `packs` while above `bound` and not `spent()`: the room gathered until a pack
    empties (the next round starts from there); where none empties, with `groups`, the first group of the
    emptiest packs that bin completion repacks into one fewer (else the rounds end). `gathered`: the room of
    `packs` is gathered already (no pack empties), so the first round goes straight to the groups."""
    while len(packs) > bound and not spent():
        spend(len(packs) * ROUND_SECONDS_A_PACK)
        if not gathered:
            moved = list(packs)
            _concentrate(moved, max_len, depth, spent)
            moved = [p for p in moved if len(p)]
            if len(moved) < len(packs):  # a pack emptied
                packs = moved
                continue
        gathered = False
        if spent() or not groups:
            break
        group = _repack_a_group(packs, max_len, depth, rng, spent, deadline)
        if group is None:
            break
        picked, repacked = group
        keep = np.ones(len(packs), dtype=bool)
        keep[picked] = False
        packs = [p for p, k in zip(packs, keep) if k] + [np.sort(p)[::-1] for p in repacked]
    return packs


def _concentrate(packs: list[np.ndarray], max_len: int, depth: int | None, stop) -> None:
    """Move room between packs (none empty), in place, until one empties (it stays in `packs`, empty: a pack
    saved), no move is left, or `stop()`: each pack with room, fullest first, is filled as full as the
    sequences of itself and one of the PARTNERS emptiest packs (at the start of the sweep) allow (the rest go
    to that partner), so the room gathers in the emptiest packs. Each move makes a fuller pack fuller by what
    it takes from an emptier one, so the sum of squared fills rises and the loop ends."""
    while not stop():
        fills = np.array([int(p.sum()) for p in packs], dtype=np.int64)
        emptiest = np.argsort(fills, kind="stable")[:PARTNERS + 1]
        moved = False
        for j in np.argsort(-fills, kind="stable"):
            if fills[j] >= max_len:
                continue
            for p in sorted((p for p in emptiest if p != j and fills[p] < fills[j]), key=lambda p: fills[p])[:PARTNERS]:
                move = _fuller(packs[j], packs[p], max_len, depth)
                if move is not None:
                    packs[j], packs[p] = move
                    if not len(packs[p]):
                        return
                    fills[j], fills[p] = int(move[0].sum()), int(move[1].sum())
                    moved = True
                    break
            if stop():
                return
        if not moved:
            return


def _fuller(a: np.ndarray, b: np.ndarray, max_len: int, depth: int | None):
    """(a', b'): the sequences of packs `a` and `b` (their lengths) split so that a' holds as many
    tokens as any subset of at most `depth` of them that fits, b' the rest (it fits: a' holds at least what a
    did), where that is more than `a` holds and b' keeps within `depth`; else None. Subset sum over the pooled
    sequences in bitsets (Python integers: bit c set = total c reachable with exactly k sequences), counted
    to the call's effort as `fill.py` counts its own."""
    pool = np.concatenate([a, b])
    n = len(pool)
    most = n if depth is None else min(depth, n)
    least = 0 if depth is None else max(0, n - depth)  # b' must keep within depth too
    history = subset_sums(pool, max_len, most)
    reach = history[-1]
    spend(MOVE_SECONDS + n * most * (max_len // 64 + 1) * MOVE_WORD_SECONDS)
    have = int(a.sum())
    k = max(range(least, most + 1), key=lambda k: reach[k].bit_length())
    total = reach[k].bit_length() - 1
    if total <= have:
        return None
    taken = subset_with(history, pool, k, total)
    return pool[taken], pool[~taken]


def _packs(mixture: Mixture) -> list[np.ndarray]:
    """One array of lengths per pack (a strategy's repeats each their own)."""
    flat, offsets = mixture.expand_ragged()
    return [flat[offsets[i]: offsets[i + 1]] for i in range(len(offsets) - 1)]


def _repack_a_group(packs: list[np.ndarray], max_len: int, depth: int | None, rng: np.random.Generator, stop,
                    deadline: float | None = None):
    """(indices of m packs, their sequences in m - 1 packs) for the first group that bin completion repacks,
    trying each ordering of the packs by room; None where none does (or `stop()` says so; bin completion also
    stops at `deadline`)."""
    free = (max_len - np.array([int(p.sum()) for p in packs])) / max_len
    slots = ((depth or max_len) - np.array([len(p) for p in packs])) / (depth or max_len)
    scores = [free, free + slots, np.minimum(4 * free, 1.0) + slots, free + 0.5 * rng.random(len(packs))]
    orders = [np.argsort(-score, kind="stable") for score in scores[:ORDERINGS]]
    subs = [np.zeros(max_len, dtype=np.int64) for _ in orders]
    for m in range(1, min(MAX_GROUP, len(packs)) + 1):  # small groups first, in every ordering
        for order, sub in zip(orders, subs):
            np.add.at(sub, packs[order[m - 1]] - 1, 1)
            if m < 2 or lower_bound(sub, depth) > m - 1:
                continue
            if stop():
                return None
            found = complete(sub, m - 1, depth, node_limit=GROUP_NODES, deadline=deadline)
            if isinstance(found, Mixture):
                return order[:m], _packs(found)
    return None
