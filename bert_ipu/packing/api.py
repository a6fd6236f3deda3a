"""`pack`: run one packing algorithm on a length histogram, and the `PackingResult` it returns.

    from bert_ipu.packing import pack
    result = pack(histogram, "cghp", max_sequences_per_pack=3, time_limit=10)
    result.packs, result.efficiency, result.lower_bound_packs

The algorithms live in their own modules (baselines, heuristics, nnlshp, cghp); this one checks the input
and dispatches.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from . import baselines, heuristics, nnlshp as _nnlshp
from .bounds import deadline_of, lower_bound as cheap_bound, past
from .cghp import cghp as _cghp
from .depth import depth_label, parse_depth
from .histogram import PackingInputError, validate_histogram, whole_number
from .mixture import Mixture

ALGORITHMS = ("none", "sort", "greedy", "spfhp", "lpfhp", "nnlshp", "cghp")
DEPTH_FREE = ("none", "sort")  # algorithms whose result does not depend on max_sequences_per_pack

@dataclass(frozen=True)
class PackingResult:
    """One algorithm's packing of one histogram.

    `computed_tokens` is what the model processes, padding included: packs x max_len for packing
    algorithms, and sum over batches of rows x longest for SORT.
    """
    algorithm: str
    histogram: np.ndarray
    max_sequences_per_pack: int | None  # None = unlimited
    mixture: Mixture
    computed_tokens: int
    lower_bound_packs: int
    seconds: float
    time_limit_reached: bool = False  # the time limit stopped the search: best packing and bound so far
    strategy: str = ""  # CGHP only: which of its paths made the packing (`cghp.CGHPResult.strategy`)

    @property
    def max_len(self) -> int:
        return len(self.histogram)

    @property
    def packs(self) -> int:
        return self.mixture.n_packs

    @property
    def sequences(self) -> int:
        return int(self.histogram.sum())

    @property
    def tokens(self) -> int:
        return int((np.arange(1, self.max_len + 1) * self.histogram).sum())

    @property
    def padding_tokens(self) -> int:
        return self.computed_tokens - self.tokens

    @property
    def efficiency(self) -> float:
        """Real tokens over computed tokens (for packers: tokens / (packs x max_len))."""
        return self.tokens / self.computed_tokens

    @property
    def packing_factor(self) -> float:
        """Sequences per pack (1 for NONE and SORT)."""
        return self.sequences / self.packs

    @property
    def speedup_upper_bound(self) -> float:
        """Computed tokens of NONE over this algorithm's: the speed-up if time is proportional to tokens."""
        return self.sequences * self.max_len / self.computed_tokens

    def to_json(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "max_sequences_per_pack": "max" if self.max_sequences_per_pack is None else self.max_sequences_per_pack,
            "packs": self.packs,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "padding_tokens": self.padding_tokens,
            "efficiency": self.efficiency,
            "packing_factor": self.packing_factor,
            "speedup_upper_bound": self.speedup_upper_bound,
            "lower_bound_packs": self.lower_bound_packs,
            "strategies": len(self.mixture.counts),
            "max_depth_used": self.mixture.depth,
            "seconds": self.seconds,
            "time_limit_reached": self.time_limit_reached,
        }


def applies(algorithm: str, max_sequences_per_pack: int | None) -> bool:
    """Whether `algorithm` can run at this depth limit (NNLSHP enumerates strategies up to depth 3)."""
    if algorithm == "nnlshp":
        return max_sequences_per_pack is not None and max_sequences_per_pack <= _nnlshp.MAX_DEPTH
    return True


def check_applies(algorithm: str, max_sequences_per_pack: int | None) -> None:
    """A PackingInputError where `algorithm` cannot run at this depth limit (`applies`)."""
    if not applies(algorithm, max_sequences_per_pack):
        raise PackingInputError(f"{algorithm} supports max_sequences_per_pack up to {_nnlshp.MAX_DEPTH}, "
                                f"not {depth_label(max_sequences_per_pack)}")


def lower_bound(histogram, max_sequences_per_pack: int | None = None) -> int:
    """A cheap lower bound on the packs any packing of `histogram` needs at this depth limit (None or "max":
    unlimited): Martello and Toth's L2, the depth, and sequences that fit beside no other (`bounds.lower_bound`);
    CGHP's results carry a stronger one. The histogram and the limit are checked as `pack` checks them."""
    histogram = validate_histogram(histogram)
    return cheap_bound(histogram, parse_depth(max_sequences_per_pack, allow_auto=False))


