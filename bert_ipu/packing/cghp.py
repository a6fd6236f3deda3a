"""CGHP: column-generation histogram packing, with a proven lower bound.

Packing a length histogram into the fewest packs of `max_len` tokens with at most `depth` sequences each
is the cutting-stock problem. Its LP relaxation (Gilmore and Gomory, 1961),

    min  sum_p x_p    s.t.  sum_p a_lp x_p >= h_l  for every length l,   x >= 0,

over all feasible patterns p (a_lp = copies of length l in p), is tight for histograms like BERT's: the
integer optimum is almost always ceil(LP) or ceil(LP) + 1. We

1. start from the patterns of LPFHP (best fit) and, under a depth limit, from the duals of the cheap
   unlimited-depth LP, so that the first restricted LP is already close;
2. solve the restricted LP with HiGHS (`scipy.optimize.linprog`) and price new patterns with the duals y:
   a pattern improves the LP iff sum_l y_l a_lp > 1, a knapsack over lengths (weight l, value y_l) with
   at most `depth` items, solved exactly by dynamic programming; duals are smoothed (Wentges) because the
   LP is very degenerate;
3. stop when Farley's bound y.h / max(1, best pattern value), valid for any y >= 0, is within half a pack
   of the restricted LP: that bound is the certificate;
4. round the LP solution down, turn over-covered slots into padding, and solve the residual histogram the
   same way (up to 8 rounds of this "iterated rounding"; each round costs little and shaves packs),
   stopping early once best fit on the residual meets the residual's own bound;
5. pack the last small residual (a few hundred sequences) with LPFHP best fit. A time-capped MIP over the
   generated patterns was tried here and never beat best fit on the paper's histograms.

`lower_bound = max(ceil(tokens / max_len), ceil(Farley bound))` comes with the result, so users see how far
from optimal the packing is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, sparse

from .heuristics import lpfhp
from .mixture import Mixture, trim_excess

# A pattern prices out when its dual value exceeds 1 by more than this; HiGHS' default tolerances are 1e-7.
PRICING_TOL = 1e-9


@dataclass(frozen=True)
class CGHPResult:
    mixture: Mixture
    lp_bound: float   # Farley's bound on the LP relaxation of the full problem (<= the LP optimum)
    lower_bound: int  # proven: no packing with this depth limit uses fewer packs


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
            rest = D - 1
        # Several columns per round: for every length l, the best pattern that contains l.
        with_l = y + best[rest, L - self.lengths]
        columns, seen = [], set()
        for j in np.argsort(-with_l):
            if with_l[j] <= 1 + PRICING_TOL or len(columns) >= n_columns:
                break
            length = int(self.lengths[j])
            pattern = tuple(sorted([length] + self._backtrack(choice, rest, L - length, D is None)))
            if pattern not in seen:
                seen.add(pattern)
                columns.append(np.array(pattern))
        return columns, float(best[-1, L])

    def _backtrack(self, choice, k, c, unlimited):
        items = []
        while c > 0 and k > 0:
            j = int(choice[k, c])
            if j < 0:  # unlimited: capacity c - 1 is as good
                c -= 1
                continue
            if j:
                items.append(int(self.lengths[j - 1]))
                c -= items[-1]
            if not unlimited:
                k -= 1
            elif j == 0:
                break
        return items


def _solve_lp(A: sparse.csc_matrix, demand: np.ndarray):
    res = optimize.linprog(np.ones(A.shape[1]), A_ub=-A, b_ub=-demand, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the packing LP: {res.message}")
    return res.x, -res.ineqlin.marginals, res.fun


def _column_matrix(patterns: list[np.ndarray], index_of: np.ndarray, n_rows: int) -> sparse.csc_matrix:
    rows = np.concatenate([index_of[p] for p in patterns])
    cols = np.repeat(np.arange(len(patterns)), [len(p) for p in patterns])
    return sparse.csc_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_rows, len(patterns)))


def column_generation(demand, lengths, max_len, pricer, patterns, max_rounds=1000, n_columns=256,
                      alpha=0.5, gap=0.5, centre=None):
    """Solve the LP relaxation over `demand` (per entry of `lengths`). Returns (x, y, lp_value, bound):
    the restricted LP's solution over `patterns` (which grows in place), its duals and value, and the bound.

    Dual smoothing (Wentges): price at a point between the best dual point so far (the "centre") and the
    restricted LP's duals. The LP is massively degenerate and its raw duals jump around; smoothing cuts the
    number of rounds several-fold. Any dual point y >= 0 gives Farley's lower bound y.h / max(1, best
    pattern value), so the loop stops as soon as that bound is within `gap` of the restricted LP value.
    """
    index_of = _index(lengths, max_len)
    A = _column_matrix(patterns, index_of, len(lengths))
    bound = 0.0 if centre is None else float(centre @ demand) / max(1.0, pricer.price(centre, 0)[1])
    for _ in range(max_rounds):
        x, y, value = _solve_lp(A, demand)
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
        if not new or value - bound <= gap:
            return x, y, value, bound
        patterns.extend(new)
        A = sparse.hstack([A, _column_matrix(new, index_of, len(lengths))], format="csc")
    raise RuntimeError(f"column generation did not converge in {max_rounds} rounds")


def _solve_relaxation(histogram: np.ndarray, depth: int, patterns: list[np.ndarray]):
    """Column generation on `histogram` (may be a residual). Returns (patterns, x, value, bound)."""
    max_len = len(histogram)
    lengths = np.nonzero(histogram)[0] + 1
    demand = histogram[lengths - 1].astype(np.float64)
    index_of = _index(lengths, max_len)
    # restrict known patterns to the lengths still wanted; singletons keep the LP feasible
    patterns = [p[index_of[p] >= 0] for p in patterns] + [np.array([l]) for l in lengths]
    patterns = list({tuple(p): p for p in patterns if len(p)}.values())
    centre = None
    if depth < max_len // int(lengths.min()):
        # The unlimited-depth LP is cheap, and its duals are a strong start for the limited one: they give
        # a Farley bound close to the final one and price out good first columns.
        free = list(patterns)
        free += [s[s > 0] for s in lpfhp(histogram, max_len).strategies]
        _, centre, _, _ = column_generation(demand, lengths, max_len, _Pricer(lengths, max_len, max_len), free)
    pricer = _Pricer(lengths, max_len, depth)
    patterns += [s[s > 0] for s in lpfhp(histogram, depth).strategies]
    if centre is not None:
        patterns += pricer.price(centre, len(lengths))[0]
    x, _, value, bound = column_generation(demand, lengths, max_len, pricer, patterns, centre=centre)
    return patterns, x, value, bound


def _as_matrix(patterns: list[np.ndarray]) -> np.ndarray:
    """Ragged patterns (0 entries allowed) as one zero-padded (n, width) matrix."""
    mat = np.zeros((len(patterns), max(len(p) for p in patterns)), dtype=np.int64)
    for i, p in enumerate(patterns):
        mat[i, : len(p)] = p
    return mat


def cghp(histogram: np.ndarray, depth: int, residual_rounds: int = 8, patience: int = 3) -> CGHPResult:
    """Pack `histogram` with at most `depth` sequences a pack; see the module docstring.

    Every round of iterated rounding yields a candidate: the packs rounded down so far plus best fit on
    what is left. The best candidate wins. Rounds stop when best fit meets the residual's own LP bound
    (nothing left to gain), after `patience` rounds without a better candidate, or after `residual_rounds`.
    """
    max_len = len(histogram)
    tokens = int((np.arange(1, max_len + 1) * histogram).sum())
    rounded: list[Mixture] = []
    residual = histogram.copy()
    patterns: list[np.ndarray] = []
    lp_bound, best, stale = None, None, 0
    for _ in range(residual_rounds):
        patterns, x, _, bound = _solve_relaxation(residual, depth, patterns)
        lp_bound = bound if lp_bound is None else lp_bound
        best_fit = lpfhp(residual, depth)
        candidate = rounded + [best_fit]
        if best is None or sum(m.n_packs for m in candidate) < sum(m.n_packs for m in best):
            best, stale = candidate, 0
        else:
            stale += 1
        whole = np.floor(x + 1e-9).astype(np.int64)
        if best_fit.n_packs <= math.ceil(bound - 1e-6) or stale >= patience or whole.sum() == 0:
            break
        part = trim_excess(_as_matrix(patterns), whole, residual)
        rounded.append(part)
        residual = residual - part.coverage(max_len)
        if residual.sum() == 0:
            best = rounded
            break
    mixture = Mixture.from_matrix(_as_matrix([row for m in best for row in m.strategies]),
                                  np.concatenate([m.counts for m in best]))
    lower = max(math.ceil(tokens / max_len), math.ceil(lp_bound - 1e-6))
    return CGHPResult(mixture, lp_bound, lower)


def _index(lengths, max_len):
    index_of = np.full(max_len + 1, -1)
    index_of[lengths] = np.arange(len(lengths))
    return index_of
