"""The cutting-stock LP that CGHP, the plan-guided packing and multi-size packing share: a HiGHS instance,
the restricted master LP kept warm across rounds, exact knapsack pricing with a depth limit, and column
generation with dual smoothing and Farley's bound.

    patterns, x, value, bound, stopped, point, solver = solve_relaxation(histogram, depth, [], True, deadline)
    x, value, bound, stopped = solver.resolve(residual)      # the same LP with fewer sequences wanted

`solve_relaxation` returns the restricted LP's patterns and solution and a proven lower bound on its optimum;
cghp.py dives on it (fixing packs and re-solving the rest warm), planned.py solves it over class means,
multisize.py keeps its own master LP over several pack lengths on the same `highs()`.
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy import sparse

from .bounds import past, proven
from .effort import SIMPLEX_WORK_PER_SECOND, effort, spend
from .heuristics import lpfhp

# A pattern prices out when its dual value exceeds 1 by more than this; HiGHS' default tolerances are 1e-7.
PRICING_TOL = 1e-9


# The unlimited-depth LP whose duals start a depth-limited one (`solve_relaxation`) gets at most this many rounds
# and this many estimated seconds of work (`effort.py`; a count, not a clock). Its 30 rounds cost up to 3 s on
# sparse histograms of long packs, where unlimited-depth pricing is dear (2,124 lengths uniform in 13-43% of
# 8,192, depth 4, 1,396 distinct: 3.8 estimated seconds), for a start no better than a third of them gives: on
# 400 cases of benchmarks/packing_small.py (mixed seeds 0-1 and, of at most 3,000 sequences, 2-5; ranges 0-3)
# every packing the same, 215 s in all instead of 221 s, and 606 packs, the bound, in 4.4 s instead of 6.2 s.
# (10 rounds, whatever their cost, were faster still there but cost a pack on 1,317 log-normal lengths at 4,096,
# depth 6, whose warm start costs 1.2 estimated seconds; docs/results/packing-scale.md, "The warm start's
# budget".)
WARM_START_ROUNDS = 30
WARM_START_SECONDS = 1.5
# Columns priced into the restricted LP per round (at most one per length). Up to one per length (1,000 and more
# on sparse histograms) grew the LP so fast that HiGHS' re-solves took most of the time: 30,508 two-humped
# lengths at 4,096, depth 6, spent 24 of 26 s in 101 solves of an LP of 32,000 columns; 128 a round cut the
# small and sparse histograms' LPs 1.5-3x and kept the Wikipedia-style and long-context cases' times
# (docs/results/packing-scale.md, "The dive: warm residual LPs and swap columns").
COLUMNS_PER_ROUND = 128
COARSE_START_LENGTHS = 600  # depth-limited, more distinct lengths than this: start from the LP's patterns on
                            # lengths rounded up to units of 2 tokens (recursively) ...
COARSE_START_COPIES = 8     # ... when there are at least this many sequences a length on average: on sparse
                            # histograms it cost time and packs (713 uniform lengths at 4,096, depth 8: 7.4 s
                            # instead of 1.6 s; 1,317 log-normal at 4,096, depth 6: 509 packs in 15 s instead
                            # of 508, the bound, in 2.7 s)
COARSE_VARIANTS = 27        # real-length combinations tried per coarse pattern
# Once the restricted LP has more than PRUNE_COLUMNS columns a length, each round deletes the columns at zero
# with reduced cost above PRUNE_RC (pricing brings one back if it pays again). Otherwise a depth-limited LP on
# a large histogram grows to many thousands of columns, and every primal simplex iteration prices them all;
# pruning saves time there with the same or fewer packs. Depth-limited LPs only: at unlimited depth it made no
# clear difference to the time and SQuAD's packing lost its optimum (docs/results/packing-scale.md, "Rounding
# up, and a smaller LP").
PRUNE_RC = 0.05
PRUNE_COLUMNS = 3

# The LPs of the coarse start (`_coarse_columns`) are only a start: each stops after this share of the call's
# patience (`effort.Effort.budget`: from 1,000 packs).
COARSE_SHARE = 0.35


class LPFailure(RuntimeError):
    """HiGHS could not solve a packing LP (demands of about 10^12 a length made both simplex methods report the
    bounded LP "Unbounded" or "Unknown"), or column generation did not converge: CGHP falls back to best fit."""


def pricing_seconds(n_lengths: int, max_len: int, depth: int, shortest: int) -> float:
    """A rough estimate of one exact pricing round (measured on this project's CPU): the capacity loop of
    the unlimited recursion, or depth x lengths vector operations over the capacities."""
    if depth >= max_len // shortest:
        return max_len * (3e-6 + n_lengths * 2e-9)
    return depth * n_lengths * (1e-6 + max_len * 1e-9)


class Pricer:
    """Exact pricing: the best patterns under duals y, with at most `depth` items of total length <= L."""

    def __init__(self, lengths: np.ndarray, max_len: int, depth: int):
        self.lengths = lengths  # lengths with demand > 0, ascending
        self.max_len = max_len
        self.depth = min(depth, max_len // int(lengths.min()))
        self.seconds = pricing_seconds(len(lengths), max_len, self.depth, int(lengths.min()))

    def price(self, y: np.ndarray, n_columns: int) -> tuple[list[np.ndarray], float]:
        """Up to n_columns improving patterns (as length arrays), and the best pattern's value.

        Copies of a length are unbounded (the LP only needs a_lp >= 0). With a depth limit,
        best[k, c] is the largest dual value of at most k items of total length <= c; best[0] = 0
        everywhere, so best[k] is non-decreasing in c. When the limit cannot bind (depth >= L // shortest)
        the classic one-dimensional recursion over capacity is used instead, which is much cheaper.
        """
        L, D = self.max_len, self.depth
        spend(self.seconds)
        useful = y > 0
        lens, vals, idx = self.lengths[useful], y[useful], np.nonzero(useful)[0]
        if len(vals) > 1:
            # An item worth no more than a shorter one is never needed (swap it for the shorter: the pattern
            # still fits and is worth as much), and with ties broken towards shorter items, as below, the
            # recursions never pick it: same patterns, fewer steps. On Wikipedia-style histograms at depth 3
            # these are most of the lengths.
            keep = np.concatenate([[True], vals[1:] > np.maximum.accumulate(vals)[:-1]])
            lens, vals, idx = lens[keep], vals[keep], idx[keep]
        if D >= L // int(self.lengths.min()):
            best = np.zeros(L + 1)
            choice = np.zeros(L + 1, dtype=np.int64)  # index + 1 of the last item at capacity c; 0 = none
            for c in range(1, L + 1):
                fits = lens <= c
                cand = best[c - lens[fits]] + vals[fits]
                j = int(np.argmax(cand)) if len(cand) else -1
                if j >= 0 and cand[j] > best[c - 1]:
                    best[c], choice[c] = cand[j], idx[fits][j] + 1
                else:
                    best[c], choice[c] = best[c - 1], -1  # capacity c - 1 is as good
            # the largest capacity <= c whose best ends with an item: backtracking jumps there at once (walking
            # down one capacity at a time was a large share of CGHP's time on sparse histograms)
            last = np.maximum.accumulate(np.where(choice > 0, np.arange(L + 1), 0))
            best, choice = best[None].repeat(2, 0), choice[None].repeat(2, 0)
            rest, D = 1, None
        else:
            best = np.zeros((D + 1, L + 1))
            choice = np.zeros((D + 1, L + 1), dtype=np.int64)  # index + 1 of the item added at k; 0 = none
            for k in range(1, D + 1):
                prev, cur, ch = best[k - 1], best[k - 1].copy(), choice[k]
                for j, length, value in zip(idx, lens, vals):
                    cand = prev[: L + 1 - length] + value
                    better = cand > cur[length:]
                    cur[length:][better] = cand[better]
                    ch[length:][better] = j + 1
                best[k] = cur
            rest, last = D - 1, None
        # Several columns per round: for every length l, the best pattern that contains l.
        with_l = y + best[rest, L - self.lengths]
        columns, seen = [], set()
        for j in np.argsort(-with_l):
            if with_l[j] <= 1 + PRICING_TOL or len(columns) >= n_columns:
                break
            length = int(self.lengths[j])
            pattern = tuple(sorted([length] + self._backtrack(choice, rest, L - length, last)))
            if pattern not in seen:
                seen.add(pattern)
                columns.append(np.array(pattern))
        return columns, float(best[-1, L])

    def _backtrack(self, choice, k, c, last):
        """The items of the best pattern at capacity c (and at most k items): `last` is None with a depth
        limit (choice[k, c] = 0: no item at k), else the unlimited recursion's jump table."""
        items = []
        if last is not None:
            c = int(last[c])
            while c > 0:
                items.append(int(self.lengths[choice[1, c] - 1]))
                c = int(last[c - items[-1]])
            return items
        while c > 0 and k > 0:
            j = int(choice[k, c])
            if j:
                items.append(int(self.lengths[j - 1]))
                c -= items[-1]
            k -= 1
        return items


def _column_matrix(patterns: list[np.ndarray], index_of: np.ndarray, n_rows: int) -> sparse.csc_matrix:
    rows = np.concatenate([index_of[p] for p in patterns])
    cols = np.repeat(np.arange(len(patterns)), [len(p) for p in patterns])
    A = sparse.csc_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_rows, len(patterns)))
    A.sum_duplicates()
    return A


