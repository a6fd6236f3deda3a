"""The GLUE run's config: the data section (task, splits, packing), and the root (kind: glue)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import (ConfigError, ModelConfig, ParallelConfig, RunConfig, check_algorithm,
                       depth_value)
from ..common import FinetuneConfig


GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")


@dataclass
class GlueDataConfig:
    task: str
    """cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte or wnli"""
    data_dir: str
    """the task's folder of official GLUE TSV files, or a `datasets` dataset saved to disk (glue/<task> layout)"""
    train_split: str | None = "train"
    """null: evaluate model.init_checkpoint only"""
    eval_splits: list | None = None
    """splits to score (default dev; mnli: dev_matched and dev_mismatched)"""
    predict_split: str | None = None
    """a split to predict without scoring (e.g. test)"""
    vocab: str | None = None
    """WordPiece vocab.txt; None = the init checkpoint's vocab.txt if it has one, else bert-base-uncased's"""
    max_seq_length: int = 128
    algorithm: str = "cghp"
    """packing algorithm over the examples' lengths; none = unpacked (one example per row)"""
    max_sequences_per_pack: int | str = "auto"
    """depth limit: N, max, or auto: the smallest depth that packs the examples as tightly as unlimited depth"""

    def __post_init__(self):
        if self.task not in GLUE_TASKS:
            raise ConfigError(f"data.task {self.task!r}: choose one of {', '.join(GLUE_TASKS)}")
        if self.max_seq_length < 8:
            raise ConfigError("data.max_seq_length must be >= 8")
        if self.eval_splits is not None and not all(isinstance(s, str) and s for s in self.eval_splits):
            raise ConfigError(f"data.eval_splits {self.eval_splits!r}: give split names (e.g. [dev])")
        check_algorithm(self.algorithm)
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")


@dataclass(kw_only=True)
class GlueRunConfig(RunConfig):
    """A GLUE fine-tuning run (kind: glue; run_glue.py)."""
    script: ClassVar[str] = "run_glue.py"
    kind: str = "glue"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: GlueDataConfig
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
