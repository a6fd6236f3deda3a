"""Balance across devices (after Hierarchical Balance Packing): metrics, and a balanced dealing of an update's
packs to data-parallel ranks and micro-batches.

    from bert_ipu.packing.balance import pack_costs, balanced_order, balance_metrics
    costs = pack_costs(flat_lengths, offsets)                # per pack: linear_weight x tokens + sum of l^2
    order = balanced_order(costs, n_ranks=8, micro_batch_size=4)
    packs_in_loader_order = packs[order]                     # rank r takes the r-th contiguous share

With block-skipping attention a pack costs its tokens (linear layers) plus the sum of its sequences' squared
lengths (attention), and a data-parallel step waits for its slowest rank. Packs of one pack length all have
about the same tokens, but their attention differs several-fold (one 512-token sequence: 262,144; four of 128:
65,536), so dealing an update's packs at random leaves ranks idle.

Metrics of one update (each rank r has a cost c_r; the ratio is 0 when all ranks are equal):

    balance ratio(c)       = 1 - mean_r c_r / max_r c_r   (the share of the slowest rank's time others idle)
    attention balance (ABR) = balance ratio of c_r = sum of squared sequence lengths on rank r
    data balance (DBR)      = balance ratio of c_r = real tokens on rank r
    padding ratio           = padding tokens / computed tokens (packs x pack length)

`balanced_order` is deterministic, keeps the update's packs (so its sequences) unchanged and only permutes
them: a cardinality-constrained longest-processing-time dealing (each rank gets exactly its share of packs,
most expensive first, to the cheapest rank that still has room), then swaps of one pack of the most loaded rank with
one of another rank while that lowers the maximum; the same again across each rank's micro-batches.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

MAX_RANKS = 256
"""the most ranks a balance report deals to (the packing report's and the profile's --ranks): balancing one update
costs about ranks^2 steps (256 ranks: about 3 s)"""


def pack_costs(flat_lengths: np.ndarray, offsets: np.ndarray, linear_weight: float = 0.0) -> np.ndarray:
    """Cost of each pack: linear_weight x its tokens + the sum of its sequences' squared lengths.

    flat_lengths, offsets: ragged packs (pack p holds flat_lengths[offsets[p]:offsets[p + 1]]).
    linear_weight: the linear layers' cost per token in units of attention's per token-pair; for BERT with
    hidden size h about 6 h (24 h^2 FLOPs a token against 4 h a token pair). 0 = attention only."""
    flat = np.asarray(flat_lengths, dtype=np.float64)
    cum_sq = np.concatenate([[0.0], np.cumsum(flat * flat)])
    cum = np.concatenate([[0.0], np.cumsum(flat)])
    starts, ends = np.asarray(offsets[:-1]), np.asarray(offsets[1:])
    return (cum_sq[ends] - cum_sq[starts]) + linear_weight * (cum[ends] - cum[starts])


def balance_ratio(per_rank: np.ndarray) -> float:
    """1 - mean / max of per-rank costs: 0 = perfectly balanced."""
    per_rank = np.asarray(per_rank, dtype=np.float64)
    top = per_rank.max()
    return 0.0 if top <= 0 else float(1 - per_rank.mean() / top)


@dataclass(frozen=True)
class BalanceMetrics:
    attention_balance_ratio: float
    data_balance_ratio: float
    padding_ratio: float


def balance_metrics(flat_lengths, offsets, n_ranks: int, pack_length: int) -> BalanceMetrics:
    """The metrics of one update whose packs (ragged, in loader order) are split into n_ranks contiguous
    equal shares, as `bert_ipu.data.loader.UpdateLoader` does."""
    n_packs = len(offsets) - 1
    if n_ranks < 1 or n_packs % n_ranks:
        raise ValueError(f"{n_packs} packs cannot be split evenly over {n_ranks} ranks")
    rank = np.arange(n_packs) // (n_packs // n_ranks)
    attention = np.bincount(rank, weights=pack_costs(flat_lengths, offsets), minlength=n_ranks)
    tokens = np.bincount(rank, weights=pack_costs(flat_lengths, offsets, 1.0) - pack_costs(flat_lengths, offsets),
                         minlength=n_ranks)
    return BalanceMetrics(balance_ratio(attention), balance_ratio(tokens),
                          float(1 - tokens.sum() / (n_packs * pack_length)))


def _deal(costs: np.ndarray, items: np.ndarray, n_bins: int, swap_rounds: int) -> list[np.ndarray]:
    """Split `items` (indices into costs) into n_bins groups of equal size with near-equal cost sums."""
    share = len(items) // n_bins
    order = items[np.lexsort((items, -costs[items]))]     # most expensive first; ties by index (determinism)
    bins = [[] for _ in range(n_bins)]
    load = np.zeros(n_bins)
    # the cheapest bin with room, ties to the lowest index: a heap of (load, bin) over the bins with room
    # (scanning every bin for every pack was packs x bins steps: minutes at a few hundred ranks)
    heap = [(0.0, b) for b in range(n_bins)]
    for i in order.tolist():
        _, b = heapq.heappop(heap)
        bins[b].append(i)
        load[b] += costs[i]
        if len(bins[b]) < share:
            heapq.heappush(heap, (float(load[b]), b))
    bins = [np.array(b, dtype=np.int64) for b in bins]
    for _ in range(swap_rounds):
        hi = int(np.argmax(load))
        best = None  # (new max of the pair, other bin, position on hi, position on other, delta)
        ci = costs[bins[hi]]
        for b in range(n_bins):
            gap = load[hi] - load[b]
            if b == hi or gap <= 0:
                continue
            # swap i (on hi) with j (on b) moves d = c_i - c_j; the pair's larger load becomes
            # max(load_hi - d, load_b + d), best at d = gap / 2: for every i, bisect b's sorted costs.
            cj = costs[bins[b]]
            sort_j = np.argsort(cj, kind="stable")
            pos = np.clip(np.searchsorted(cj[sort_j], ci - gap / 2), 0, len(cj) - 1)
            cand = np.stack([pos, np.maximum(pos - 1, 0)])
            d = ci[None, :] - cj[sort_j][cand]
            pair_max = np.maximum(load[hi] - d, load[b] + d)
            k = np.unravel_index(int(np.argmin(pair_max)), pair_max.shape)
            if pair_max[k] < load[hi] - 1e-9 and (best is None or pair_max[k] < best[0]):
                best = (pair_max[k], b, k[1], sort_j[cand[k]], d[k])
        if best is None:
            break
        _, b, i_pos, j_pos, d = best
        bins[hi][i_pos], bins[b][j_pos] = bins[b][j_pos], bins[hi][i_pos]
        load[hi] -= d
        load[b] += d
    return bins


def balanced_order(costs, n_ranks: int, micro_batch_size: int = 1, swap_rounds: int = 1000) -> np.ndarray:
    """A permutation of one update's packs (by `costs`) for a loader that gives rank r the r-th contiguous
    share and cuts each share into micro-batches of `micro_batch_size`: ranks get near-equal cost, and so do
    the micro-batches within a rank. Deterministic; the set of packs is unchanged."""
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if n == 0 or n_ranks < 1 or micro_batch_size < 1 or n % (n_ranks * micro_batch_size):
        raise ValueError(f"{n} packs cannot be dealt to {n_ranks} ranks in micro-batches of {micro_batch_size}")
    ranks = _deal(costs, np.arange(n), n_ranks, swap_rounds)
    incoming = np.arange(n).reshape(n_ranks, -1)
    if max(costs[r].sum() for r in ranks) > costs[incoming].sum(axis=1).max():
        ranks = list(incoming)  # never worse than the order given (the heuristic has no such guarantee)
    out = []
    for rank in ranks:
        for micro in _deal(costs, rank, len(rank) // micro_batch_size, swap_rounds):
            out.append(np.sort(micro))
    return np.concatenate(out)


def update_balance(flat_lengths, offsets, n_ranks: int, packs_per_update: int, pack_length: int,
                   updates: int = 100, micro_batch_size: int = 1) -> dict:
    """Mean metrics over the first `updates` updates of consecutive packs (ragged, in loader order), dealt
    as they come and by `balanced_order`: keys abr_loader, abr_balanced, dbr_loader, dbr_balanced,
    padding_ratio, updates."""
    flat, offsets = np.asarray(flat_lengths), np.asarray(offsets)
    if packs_per_update % (n_ranks * micro_batch_size):
        raise ValueError(f"{packs_per_update} packs per update cannot be dealt to {n_ranks} ranks")
    count = min(updates, (len(offsets) - 1) // packs_per_update)
    if count == 0:
        raise ValueError(f"{len(offsets) - 1} packs do not fill one update of {packs_per_update}")
    rows = {k: [] for k in ("abr_loader", "abr_balanced", "dbr_loader", "dbr_balanced", "padding_ratio")}
    for u in range(count):
        first = u * packs_per_update
        sub = offsets[first:first + packs_per_update + 1]
        f, o = flat[sub[0]:sub[-1]], sub - sub[0]
        plain = balance_metrics(f, o, n_ranks, pack_length)
        order = balanced_order(pack_costs(f, o), n_ranks, micro_batch_size)
        sizes = np.diff(o)[order]
        f2 = f[np.repeat(o[:-1][order], sizes) + np.arange(len(f)) - np.repeat(np.cumsum(sizes) - sizes, sizes)]
        fair = balance_metrics(f2, np.concatenate([[0], np.cumsum(sizes)]), n_ranks, pack_length)
        rows["abr_loader"].append(plain.attention_balance_ratio)
        rows["abr_balanced"].append(fair.attention_balance_ratio)
        rows["dbr_loader"].append(plain.data_balance_ratio)
        rows["dbr_balanced"].append(fair.data_balance_ratio)
        rows["padding_ratio"].append(plain.padding_ratio)
    return {**{k: float(np.mean(v)) for k, v in rows.items()}, "updates": count}