def _binding():
    """HiGHS' Python binding: the `highspy` package if installed, else the same binding that scipy ships
    (private in scipy, so pinned by requirements.txt's scipy). Returns (Highs class, HighsVarType)."""
    try:
        import highspy
        return highspy.Highs, highspy.HighsVarType
    except ImportError:
        from scipy.optimize._highspy._core import HighsVarType, _Highs
        return _Highs, HighsVarType


def highs_integer():
    """A silent HiGHS instance for a small integer program (`repack.py`), and HiGHS' integer variable type."""
    Highs, var_type = _binding()
    h = Highs()
    h.setOptionValue("output_flag", False)
    return h, var_type.kInteger


def highs():
    """A silent HiGHS instance for the packing LPs."""
    h = _binding()[0]()
    h.setOptionValue("output_flag", False)
    # Primal simplex: added columns keep the last solution feasible, so it restarts where it stopped
    # (dual simplex, HiGHS' default, was slower here; docs/results/packing-scale.md, "Long packs: heuristics
    # and the warm LP").
    h.setOptionValue("simplex_strategy", 4)
    return h


# A depth-limited `MasterLP`'s first solve uses dual simplex instead (a slack basis is dual feasible): it
# makes depth-limited CGHP faster, while at unlimited depth it was slower, so there the first solve stays
# primal (docs/results/packing-scale.md, "Rounding up, and a smaller LP").
DUAL_SIMPLEX = 1


