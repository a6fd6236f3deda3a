"""Histogram packing: put variable-length sequences into fixed-length packs with as little padding as
possible, and assign real sequences to the packs.

    from bert_ipu.packing import pack, assign
    result = pack(histogram, "cghp", max_sequences_per_pack=3)   # a PackingResult
    packs = assign(lengths, result.mixture, max_len=len(histogram), seed=0)

The depth limit (`max_sequences_per_pack`) is `N | max | auto` everywhere: `parse_depth` reads it, `depth_label`
writes it, `auto_depth(histogram)` resolves "auto" on the data.

Run `python -m bert_ipu.packing --help` for the report that compares every algorithm on a histogram.

Algorithms (all work on the length histogram, not on the sequences):
  none    one sequence per pack (vanilla BERT with padding)
  sort    sorted batching, each batch padded to its longest sequence (dynamic shapes; not packing)
  greedy  shuffle and concatenate, close a pack when the next sequence does not fit (T5/RoBERTa)
  spfhp   shortest-pack-first histogram packing (Krell et al.)
  lpfhp   longest-pack-first histogram packing (Krell et al.)
  nnlshp  non-negative least-squares histogram packing, depth <= 3 (Krell et al.)
  cghp    column-generation histogram packing: LP-optimal up to rounding, with a proven lower bound (ours)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from . import baselines, heuristics, nnlshp as _nnlshp
from .assign import EMPTY, assign, assign_multi_size, assign_ragged
from .bounds import deadline_of, lower_bound
from .cghp import cghp as _cghp
from .depth import auto_depth, depth_label, parse_depth
from .histogram import (PackingInputError, expand_histogram, histogram_of, load_histogram, load_lengths,
                        validate_histogram, validate_lengths)
from .mixture import Mixture

ALGORITHMS = ("none", "sort", "greedy", "spfhp", "lpfhp", "nnlshp", "cghp")
DEPTH_FREE = ("none", "sort")  # algorithms whose result does not depend on max_sequences_per_pack

__all__ = ["ALGORITHMS", "DEPTH_FREE", "EMPTY", "Mixture", "PackingInputError", "PackingResult", "applies",
           "assign", "assign_multi_size", "assign_ragged", "auto_depth", "depth_label", "expand_histogram", "histogram_of", "load_histogram",
           "load_lengths", "lower_bound", "pack", "parse_depth", "validate_histogram", "validate_lengths"]


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


def pack(histogram, algorithm: str, max_sequences_per_pack: int | None = None, *, seed: int = 0,
         batch_size: int = 32, time_limit: float | None = None) -> PackingResult:
    """Run one packing algorithm on a length histogram.

    max_sequences_per_pack: the depth limit, or None for unlimited. Ignored by NONE and SORT (one
    sequence per row). seed: GREEDY's shuffle. batch_size: SORT's batch size. time_limit: seconds (> 0)
    after which the algorithm returns the best packing and bound it has, with `time_limit_reached` set
    (SPFHP, LPFHP and GREEDY put what they have not placed into packs of their own; CGHP returns its best
    candidate; NNLSHP checks the limit before and after its NNLS solve, which cannot be interrupted).
    """
    deadline = deadline_of(time_limit)
    histogram = validate_histogram(histogram)
    if algorithm not in ALGORITHMS:
        raise PackingInputError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    if max_sequences_per_pack is not None and max_sequences_per_pack < 1:
        raise PackingInputError(f"max_sequences_per_pack is {max_sequences_per_pack}; it must be >= 1 (or max)")
    if not applies(algorithm, max_sequences_per_pack):
        raise PackingInputError(f"nnlshp supports max_sequences_per_pack up to {_nnlshp.MAX_DEPTH}, "
                                f"not {depth_label(max_sequences_per_pack)}")
    if batch_size < 1:
        raise PackingInputError(f"batch_size is {batch_size}; it must be >= 1")
    max_len = len(histogram)
    depth = max_len if max_sequences_per_pack is None else min(max_sequences_per_pack, max_len)
    if algorithm in DEPTH_FREE:
        max_sequences_per_pack = 1
    bound = lower_bound(histogram, max_sequences_per_pack)
    start = time.perf_counter()
    computed, late = None, False
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
    seconds = time.perf_counter() - start
    if computed is None:
        computed = mixture.n_packs * max_len
    return PackingResult(algorithm, histogram, max_sequences_per_pack, mixture, computed, bound, seconds, late)
