"""CGHP: column-generation histogram packing, with a proven lower bound.

Packing a length histogram into the fewest packs of `max_len` tokens with at most `depth` sequences each
is the cutting-stock problem. Its LP relaxation (Gilmore and Gomory, 1961),

    min  sum_p x_p    s.t.  sum_p a_lp x_p >= h_l  for every length l,   x >= 0,

over all feasible patterns p (a_lp = copies of length l in p), is tight for histograms like BERT's: the
integer optimum is almost always ceil(LP) or ceil(LP) + 1. We

0. run LPFHP (best fit) first and return it at once when it meets the cheap bound (Martello and Toth's L2,
   depth): at unlimited depth on long-context data it usually does; else bin completion (`complete.py`)
   looks briefly for a packing at the cheap bound (returned: optimal) or proves there is none (the bound
   rises by one); where the tokens set that bound and best fit is at most 16 packs above it, its room is
   gathered into its emptiest packs (`neighbourhood.py`; a pack above the bound, then the pool search of
   `tabu.py` for 0.5 estimated seconds), returned where that reaches the bound; else (except where the plan,
   bucketed lengths or fine buckets take over, below) the minimum-slack fill (`fill.py`; below 1,000 packs
   where the depth limit can bind, also with the lengths in a seeded random order), returned when it meets the
   bound: on small, sparse histograms it usually does; where the fill's or the plan's packing is a pack above
   the cheap bound (from 100 packs), its room is gathered and the pool searches it, as best fit's above;
1. start from the patterns of LPFHP and, under a depth limit, from the duals of the unlimited-depth LP
   (full histogram only, at most 30 rounds or 1.5 estimated seconds of work), or with more than 600
   distinct lengths (and at least 8 sequences a length) from the support of the same LP on lengths rounded
   up to 2-token units (recursively), so that the first restricted LP is already close;
2. solve the restricted LP with HiGHS (one model kept warm across rounds, with Valerio de Carvalho's swap
   columns: a slot of a longer length may hold a shorter sequence, `lp.MasterLP`) and price new patterns
   with the duals y: a pattern improves the LP iff sum_l y_l a_lp > 1, a knapsack over lengths (weight l,
   value y_l) with at most `depth` items, solved exactly by dynamic programming; duals are smoothed
   (Wentges) because the LP is very degenerate;
3. stop when Farley's bound y.h / max(1, best pattern value), valid for any y >= 0, rounded up meets the
   restricted LP's value rounded up, or the cheap bound does (no LP bound can prove more), or it is within a
   millionth: that bound is the certificate;
4. dive (`_exact`): fix packs from the LP solution (its whole parts; under a depth limit also, largest
   first, fractional parts of at least 0.3 whose sequences are all still left; then the largest fractional
   parts until at least 1/8 of the LP's packs are fixed), fill their slots with real sequences (a slot the LP
   swapped holds a shorter one, an over-covered one is padding), and re-solve the LP of what is left from its
   last basis (a fresh LP once less than half of the sequences is left), until a candidate meets the bound,
   the packs fixed plus the residual's bound cannot beat the best candidate, or 100 steps;
5. every step's candidate is the packs fixed so far plus LPFHP best fit, or the fill where it takes fewer
   packs, on the rest; the best wins. A time-capped MIP over the generated patterns was tried here and never
   beat best fit on the paper's histograms (a node-limited one is the last step, 9, on small models). Once
   at most ENDGAME sequences are left, bin completion (`complete.py`) decides them exactly at the residual's
   bound, within a node limit;
6. on a small histogram still above its bound (present lengths x bound at most 5,000), ask an integer
   program over copies of each length in each pack (`repack.py`) for a packing at the bound, where it decides
   nothing bin completion with more nodes, and where either proves there is none, raise the bound by one
   (`_settle`);
7. on any histogram still above the goal (the bound; from 1,000 packs, within 0.1% of it), gather its room into
   its emptiest packs until one empties, then search with a pool of unpacked sequences, then repack groups of
   the emptiest packs into one pack fewer by bin completion, within 2 estimated seconds (`_improve`,
   `neighbourhood.py`, `tabu.py`): where exact pricing is dear on a small histogram, the plan or best fit is
   returned at once, often a pack above the bound, and this is what reaches it;
8. on a packing still above the goal whose bound no LP on the real lengths proved (the plan or best fit returned
   at once, bucketed lengths), column generation on the real lengths for PROVE_SECONDS, for its bound only
   (`_prove`): there the packing is often optimal and only the cheap bound said otherwise;
9. on a packing still above the goal, the integer program over the patterns of that LP or the dive's first
   and the packing's own packs, from the packing, within BRANCH_NODES nodes (`_branch`, price and branch).

`lower_bound = max(cheap bound, ceil(Farley bound))` comes with the result, so users see how far from
optimal the packing is; with more than 600 distinct lengths also `lp.coarse_bound`, proven first from a small
LP (its duals spread over the real lengths), so a large LP stopped by a deadline still reports a strong bound.
Histograms whose exact pricing would be slow (long packs, many lengths) are solved on bucketed lengths
(`_bucketed`); large ones (from 1,000 packs, L > 2,048) whose pricing is slowish (0.04-0.1 s a round:
FINE_PRICING_SECONDS) keep a start already within 0.1% of the bound, or are first packed on finer buckets,
kept within 0.1% of the bound, else the start of the dive. A deadline stops any step with the best packing
and bound so far. Each call counts its work (`effort.py`, deterministic): past its patience, from 1,000 packs,
the LPs stop within 0.05% of the bound and the dive at a packing within 0.1% of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .bounds import lower_bound as cheap_lower_bound, past, proven, tokens_bound
from .complete import NODE_LIMIT, complete
from .fill import FILL_WORDS, fill
from .heuristics import lpfhp, run_lpfhp
from .histogram import expand_histogram
from .mixture import Mixture, pattern_matrix, trim_excess
from .effort import GOAL_GAP, counting, effort
from .lp import (COARSE_START_LENGTHS, LPFailure, coarse_bound, farley, interpolated, pricing_seconds,
                 solve_relaxation)
from .neighbourhood import neighbourhood
from .planned import PLAN_ENOUGH, PLAN_MAX_PACKS, PLAN_MIN_DEPTH, planned
from .repack import INFEASIBLE, MAX_VARIABLES, pack_from, pack_into



# Exact column generation while one pricing round costs about this many seconds (estimated); above it, the
# lengths are bucketed (`_bucketed`).
EXACT_PRICING_SECONDS = 0.1
GRID = 4096           # bucketed: lengths in units of ceil(max_len / GRID) tokens ...
BUCKET_STEP = 1 / 128  # ... and buckets at most 1/128 of their length wide
# A large histogram (from 1,000 packs, where 0.1% is a pack: `effort.Effort.tolerant`) whose exact pricing
# would still cost more than FINE_PRICING_SECONDS a round keeps the best packing so far if it is within 0.1% of
# the bound known (`effort.Effort.near`); else it is first packed on lengths in units of ceil(max_len /
# FINE_GRID) tokens (no wider buckets), kept where it is within 0.1% of the bound; else exact column generation
# goes on from it. On 43 such random histograms (of at least 2,000 packs) exact column generation took up to
# 21 s (16 of them over 5 s), the fine bucketed one at most 2.8 s, mostly with the same packs or fewer; from
# 1,000 packs it took 1,336 packs from 22 s to 0.3 s, the plan being within a pack
# (docs/results/packing-scale.md, "Fine buckets first on large histograms"). From 0.04 s rather than 0.06 s:
# 30,508 two-humped lengths at 4,096, depth 6 (0.043 s a round) then packed at 6,691 in 3.8 s instead of 6,693 in
# 5.2 s; of the 399 other random cases one took a pack more (1,840 / 1,839 in 0.7 s instead of 4 s), and three
# proved a bound 1-9 packs weaker (docs/results/packing-scale.md, "Relaxing from 1,000 packs").
FINE_PRICING_SECONDS = 0.04
FINE_GRID = 2048
# Fills with the lengths in a seeded random order after the one longest first, where the depth limit can bind
# below 1,000 packs (`_cghp`; docs/results/packing-scale.md, "A shuffled fill").
SHUFFLED_FILLS = 1
ROUND_UP = 0.3              # under a depth limit the dive also rounds up fractional parts from this size (`_round`)
# The most steps of a dive (`_exact`): each fixes at least one pack and re-solves the residual's LP warm. A
# count, not a clock, so that the same histogram always packs the same way. On the 80 histograms of
# benchmarks/packing_small.py (seeds 0 and 1) a dive took at most 18 steps.
DIVE_STEPS = 100
# A dive step fixes at least 1/DIVE_SHARE of the residual LP's packs: one pack a step (the dive proper) took
# a hundred steps on residuals of a few hundred sequences that bulk rounding left on large histograms.
DIVE_SHARE = 8
# A residual of less than 1/FRESH_LP of the sequences the LP was built for gets a fresh LP over its own lengths:
# re-solving the warm one, with every pattern of the full histogram, took 0.5 s where a fresh one took 0.08 s
# (Wikipedia-style 2048, depth 3, 454 sequences left of 16M). From half, not 1/8: on the residuals a dive leaves
# after its first step the warm LP's re-solves took 0.25-2 s each where a fresh one took 0.06-0.3 s, and the
# fresh LPs' solutions rounded better (30,508 two-humped lengths at 4,096, depth 6: 6,687 packs, the bound, in
# 14 s instead of 6,688 in 21 s; 240 random cases: three more at the bound, none worse;
# docs/results/packing-scale.md, "A bound first, from a small LP").
FRESH_LP = 2
# From an LP bound of STOP_PACKS packs, iterated rounding stops at one pack above ceil(LP) (where the integer
# optimum of cutting stock almost always is: it is ceil(LP) or ceil(LP) + 1), 0.0000125% of 8M packs: on
# Wikipedia-style histograms the residual rounds that chased that last pack took much time and gained nothing
# (docs/results/packing-scale.md, "Stop at one pack above ceil(LP)"). Below it (SQuAD, tests) rounds go on as
# long as they can gain a pack.
STOP_PACKS = 1_000_000
# A residual of at most ENDGAME sequences is decided by bin completion (`complete.py`) at its bound: where
# packs must be almost full, the dive's last steps, fixing packs of a fractional LP solution over a few dozen
# sequences, cost a pack (1,583 lengths uniform in 5-22% of 2,048, depth 8: 216 against the bound 215; the
# search packed the last 55 sequences into the 7 packs the bound allows, in 0.02 s).
ENDGAME = 60
# Bin completion's nodes at the cheap bound before anything else (after best fit): about 0.1 s where it decides
# nothing. On the 240 cases of benchmarks/packing_small.py (mixed seeds 0-1, ranges 0-3) best fit missed the
# cheap bound of at most 3,000 packs on 115; at 30,000 nodes the search found a packing at it on 11 and proved
# it impossible on 2 (821 lengths uniform in 6-55% of 8,192, depth 16: 244 packs, the bound, in 0.02 s, where
# the plan ended at 245). At 200,000 nodes it found 18, among them 2,124 lengths uniform in 13-43% of 8,192,
# depth 4 (606 in 0.44 s, where the dive took 6 s), but cost 0.7-0.8 s on each of the 60 histograms of over
# 600 lengths where it decided nothing, which would take six of them past 5 s (docs/results/packing-scale.md,
# "Bin completion: the last packs of tight histograms").
FIRST_NODES = NODE_LIMIT
# ... only where it could reach the last pack: it takes a node a sequence of each pack, and the packings it
# found took 10-40 nodes a pack. On larger histograms (Wikipedia-style, 8M packs) it only cost 0.15 s.
NODES_A_PACK = 10
# Bin completion's nodes in `_settle`, where the integer program decided nothing: only small histograms (present
# lengths x bound at most repack.MAX_VARIABLES) still a pack above their bound get there, 3 of 400 random cases
# (benchmarks/packing_small.py: mixed seeds 0-1, and 2-5 of at most 3,000 sequences; ranges seeds 0-3); the
# integer program packed one at its bound (268 two-humped lengths: 18 in 0.03 s) and decided nothing on two in
# 1.7 s each. With 1,000,000 nodes (1-4 s) the search packed both at their bound (110 log-normal lengths at
# 8,192, depth 4: 33 packs, in 1.3 s; 175 at 2,048, depth 8: 26, in 2.1 s); at 300,000 nodes neither
# (docs/results/packing-scale.md, "The warm start's budget"). Only a histogram already a pack above its bound
# pays for it.
SETTLE_NODES = 1_000_000
# Where the tokens set the cheap bound and best fit is at most GATHER_PACKS packs above it, best fit's packing
# first has its room gathered into its emptiest packs (`neighbourhood.py`, no groups) for at most
# GATHER_SECONDS estimated seconds, and is returned where that reaches the bound: packs must be almost full
# there, and moving room between pairs of packs often empties the last ones in a fraction of a second (7,040
# sequences uniform in 4-44% of 2,048, depth 16: 1,665, the bound, in 0.2 s, where the rest took 4 s to 1,666).
# Where best fit was further above, the gathering saved a few packs at most, not the bound, and cost up to
# 0.8 s; a gathered packing within 0.1% of the bound but not at it cost packs that the dive finds. (Its effort
# counts to the call's patience, `effort.py`, as every step's does.)
GATHER_SECONDS = 0.5
GATHER_PACKS = 16
# Where the gathered packing is one pack above that bound, the pool search (`tabu.py`) gets this many estimated
# seconds on it before anything else: of the 86 such cases among 880 random ones (benchmarks/packing_small.py,
# every family and seed measured) it reached the bound on 51, each within 0.7 estimated seconds (1,228
# log-normal lengths at 8,192, unlimited depth: 557 in 0.15 s, where the LP and the dive took 5.8 s); from two
# packs above, on 2 of 17 (docs/results/packing-scale.md, "The pool on the gathered packing"). Only from
# EARLY_POOL_PACKS packs: below, a search that failed cost up to 1 s (twice its estimate: the pool's moves cost
# more than estimated on a few dozen packs; 26 packs at 4,096 went from 3.9 s to 4.9 s), and the integer
# program and bin completion (`_settle`) decide such small histograms anyway.
# The same gathering and pool search (GATHER_SECONDS and EARLY_POOL_SECONDS) run on the fill's or the plan's
# packing where that is one pack above the cheap bound, from EARLY_POOL_PACKS packs, before the LPs: the plan of
# 7,511 lengths uniform in 4-19% of 4,096, depth 16, was 844 against 843, which the dive took 9.5 s to better
# by nothing and the last step reached in 0.05 s (docs/results/packing-scale.md, "The early step on the plan").
EARLY_POOL_SECONDS = 0.5
EARLY_POOL_PACKS = 100
# A packing still above the goal whose bound no LP on the real lengths proved (the plan or best fit returned at
# once where exact pricing is dear, or bucketed lengths) gets column generation on the real lengths for this
# many estimated seconds, from a cold start, only for its bound (`_prove`): Farley's bound holds at any round.
# There, the bound was the cheap one, and the packing often optimal: 943 packs for 2,038 lengths uniform in
# 0-88% of 8,192, depth 16 (1,775 distinct), against a cheap bound of 941, where the LP's optimum is 942.5 (0.08 s
# to prove it); 416 for 946 lengths, whose LP is 416.0 (0.04 s). On the other dear cases still above their
# bound it proved nothing more in 0.1-0.2 s (docs/results/packing-scale.md, "The LP's bound where the packing is
# above the cheap one").
PROVE_SECONDS = 0.5
# A packing still above the goal after that gets the integer program over the patterns of an LP on the real
# lengths (the dive's first, or `_prove`'s) and its own packs, from itself (`_branch`, `repack.pack_from`: price
# and branch), with at most BRANCH_NODES branch-and-bound nodes, where that model has at most BRANCH_SIZE
# entries (present lengths x columns, its own packs among them). On the 880 cases of benchmarks/packing_small.py
# it ran on the eight still a pack above their bound and packed two at the bound, both at the root: 276
# log-normal lengths at 512, depth 3 (179 x 549 patterns): 143 in 0.2 s, which an arc-flow integer program took
# 31 s to find; 243 at 1,024, depth 6 (193 x 1,058): 100 in 1.1 s. The six larger models (1.1M-5.7M entries)
# found nothing, one in 2.5 s (531 x 5,202: HiGHS' root LP alone took 1.2 s), the others in 0.1-0.9 s
# (docs/results/packing-scale.md, "Price and branch").
BRANCH_NODES = 100
BRANCH_SIZE = 1_000_000


def _slack(lp_bound: float) -> int:
    return 1 if lp_bound >= STOP_PACKS else 0


@dataclass(frozen=True)
class CGHPResult:
    mixture: Mixture
    lp_bound: float   # Farley's bound on the LP relaxation of the full problem (<= the LP optimum), or the
                      # cheap bound where that is larger (it bounds the integer optimum, not the LP's)
    lower_bound: int  # proven: no packing with this depth limit uses fewer packs
    time_limit_reached: bool = False
    strategy: str = "exact"  # what made the packing returned: "heuristic": best fit; "gathered": best fit
                             # with its room gathered into its emptiest packs (GATHER_SECONDS), and a pack
                             # above the bound, the pool search (EARLY_POOL_SECONDS); "filled": the
                             # minimum-slack fill (`fill.py`); "planned" (`planned.py`); "exact": the dive
                             # on column generation; "bucketed": the dive on bucketed lengths; "integer": a
                             # small histogram packed at its bound by the integer program of `repack.py`;
                             # "completed": packed at the bound by bin completion (`complete.py`): first,
                             # at the cheap bound, or in `_settle` after the integer program;
                             # "improved": the packing above with packs saved by the local search of
                             # `neighbourhood.py` (room gathered until a pack empties, the pool, groups);
                             # "branched": the integer program over an LP's patterns (`_branch`)
    priced: bool = False  # lp_bound comes from column generation on the real lengths (else `_prove` may try)
    columns: list | None = field(default=None, repr=False, compare=False)  # that LP's patterns, for `_branch`


def cghp(histogram: np.ndarray, depth: int, steps: int | None = None, deadline: float | None = None) -> CGHPResult:
    """Pack `histogram` with at most `depth` sequences a pack; see the module docstring: `_cghp`, then, on a
    small histogram still above its bound, `_settle`, and on any still above the goal (the bound, or within 0.1%
    of it from 1,000 packs), `_improve`. Its effort is counted (`effort.py`): past its patience
    the LPs and the dive stop within 0.1% of the bound. Where HiGHS fails on an LP (`lp.LPFailure`: only seen at
    about 10^12 sequences a length), best fit with the cheap bound, both valid."""
    with counting(int(histogram.sum())):
        try:
            result = _settle(_cghp(histogram, depth, steps, deadline), histogram, depth, deadline)
            result = _prove(_improve(result, histogram, depth, deadline), histogram, depth, deadline)
            return _branch(result, histogram, deadline)
        except LPFailure:
            cheap = cheap_lower_bound(histogram, depth)
            return CGHPResult(lpfhp(histogram, depth), float(cheap), cheap, False, "heuristic")


def _above_goal(packs: int, bound: int) -> bool:
    """Whether `packs` misses the goal: above `bound`, and, from 1,000 packs (where 0.1% is a pack), above it
    by more than 0.1%."""
    return packs > bound and not (GOAL_GAP * bound >= 1 and packs <= bound * (1 + GOAL_GAP) + 1e-9)


def _prove(result: CGHPResult, histogram: np.ndarray, depth: int, deadline) -> CGHPResult:
    """A packing still above the goal whose bound no LP on the real lengths proved: column generation on
    them, from a cold start, for PROVE_SECONDS estimated seconds, for its Farley bound only (valid at any
    round); the packing stays. Where exact pricing is dear CGHP returns the plan or best fit with the cheap
    bound, and the packing is often optimal: this says so."""
    if result.priced or PROVE_SECONDS <= 0 or not _above_goal(result.mixture.n_packs, result.lower_bound):
        return result
    if past(deadline):  # (a call without one may then report a stronger bound)
        return replace(result, time_limit_reached=True)
    columns, _, _, farley_bound, late, _, _ = solve_relaxation(histogram, depth, [], False, deadline, swaps=True,
                                                               gap=0, known=result.lower_bound, budget=PROVE_SECONDS)
    lower = max(result.lower_bound, proven(farley_bound))
    # a deadline that stops it leaves the bound weaker (the packing is the same): said where it still misses
    late = result.time_limit_reached or (late and _above_goal(result.mixture.n_packs, lower))
    return replace(result, lp_bound=max(result.lp_bound, farley_bound), lower_bound=lower, time_limit_reached=late,
                   columns=columns)


def _branch(result: CGHPResult, histogram: np.ndarray, deadline) -> CGHPResult:
    """A packing still above the goal, with the patterns of an LP on the real lengths (the dive's first, as its
    warm re-solves grew it, or `_prove`'s): the integer program over them and the packing's own packs
    (`repack.pack_from`, price and branch), from the packing, within BRANCH_NODES nodes, where that model has at
    most BRANCH_SIZE entries. Where the deadline stops (or precedes) it above the goal, the result says so
    (time_limit_reached), as the other steps' do."""
    columns, result = result.columns, replace(result, columns=None)
    if BRANCH_NODES <= 0 or not columns or not _above_goal(result.mixture.n_packs, result.lower_bound):
        return result
    if past(deadline):
        return replace(result, time_limit_reached=True)
    if np.count_nonzero(histogram) * (len(columns) + len(result.mixture.counts)) > BRANCH_SIZE:
        return result
    found = pack_from(histogram, columns, result.mixture, BRANCH_NODES, deadline)
    if found is not None:
        result = replace(result, mixture=found, strategy="branched")
    late = result.time_limit_reached or (past(deadline) and _above_goal(result.mixture.n_packs, result.lower_bound))
    return replace(result, time_limit_reached=late)


def _improve(result: CGHPResult, histogram: np.ndarray, depth: int, deadline) -> CGHPResult:
    """A packing above its bound, and not within 0.1% of it, with packs saved by the local search of
    `neighbourhood.py` (its room gathered until a pack empties; a pool of unpacked sequences, `tabu.py`; groups
    of its emptiest packs repacked into one fewer). Where the deadline stops (or precedes) that search above
    the bound, the result says so (time_limit_reached), as `_settle`'s does: a time-limited call may then differ
    from one without."""
    packs, bound = result.mixture.n_packs, result.lower_bound
    if not _above_goal(packs, bound):
        return result
    improved = result.mixture if past(deadline) else neighbourhood(result.mixture, histogram, bound, depth, deadline)
    late = result.time_limit_reached or (past(deadline) and improved.n_packs > bound)
    if improved.n_packs >= packs:
        return replace(result, time_limit_reached=late)
    return replace(result, mixture=improved, strategy="improved", time_limit_reached=late)


def _settle(result: CGHPResult, histogram: np.ndarray, depth: int, deadline) -> CGHPResult:
    """A small histogram (present lengths x bound at most repack.MAX_VARIABLES) whose packing is above its
    bound: ask the integer program of `repack.py` for a packing at the bound, and where it decides nothing,
    bin completion with SETTLE_NODES nodes (`complete.py`); where either proves there is none, raise the bound
    by one and ask again. On small, sparse histograms under a depth limit the dive can end a pack above the
    bound (268 two-humped lengths at 4,096, depth 16: 19 against 18), and only this says which of the two is
    wrong (there, the packing: 18 packs exist)."""
    mixture, bound, asked, made = result.mixture, result.lower_bound, False, result.strategy
    lengths = int(np.count_nonzero(histogram))
    while mixture.n_packs > bound and lengths * bound <= MAX_VARIABLES and not past(deadline):
        found, asked, made = pack_into(histogram, bound, depth, deadline=deadline), True, "integer"
        if found is None and not past(deadline):
            found, made = complete(histogram, bound, depth, node_limit=SETTLE_NODES, deadline=deadline), "completed"
        if found is INFEASIBLE:
            bound += 1
        else:
            if found is not None:
                mixture = found
            break
    if not asked:
        return result
    # the deadline may have stopped the integer program (a time-limited call then differs from one without)
    late = result.time_limit_reached or (past(deadline) and mixture.n_packs > bound)
    return replace(result, mixture=mixture, lower_bound=bound, strategy=made if mixture is not result.mixture
                   else result.strategy, time_limit_reached=late)


def _cghp(histogram: np.ndarray, depth: int, steps: int | None, deadline: float | None) -> CGHPResult:
    """Best fit, the fill, the plan, and the dive on column generation (see the module docstring).

    Best fit (LPFHP) comes first: when it meets the cheap bound (tokens, long sequences, depth) it is
    optimal and returned at once. Under a depth limit where the token bound binds, with at most
    PLAN_MAX_PACKS packs, `planned` (an LP over class means realised with the real lengths) comes next on
    long or sparse histograms, and is returned when exact pricing would be slow or it is within PLAN_ENOUGH
    of the cheap bound. Otherwise a histogram whose exact pricing is cheap is solved exactly (`_exact`, with
    the best packing so far as the one to beat), a larger one on bucketed lengths (`_bucketed`). In between
    (from 1,000 packs, pricing above FINE_PRICING_SECONDS, L > FINE_GRID) the best packing so far is kept if
    it is within 0.1% of the bound known, else fine buckets (units of ceil(L / FINE_GRID) tokens) come first,
    kept if within 0.1% of the bound, else the start of `_exact`; each dive gets `steps` steps. `deadline` (a
    `time.perf_counter()` value): past it, the best packing and the best bound found so far are returned,
    with time_limit_reached set.
    """
    max_len = len(histogram)
    cheap = cheap_lower_bound(histogram, depth)
    counted = effort()
    counted.packs = cheap
    start, late = run_lpfhp(histogram, depth, deadline=deadline)
    if start.n_packs <= cheap or late:
        return CGHPResult(start, float(cheap), cheap, late, "heuristic")
    # bin completion at the cheap bound, briefly, on up to FIRST_NODES / NODES_A_PACK packs: where packs must be
    # almost full it often finds that packing (optimal) or proves there is none (the bound rises by one) at once
    for _ in range(2 if cheap * NODES_A_PACK <= FIRST_NODES else 0):
        found = complete(histogram, cheap, depth, node_limit=FIRST_NODES, deadline=deadline)
        if found is INFEASIBLE:
            cheap += 1
            counted.packs = cheap
            if start.n_packs <= cheap:
                return CGHPResult(start, float(cheap), cheap, False, "heuristic")
            continue
        if found is not None:
            return CGHPResult(found, float(cheap), cheap, False, "completed")
        break
    if cheap == tokens_bound(histogram) and start.n_packs - cheap <= GATHER_PACKS:
        # (a gathered packing above the bound is dropped: the plan, the dive and the last step's groups reached
        # the bound more often from best fit than from it)
        gathered = neighbourhood(start, histogram, cheap, depth, deadline, seconds=GATHER_SECONDS, groups=False)
        if gathered.n_packs == cheap + 1 and cheap >= EARLY_POOL_PACKS:  # the pool's search saves one (`tabu.py`)
            gathered = neighbourhood(gathered, histogram, cheap, depth, deadline, seconds=0, groups=False,
                                     pool=EARLY_POOL_SECONDS)  # (seconds 0: the pool search alone)
        if gathered.n_packs <= cheap:
            return CGHPResult(gathered, float(cheap), cheap, False, "gathered")
    lengths = np.nonzero(histogram)[0] + 1
    pricing = pricing_seconds(len(lengths), max_len, depth, int(lengths[0]))
    expensive = pricing > EXACT_PRICING_SECONDS
    plannable = _plannable(histogram, depth, cheap, expensive)
    made = "heuristic"  # what made `start`
    # fine buckets first (FINE_PRICING_SECONDS), where exact column generation would be slow
    fine = not expensive and pricing > FINE_PRICING_SECONDS and max_len > FINE_GRID and counted.tolerant
    if not (expensive or plannable or fine):
        # the fill: not where the plan or bucketed lengths take over (long packs, or a depth limit with full
        # packs and many lengths): there it met no bound on the long-context cases and cost 1-2.4 s; nor on
        # large histograms that fine buckets take first, where it met no bound in 43 random cases and cost up
        # to 1 s (105,556 two-humped lengths at 8,192). Below 1,000 packs, where the depth limit can bind, a
        # second fill takes the lengths in a seeded random order: longest first left only short sequences for
        # the last packs, too few under the limit to fill them (2,174 lengths of 1-540 at 2,048, depth 16: 307
        # packs; shuffled 291, the bound, in 0.06 s). Not from 1,000 packs: there it cost up to 2 s and twice
        # made the call miss its goal (docs/results/packing-scale.md, "A shuffled fill")
        binds = depth < max_len // int(lengths[0]) and not counted.tolerant
        for shuffle in [None] + [np.random.default_rng(seed) for seed in range(SHUFFLED_FILLS if binds else 0)]:
            filled = fill(histogram, depth, deadline=deadline, shuffle=shuffle)
            if filled is not None and filled.n_packs < start.n_packs:
                start, made = filled, "filled"
                if start.n_packs <= cheap:
                    return CGHPResult(start, float(cheap), cheap, False, "filled")
    if plannable:
        plan = planned(histogram, depth, deadline)
        used = plan.n_packs < start.n_packs
        start, made = (plan, "planned") if used else (start, made)
        if expensive or start.n_packs <= cheap * (1 + PLAN_ENOUGH) or past(deadline):
            return CGHPResult(start, float(cheap), cheap, past(deadline), made)
    if made != "heuristic" and start.n_packs == cheap + 1 and cheap >= EARLY_POOL_PACKS and not past(deadline):
        # the fill's or the plan's packing a pack above the bound: the gathering and the pool search first
        early = neighbourhood(start, histogram, cheap, depth, deadline, seconds=GATHER_SECONDS, groups=False,
                              pool=EARLY_POOL_SECONDS)
        if early.n_packs <= cheap:
            return CGHPResult(early, float(cheap), cheap, False, "improved")
    if expensive:
        return _bucketed(histogram, depth, start, cheap, steps or DIVE_STEPS, deadline, made=made)
    # a large LP proves its bound last, and a small one most of it first (`coarse_bound`): reported even when
    # the deadline stops the large one, and column generation ends once the LP's value rounded up meets it
    coarse = coarse_bound(histogram, depth, deadline) if len(lengths) > COARSE_START_LENGTHS else 0.0
    known = max(cheap, proven(coarse))
    counted.packs = known
    if fine and not past(deadline):
        if counted.near(start.n_packs):  # (the plan often is)
            return CGHPResult(start, max(coarse, cheap), known, False, made)
        tried = _bucketed(histogram, depth, start, cheap, steps or DIVE_STEPS, deadline, FINE_GRID, 0.0, made)
        coarse, known = max(coarse, tried.lp_bound), max(known, tried.lower_bound)
        counted.packs = known
        start, made = tried.mixture, tried.strategy  # (never more packs than `start`)
        if counted.near(start.n_packs) or tried.time_limit_reached:
            return CGHPResult(start, coarse, known, tried.time_limit_reached, made)
    mixture, lp_bound, _, late, columns = _exact(histogram, depth, start, known, steps or DIVE_STEPS, deadline)
    lp_bound = max(lp_bound, coarse)
    return CGHPResult(mixture, lp_bound, max(known, proven(lp_bound)), late,
                      "exact" if mixture.n_packs < start.n_packs else made, priced=True, columns=columns)


def _plannable(histogram: np.ndarray, depth: int, cheap: int, expensive: bool) -> bool:
    """Whether `planned` is worth running first: a depth limit that can bind, the token bound at least the
    depth bound (so packs must be full), at most PLAN_MAX_PACKS packs (it realises them one by one), and
    either exact pricing too slow, or a limit of at least PLAN_MIN_DEPTH with more than COARSE_START_LENGTHS
    lengths: there exact column generation was slower and worse than the plan on sparse long-context
    histograms at depths 6 and 8, while at depth 3 it was better (docs/results/packing-scale.md, "Plan-guided
    packing")."""
    max_len = len(histogram)
    if cheap > PLAN_MAX_PACKS or depth >= max_len // (int(np.argmax(histogram > 0)) + 1):
        return False
    if tokens_bound(histogram) < math.ceil(int(histogram.sum()) / depth):
        return False
    return expensive or (depth >= PLAN_MIN_DEPTH and int((histogram > 0).sum()) > COARSE_START_LENGTHS)


def _exact(histogram, depth, start, cheap, steps, deadline):
    """A dive on column generation (see the module docstring, steps 2-5). Each step fixes packs from the LP
    solution (`_round`: its whole parts, under a depth limit also fractional parts of at least ROUND_UP whose
    sequences are all left, then the largest fractional parts until 1/DIVE_SHARE of the LP's packs, at least
    one, are fixed), fills their slots with real sequences (a slot the LP swapped takes a shorter one:
    `trim_excess(..., swap=True)`), and re-solves the LP of what is left from where it stopped
    (`ColumnGeneration.resolve`; a fresh LP once less than 1/FRESH_LP of the sequences is left). Every step
    yields a candidate: the packs fixed so far plus best fit (or the fill) on the rest; the best candidate wins.
    The dive stops when a candidate meets the full problem's bound (up to `_slack`), or past the call's
    patience is within 0.1% of the best bound known (`effort.Effort.accepts`), when the packs fixed plus the
    residual's proven bound cannot beat the best candidate, after `steps` steps, or at the deadline.
    Returns (mixture, LP bound of the full problem, the dual point that proved it (per present length, or
    None), stopped, the first LP's patterns)."""
    max_len = len(histogram)
    patterns, x, value, lp_bound, late, point, solver = solve_relaxation(histogram, depth, [], True, deadline,
                                                                         swaps=True, gap=0, known=cheap)
    columns = patterns  # (the first LP's, grown in place by the warm re-solves: for `_branch`)
    built_for = int(histogram.sum())
    # (the slack by the size of the problem: the LP may stop early at the cheap bound, with a far weaker bound)
    target = max(cheap, proven(lp_bound)) + _slack(max(cheap, lp_bound))
    best, best_packs = [start], start.n_packs
    fixed, fixed_packs, residual = [], 0, histogram.copy()
    # rounding up pays where best fit packs a residual badly, which it does under a depth limit; at unlimited
    # depth it bought nothing on Wikipedia-512 and cost an extra residual LP (docs/results/packing-scale.md,
    # "Rounding up, and a smaller LP")
    up = ROUND_UP if depth < max_len // int(np.nonzero(histogram)[0][0] + 1) else None
    counted = effort()  # past its patience, a packing within 0.1% of the bound known is enough
    searched = False    # bin completion tried on a residual of at most ENDGAME sequences
    for _ in range(steps):
        if x is None or best_packs <= target or counted.accepts(best_packs):
            break
        whole = _round(patterns, x, residual, up, max(1, int((value or 0) / DIVE_SHARE)))
        used = np.nonzero(whole)[0]
        part = trim_excess(pattern_matrix([patterns[j] for j in used]), whole[used], residual, swap=True)
        fixed.append(part)
        fixed_packs += part.n_packs
        residual = residual - part.coverage(max_len)
        if not residual.any():
            if fixed_packs < best_packs:
                best, best_packs = list(fixed), fixed_packs
            break
        tail = _pack_rest(residual, depth)
        if fixed_packs + tail.n_packs < best_packs:
            best, best_packs = fixed + [tail], fixed_packs + tail.n_packs
        if late or best_packs <= target or counted.accepts(best_packs):
            break
        # (the residual LPs run to their own bound: stopping them at the residual's cheap bound, as the first
        # one stops at the full problem's, left them less converged and cost packs, e.g. 27,044 instead of
        # 27,043 on Wikipedia-512 / 300 at depth 3)
        # (past the patience a residual LP stops within the call's slack of its own cheap bound too: its Farley
        # bound comes last, and on 9,685 lengths at 8,192, depth 16, a residual of 1,212 took 1.4 s waiting for
        # it; 5.0 s in all instead of 6.2, the same packs)
        floor = cheap_lower_bound(residual, depth)
        if residual.sum() * FRESH_LP < built_for:
            patterns, x, value, bound, late, _, solver = solve_relaxation(residual, depth, patterns, False, deadline,
                                                                          swaps=True, gap=0, floor=floor)
            built_for = int(residual.sum())
        else:
            x, value, bound, late = solver.resolve(residual, deadline, floor)
        bound = proven(max(bound, floor))
        if fixed_packs + bound >= best_packs:  # this dive can no longer gain a pack
            break
        if residual.sum() <= ENDGAME and not searched and not late:  # a few dozen left: decide them exactly
            # (once: a residual it could not decide, the next smaller one rarely was, and each try cost the
            # whole node limit: 0.3 s at 100,000 nodes, 0.9 s in all on ranges seed 3, case 11)
            found, searched = complete(residual, bound, depth, deadline=deadline), True
            if isinstance(found, Mixture):  # at the residual's bound: no later step of this dive can do better
                best, best_packs = fixed + [found], fixed_packs + found.n_packs
                break
            if found is INFEASIBLE and fixed_packs + bound + 1 >= best_packs:
                break
    return Mixture.concat(best), lp_bound, point, late, columns


def _pack_rest(residual: np.ndarray, depth: int) -> Mixture:
    """A residual of iterated rounding packed by best fit, or by the minimum-slack fill where that takes
    fewer packs (residuals are mostly small, so the fill is cheap there, and it often saves the last pack; a
    tenth of its budget, as a residual is packed every round: on the coarse LP of long packs at depth 8 the
    whole budget cost 1.4 s a packing for nothing)."""
    tail = lpfhp(residual, depth)
    if tail.n_packs > cheap_lower_bound(residual, depth):
        filled = fill(residual, depth, budget=FILL_WORDS / 10)
        if filled is not None and filled.n_packs < tail.n_packs:
            return filled
    return tail


def _round(patterns: list[np.ndarray], x: np.ndarray, residual: np.ndarray, up: float | None,
           at_least: int = 0) -> np.ndarray:
    """Packs per pattern from an LP solution x over `residual`: x rounded down, then, largest fractional part
    first, one more pack of each pattern whose part is at least `up` (None: none) while all of its sequences
    are still left (no padding is added), and then, again largest first, of the patterns not rounded up yet,
    left or not, until at least `at_least` packs are fixed (their slots then hold what is left:
    `trim_excess(..., swap=True)`). On large depth-limited histograms rounding down alone leaves hundreds of
    sequences, which best fit packs well above their LP, and the residual LPs that peel them off a few at a
    time take much of the time and still end tens of packs above the bound; rounding up first leaves far
    fewer, and on the Wikipedia-style histograms measured the packing ends within one pack of the bound
    (docs/results/packing-scale.md, "Rounding up, and a smaller LP")."""
    x = np.maximum(x, 0.0)  # (HiGHS may return -1e-8: floored, a pattern used -1 times)
    floor = np.floor(x + 1e-9).astype(np.int64)
    whole, fixed = floor.copy(), int(floor.sum())
    if up is None and fixed >= at_least:
        return whole
    up = math.inf if up is None else up
    sizes = np.array([len(p) for p in patterns[:len(x)]])
    flat = np.concatenate(patterns[:len(x)])
    covered = np.bincount(flat - 1, weights=np.repeat(whole, sizes), minlength=len(residual))
    left = residual - np.rint(covered).astype(np.int64)  # negative where rounding down over-covers (padding)
    frac = x - whole
    starts = np.concatenate([[0], np.cumsum(sizes)])
    order = np.argsort(-frac, kind="stable")
    for j in order:  # fractional parts of at least `up` whose sequences are all left
        if frac[j] < up:
            break
        items, need = np.unique(flat[starts[j]: starts[j + 1]] - 1, return_counts=True)
        if (left[items] >= need).all():
            left[items] -= need
            whole[j] += 1
            fixed += 1
    rounded = whole > floor
    for j in order:  # then the largest fractional parts not rounded up yet, left or not, up to `at_least`
        if fixed >= at_least or frac[j] <= 0:
            break
        if not rounded[j]:
            whole[j] += 1
            fixed += 1
    return whole


def _bucket_edges(units: int, step: float = BUCKET_STEP) -> np.ndarray:
    """Upper edges of the length buckets, in units: every unit up to 1 / step, then buckets at most `step` of
    their length wide (0: every unit); the last edge is `units`."""
    edges, u = [], 1
    while u < units:
        edges.append(u)
        u = max(u + 1, int(u * (1 + step)))
    edges.append(units)
    return np.array(edges, dtype=np.int64)


def _bucketed(histogram, depth, start, cheap, steps, deadline, grid=GRID, step=BUCKET_STEP,
              made="heuristic") -> CGHPResult:
    """Column generation on a coarser histogram: lengths rounded *up* to units of g = ceil(max_len / grid)
    tokens and then to buckets at most `step` of their length wide (0: units only), so pricing costs the same
    at any pack length. A packing of the rounded-up lengths is a packing of the real ones (each real sequence
    takes a slot of its bucket). `cheap`: a bound proven on the real histogram; `made`: what made `start`,
    the strategy reported where the bucketed packing does not beat it.

    The rounded-up instance's LP bound is no bound for the real one. The bound reported is proven on the
    real one: Farley's bound y.h / max(1, best pattern value under y) holds for any duals y >= 0, and here
    the best pattern is priced on the lengths rounded *down* to their bucket's smallest (a relaxation: every
    real pattern stays feasible), with y the coarse LP's best duals; or the cheap bound if that is larger."""
    max_len = len(histogram)
    g = -(-max_len // grid)
    units = max_len // g
    edges = _bucket_edges(units, step)
    present = np.nonzero(histogram)[0] + 1
    # unit length of each present length; a length above units x g tokens (max_len not a multiple of g) is
    # clamped to a whole pack of units: it packs alone in the coarse instance, as it would really (every other
    # length is at least one unit), so coarse packs stay real packs
    rounded_up = edges[np.searchsorted(edges, np.minimum(-(-present // g), units))]
    coarse = np.zeros(units, dtype=np.int64)
    np.add.at(coarse, rounded_up - 1, histogram[present - 1])
    coarse_start, late = run_lpfhp(coarse, depth, deadline=deadline)
    lp_bound, lower = float(cheap), cheap
    if not late:
        mixture, _, point, late, _ = _exact(coarse, depth, coarse_start, cheap_lower_bound(coarse, depth), steps,
                                         deadline)
        if mixture.n_packs < start.n_packs:
            start, made = _realise(mixture, histogram, present, rounded_up), "bucketed"
        if point is not None:
            coarse_lengths = np.nonzero(coarse)[0] + 1               # the rows of `point`, ascending
            smallest = np.full(units + 1, max_len + 1, dtype=np.int64)
            np.minimum.at(smallest, rounded_up, present)              # in tokens
            down = smallest[coarse_lengths]                           # ascending too (buckets are)
            at_down = np.zeros(max_len, dtype=np.int64)               # each bucket's sequences at its smallest
            at_down[down - 1] = coarse[coarse_lengths - 1]
            rounded_down = farley(at_down, depth, point)
            # or the same duals spread linearly over the real lengths (as in `coarse_bound`), often stronger
            spread = farley(histogram, depth, interpolated(histogram, coarse_lengths * g, point))
            lp_bound = max(lp_bound, rounded_down, spread)
            lower = max(cheap, proven(lp_bound))
    return CGHPResult(start, lp_bound, lower, late, made)


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