def add_swap_columns(h, m: int) -> int:
    """Adds to HiGHS model `h` (rows: `m` lengths, ascending) one zero-cost column per pair of neighbouring
    lengths, +1 in the shorter one's row and -1 in the longer one's (`MasterLP`'s swaps); returns how many."""
    k = max(m - 1, 0)
    if k:
        rows = np.stack([np.arange(k), np.arange(1, k + 1)], axis=1).ravel().astype(np.int32)
        h.addCols(k, np.zeros(k), np.zeros(k), np.full(k, h.getInfinity()), 2 * k,
                  np.arange(0, 2 * k, 2, dtype=np.int32), rows, np.tile([1.0, -1.0], k))
    return k


class MasterLP:
    """The restricted master LP  min sum x  s.t.  A x >= demand, x >= 0, kept alive between rounds of
    column generation: new columns are added to the model and HiGHS re-optimises from the last basis (a
    few simplex iterations) instead of solving from scratch (`linprog` every round took most of CGHP's
    time).

    swaps: also one zero-cost column per pair of neighbouring lengths, +1 in the shorter one's row and -1 in
    the longer one's: a slot of the longer length may hold a sequence of the shorter one (any pattern stays
    feasible, depth limit included). These are Valerio de Carvalho's dual-optimal inequalities: in the dual
    they say y is non-decreasing in length, which some optimal dual already is, so the LP's value is the
    same, but the duals stop jumping between equivalent points and column generation converges in fewer,
    cheaper rounds (on 18,427 log-normal lengths at 2,048, 14 rounds and 3.6 s instead of 30 and 11.3 s;
    docs/results/packing-scale.md, "The dive: warm residual LPs and swap columns"). The solution's x is over
    the patterns only; a pattern's slots that cover more of a length than is wanted then hold shorter
    sequences (`mixture.trim_excess(..., swap=True)`)."""

    def __init__(self, demand: np.ndarray, index_of: np.ndarray, dual_first: bool = False, swaps: bool = False):
        self.h = highs()
        self.index_of = index_of
        self.n = 0
        self.dual_next = dual_first  # the first solve only (see DUAL_SIMPLEX)
        inf = self.h.getInfinity()
        m = len(demand)
        self.demand = demand.astype(np.float64)
        self.h.addRows(m, self.demand, np.full(m, inf), 0, np.zeros(m, dtype=np.int32),
                       np.zeros(0, dtype=np.int32), np.zeros(0))
        self.swaps = add_swap_columns(self.h, m) if swaps else 0  # the swap columns come first

    def add(self, patterns: list[np.ndarray]) -> None:
        if not patterns:
            return
        A = _column_matrix(patterns, self.index_of, int(self.index_of.max()) + 1)  # csc, duplicates summed
        k = len(patterns)
        self.h.addCols(k, np.ones(k), np.zeros(k), np.full(k, self.h.getInfinity()), A.nnz,
                       A.indptr[:-1].astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64))
        self.n += k

    def set_demand(self, demand: np.ndarray) -> None:
        """A new right-hand side (a residual: some sequences are packed). The last basis stays dual feasible,
        so the next solve uses dual simplex from it."""
        for i in np.nonzero(demand != self.demand)[0]:
            self.h.changeRowBounds(int(i), float(demand[i]), self.h.getInfinity())
        self.demand = demand.astype(np.float64)
        self.dual_next = True

    def solve(self, deadline: float | None = None):
        """(x over the patterns, duals, value), or None if HiGHS stopped at `deadline` (a
        `time.perf_counter()` value)."""
        if deadline is not None:
            # HiGHS' time limit counts all the runs of the instance
            self.h.setOptionValue("time_limit", self.h.getRunTime() + max(deadline - time.perf_counter(), 1e-3))
        if self.dual_next:
            self.h.setOptionValue("simplex_strategy", DUAL_SIMPLEX)
        self.h.run()
        if self.dual_next:
            self.h.setOptionValue("simplex_strategy", 4)
            self.dual_next = False
        status = self.h.getModelStatus()
        spend(self.h.getInfo().simplex_iteration_count * len(self.demand) / SIMPLEX_WORK_PER_SECOND)
        if self.h.modelStatusToString(status) not in ("Optimal", "Time limit reached"):
            # Demands past about 2**30 a length (a billion sequences of one length) made the primal simplex
            # report this LP, which is bounded (packs >= 0), "Unbounded"; the dual simplex solves it
            self.h.setOptionValue("simplex_strategy", DUAL_SIMPLEX)
            self.h.run()
            self.h.setOptionValue("simplex_strategy", 4)
            status = self.h.getModelStatus()
            spend(self.h.getInfo().simplex_iteration_count * len(self.demand) / SIMPLEX_WORK_PER_SECOND)
        if self.h.modelStatusToString(status) == "Time limit reached":
            return None
        if self.h.modelStatusToString(status) != "Optimal":
            raise LPFailure(f"HiGHS failed on the packing LP: {self.h.modelStatusToString(status)}")
        sol = self.h.getSolution()
        x, y = np.array(sol.col_value)[self.swaps:], np.maximum(np.array(sol.row_dual), 0.0)
        return x, y, float(self.h.getInfo().objective_function_value)

    def prune(self, x: np.ndarray, threshold: float) -> np.ndarray:
        """Delete the pattern columns at zero in the last solution whose reduced cost exceeds `threshold`
        (nonbasic, so the basis stays); returns the mask of the patterns kept."""
        drop = (x <= 0) & (np.array(self.h.getSolution().col_dual)[self.swaps:] > threshold)
        if drop.any():
            self.h.deleteCols(int(drop.sum()), (np.nonzero(drop)[0] + self.swaps).astype(np.int32))
            self.n -= int(drop.sum())
        return ~drop