def pack(histogram, algorithm: str, max_sequences_per_pack: int | None = None, *, seed: int = 0,
         batch_size: int = 32, time_limit: float | None = None) -> PackingResult:
    """Run one packing algorithm on a length histogram.

    max_sequences_per_pack: the depth limit, None or "max" for unlimited, "auto" (`auto_depth`), as `parse_depth`
    reads it. Ignored by NONE and SORT (one sequence per row). seed: GREEDY's shuffle. batch_size: SORT's batch
    size. time_limit: seconds (> 0) after which the algorithm returns the best packing and bound it has, with
    `time_limit_reached` set (SPFHP, LPFHP and GREEDY put what they have not placed into packs of their own; CGHP
    returns its best candidate; NNLSHP checks the limit before and after its NNLS solve, which cannot be
    interrupted); with "auto", `auto_depth`'s CGHP runs count to it too.
    """
    deadline = deadline_of(time_limit)
    histogram = validate_histogram(histogram)
    if algorithm not in ALGORITHMS:
        raise PackingInputError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    # (read as everywhere: a whole number >= 1, "max" or None, "auto"; 2.5 or True were taken as they were)
    max_sequences_per_pack = resolve_depth(max_sequences_per_pack, histogram, algorithm, deadline)
    check_applies(algorithm, max_sequences_per_pack)
    batch_size, seed = whole_number(batch_size, "batch_size", 1), whole_number(seed, "seed")
    max_len = len(histogram)
    depth = max_len if max_sequences_per_pack is None else min(max_sequences_per_pack, max_len)
    bound = cheap_bound(histogram, max_sequences_per_pack)
    start = time.perf_counter()
    computed, late, strategy = None, False, ""
    if algorithm == "none":
        mixture = baselines.none(histogram)
    elif algorithm == "sort":
        mixture, computed = baselines.sort_batches(histogram, batch_size)
    elif algorithm == "greedy":
        mixture, late = baselines.greedy(histogram, depth, seed=seed, deadline=deadline)
    elif algorithm == "spfhp":
        mixture, late = heuristics.run_spfhp(histogram, depth, deadline)
    elif algorithm == "lpfhp":
        mixture, late = heuristics.run_lpfhp(histogram, depth, deadline=deadline)
    elif algorithm == "nnlshp":
        mixture, late = _nnlshp.nnlshp(histogram, depth, deadline=deadline)
    else:
        solved = _cghp(histogram, depth, deadline=deadline)
        mixture, bound, late = solved.mixture, max(bound, solved.lower_bound), solved.time_limit_reached
        strategy = solved.strategy
    seconds = time.perf_counter() - start
    if computed is None:
        computed = mixture.n_packs * max_len
    return PackingResult(algorithm, histogram, max_sequences_per_pack, mixture, computed, bound, seconds, late,
                         strategy)


def auto_depth(histogram, algorithm: str = "cghp", deadline: float | None = None) -> int:
    """The smallest depth limit at which CGHP needs at most 0.1% more packs than with unlimited depth (and at most
    the deepest pack of the unlimited packing): deeper packs would gain almost nothing. Capped at 3 for NNLSHP (it
    enumerates strategies up to depth 3).

    Depths below sequences / packs(unlimited) cannot reach that pack count (a packing of depth d has at
    least sequences / d packs), so the search starts there. `deadline` (a `time.perf_counter()` value, a
    packing call's with "auto"): each CGHP run gets the time left, and once it passes the search stops at the
    unlimited packing's deepest pack (a limit that costs no pack)."""
    if algorithm not in ALGORITHMS:
        raise PackingInputError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    histogram = validate_histogram(histogram)

    def left():
        return None if deadline is None else max(deadline - time.perf_counter(), 1e-3)

    unlimited = pack(histogram, "cghp", None, time_limit=left())
    target = unlimited.packs
    # the unlimited packing itself respects a limit of its own deepest pack: no deeper limit is ever needed
    # (CGHP at a limit is a heuristic that can stay a few packs above the unlimited count at every depth,
    # which once made this loop run one CGHP per depth up to max_len)
    deepest = max(1, unlimited.mixture.depth)
    depth = max(1, math.ceil(int(np.sum(histogram)) / target))
    enough = target + target // 1000  # within 0.1% of the unlimited count: a deeper limit would gain at most that
    while depth < deepest and not past(deadline) \
            and pack(histogram, "cghp", depth, time_limit=left()).packs > enough:
        depth += 1
    depth = deepest if past(deadline) else min(depth, deepest)
    return min(depth, 3) if algorithm == "nnlshp" else depth


def resolve_depth(requested, histogram, algorithm: str, deadline: float | None = None) -> int | None:
    """The depth limit a packer runs with on this data: 1 for NONE and SORT (one sequence a row),
    `auto_depth(histogram, deadline=deadline)` for "auto", else `requested` as `parse_depth` reads it (None =
    unlimited)."""
    requested = parse_depth(requested)
    if algorithm in DEPTH_FREE:
        return 1
    if requested == "auto":
        return auto_depth(histogram, algorithm, deadline)
    return requested
