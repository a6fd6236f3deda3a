"""Multi-size packing (Hierarchical Balance Packing's multi-level packing): packs of several lengths chosen
together, with a proven lower bound on their cost.

    from bert_ipu.packing.multisize import pack_multi_size
    r = pack_multi_size(histogram, [8192, 16384, 32768], max_sequences_per_pack=None)
    r.mixtures[8192], r.mixtures[16384], ...   # a Mixture per pack length (real sequence lengths)
    r.cost, r.lower_bound                      # computed tokens (or the given costs) and a bound on any packing

`histogram[i]` counts sequences of length i + 1 (up to the largest pack length). A pack of length S_s costs
`costs[s]` (default S_s: the tokens it computes, so the cost is the packing's computed tokens, padding
included). The multi-size cutting-stock LP

    min  sum_s c_s sum_p x_sp    s.t.  sum_sp a_lp x_sp >= h_l for every length l,   x >= 0,

over the patterns p of every size s (at most `depth` sequences of total length <= S_s), is solved by column
generation with HiGHS (scipy's binding, one model kept warm as CGHP's) and an exact knapsack pricing per size (one dynamic programme up to
the largest size answers every size: best[k, c] for all capacities c). For any duals y >= 0, Farley's bound
y.h / max_s(best_s(y) / c_s) is a lower bound on the LP (y scaled by that factor is dual feasible), so on any
packing; with integer costs it is rounded up to a multiple of their greatest common divisor.

The packing: iterated rounding (take floor(x) of the LP, drop over-covered sequences, shrink each pack to the
cheapest size its tokens fit, solve the residual again; up to `rounds` times), then LPFHP at the largest size
on what is left, each of its packs shrunk the same way; the cheaper of that and LPFHP with shrinking on the
whole histogram (real lengths) is returned.

Long packs: with `grid` g > 1 the packing is computed on lengths rounded *up* to multiples of g tokens (a pack
of rounded lengths that fits holds the real ones) and the bound on lengths rounded *down* (every real packing
is one of the rounded-down lengths, so that bound holds for the real lengths); `grid=None` (the default)
picks g so that the largest size is at most 2,048 units (g = 1 up to 2,048 tokens). Best fit is returned at
once when it meets the cheap bound (tokens x the least cost per token).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import reduce

import numpy as np

from .bounds import deadline_of, past
from .depth import parse_depth
from .lp import highs
from .heuristics import lpfhp
from .histogram import PackingInputError, check_memory, validate_histogram
from .mixture import Mixture

PRICING_TOL = 1e-9
COLUMNS_PER_ROUND = 16  # per pack length
UNITS = 2048  # grid=None: the largest size in at most this many units

MULTI_SIZE_BYTES = 160  # peak memory a sequence (measured: 2.8 GB for 20M sequences): more is refused


@dataclass(frozen=True)
class MultiSizeResult:
    mixtures: dict            # pack length -> Mixture of real sequence lengths (sizes with no pack left out)
    cost: float               # sum over packs of their size's cost
    lp_bound: float           # Farley's bound on the LP relaxation (rounded-down lengths when grid > 1; the
                              # token bound when best fit met it and no LP was solved)
    lower_bound: float        # proven: no packing into these sizes costs less
    grid: int = 1
    time_limit_reached: bool = False

    @property
    def packs(self) -> dict:
        return {s: m.n_packs for s, m in self.mixtures.items()}

    @property
    def computed_tokens(self) -> int:
        return sum(s * m.n_packs for s, m in self.mixtures.items())

    @property
    def gap(self) -> float:
        """cost / lower_bound - 1."""
        return self.cost / self.lower_bound - 1 if self.lower_bound > 0 else 0.0


def check_pack_lengths(pack_lengths) -> list[int]:
    """The pack lengths as ints (in the order given), or a PackingInputError naming the problem: not a
    non-empty list of whole numbers >= 1, or a length given twice."""
    sizes = None
    if isinstance(pack_lengths, (list, tuple, np.ndarray)):
        try:
            sizes = [int(s) for s in pack_lengths]
        except (TypeError, ValueError, OverflowError):  # None or a list among them, nan, inf
            sizes = None
    if not sizes or any(isinstance(t, (bool, np.bool_, str, bytes)) or s != t or s < 1
                        for s, t in zip(sizes, pack_lengths)):
        raise PackingInputError(f"pack lengths {pack_lengths!r}: give a non-empty list of whole numbers >= 1")
    if len(set(sizes)) != len(sizes):
        twice = sorted({s for s in sizes if sizes.count(s) > 1})
        raise PackingInputError(f"pack lengths {sizes}: each length once ({', '.join(map(str, twice))} given twice)")
    return sizes


def check_input(histogram, pack_lengths, costs, depth):
    """(histogram, sizes ascending, costs in that order, the depth limit as `parse_depth` reads it), or a
    PackingInputError naming the problem."""
    sizes = check_pack_lengths(pack_lengths)
    histogram = validate_histogram(histogram)
    top = int(np.nonzero(histogram)[0][-1]) + 1
    if top > max(sizes):
        raise PackingInputError(f"the histogram has sequences of length {top}, longer than the largest pack "
                                f"length {max(sizes)}")
    try:
        costs = [float(s) for s in sizes] if costs is None else [float(c) for c in costs]
    except (TypeError, ValueError):
        raise PackingInputError(f"costs {costs!r}: one number > 0 per pack length") from None
    if len(costs) != len(sizes) or not all(math.isfinite(c) and c > 0 for c in costs):
        raise PackingInputError(f"costs {costs}: one number > 0 per pack length")
    depth = parse_depth(depth, allow_auto=False)   # (a whole number >= 1, "max" or None)
    order = np.argsort(sizes)
    return (histogram, np.array(sizes, dtype=np.int64)[order], np.array(costs)[order], depth)


def _knapsack(lens: np.ndarray, vals: np.ndarray, cap: int, depth: int):
    """(best, rest, items): best[c] (c = 0..cap) the largest value of at most `depth` items (unbounded copies)
    of total weight <= c, rest[c] the same with one item fewer, and items(c, fewer) the item indices of
    best[c] (of rest[c] if `fewer`). lens: ascending, >= 1 (units)."""
    most = cap // int(lens.min())
    D = most if depth is None else min(depth, most)
    if D >= most:  # the depth cannot bind: the one-dimensional recursion over capacity
        best = np.zeros(cap + 1)
        choice = np.full(cap + 1, -1, dtype=np.int64)  # item added last at c; -1 = best[c] is best[c - 1]
        fit_counts = np.searchsorted(lens, np.arange(cap + 1), side="right")  # lens ascending: a prefix fits
        for c in range(1, cap + 1):
            best[c] = best[c - 1]
            n = fit_counts[c]
            if n:
                cand = best[c - lens[:n]] + vals[:n]
                j = cand.argmax()
                if cand[j] > best[c]:
                    best[c], choice[c] = cand[j], j

        def items(c, fewer=False):  # the depth cannot bind, so one item fewer changes nothing
            out = []
            while c > 0:
                if choice[c] < 0:
                    c -= 1
                else:
                    out.append(int(choice[c]))
                    c -= int(lens[choice[c]])
            return out
        return best, best, items
    table = np.zeros((D + 1, cap + 1))
    choice = np.full((D + 1, cap + 1), -1, dtype=np.int64)
    for k in range(1, D + 1):
        prev, cur = table[k - 1], table[k - 1].copy()
        for j, (w, v) in enumerate(zip(lens.tolist(), vals.tolist())):
            cand = prev[: cap + 1 - w] + v
            better = cand > cur[w:]
            cur[w:][better] = cand[better]
            choice[k, w:][better] = j
        table[k] = cur

    def items(c, fewer=False):
        k, out = D - fewer, []
        while k > 0:  # choice -1: at most k - 1 items do as well at this capacity
            j = int(choice[k, c])
            if j >= 0:
                out.append(j)
                c -= int(lens[j])
            k -= 1
        return out
    return table[D], table[D - 1], items


class _ColumnGeneration:
    """The multi-size LP over unit lengths `lens` (ascending, demand `demand`) and capacities `caps`."""

    def __init__(self, lens, caps, costs, depth):
        self.lens, self.caps, self.costs, self.depth = lens, caps, costs, depth
        self.columns: list[tuple[int, np.ndarray]] = []  # (size index, counts per length)
        self.seen = set()
        for j, w in enumerate(lens):  # one column per length: the cheapest size it fits alone (feasibility)
            s = min((s for s in range(len(caps)) if caps[s] >= w), key=lambda s: costs[s])
            self.add(s, [j])

    def add(self, s: int, items: list[int]) -> bool:
        a = np.bincount(np.asarray(items, dtype=np.int64), minlength=len(self.lens))
        key = (s, a.tobytes())
        if key in self.seen:
            return False
        self.seen.add(key)
        self.columns.append((s, a))
        return True

    def _master(self, demand: np.ndarray):
        """A HiGHS model of the restricted LP on `demand`, kept warm while columns are added (as CGHP's)."""
        h = highs()
        m, inf = len(demand), h.getInfinity()
        h.addRows(m, demand.astype(np.float64), np.full(m, inf), 0, np.zeros(m, dtype=np.int32),
                  np.zeros(0, dtype=np.int32), np.zeros(0))
        return h

    def _add_to(self, h, columns) -> None:
        if not columns:
            return
        k = len(columns)
        A = np.stack([a for _, a in columns], axis=1)
        rows, cols = np.nonzero(A)
        order = np.lexsort((rows, cols))
        rows, cols = rows[order], cols[order]
        starts = np.searchsorted(cols, np.arange(k)).astype(np.int32)
        h.addCols(k, np.array([self.costs[s] for s, _ in columns], dtype=np.float64), np.zeros(k),
                  np.full(k, h.getInfinity()), len(rows), starts, rows.astype(np.int32),
                  A[rows, cols].astype(np.float64))

    def solve(self, demand: np.ndarray, deadline, max_rounds: int = 500):
        """Column generation on `demand`: (x per column, Farley's bound, whether the deadline passed)."""
        bound, x = 0.0, None
        h = self._master(demand)
        self._add_to(h, self.columns)
        for _ in range(max_rounds):
            if deadline is not None:
                h.setOptionValue("time_limit", h.getRunTime() + max(deadline - time.perf_counter(), 1e-3))
            h.run()
            status = h.modelStatusToString(h.getModelStatus())
            if status == "Time limit reached":  # no LP solution yet: nothing to round, only best fit
                return (np.zeros(len(self.columns)) if x is None else x), bound, True
            if status != "Optimal":
                raise RuntimeError(f"HiGHS failed on the multi-size packing LP: {status}")
            sol = h.getSolution()
            x, y = np.array(sol.col_value), np.maximum(np.array(sol.row_dual), 0.0)
            value = float(h.getInfo().objective_function_value)
            best, rest, items = _knapsack(self.lens, y, int(self.caps.max()), self.depth)
            ratio = max(best[cap] / cost for cap, cost in zip(self.caps, self.costs))
            bound = max(bound, float(y @ demand) / max(ratio, 1.0))
            before = len(self.columns)
            for s, (cap, cost) in enumerate(zip(self.caps, self.costs)):
                # several columns a round: for each length l that fits, the best pattern holding l
                fits = np.nonzero(self.lens <= cap)[0]
                with_l = y[fits] + rest[cap - self.lens[fits]]
                for j in fits[np.argsort(-with_l)][:COLUMNS_PER_ROUND]:
                    if y[j] + rest[cap - self.lens[j]] <= cost * (1 + PRICING_TOL):
                        break
                    self.add(s, [int(j), *items(int(cap - self.lens[j]), fewer=True)])
            if len(self.columns) == before or value - bound <= 1e-9 * max(1.0, value) or past(deadline):
                return x, bound, past(deadline)
            self._add_to(h, self.columns[before:])
        return x, bound, False


def _shrink(lens_units: np.ndarray, caps: np.ndarray, costs: np.ndarray) -> int:
    """The size index of least cost whose capacity holds `lens_units`' total."""
    total = int(lens_units.sum())
    return min((s for s in range(len(caps)) if caps[s] >= total), key=lambda s: costs[s])


def _heuristic(demand: np.ndarray, lens: np.ndarray, caps, costs, depth) -> list[tuple[int, np.ndarray, int]]:
    """LPFHP at the largest capacity on unit lengths, each pack shrunk to its cheapest size:
    (size index, unit lengths of the pack, copies)."""
    hist = np.zeros(int(caps.max()), dtype=np.int64)
    np.add.at(hist, lens - 1, demand)
    if hist.sum() == 0:
        return []
    mix = lpfhp(hist, depth if depth is not None else int(hist.sum()))
    out = []
    for i in range(len(mix.counts)):
        p = mix.strategy(i)
        out.append((_shrink(p, caps, costs), p, int(mix.counts[i])))
    return out


def _round_down(cg: _ColumnGeneration, x: np.ndarray, demand: np.ndarray, caps, costs):
    """floor(x) of the columns with over-covered sequences dropped, each pack shrunk: (packs, residual)."""
    packs, left = [], demand.copy()
    for (s, a), xi in zip(cg.columns, x):
        n = int(math.floor(xi + 1e-9))
        while n > 0:
            take = np.minimum(a, left)  # a copy keeps only the sequences still demanded (the rest: padding)
            if take.sum() == 0:
                break
            k = min(n, int((left[take > 0] // take[take > 0]).min()))  # copies that can all keep as much
            left -= take * k
            units = np.repeat(cg.lens, take)
            packs.append((_shrink(units, caps, costs), units, k))
            n -= k
    return packs, left


def _solve_units(demand, lens, caps, costs, depth, deadline, rounds):
    """Packs (size index, unit lengths, copies) of `demand` and Farley's bound of its LP."""
    cg = _ColumnGeneration(lens, caps, costs, depth)
    index = {int(w): j for j, w in enumerate(lens)}
    for s, units, _ in _heuristic(demand, lens, caps, costs, depth):  # start from best fit's patterns
        cg.add(s, [index[int(w)] for w in units])
    x, bound, late = cg.solve(demand, deadline)
    packs, left = [], demand.copy()
    for r in range(rounds):
        got, left = _round_down(cg, x, left, caps, costs)
        packs += got
        if not got or left.sum() == 0 or past(deadline):
            break
        x, _, late2 = cg.solve(left, deadline)
        late |= late2
    packs += _heuristic(left, lens, caps, costs, depth)
    return packs, bound, late or past(deadline)


def _units(histogram: np.ndarray, g: int, up: bool):
    """Demand per unit length (ascending unit lengths with demand > 0), lengths rounded up or down to g."""
    length = np.arange(1, len(histogram) + 1)
    u = -(-length // g) if up else length // g
    keep = (histogram > 0) & (u > 0)
    demand = np.bincount(u[keep], weights=histogram[keep]).astype(np.int64)
    lens = np.nonzero(demand)[0]
    return lens.astype(np.int64), demand[lens]


def _real_mixtures(histogram, packs, sizes, g) -> dict:
    """Give every unit slot a real sequence of its bucket (in ascending order): a Mixture per size."""
    first = np.cumsum([0] + [k for _, _, k in packs])
    slot_units = np.concatenate([np.tile(units, k) for _, units, k in packs])
    pack_of = np.concatenate([np.repeat(np.arange(k) + first[i], len(units)) for i, (_, units, k) in enumerate(packs)])
    size_of = np.concatenate([np.full(k, s) for s, _, k in packs])
    real = np.repeat(np.arange(1, len(histogram) + 1), histogram)      # every sequence, ascending
    order = np.argsort(slot_units, kind="stable")                      # slots by unit, ascending
    if not np.array_equal(slot_units[order], -(-real // g)):
        raise AssertionError("multi-size packing lost or duplicated a sequence")
    lengths = np.empty(len(slot_units), dtype=np.int64)
    lengths[order] = real
    by_pack = np.argsort(pack_of, kind="stable")
    per_pack = np.bincount(pack_of, minlength=len(size_of))
    slot_size, flat_all = size_of[pack_of[by_pack]], lengths[by_pack]
    out = {}
    for s in np.unique(size_of):
        per = per_pack[size_of == s]
        out[int(sizes[s])] = Mixture.from_ragged(flat_all[slot_size == s], np.concatenate([[0], np.cumsum(per)]),
                                                 np.ones(len(per), dtype=np.int64))
    return out


def pack_multi_size(histogram, pack_lengths, max_sequences_per_pack: int | None = None, costs=None,
                    grid: int | None = None, rounds: int = 8, time_limit: float | None = None) -> MultiSizeResult:
    """Pack `histogram` into packs of the given lengths at least cost, with a proven bound (module docstring).
    Bad input is a PackingInputError (a ValueError) naming the problem."""
    histogram, sizes, costs_arr, max_sequences_per_pack = check_input(histogram, pack_lengths, costs,
                                                                      max_sequences_per_pack)
    sequences = int(histogram.sum())
    check_memory(sequences * MULTI_SIZE_BYTES, f"pack_multi_size realises its packs with each of the {sequences:,} "
                                               "sequences in memory")
    deadline = deadline_of(time_limit)
    if grid is None:
        grid = max(1, -(-int(sizes.max()) // UNITS))
        longest = int(np.nonzero(histogram)[0][-1]) + 1
        while grid > 1 and -(-longest // grid) > int(sizes.max()) // grid:
            grid -= 1  # the longest sequence, rounded up, must still fit the largest pack (5,000: grid 3 -> 2)
    if isinstance(grid, bool) or int(grid) != grid or grid < 1:
        raise PackingInputError(f"grid {grid!r}: a whole number of tokens >= 1 (or None: automatic)")
    depth = max_sequences_per_pack
    caps = sizes // grid
    lens, demand = _units(histogram, grid, up=True)
    if lens.max() > caps.max():
        raise PackingInputError(f"grid {grid}: a sequence rounded up to {int(lens.max()) * grid} tokens no longer "
                                f"fits the largest pack ({int(sizes.max())}); use a smaller grid")
    # cheap bound: every token costs at least the cheapest cost per token
    tokens = int((np.arange(1, len(histogram) + 1) * histogram).sum())
    cheap = tokens * float((costs_arr / sizes).min())
    step = reduce(math.gcd, (int(c) for c in costs_arr)) if all(c == int(c) for c in costs_arr) else None
    rounded = (lambda b: math.ceil(b / step - 1e-9) * step) if step else (lambda b: b)
    # best fit on the real lengths (never rounded: at long context it is hard to beat, and fast)
    real_lens = np.nonzero(histogram)[0] + 1
    plain = _heuristic(histogram[real_lens - 1], real_lens, sizes, costs_arr, depth)
    cost = sum(costs_arr[s] * k for s, _, k in plain)
    if cost <= rounded(cheap) + 1e-9:  # best fit is already optimal: no LP needed
        return MultiSizeResult(_real_mixtures(histogram, plain, sizes, 1), float(cost), cheap,
                               float(rounded(cheap)), int(grid), False)
    packs, bound, late = _solve_units(demand, lens, caps, costs_arr, depth, deadline, rounds)
    packs_grid = grid
    if sum(costs_arr[s] * k for s, _, k in packs) < cost:
        cost = sum(costs_arr[s] * k for s, _, k in packs)
    else:
        packs, packs_grid = plain, 1
    if grid > 1:  # the bound on lengths rounded down (those that round to 0 units take no room)
        lens_down, demand_down = _units(histogram, grid, up=False)
        if len(lens_down):
            _, bound, late2 = _ColumnGeneration(lens_down, caps, costs_arr, depth).solve(demand_down, deadline)
            late |= late2
        else:
            bound = 0.0
    lower = rounded(max(bound, cheap))
    return MultiSizeResult(_real_mixtures(histogram, packs, sizes, packs_grid), float(cost), float(bound), float(lower),
                           int(grid), bool(late))

