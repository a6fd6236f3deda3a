"""The pretraining run's config: the dataset section, and the root (kind: pretraining)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import ConfigError, ModelConfig, ParallelConfig, RunConfig, TrainConfig, check_algorithm, depth_value


@dataclass
class DataConfig:
    dataset: str = "runs/data/packed_128"
    """packed (or unpacked) dataset folder; created from `prepare_input` when missing"""
    prepare_input: str | None = "builtin"
    """text to create the dataset from when it does not exist (None: the dataset must exist)"""
    max_seq_length: int = 128
    algorithm: str = "cghp"
    """packing algorithm of the dataset; none = unpacked. An existing dataset packed otherwise is an error"""
    max_sequences_per_pack: int | str = 3
    """depth limit: N, max (unlimited) or auto (the smallest that packs as tightly as unlimited)"""
    validation_fraction: float = 0.05
    """documents held out for validation when the dataset is created"""

    def __post_init__(self):
        if self.max_seq_length < 8 or not 0 < self.validation_fraction < 1:
            raise ConfigError("data.max_seq_length must be >= 8 and data.validation_fraction in (0, 1)")
        check_algorithm(self.algorithm)
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")


@dataclass(kw_only=True)
class PretrainingRunConfig(RunConfig):
    """A pretraining run (kind: pretraining; run_pretraining.py)."""
    script: ClassVar[str] = "run_pretraining.py"
    pipeline: ClassVar[bool] = True
    kind: str = "pretraining"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