class ColumnGeneration:
    """Column generation on one histogram's LP relaxation (`run`), kept warm for the residuals of a dive
    (`resolve`: fewer sequences wanted, every pattern so far kept, HiGHS restarts from the last basis)."""

    def __init__(self, demand, lengths, max_len, pricer, patterns, n_columns=None, swaps=False):
        if n_columns is None:
            n_columns = COLUMNS_PER_ROUND
        self.demand, self.pricer, self.n_columns = demand, pricer, n_columns
        self.patterns = patterns  # grows (and is pruned) in place: x is over it
        self.index_of = length_index(lengths, max_len)
        self.limited = pricer.depth < max_len // int(lengths.min())
        self.lp = MasterLP(demand, self.index_of, dual_first=self.limited, swaps=swaps)
        self.lp.add(patterns)

    def run(self, max_rounds=1000, alpha=0.5, gap=0.5, rel_gap=1e-6, centre=None, deadline=None, give_up=False,
            known=0, budget=math.inf, floor=0):
        """Returns (x, y, lp_value, bound, stopped, point): the restricted LP's solution over `patterns`, its
        duals and value, the bound, whether `deadline` stopped the loop (then `bound` is the best proven so
        far and x may be the previous round's, over the first len(x) patterns, or None), and the dual point
        that proved `bound` (None if none did).

        Dual smoothing (Wentges): price at a point between the best dual point so far (the "centre") and the
        restricted LP's duals. The LP is massively degenerate and its raw duals jump around; smoothing cuts
        the number of rounds several-fold. Any dual point y >= 0 gives Farley's lower bound y.h / max(1, best
        pattern value), so the loop stops as soon as that bound is within `gap` of the restricted LP value.

        gap=0: stop instead once the bound rounded up (or `known`, a bound proven otherwise) meets the restricted
        LP's value rounded up: packs are whole, so no more rounds can prove more, and the LP is as converged as
        a dive needs. Where the LP's optimum is just above an integer this goes on past a half-pack gap (2,250
        lengths at 128, depth 16: stopped at 342.01 against a bound of 341.66, the dive ended one pack above
        342, the optimum), and elsewhere it stops well before it.

        Once the call's patience is spent (`Effort`), it also stops within `Effort.slack()` packs of the bound
        (or `known`, or `floor`: a bound for this test only, as a residual's cheap bound); and after `budget`
        estimated seconds of its own it stops where it is (`stopped` False).
        """
        demand, pricer, index_of, lp, patterns = self.demand, self.pricer, self.index_of, self.lp, self.patterns
        bound = 0.0 if centre is None else float(centre @ demand) / max(1.0, pricer.price(centre, 0)[1])
        x, counted = None, effort()
        began = counted.spent
        for _ in range(max_rounds):
            solved = lp.solve(deadline)
            if solved is None:  # HiGHS stopped at the deadline: the last round's x covers the first len(x) patterns
                return x, None, None, bound, True, centre
            x, y, value = solved
            a = alpha if centre is not None else 0.0
            while True:
                point = y if a == 0 else a * centre + (1 - a) * y
                new, top = pricer.price(point, self.n_columns)
                point_bound = float(point @ demand) / max(top, 1.0)
                if point_bound > bound:
                    bound, centre = point_bound, point
                # keep only columns that improve the current LP (smoothing can price out stale ones)
                new = [p for p in new if y[index_of[p]].sum() > 1 + PRICING_TOL]
                if new or a == 0:
                    break
                a = 0.0  # mis-price: fall back to the LP's own duals
            if not new or value - bound <= max(gap, rel_gap * value) or (
                    gap == 0 and max(proven(bound), known) >= proven(value)) or (
                    value - max(bound, known, floor) <= counted.slack()) or counted.spent - began > budget:
                return x, y, value, bound, False, centre
            if past(deadline):
                return x, y, value, bound, True, centre
            if self.limited and lp.n > PRUNE_COLUMNS * len(demand):
                keep = lp.prune(x, PRUNE_RC)
                patterns[:] = [p for p, k in zip(patterns, keep) if k]
                x = x[keep]
            patterns.extend(new)
            lp.add(new)
        if give_up:  # as if stopped: the bound and dual point so far are valid
            return x, y, value, bound, True, centre
        raise LPFailure(f"column generation did not converge in {max_rounds} rounds")

    def resolve(self, residual: np.ndarray, deadline=None, floor=0):
        """The LP of `residual` (a histogram over the same pack length, no length that was not wanted at the
        start), from where the last solve stopped, to gap=0 (or the call's slack, as `run`): (x, lp_value,
        bound, stopped)."""
        lengths = np.nonzero(self.index_of >= 0)[0]
        self.demand = residual[lengths - 1].astype(np.float64)
        self.lp.set_demand(self.demand)
        x, _, value, bound, stopped, _ = self.run(deadline=deadline, gap=0, floor=floor)
        return x, value, bound, stopped


