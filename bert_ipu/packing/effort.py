"""Effort: how long a packing call has worked, counted as estimated seconds, not by a clock.

CGHP on a large degenerate LP (thousands of distinct lengths, tight packs) spent 10-60 s pushing the last few
packs out of it: 105,556 two-humped lengths at 8,192 took 56 s to 32,623 packs against a bound of 32,618, and
52,601 lengths uniform in 2-53% of 8,192 ran past 30 s. A packing call should end within seconds, within 0.1%
of its bound, without a time limit (issue "Trust, third pass", item 14). So each call counts its work,

    HiGHS' simplex iterations x rows / SIMPLEX_WORK_PER_SECOND    (about this CPU's rate on the packing LPs)
    + each pricing round's `lp.pricing_seconds`
    + the minimum-slack fill's bitset words x FILL_WORD_SECONDS,

and once that passes its patience, RELAX_AFTER estimated seconds and as many again per million sequences:

- column generation also stops where its value is within RELAXED_GAP of the best bound known (in packs of the
  whole problem; for the dive's residual LPs, of their own Farley or cheap bound);
- CGHP's dive stops at a packing within GOAL_GAP of the bound (`accepts`);

and, from the start, each LP of the coarse start stops after a share of the patience (`lp.COARSE_SHARE`): it is
only a start. All three only from 1,000 packs, where 0.1% is at least a pack (`tolerant`): below that the goal
is the bound itself, and a less converged LP cost a pack (1,317 log-normal lengths at 4,096, depth 6: 509
instead of 508, the bound). (Between 1,000 and 2,000 packs the looser LPs cost a pack on a few
histograms, each still within 0.1%, and took up to 6 s off others: docs/results/packing-scale.md, "Relaxing
from 1,000 packs".) A count, not a clock: the same histogram packs the same way on any machine and under any
load (with the same HiGHS). `cghp.cghp` counts inside `counting`; LPs solved outside a packing call never relax.

`near` (within GOAL_GAP of the bound, from 1,000 packs, where that is a pack: `tolerant`) is also what CGHP
keeps at once, patience or not, where exact pricing would be slowish (`cghp.FINE_PRICING_SECONDS`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

RELAX_AFTER = 3.0
RELAXED_GAP = 5e-4
GOAL_GAP = 1e-3
SIMPLEX_WORK_PER_SECOND = 12e6
FILL_WORD_SECONDS = 2e-8  # 20-40 ns a 64-bit word (fill.FILL_WORDS)


@dataclass
class Effort:
    """One packing call's effort so far: `spent` estimated seconds, `patience` of them before the gaps relax,
    `packs` the best bound known (the scale of the relaxed gaps)."""
    patience: float
    packs: float = 0.0
    spent: float = 0.0

    @property
    def relaxed(self) -> bool:
        return self.spent > self.patience

    @property
    def large(self) -> bool:
        """From 1,000 packs (as `tolerant`): anything here may relax."""
        return self.tolerant

    def slack(self) -> float:
        """Packs column generation may leave between its value and the bound: RELAXED_GAP of the problem once
        the patience is spent, on a large problem; else -1 (none)."""
        return RELAXED_GAP * self.packs if self.relaxed and self.large else -1.0

    @property
    def tolerant(self) -> bool:
        """From 1,000 packs: GOAL_GAP of the problem is at least a pack (below it nothing is `near`: only the
        bound itself would be, and the exact path looks for it)."""
        return GOAL_GAP * self.packs >= 1

    def near(self, packs: int) -> bool:
        """Whether a packing of `packs` packs is within GOAL_GAP of `self.packs`, the best bound known on the
        real histogram (not a rounded-up one's), where that is at least a pack (`tolerant`). (With a margin
        for rounding: 1,000 x 1.001 is 1000.9999999999999 in floating point.)"""
        return self.tolerant and packs <= self.packs * (1 + GOAL_GAP) + 1e-9

    def accepts(self, packs: int) -> bool:
        """Whether a packing of `packs` is good enough for the dive to stop at: `near` the bound, once relaxed
        (as `slack`, from 1,000 packs)."""
        return self.slack() >= 0 and self.near(packs)

    def budget(self, share: float) -> float:
        """`share` of the patience as one step's budget of estimated seconds on a large problem; else none."""
        return share * self.patience if self.large else math.inf


_EFFORT: contextvars.ContextVar[Effort | None] = contextvars.ContextVar("packing_effort", default=None)


@contextlib.contextmanager
def counting(sequences: int):
    """Count the effort of the packing call that runs inside (in this thread: `effort()` returns it), and
    forget it after, so that LPs solved outside a call never relax."""
    counted = Effort(patience=RELAX_AFTER * (1 + sequences / 1e6))
    token = _EFFORT.set(counted)
    try:
        yield counted
    finally:
        _EFFORT.reset(token)


def effort() -> Effort:
    """The effort of the packing call under way, or one that never relaxes (work outside a packing call)."""
    return _EFFORT.get() or Effort(patience=math.inf)


def spend(seconds: float) -> None:
    """Count `seconds` (estimated) of work to the packing call under way, if any."""
    counted = _EFFORT.get()
    if counted is not None:
        counted.spent += seconds
