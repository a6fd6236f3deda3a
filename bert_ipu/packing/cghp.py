"""CGHP: column-generation histogram packing, with a proven lower bound.

Packing a length histogram into the fewest packs of `max_len` tokens with at most `depth` sequences each
is the cutting-stock problem. Its LP relaxation (Gilmore and Gomory, 1961),

    min  sum_p x_p    s.t.  sum_p a_lp x_p >= h_l  for every length l,   x >= 0,

over all feasible patterns p (a_lp = copies of length l in p), is tight for histograms like BERT's: the
integer optimum is almost always ceil(LP) or ceil(LP) + 1. We

0. run LPFHP (best fit) first and return it at once when it meets the cheap bound (tokens, long sequences,
   depth): at unlimited depth on long-context data it usually does;
1. start from the patterns of LPFHP and, under a depth limit, from the duals of the unlimited-depth LP
   (full histogram only, at most 30 rounds), or with more than 600 distinct lengths from the support of the
   same LP on lengths rounded up to 2-token units (recursively), so that the first restricted LP is
   already close;
2. solve the restricted LP with HiGHS (one model kept warm across rounds) and price new patterns with the
   duals y:
   a pattern improves the LP iff sum_l y_l a_lp > 1, a knapsack over lengths (weight l, value y_l) with
   at most `depth` items, solved exactly by dynamic programming; duals are smoothed (Wentges) because the
   LP is very degenerate;
3. stop when Farley's bound y.h / max(1, best pattern value), valid for any y >= 0, is within half a pack
   (or a millionth) of the restricted LP: that bound is the certificate;
4. round the LP solution down, then (under a depth limit) round up, largest first, the fractional parts of
   at least 0.3 whose sequences are all still left; turn over-covered slots into padding, and solve the
   residual histogram the same way (up to 8 rounds of this "iterated rounding"; each round costs little and shaves packs),
   stopping early once best fit on the residual meets the residual's own bound, or the full problem's;
5. pack the last small residual (a few hundred sequences) with LPFHP best fit. A time-capped MIP over the
   generated patterns was tried here and never beat best fit on the paper's histograms.

`lower_bound = max(cheap bound, ceil(Farley bound))` comes with the result, so users see how far from
optimal the packing is. Histograms whose exact pricing would be slow (long packs, many lengths) are solved
on bucketed lengths (`_bucketed`), and a deadline stops any step with the best packing and bound so far.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from .bounds import lower_bound as cheap_lower_bound, past
from .heuristics import lpfhp, run_lpfhp
from .histogram import expand_histogram
from .mixture import Mixture, trim_excess
from .planned import PLAN_ENOUGH, PLAN_MAX_PACKS, PLAN_MIN_DEPTH, planned

# A pattern prices out when its dual value exceeds 1 by more than this; HiGHS' default tolerances are 1e-7.
PRICING_TOL = 1e-9


# Exact column generation while one pricing round costs about this many seconds (estimated); above it, the
# lengths are bucketed (`_bucketed`).
EXACT_PRICING_SECONDS = 0.1
GRID = 4096           # bucketed: lengths in units of ceil(max_len / GRID) tokens ...
BUCKET_STEP = 1 / 128  # ... and buckets at most 1/128 of their length wide
WARM_START_ROUNDS = 30
COARSE_START_LENGTHS = 600  # depth-limited, more distinct lengths than this: start from the LP's patterns on
                            # lengths rounded up to units of 2 tokens (recursively)
COARSE_VARIANTS = 27        # real-length combinations tried per coarse pattern
# Once the restricted LP has more than PRUNE_COLUMNS columns a length, each round deletes the columns at zero
# with reduced cost above PRUNE_RC (pricing brings one back if it pays again). The LP otherwise grew to
# 15,000 columns at Wikipedia-style 2048, depth 3, where every primal simplex iteration prices them all:
# 0.77-0.94x the time there and at 1024, back to back, same or fewer packs. Depth-limited LPs only: at
# unlimited depth it was 0.87-1.03x, and SQuAD's unlimited packing lost its optimum (40,196 packs, not 40,195).
PRUNE_RC = 0.05
PRUNE_COLUMNS = 3
ROUND_UP = 0.3              # iterated rounding also rounds up fractional parts from this size (`_round`)
# From an LP bound of STOP_PACKS packs, iterated rounding stops at one pack above ceil(LP) (where the integer
# optimum of cutting stock almost always is: it is ceil(LP) or ceil(LP) + 1), 0.0000125% of 8M packs: on
# Wikipedia-style 2048 at unlimited depth (held-out seed 2) four residual rounds, 1.9 s, never improved on a
# packing 1 pack above the bound. Below it (SQuAD, tests) rounds go on as long as they can gain a pack.
STOP_PACKS = 1_000_000


def _slack(lp_bound: float) -> int:
    return 1 if lp_bound >= STOP_PACKS else 0


@dataclass(frozen=True)
class CGHPResult:
    mixture: Mixture
    lp_bound: float   # Farley's bound on the LP relaxation of the full problem (<= the LP optimum)
    lower_bound: int  # proven: no packing with this depth limit uses fewer packs
    time_limit_reached: bool = False
    strategy: str = "exact"  # "heuristic": best fit (met the cheap bound, or the plan did not beat it);
                             # "planned" (`planned.py`); "exact"; "bucketed"


class _Pricer:
    """Exact pricing: the best patterns under duals y, with at most `depth` items of total length <= L."""

    def __init__(self, lengths: np.ndarray, max_len: int, depth: int):
        self.lengths = lengths  # lengths with demand > 0, ascending
        self.max_len = max_len
        self.depth = min(depth, max_len // int(lengths.min()))

    def price(self, y: np.ndarray, n_columns: int) -> tuple[list[np.ndarray], float]:
        """Up to n_columns improving patterns (as length arrays), and the best pattern's value.

        Copies of a length are unbounded (the LP only needs a_lp >= 0). With a depth limit,
        best[k, c] is the largest dual value of at most k items of total length <= c; best[0] = 0
        everywhere, so best[k] is non-decreasing in c. When the limit cannot bind (depth >= L // shortest)
        the classic one-dimensional recursion over capacity is used instead, which is much cheaper.
        """
        L, D = self.max_len, self.depth
        useful = y > 0
        lens, vals, idx = self.lengths[useful], y[useful], np.nonzero(useful)[0]
        if len(vals) > 1:
            # An item worth no more than a shorter one is never needed (swap it for the shorter: the pattern
            # still fits and is worth as much), and with ties broken towards shorter items, as below, the
            # recursions never pick it: same patterns, fewer steps. These are 85-90% of the lengths on
            # Wikipedia-style 1024 and 2048 at depth 3 (Pareto items 100-320 of 1,000-2,000).
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
            # down one capacity at a time was 28% of CGHP on a sparse 2048 histogram)
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


def _highs():
    """A HiGHS instance: the `highspy` package if installed, else the same binding that scipy ships (private
    in scipy, so pinned by requirements.txt's scipy)."""
    try:
        import highspy
        h = highspy.Highs()
    except ImportError:
        from scipy.optimize._highspy._core import _Highs
        h = _Highs()
    h.setOptionValue("output_flag", False)
    # Primal simplex: added columns keep the last solution feasible, so it restarts where it stopped
    # (dual simplex, HiGHS' default, took 1.5-2x longer on Wikipedia-1024 at depth 3).
    h.setOptionValue("simplex_strategy", 4)
    return h


# A depth-limited `_MasterLP`'s first solve uses dual simplex instead (a slack basis is dual feasible):
# all of CGHP at Wikipedia-style 1024, depth 3, 1.75 s -> 1.4 s, and 2048 1.33x faster; at unlimited depth
# it was 1.1-1.3x slower (2048), so there the first solve stays primal.
DUAL_SIMPLEX = 1


class _MasterLP:
    """The restricted master LP  min sum x  s.t.  A x >= demand, x >= 0, kept alive between rounds of
    column generation: new columns are added to the model and HiGHS re-optimises from the last basis (a
    few simplex iterations) instead of solving from scratch (linprog every round was 80% of CGHP's time
    on Wikipedia-1024)."""

    def __init__(self, demand: np.ndarray, index_of: np.ndarray, dual_first: bool = False):
        self.h = _highs()
        self.index_of = index_of
        self.n = 0
        self.dual_next = dual_first  # the first solve only (see DUAL_SIMPLEX)
        inf = self.h.getInfinity()
        m = len(demand)
        self.h.addRows(m, demand.astype(np.float64), np.full(m, inf), 0, np.zeros(m, dtype=np.int32),
                       np.zeros(0, dtype=np.int32), np.zeros(0))

    def add(self, patterns: list[np.ndarray]) -> None:
        if not patterns:
            return
        A = _column_matrix(patterns, self.index_of, int(self.index_of.max()) + 1)  # csc, duplicates summed
        k = len(patterns)
        self.h.addCols(k, np.ones(k), np.zeros(k), np.full(k, self.h.getInfinity()), A.nnz,
                       A.indptr[:-1].astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64))
        self.n += k

    def solve(self, deadline: float | None = None):
        """(x, duals, value), or None if HiGHS stopped at `deadline` (a `time.perf_counter()` value)."""
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
        if self.h.modelStatusToString(status) == "Time limit reached":
            return None
        if self.h.modelStatusToString(status) != "Optimal":
            raise RuntimeError(f"HiGHS failed on the packing LP: {self.h.modelStatusToString(status)}")
        sol = self.h.getSolution()
        x, y = np.array(sol.col_value), np.maximum(np.array(sol.row_dual), 0.0)
        return x, y, float(self.h.getInfo().objective_function_value)

    def prune(self, x: np.ndarray, threshold: float) -> np.ndarray:
        """Delete the columns at zero in the last solution whose reduced cost exceeds `threshold` (nonbasic,
        so the basis stays); returns the mask of the columns kept."""
        drop = (x <= 0) & (np.array(self.h.getSolution().col_dual) > threshold)
        if drop.any():
            self.h.deleteCols(int(drop.sum()), np.nonzero(drop)[0].astype(np.int32))
            self.n -= int(drop.sum())
        return ~drop


def column_generation(demand, lengths, max_len, pricer, patterns, max_rounds=1000, n_columns=None,
                      alpha=0.5, gap=0.5, rel_gap=1e-6, centre=None, deadline=None, give_up=False):
    """Solve the LP relaxation over `demand` (per entry of `lengths`). Returns (x, y, lp_value, bound,
    stopped, point): the restricted LP's solution over `patterns` (which grows in place), its duals and
    value, the bound, whether `deadline` stopped the loop (then `bound` is the best proven so far and x may
    be the previous round's, over the first len(x) patterns, or None), and the dual point that proved `bound`
    (None if none did).

    Dual smoothing (Wentges): price at a point between the best dual point so far (the "centre") and the
    restricted LP's duals. The LP is massively degenerate and its raw duals jump around; smoothing cuts the
    number of rounds several-fold. Any dual point y >= 0 gives Farley's lower bound y.h / max(1, best
    pattern value), so the loop stops as soon as that bound is within `gap` of the restricted LP value.
    """
    if n_columns is None:  # up to one column per length and round: fewer, cheaper rounds than a fixed cap
        n_columns = max(256, len(lengths))
    index_of = _index(lengths, max_len)
    limited = pricer.depth < max_len // int(lengths.min())
    lp = _MasterLP(demand, index_of, dual_first=limited)
    lp.add(patterns)
    bound = 0.0 if centre is None else float(centre @ demand) / max(1.0, pricer.price(centre, 0)[1])
    x = None
    for _ in range(max_rounds):
        solved = lp.solve(deadline)
        if solved is None:  # HiGHS stopped at the deadline: the last round's x covers the first len(x) patterns
            return x, None, None, bound, True, centre
        x, y, value = solved
        a = alpha if centre is not None else 0.0
        while True:
            point = y if a == 0 else a * centre + (1 - a) * y
            new, top = pricer.price(point, n_columns)
            point_bound = float(point @ demand) / max(top, 1.0)
            if point_bound > bound:
                bound, centre = point_bound, point
            # keep only columns that improve the current LP (smoothing can price out stale ones)
            new = [p for p in new if y[index_of[p]].sum() > 1 + PRICING_TOL]
            if new or a == 0:
                break
            a = 0.0  # mis-price: fall back to the LP's own duals
        if not new or value - bound <= max(gap, rel_gap * value):
            return x, y, value, bound, False, centre
        if past(deadline):
            return x, y, value, bound, True, centre
        if limited and lp.n > PRUNE_COLUMNS * len(lengths):
            keep = lp.prune(x, PRUNE_RC)
            patterns[:] = [p for p, k in zip(patterns, keep) if k]
            x = x[keep]
        patterns.extend(new)
        lp.add(new)
    if give_up:  # as if stopped: the bound and dual point so far are valid
        return x, y, value, bound, True, centre
    raise RuntimeError(f"column generation did not converge in {max_rounds} rounds")


def _solve_relaxation(histogram: np.ndarray, depth: int, patterns: list[np.ndarray], warm: bool, deadline):
    """Column generation on `histogram` (may be a residual). Returns (patterns, x, value, bound, stopped)."""
    max_len = len(histogram)
    lengths = np.nonzero(histogram)[0] + 1
    demand = histogram[lengths - 1].astype(np.float64)
    index_of = _index(lengths, max_len)
    # restrict known patterns to the lengths still wanted; singletons keep the LP feasible
    patterns = [p[index_of[p] >= 0] for p in patterns] + [np.array([l]) for l in lengths]
    patterns = list({tuple(p): p for p in patterns if len(p)}.values())
    centre, pre_bound = None, 0.0
    limited = depth < max_len // int(lengths.min())
    if warm and limited and len(lengths) > COARSE_START_LENGTHS:
        # Many lengths: start from the support of the same LP on lengths rounded up to units of 2 tokens
        # (solved the same way, so recursively down to at most COARSE_START_LENGTHS lengths), each coarse
        # pattern expanded into the real lengths of its units (any choice fits: the rounded-up total does).
        # The restricted LP then starts near its optimum instead of at best fit's depth-limited patterns
        # (11.6% above it on Wikipedia-style 1024, depth 3, where exact column generation then spent 13 ever
        # slower rounds): 9.6 s -> 1.9 s there, 60+ s -> 5.9 s at 2048. It replaces the unlimited-depth warm
        # start (with both, 1024 took 5.7 s). At unlimited depth it did not help (2048: 4.0 s -> 4.8 s).
        patterns += _coarse_columns(histogram, depth, deadline)
        warm = False
    if warm and limited:
        # The unlimited-depth LP is cheap, and its duals are a strong start for the limited one: they give
        # a Farley bound close to the final one and price out good first columns. Only worth it on the full
        # histogram: on the small residuals of iterated rounding it was re-solved to a 0.5-pack gap every
        # round and took 88% of the time (Wikipedia-2048, depth 3: 206 s -> 12.9 s without it, same packs).
        free = list(patterns)
        free += [s[s > 0] for s in lpfhp(histogram, max_len).strategies]
        # Only a start: on sparse histograms (a few sequences a length) this LP is so degenerate that it
        # may not converge in minutes, so it gets WARM_START_ROUNDS rounds and then its best point so far.
        _, y, _, pre_bound, stopped, point = column_generation(
            demand, lengths, max_len, _Pricer(lengths, max_len, max_len), free, deadline=deadline,
            max_rounds=WARM_START_ROUNDS, give_up=True)
        if past(deadline):  # the unlimited LP's bound also bounds the limited problem
            return patterns, None, None, pre_bound, True, point
        centre = y if not stopped else point
    pricer = _Pricer(lengths, max_len, depth)
    patterns += [s[s > 0] for s in lpfhp(histogram, depth).strategies]
    if centre is not None:
        patterns += pricer.price(centre, len(lengths))[0]
    x, _, value, bound, stopped, point = column_generation(demand, lengths, max_len, pricer, patterns,
                                                           centre=centre, deadline=deadline)
    return patterns, x, value, max(bound, pre_bound if stopped else 0.0), stopped, point


def _coarse_columns(histogram: np.ndarray, depth: int, deadline) -> list[np.ndarray]:
    """Patterns of the real lengths from the LP on lengths rounded up to units of 2 tokens (see
    `_solve_relaxation`): every support pattern of the coarse LP with each unit replaced by the real lengths
    of that unit, all combinations up to COARSE_VARIANTS a pattern (beyond that, a staircase: the first i
    units at their shortest real length and the rest at their longest, for every i)."""
    import itertools

    max_len = len(histogram)
    g = 2
    present = np.nonzero(histogram)[0] + 1
    up = -(-present // g)
    coarse = np.zeros(max_len // g, dtype=np.int64)
    np.add.at(coarse, up - 1, histogram[present - 1])
    patterns, x, *_ = _solve_relaxation(coarse, depth, [], True, deadline)
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


def _as_matrix(patterns: list[np.ndarray]) -> np.ndarray:
    """Ragged patterns (0 entries allowed) as one zero-padded (n, width) matrix."""
    mat = np.zeros((len(patterns), max(len(p) for p in patterns)), dtype=np.int64)
    for i, p in enumerate(patterns):
        mat[i, : len(p)] = p
    return mat


def pricing_seconds(n_lengths: int, max_len: int, depth: int, shortest: int) -> float:
    """A rough estimate of one exact pricing round (measured on this project's CPU): the capacity loop of
    the unlimited recursion, or depth x lengths vector operations over the capacities."""
    if depth >= max_len // shortest:
        return max_len * (3e-6 + n_lengths * 2e-9)
    return depth * n_lengths * (1e-6 + max_len * 1e-9)


def cghp(histogram: np.ndarray, depth: int, residual_rounds: int = 8, patience: int = 3,
         deadline: float | None = None) -> CGHPResult:
    """Pack `histogram` with at most `depth` sequences a pack; see the module docstring.

    Best fit (LPFHP) comes first: when it meets the cheap bound (tokens, long sequences, depth) it is
    optimal and returned at once. Under a depth limit where the token bound binds, with at most
    PLAN_MAX_PACKS packs, `planned` (an LP over class means realised with the real lengths) comes next on
    long or sparse histograms, and is returned when exact pricing would be slow or it is within PLAN_ENOUGH
    of the cheap bound. Otherwise a histogram whose exact pricing is cheap is solved exactly (`_exact`,
    with the best packing so far as the one to beat), a larger one on bucketed lengths (`_bucketed`). `deadline` (a
    `time.perf_counter()` value): past it, the best packing and the best bound found so far are returned,
    with time_limit_reached set.
    """
    max_len = len(histogram)
    cheap = cheap_lower_bound(histogram, depth)
    start, late = run_lpfhp(histogram, depth, deadline=deadline)
    if start.n_packs <= cheap or late:
        return CGHPResult(start, float(cheap), cheap, late, "heuristic")
    lengths = np.nonzero(histogram)[0] + 1
    expensive = pricing_seconds(len(lengths), max_len, depth, int(lengths[0])) > EXACT_PRICING_SECONDS
    if _plannable(histogram, depth, cheap, expensive):
        plan = planned(histogram, depth, deadline)
        used = plan.n_packs < start.n_packs
        start = plan if used else start
        if expensive or start.n_packs <= cheap * (1 + PLAN_ENOUGH) or past(deadline):
            return CGHPResult(start, float(cheap), cheap, past(deadline), "planned" if used else "heuristic")
    if expensive:
        return _bucketed(histogram, depth, start, cheap, residual_rounds, patience, deadline)
    mixture, lp_bound, _, late = _exact(histogram, depth, start, residual_rounds, patience, deadline)
    return CGHPResult(mixture, lp_bound, max(cheap, math.ceil(lp_bound - 1e-6)), late, "exact")


def _plannable(histogram: np.ndarray, depth: int, cheap: int, expensive: bool) -> bool:
    """Whether `planned` is worth running first: a depth limit that can bind, the token bound at least the
    depth bound (so packs must be full), at most PLAN_MAX_PACKS packs (it realises them one by one), and
    either exact pricing too slow, or a limit of at least PLAN_MIN_DEPTH with more than COARSE_START_LENGTHS
    lengths: there exact column generation was slow and worse on sparse long-context histograms (100,000
    lengths at 2,048, depth 6: 45,099 packs at a 60 s limit against 42,630 in 2 s; depth 8: 42,646 in 41 s
    against 42,622 in 2 s), while at depth 3 it was better (200,000 at 1,024: 118,380 in 6.7 s against
    118,507)."""
    max_len = len(histogram)
    if cheap > PLAN_MAX_PACKS or depth >= max_len // (int(np.argmax(histogram > 0)) + 1):
        return False
    tokens = int((np.arange(1, max_len + 1) * histogram).sum())
    if math.ceil(tokens / max_len) < math.ceil(int(histogram.sum()) / depth):
        return False
    return expensive or (depth >= PLAN_MIN_DEPTH and int((histogram > 0).sum()) > COARSE_START_LENGTHS)


def _exact(histogram, depth, start, residual_rounds, patience, deadline):
    """Iterated rounding of column generation. Every round yields a candidate: the packs rounded down so far
    plus best fit on what is left; the best candidate wins. Rounds stop when best fit meets the residual's
    own LP bound (nothing left to gain), after `patience` rounds without a better candidate, after
    `residual_rounds`, or at the deadline. Returns (mixture, LP bound of the full problem, the dual point
    that proved it (per present length, or None), stopped)."""
    max_len = len(histogram)
    rounded: list[Mixture] = []
    residual = histogram.copy()
    patterns: list[np.ndarray] = []
    lp_bound, point, best, best_packs, stale, late = 0.0, None, [start], start.n_packs, 0, False
    # rounding up pays where best fit packs a residual badly: under a depth limit (21% above the residual's LP
    # at Wikipedia-style 1024, depth 3); at unlimited depth it bought nothing on Wikipedia-512 and cost an
    # extra residual LP (0.38 -> 0.48 s)
    up = ROUND_UP if depth < max_len // int(np.nonzero(histogram)[0][0] + 1) else None
    for round_ in range(residual_rounds):
        if round_ > 0:
            # rounded so far plus best fit on the residual may already meet the full problem's bound (up to
            # `_slack`): then the residual's LP (a fresh model over every pattern so far: 0.4-1.2 s on
            # Wikipedia-style 2048, unlimited depth) can gain at most that
            tail = lpfhp(residual, depth)
            if sum(m.n_packs for m in rounded) + tail.n_packs <= math.ceil(lp_bound - 1e-6) + _slack(lp_bound):
                best = rounded + [tail]
                break
        patterns, x, _, bound, late, dual = _solve_relaxation(residual, depth, patterns, round_ == 0, deadline)
        if round_ == 0:
            lp_bound, point = bound, dual
        if late:
            if x is not None and np.floor(x + 1e-9).sum() > 0:
                # stopped mid-way with a restricted LP solution: its rounding plus best fit on the rest is
                # usually far better than best fit alone
                part = trim_excess(_as_matrix(patterns[:len(x)]), np.floor(x + 1e-9).astype(np.int64), residual)
                rest = residual - part.coverage(max_len)
                tail = [lpfhp(rest, depth)] if rest.sum() else []
                packs = sum(m.n_packs for m in rounded + [part] + tail)
                if packs < best_packs:
                    best, best_packs = rounded + [part] + tail, packs
            break
        best_fit = start if round_ == 0 else tail
        packs = sum(m.n_packs for m in rounded) + best_fit.n_packs
        if packs < best_packs:
            best, best_packs, stale = rounded + [best_fit], packs, 0
        else:
            stale += 1
        whole = _round(patterns, x, residual, up)
        if best_fit.n_packs <= math.ceil(bound - 1e-6) or stale >= patience or whole.sum() == 0:
            break
        part = trim_excess(_as_matrix(patterns[:len(x)]), whole, residual)
        rounded.append(part)
        residual = residual - part.coverage(max_len)
        if residual.sum() == 0:
            best = rounded
            break
    else:  # the last round's rounding, with best fit on its residual, is a candidate too
        tail = lpfhp(residual, depth)
        if sum(m.n_packs for m in rounded) + tail.n_packs < best_packs:
            best = rounded + [tail]
    return Mixture.concat(best), lp_bound, point, late


def _round(patterns: list[np.ndarray], x: np.ndarray, residual: np.ndarray, up: float | None) -> np.ndarray:
    """Packs per pattern from an LP solution x over `residual`: x rounded down, then (unless `up` is None),
    largest fractional part first, one more pack of each pattern whose part is at least `up` while all of its
    sequences are still left (no padding is added). Rounding down alone left 812 sequences on Wikipedia-style
    1024, depth 3, which best fit packed 21% above their LP, and the residual LPs that peeled them off a few
    at a time (a fresh model over every pattern so far) were 30% of the time, ending 21-43 packs above the
    bound; rounding up first leaves 130-250, and the packing ends 0-1 packs above the bound (1024 and 2048,
    seeds 0-2)."""
    whole = np.floor(x + 1e-9).astype(np.int64)
    if up is None:
        return whole
    sizes = np.array([len(p) for p in patterns[:len(x)]])
    flat = np.concatenate(patterns[:len(x)])
    covered = np.bincount(flat - 1, weights=np.repeat(whole, sizes), minlength=len(residual))
    left = residual - np.rint(covered).astype(np.int64)  # negative where rounding down over-covers (padding)
    frac = x - whole
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for j in np.argsort(-frac, kind="stable"):
        if frac[j] < up:
            break
        items, need = np.unique(flat[starts[j]: starts[j + 1]] - 1, return_counts=True)
        if (left[items] >= need).all():
            left[items] -= need
            whole[j] += 1
    return whole


def _bucket_edges(units: int) -> np.ndarray:
    """Upper edges of the length buckets, in units: every unit up to 1 / BUCKET_STEP, then buckets at most
    BUCKET_STEP of their length wide; the last edge is `units`."""
    edges, u = [], 1
    while u < units:
        edges.append(u)
        u = max(u + 1, int(u * (1 + BUCKET_STEP)))
    edges.append(units)
    return np.array(edges, dtype=np.int64)


def _bucketed(histogram, depth, start, cheap, residual_rounds, patience, deadline) -> CGHPResult:
    """Column generation on a coarser histogram: lengths rounded *up* to units of g = ceil(max_len / GRID)
    tokens and then to buckets at most 1/128 wide, so pricing costs the same at any pack length. A packing of
    the rounded-up lengths is a packing of the real ones (each real sequence takes a slot of its bucket).

    The rounded-up instance's LP bound is no bound for the real one. The bound reported is proven on the
    real one: Farley's bound y.h / max(1, best pattern value under y) holds for any duals y >= 0, and here
    the best pattern is priced on the lengths rounded *down* to their bucket's smallest (a relaxation: every
    real pattern stays feasible), with y the coarse LP's best duals; or the cheap bound if that is larger."""
    max_len = len(histogram)
    g = -(-max_len // GRID)
    units = max_len // g
    edges = _bucket_edges(units)
    present = np.nonzero(histogram)[0] + 1
    rounded_up = edges[np.searchsorted(edges, -(-present // g))]  # unit length of each present length
    coarse = np.zeros(units, dtype=np.int64)
    np.add.at(coarse, rounded_up - 1, histogram[present - 1])
    coarse_start, late = run_lpfhp(coarse, depth, deadline=deadline)
    lp_bound, lower = float(cheap), cheap
    if not late:
        mixture, _, point, late = _exact(coarse, depth, coarse_start, residual_rounds, patience, deadline)
        if mixture.n_packs < start.n_packs:
            start = _realise(mixture, histogram, present, rounded_up)
        if point is not None:
            coarse_lengths = np.nonzero(coarse)[0] + 1               # the rows of `point`, ascending
            smallest = np.full(units + 1, max_len + 1, dtype=np.int64)
            np.minimum.at(smallest, rounded_up, present)              # in tokens
            down = smallest[coarse_lengths]                           # ascending too (buckets are)
            top = _Pricer(down, max_len, depth).price(point, 0)[1]
            farley = float(point @ coarse[coarse_lengths - 1]) / max(1.0, top)
            lp_bound = max(lp_bound, farley)
            lower = max(cheap, math.ceil(farley - 1e-6))
    return CGHPResult(start, lp_bound, lower, late, "bucketed")


def _realise(coarse: Mixture, histogram, present, rounded_up) -> Mixture:
    """Fill the slots of a mixture over rounded-up unit lengths with the real lengths: the k-th slot of a
    unit length gets the k-th real sequence rounded up to it (both in ascending order of that unit)."""
    slots, offsets = coarse.expand_ragged()
    real = expand_histogram(histogram)                           # ascending, so their units are too
    unit_of = np.zeros(len(histogram) + 1, dtype=np.int64)
    unit_of[present] = rounded_up
    filled = np.empty(len(slots), dtype=np.int64)
    filled[np.argsort(slots, kind="stable")] = real[np.argsort(unit_of[real], kind="stable")]
    return Mixture.from_ragged(filled, offsets, np.ones(len(offsets) - 1, dtype=np.int64))


def _index(lengths, max_len):
    index_of = np.full(max_len + 1, -1)
    index_of[lengths] = np.arange(len(lengths))
    return index_of