def column_generation(demand, lengths, max_len, pricer, patterns, max_rounds=1000, n_columns=None,
                      alpha=0.5, gap=0.5, rel_gap=1e-6, centre=None, deadline=None, give_up=False, swaps=False,
                      budget=math.inf):
    """Solve the LP relaxation over `demand` (per entry of `lengths`) from `patterns` (which grows in place):
    `ColumnGeneration.run`'s result."""
    return ColumnGeneration(demand, lengths, max_len, pricer, patterns, n_columns, swaps).run(
        max_rounds, alpha, gap, rel_gap, centre, deadline, give_up, budget=budget)


def solve_relaxation(histogram: np.ndarray, depth: int, patterns: list[np.ndarray], warm: bool, deadline,
                     swaps: bool = False, gap: float = 0.5, known: int = 0, budget: float = math.inf, floor=0):
    """Column generation on `histogram` (may be a residual). Returns (patterns, x, value, bound, stopped,
    point, solver): `solver` is the `ColumnGeneration` kept warm for residuals (None if the deadline stopped
    the warm start); `swaps` as in `MasterLP`; `known`, a bound proven otherwise, `budget` (estimated
    seconds) and `floor` as in `ColumnGeneration.run`."""
    max_len = len(histogram)
    lengths = np.nonzero(histogram)[0] + 1
    demand = histogram[lengths - 1].astype(np.float64)
    index_of = length_index(lengths, max_len)
    # restrict known patterns to the lengths still wanted; singletons keep the LP feasible
    patterns = [p[index_of[p] >= 0] for p in patterns] + [np.array([l]) for l in lengths]
    patterns = list({tuple(p): p for p in patterns if len(p)}.values())
    centre, pre_bound = None, 0.0
    limited = depth < max_len // int(lengths.min())
    dense = demand.sum() >= COARSE_START_COPIES * len(lengths)
    if warm and limited and len(lengths) > COARSE_START_LENGTHS and dense:
        # Many lengths: start from the support of the same LP on lengths rounded up to units of 2 tokens
        # (solved the same way, so recursively down to at most COARSE_START_LENGTHS lengths), each coarse
        # pattern expanded into the real lengths of its units (any choice fits: the rounded-up total does).
        # The restricted LP then starts near its optimum instead of at best fit's depth-limited patterns,
        # far above it, from where exact column generation spent many ever slower rounds. It replaces the
        # unlimited-depth warm start (with both, CGHP was slower than with this alone). At unlimited depth it
        # did not help (docs/results/packing-scale.md, "Where the time went, and the coarse start").
        patterns += _coarse_columns(histogram, depth, deadline, known)
        # and without swap columns: from these columns they made the LP slower (Wikipedia-style 2048 at depth 3:
        # 2.8 s instead of 1.9 s) for the same packs
        warm, swaps = False, False
    if warm and limited:
        # The unlimited-depth LP is cheap, and its duals are a strong start for the limited one: they give
        # a Farley bound close to the final one and price out good first columns. Only worth it on the full
        # histogram: on the small residuals of iterated rounding it was re-solved to a 0.5-pack gap every
        # round and took most of the time, for the same packs (docs/results/packing-scale.md, "Long packs:
        # heuristics and the warm LP").
        free = list(patterns)
        free += [s[s > 0] for s in lpfhp(histogram, max_len).strategies]
        # Only a start: on sparse histograms (a few sequences a length) this LP is so degenerate that it
        # may not converge in minutes, so it gets WARM_START_ROUNDS rounds (then its best point so far) or
        # WARM_START_SECONDS of estimated work (then its last duals).
        _, y, _, pre_bound, stopped, point = column_generation(
            demand, lengths, max_len, Pricer(lengths, max_len, max_len), free, deadline=deadline,
            max_rounds=WARM_START_ROUNDS, give_up=True, swaps=swaps, budget=WARM_START_SECONDS)
        if past(deadline):  # the unlimited LP's bound also bounds the limited problem
            return patterns, None, None, pre_bound, True, point, None
        centre = y if not stopped else point
    pricer = Pricer(lengths, max_len, depth)
    patterns += [s[s > 0] for s in lpfhp(histogram, depth).strategies]
    if centre is not None:
        patterns += pricer.price(centre, len(lengths))[0]
    solver = ColumnGeneration(demand, lengths, max_len, pricer, patterns, swaps=swaps)
    x, _, value, bound, stopped, point = solver.run(centre=centre, deadline=deadline, gap=gap, known=known,
                                                    budget=budget, floor=floor)
    # (the unlimited LP's bound also bounds the limited problem, however each ended)
    return patterns, x, value, max(bound, pre_bound), stopped, point, solver


