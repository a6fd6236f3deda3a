"""The profile's config: what to measure (algorithms, backends, steps, rounds, outputs), and the root (kind:
profile)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import ConfigError, ModelConfig, check_backend


STEP_MODES = ("eager", "compile", "cudagraphs")


@dataclass
class ProfileConfig:
    histogram: str = "benchmarks/histograms/wikipedia_512.json"
    """length distribution: a histogram JSON (element i = sequences of length i+1)"""
    algorithms: list = field(default_factory=lambda: ["none", "sort", "greedy", "spfhp", "lpfhp", "nnlshp", "cghp"])
    max_sequences_per_pack: int = 3
    micro_batch_size: int = 4
    """rows (packs, or sequences for NONE and SORT) per measured step"""
    steps: int = 3
    """measured steps per algorithm per round"""
    rounds: int = 5
    """rounds of all algorithms, interleaved; the first is warm-up and dropped"""
    sort_batch_size: int = 4
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    """fp32, or bf16 autocast (what a GPU run uses)"""
    backends: list | None = None
    """attention backends to measure (mask, reference, flex, varlen), each with every algorithm; None = the model's"""
    hf_baseline: bool = False
    """also time transformers' BertForPreTraining on NONE's rows (row 'hf'); OH of the others stays over our NONE"""
    compile: bool = False
    """also time torch.compile per algorithm: one compilation per distinct batch shape"""
    step_modes: list = field(default_factory=lambda: ["eager"])
    """how each backend's steps run, each timed as its own rows (backend `mask+compile`, ...): eager;
    compile (torch.compile of forward and backward with static shapes; the AdamW step stays eager); cudagraphs
    (the same, replayed as CUDA graphs: mode reduce-overhead, CUDA only). SORT's changing shapes are timed eager
    only"""
    engine: bool = False
    """also time the training application's step on the packed algorithms' batches, each step mode a row
    (`mask+engine`, `mask+engine+compile`, ...): the engine's LocalParallel with train.compile set to the step mode,
    the pretraining task's loss, gradient clipping, LAMB on its multi-tensor path and the schedule, the counts on
    the host and the batches copied through pinned memory: what run_pretraining.py runs for one micro-batch"""
    trace_dir: str | None = None
    """folder for torch.profiler traces and op tables per algorithm (and config.yaml); None = no traces"""
    json: str | None = None
    """JSON-lines file of the rows, one object per algorithm and backend (and <json>.config.yaml); None = none"""
    plot: str | None = None
    """PNG of the theoretical and realized speed-ups and the histogram; None = no plot"""
    scaling: str | None = None
    """PNG of the Section E study (packing vs un-padded batches over data-parallel devices); None = no study"""
    scaling_batches: int = 40
    """batches of each kind timed for the scaling study"""
    ranks: int | None = None
    """data-parallel ranks for the balance metrics (ABR, DBR, padding ratio; docs/packing.md, "Balance across devices")
    of updates of ranks x micro_batch_size packs drawn from each packing, dealt in order and balanced; None = none"""
    balance_updates: int = 200
    """updates drawn for the balance metrics"""

    def __post_init__(self):
        from ...packing import ALGORITHMS

        from ...packing.balance import MAX_RANKS

        if self.ranks is not None and not 1 <= self.ranks <= MAX_RANKS or self.balance_updates < 1:
            raise ConfigError(f"profile.ranks must be 1 to {MAX_RANKS} (or null: its balancing work grows as ranks "
                              "squared) and profile.balance_updates >= 1")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"profile.precision {self.precision!r}: choose fp32 or bf16")
        if min(self.micro_batch_size, self.steps, self.sort_batch_size) < 1 or self.rounds < 2:
            raise ConfigError("profile.micro_batch_size, steps and sort_batch_size must be >= 1, rounds >= 2")
        if not isinstance(self.algorithms, list) or not self.algorithms:
            raise ConfigError(f"profile.algorithms {self.algorithms!r}: a non-empty list of {', '.join(ALGORITHMS)}")
        bad = [a for a in self.algorithms if a not in ALGORITHMS]
        if bad:
            raise ConfigError(f"profile.algorithms: unknown algorithm(s) {', '.join(map(repr, bad))}; choose from "
                              f"{', '.join(ALGORITHMS)}")
        if self.max_sequences_per_pack < 1:
            raise ConfigError(f"profile.max_sequences_per_pack {self.max_sequences_per_pack}: must be >= 1")
        if self.backends is not None:
            if not isinstance(self.backends, list) or not self.backends:
                raise ConfigError(f"profile.backends {self.backends!r}: a non-empty list of attention backends (or "
                                  "null for model.attention_backend)")
            for name in self.backends:
                check_backend(name, "profile.backends:")
        if not isinstance(self.step_modes, list) or not self.step_modes or \
                any(m not in STEP_MODES for m in self.step_modes):
            raise ConfigError(f"profile.step_modes {self.step_modes!r}: a non-empty list of "
                              f"{', '.join(STEP_MODES)}")
        if self.scaling_batches < 2:
            raise ConfigError(f"profile.scaling_batches {self.scaling_batches}: must be >= 2")


@dataclass
class ProfilingRunConfig:
    """A profile (kind: profile; run_profiling.py)."""
    script: ClassVar[str] = "run_profiling.py"
    model: ModelConfig = field(default_factory=ModelConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    name: str = "unnamed"
    kind: str = "profile"
