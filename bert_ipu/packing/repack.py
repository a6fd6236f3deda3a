"""Exact packing of a small histogram into a given number of packs: an integer program that HiGHS solves or
proves infeasible.

CGHP's dive ends at the bound on almost every histogram, but on a few small ones (a few hundred sequences, a
depth limit) it ends a pack above it, and then nothing says whether the packing or the bound is to blame.
Below a size where HiGHS' branch and bound is quick, CGHP asks this module:

    packs = pack_into(histogram, bins, depth)   # a Mixture of at most `bins` packs, INFEASIBLE, or None

The model counts, for every present length l and pack b, the copies y[l, b] of l in b:

    sum_b y[l, b] = h_l,   sum_l l y[l, b] <= max_len,   sum_l y[l, b] <= depth,   y integer >= 0,

and does nothing against the symmetry between packs: ordering them by the tokens they hold made HiGHS take
4.5 s instead of 0.04 s to find the 18 packs of the case below (proving 17 impossible took 0.05 s without it).
A node limit (more nodes for a smaller model), not a clock, bounds the search, so the same histogram always gets the same answer (a deadline,
when given, can stop it sooner); HiGHS' RINS and RENS sub-MIP heuristics are off, as they spent most of the
time of the searches that found nothing (3.8 s instead of 1.0 s at 20 nodes) and none of the ones that did.

    packs = pack_from(histogram, patterns, start, node_limit)   # fewer packs than `start`, or None

is the other integer program, for CGHP's last step (price and branch): the fewest packs drawn from an LP's
patterns (and `start`'s own packs), from `start`. Its size is the LP's, not lengths x packs, so it also runs
where the model above would be too large; it proves nothing.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import sparse

from .lp import _column_matrix, add_swap_columns, highs_integer, length_index
from .mixture import Mixture, pattern_matrix, trim_excess

INFEASIBLE = "infeasible"
# The largest model tried, in integer variables (present lengths x packs), and the branch-and-bound nodes it
# gets. 268 two-humped lengths at 4,096, depth 16 (189 present lengths x 18 packs: 3,402 variables) were packed
# at their bound in 0.04 s, and 17 packs proven impossible in 0.05 s; models of 3,500-4,700 variables that
# found nothing took up to 1.5 s at 200 nodes, one found its packing at the bound at 200 nodes and not at 20
# (docs/results/packing-scale.md, "Small histograms packed exactly").
MAX_VARIABLES = 5_000
NODE_LIMIT = 200
# A smaller model gets more nodes, for about the same work (nodes x variables): at a flat 200 nodes HiGHS could
# not prove that 9 sequences at 10 tokens need 6 packs (35 variables: 300 nodes, 0.04 s, did).
NODE_WORK = NODE_LIMIT * MAX_VARIABLES


def pack_into(histogram: np.ndarray, bins: int, depth: int, node_limit: int | None = None,
              deadline: float | None = None):
    """A Mixture packing `histogram` into at most `bins` packs of len(histogram) tokens and at most `depth`
    sequences; INFEASIBLE if HiGHS proves that none exists; None if it decides neither within `node_limit`
    branch-and-bound nodes (default: NODE_WORK / variables, at least NODE_LIMIT), or before `deadline`, a
    `time.perf_counter()` value."""
    if bins < 1:
        return INFEASIBLE
    max_len = len(histogram)
    lengths = np.nonzero(histogram)[0] + 1
    m, n = len(lengths), len(lengths) * bins
    demand = histogram[lengths - 1].astype(np.float64)
    var = np.arange(n)                                   # y[l, b] is variable l * bins + b
    of_length, of_pack = np.repeat(np.arange(m), bins), np.tile(np.arange(bins), m)
    rows = np.concatenate([of_length, m + of_pack, m + bins + of_pack])  # demand, tokens, sequences
    values = np.concatenate([np.ones(n), lengths[of_length].astype(np.float64), np.ones(n)])
    A = sparse.csc_matrix((values, (rows, np.tile(var, 3))), shape=(m + 2 * bins, n))
    lower = np.concatenate([demand, np.zeros(2 * bins)])
    upper = np.concatenate([demand, np.full(bins, float(max_len)), np.full(bins, float(depth))])
    cap = np.minimum(histogram[lengths - 1], np.minimum(max_len // lengths, depth))[of_length]

    h, integer = highs_integer()
    h.setOptionValue("mip_max_nodes", int(node_limit or max(NODE_LIMIT, NODE_WORK // n)))
    h.setOptionValue("mip_heuristic_run_rins", False)
    h.setOptionValue("mip_heuristic_run_rens", False)
    if deadline is not None:
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 1e-3))
    h.addRows(len(lower), lower, upper, 0, np.zeros(len(lower), dtype=np.int32), np.zeros(0, dtype=np.int32),
              np.zeros(0))
    h.addCols(n, np.zeros(n), np.zeros(n), cap.astype(np.float64), A.nnz, A.indptr[:-1].astype(np.int32),
              A.indices.astype(np.int32), A.data)
    h.changeColsIntegrality(n, var.astype(np.int32), np.array([integer] * n))
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if status == "Infeasible":
        return INFEASIBLE
    if status != "Optimal":  # node or time limit with no packing found
        return None
    y = np.rint(np.array(h.getSolution().col_value)).astype(np.int64).reshape(m, bins)
    if not (np.array_equal(y.sum(axis=1), histogram[lengths - 1]) and (lengths @ y <= max_len).all()
            and (y.sum(axis=0) <= depth).all()):
        return None  # within HiGHS' integrality tolerance but not a packing once rounded: none found
    packs = [np.repeat(lengths, y[:, b])[::-1].tolist() for b in range(bins) if y[:, b].any()]
    return Mixture.from_lists(packs, [1] * len(packs))


def pack_from(histogram: np.ndarray, patterns: list[np.ndarray], start: Mixture, node_limit: int,
              deadline: float | None = None) -> Mixture | None:
    """The integer program of the restricted master LP (price and branch): the fewest packs drawn from
    `patterns` (length arrays, e.g. an LP's columns) and `start`'s own packs that cover `histogram`, with the
    LP's swap columns (a slot of a longer length may hold a shorter sequence: `lp.MasterLP`), from `start` as
    the incumbent. Returns a packing with fewer packs than `start`, or None (none within `node_limit`
    branch-and-bound nodes or before `deadline`). It proves nothing: a packing may exist that uses other
    patterns."""
    max_len = len(histogram)
    lengths = np.nonzero(histogram)[0] + 1
    m = len(lengths)
    own = [s[s > 0] for s in start.strategies]
    columns = list({tuple(p): p for p in list(patterns) + own if len(p)}.values())
    where = {tuple(p): i for i, p in enumerate(columns)}
    A = _column_matrix(columns, length_index(lengths, max_len), m)  # the LP's own (csc, duplicates summed)

    h, integer = highs_integer()
    inf = h.getInfinity()
    h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("mip_abs_gap", 1 - 1e-6)  # packs are whole: an incumbent within a pack of the LP is optimal
    # (as in `pack_into`: with RINS and RENS, 1,058 patterns of 193 lengths took 4.6 s at the root to find the
    # packing that took 1.1 s without them)
    h.setOptionValue("mip_heuristic_run_rins", False)
    h.setOptionValue("mip_heuristic_run_rens", False)
    if deadline is not None:
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 1e-3))
    h.addRows(m, histogram[lengths - 1].astype(np.float64), np.full(m, inf), 0, np.zeros(m, dtype=np.int32),
              np.zeros(0, dtype=np.int32), np.zeros(0))
    k = add_swap_columns(h, m)  # first, as in the LP: a slot of a longer length may hold a shorter sequence
    n = len(columns)
    h.addCols(n, np.ones(n), np.zeros(n), np.full(n, inf), A.nnz, A.indptr[:-1].astype(np.int32),
              A.indices.astype(np.int32), A.data)
    h.changeColsIntegrality(n + k, np.arange(n + k, dtype=np.int32), np.array([integer] * (n + k)))
    incumbent = np.zeros(n + k)
    for p, count in zip(own, start.counts):
        incumbent[k + where[tuple(p)]] += count
    h.setSolution(n + k, np.arange(n + k, dtype=np.int32), incumbent)
    h.run()
    if not h.getInfo().primal_solution_status:
        return None
    x = np.rint(np.array(h.getSolution().col_value)[k:]).astype(np.int64)
    if x.sum() >= start.n_packs:
        return None
    used = np.nonzero(x)[0]
    packed = trim_excess(pattern_matrix([columns[j] for j in used]), x[used], histogram, swap=True)
    # (within HiGHS' tolerances but not a packing of every sequence once realised: none found)
    return packed if np.array_equal(packed.coverage(max_len), histogram) else None