# `coarse_bound`'s LP has at most this many lengths: units of ceil(max_len / COARSE_BOUND_UNITS) tokens.
COARSE_BOUND_UNITS = 256


def farley(histogram: np.ndarray, depth: int, y: np.ndarray) -> float:
    """Farley's lower bound y.h / max(1, best pattern value under y) for duals y >= 0 per present length of
    `histogram` (ascending): valid for any such y, as no pack holds more than the best pattern's value."""
    lengths = np.nonzero(histogram)[0] + 1
    top = Pricer(lengths, len(histogram), depth).price(y, 0)[1]
    return float(y @ histogram[lengths - 1]) / max(1.0, top)


def interpolated(histogram: np.ndarray, tokens: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Duals y given at lengths `tokens` (ascending) spread over the present lengths of `histogram`: linear in
    between, 0 at length 0, the last value beyond the last."""
    lengths = np.nonzero(histogram)[0] + 1
    return np.interp(lengths, np.concatenate([[0], tokens]), np.concatenate([[0.0], np.maximum(y, 0.0)]))


def coarse_bound(histogram: np.ndarray, depth: int, deadline=None, units: int = COARSE_BOUND_UNITS) -> float:
    """A proven lower bound on the packs of `histogram`, from an LP of at most `units` lengths: every length
    rounded *down* to units of g = ceil(max_len / units) tokens (shorter ones left out), that LP's duals spread
    linearly over the real lengths (`interpolated`), and Farley's bound on the real lengths under them
    (`farley`: priced exactly, so valid whatever the duals). 0.0 where g is 1 (the real LP is that small) or
    the deadline stopped the LP.

    Where the real LP is large and degenerate its own bound comes last: on 105,556 two-humped lengths at
    8,192 (3,084 distinct) column generation took 42 s to prove 32,622 (its Farley bound was still 0.2% low
    after 10 s), while this proves 32,618 in 0.2 s (units of 32 tokens, 125 lengths; the cheap bound is
    32,446). The step function (each length at its unit's dual) proves only the coarse LP's value, 32,350."""
    max_len = len(histogram)
    g = -(-max_len // units)
    present = np.nonzero(histogram)[0] + 1
    down = present // g
    if g == 1 or not down.any():
        return 0.0
    coarse = np.zeros(max_len // g, dtype=np.int64)
    np.add.at(coarse, down[down > 0] - 1, histogram[present[down > 0] - 1])
    _, x, _, _, stopped, point, solver = solve_relaxation(coarse, depth, [], True, deadline, swaps=True,
                                                           gap=1e-6)
    if stopped or x is None:
        return 0.0
    tokens = (np.nonzero(coarse)[0] + 1) * g
    duals = np.array(solver.lp.h.getSolution().row_dual)  # the coarse LP's own (optimal, unless the call's slack
    # stopped it: Farley's bound holds anyway): one per coarse length
    candidates = [duals] + ([point] if point is not None else [])
    return max(farley(histogram, depth, interpolated(histogram, tokens, y)) for y in candidates)


def _coarse_columns(histogram: np.ndarray, depth: int, deadline, known: int = 0) -> list[np.ndarray]:
    """Patterns of the real lengths from the LP on lengths rounded up to units of 2 tokens (see
    `solve_relaxation`): every support pattern of the coarse LP with each unit replaced by the real lengths
    of that unit, all combinations up to COARSE_VARIANTS a pattern (beyond that, a staircase: the first i
    units at their shortest real length and the rest at their longest, for every i)."""
    import itertools

    max_len = len(histogram)
    g = 2
    present = np.nonzero(histogram)[0] + 1
    # an odd max_len's own length rounds up past the last whole unit: clamped to a full coarse pack, which it
    # fills alone (as it does really), so every coarse pattern stays a real one
    up = np.minimum(-(-present // g), max_len // g)
    coarse = np.zeros(max_len // g, dtype=np.int64)
    np.add.at(coarse, up - 1, histogram[present - 1])
    # (the rounded-up histogram needs at least as many packs as the real one: `known` bounds it too; and each
    # level's LP stops after COARSE_SHARE of the call's patience: at 1,766 uniform lengths at 4,096, depth 4,
    # the level of 883 lengths took 4.5 s, and 1.5 s stopped gave the real LP as good a start)
    patterns, x, *_ = solve_relaxation(coarse, depth, [], True, deadline, known=known,
                                       budget=effort().budget(COARSE_SHARE))
    if x is None:
        return []
    options: dict[int, list[int]] = {}
    for length, unit in zip(present.tolist(), up.tolist()):
        options.setdefault(unit, []).append(length)
    out = []
    for pattern, xi in zip(patterns, x):
        if xi <= 1e-9:
            continue
        choices = [options[int(u)] for u in pattern]
        if math.prod(len(c) for c in choices) <= COARSE_VARIANTS:
            out += [np.array(sorted(combo, reverse=True)) for combo in itertools.product(*choices)]
        else:  # deep patterns: a staircase, the first i slots at their unit's shortest length, the rest longest
            out += [np.array(sorted([c[0] for c in choices[:i]] + [c[-1] for c in choices[i:]], reverse=True))
                    for i in range(len(choices) + 1)]
    return out




def length_index(lengths, max_len):
    index_of = np.full(max_len + 1, -1)
    index_of[lengths] = np.arange(len(lengths))
    return index_of
