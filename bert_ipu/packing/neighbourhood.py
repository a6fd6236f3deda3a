"""Large-neighbourhood search: take a packing one or a few packs above its bound and repack groups of its
emptiest packs into one pack fewer, by bin completion (`complete.py`).

    improved = neighbourhood(mixture, histogram, bound, depth)   # a Mixture, never more packs

CGHP's last step where its packing is above the bound and not within 0.1% of it. On small histograms whose
exact pricing is dear (at most a few thousand sequences, most lengths distinct, a depth limit of 6 to 16 at
4,096-8,192 tokens) CGHP returns the plan or best fit at once, one or two packs above the bound: 29 of the 80
cases of `benchmarks/packing_small.py --family dear` (seeds 0 and 1) met the goal, 59 with this search, the
slowest in 3.3 s (docs/results/packing-scale.md, "Repacking the emptiest packs").

Each round orders the packs by how much room they leave, in one of a few ways (free tokens; free tokens and
free slots; free slots with a little free room counting as much as a lot; free tokens with a seeded random
nudge), and for m = 2, 3, ... (small groups first, in every ordering: the groups it repacked were of 3 to 6
packs, and the search found them several times sooner) asks bin completion to pack the sequences of the first m
packs into m - 1, where the cheap bound allows it. The first packing found replaces those m packs and the next
round starts; the search ends at the bound, when no ordering and m finds one, or after SEARCH_SECONDS of estimated effort (bin
completion's nodes and each round's sorting, counted as the call's: `effort.py`; called outside a packing
call, where nothing is counted, only the group limits and the deadline end it). A packing of more than
MAX_PACKS packs is left as it is. A count, not a clock, and a seeded nudge: the same
histogram always packs the same way.
"""

from __future__ import annotations

import numpy as np

from .bounds import lower_bound, past
from .complete import complete
from .effort import effort, spend
from .mixture import Mixture

# Bin completion's nodes for one group (about 0.06 s where it decides nothing) ...
GROUP_NODES = 20_000
# ... the most packs in a group (their sequences are repacked into one pack fewer) ...
MAX_GROUP = 60
# ... and the search's estimated seconds in all: bin completion's nodes, and each round's ordering of the packs
# (ROUND_SECONDS_A_PACK a pack: four sorts and the bookkeeping).
SEARCH_SECONDS = 2.0
ROUND_SECONDS_A_PACK = 2e-6
ORDERINGS = 4
# Packings of more packs are returned as they are: a round costs time in proportion to the packs, and 0.1% of
# them is more packs than the search gains in its time.
MAX_PACKS = 20_000


def neighbourhood(mixture: Mixture, histogram: np.ndarray, bound: int, depth: int | None,
                  deadline: float | None = None) -> Mixture:
    """`mixture` (a packing of `histogram`, at most `depth` sequences a pack) with groups of packs repacked into
    one pack fewer while it is above `bound`; `mixture` itself where no group is found, or it has more than
    MAX_PACKS packs."""
    if mixture.n_packs > MAX_PACKS:
        return mixture
    max_len = len(histogram)
    packs = _packs(mixture)
    tokens = np.array([int(p.sum()) for p in packs], dtype=np.int64)
    sizes = np.array([len(p) for p in packs], dtype=np.int64)
    counted = effort()
    began = counted.spent
    rng = np.random.default_rng(0)

    def spent() -> bool:
        return counted.spent - began >= SEARCH_SECONDS or past(deadline)

    while len(packs) > bound and not spent():
        spend(len(packs) * ROUND_SECONDS_A_PACK)
        group = _repack_a_group(packs, tokens, sizes, max_len, depth, rng, spent, deadline)
        if group is None:
            break
        picked, repacked = group
        keep = np.ones(len(packs), dtype=bool)
        keep[picked] = False
        packs = [p for p, k in zip(packs, keep) if k] + repacked
        tokens = np.concatenate([tokens[keep], [int(p.sum()) for p in repacked]])
        sizes = np.concatenate([sizes[keep], [len(p) for p in repacked]])
    if len(packs) == mixture.n_packs:  # no group repacked
        return mixture
    return Mixture.from_ragged(np.concatenate(packs), np.concatenate([[0], np.cumsum(sizes)]),
                               np.ones(len(packs), dtype=np.int64))


def _packs(mixture: Mixture) -> list[np.ndarray]:
    """One array of lengths per pack (a strategy's repeats each their own)."""
    flat, offsets = mixture.expand_ragged()
    return [flat[offsets[i]: offsets[i + 1]] for i in range(len(offsets) - 1)]


def _repack_a_group(packs: list[np.ndarray], tokens: np.ndarray, sizes: np.ndarray, max_len: int,
                    depth: int | None, rng: np.random.Generator, stop, deadline: float | None = None):
    """(indices of m packs, their sequences in m - 1 packs) for the first group that bin completion repacks,
    trying each ordering of the packs by room (`tokens` and `sizes`: each pack's tokens and sequences); None
    where none does (or `stop()` says so; bin completion also stops at `deadline`)."""
    free = (max_len - tokens) / max_len
    slots = ((depth or max_len) - sizes) / (depth or max_len)
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
