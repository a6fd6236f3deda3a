"""The SQuAD run's config: the data section (files, windows, packing, answers), and the root (kind: squad)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import ConfigError, ModelConfig, ParallelConfig, RunConfig, depth_value
from ..common import FinetuneConfig


@dataclass
class SquadDataConfig:
    train_file: str | None = None
    """SQuAD v1.1 JSON (the official format) or a `datasets` dataset saved to disk; None = evaluate only"""
    predict_file: str | None = None
    """the same, to evaluate on (answers give EM/F1); None = train only"""
    vocab: str | None = None
    """WordPiece vocab.txt; None = the init checkpoint's vocab.txt if it has one, else bert-base-uncased's"""
    max_seq_length: int = 384
    doc_stride: int = 128
    """tokens between the starts of two windows over a long context (the reference's doc_stride)"""
    max_query_length: int = 64
    """questions are cut to this many tokens (counted and reported)"""
    algorithm: str = "cghp"
    """packing algorithm over the features' lengths; none = unpacked (one feature per row)"""
    max_sequences_per_pack: int | str = "auto"
    """depth limit: N, max, or auto: the smallest depth that packs the features as tightly as unlimited depth"""
    n_best_size: int = 20
    max_answer_length: int = 30

    def __post_init__(self):
        if self.train_file is None and self.predict_file is None:
            raise ConfigError("give data.train_file, data.predict_file or both")
        if self.max_seq_length < 16 or self.doc_stride < 1 or self.max_query_length < 1:
            raise ConfigError("data.max_seq_length must be >= 16, data.doc_stride and data.max_query_length >= 1")
        if self.max_query_length > self.max_seq_length - 4:
            raise ConfigError(f"data.max_query_length {self.max_query_length} leaves no room for the context in "
                              f"data.max_seq_length {self.max_seq_length}")
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")
        if min(self.n_best_size, self.max_answer_length) < 1:
            raise ConfigError("data.n_best_size and data.max_answer_length must be >= 1")


@dataclass(kw_only=True)
class SquadRunConfig(RunConfig):
    """A SQuAD fine-tuning run (kind: squad; run_squad.py)."""
    script: ClassVar[str] = "run_squad.py"
    kind: str = "squad"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SquadDataConfig
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
