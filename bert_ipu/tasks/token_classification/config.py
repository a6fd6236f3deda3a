"""The token classification run's config: the data section (CoNLL files, vocab, packing) and the root (kind:
token_classification)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import (ConfigError, ModelConfig, ParallelConfig, RunConfig, check_algorithm,
                       depth_value)
from ..common import FinetuneConfig


@dataclass
class TokenDataConfig:
    train_file: str
    """CoNLL-style text: one "word ... TAG" line a token (the tag is the last column), a blank line between
    sentences, -DOCSTART- lines skipped"""
    eval_file: str | None = None
    """the same, to score (entity precision, recall, F1 and word accuracy); None = train only"""
    vocab: str | None = None
    """WordPiece vocab.txt; None = the init checkpoint's vocab.txt if it has one, else bert-base-uncased's"""
    max_seq_length: int = 128
    """the pack length; a longer sentence is cut (its last words, unseen, are predicted O and scored so; counted)"""
    algorithm: str = "cghp"
    """packing algorithm over the sentences' lengths; none = unpacked (one sentence per row)"""
    max_sequences_per_pack: int | str = "auto"
    """depth limit: N, max, or auto (the smallest depth that packs as tightly as unlimited depth)"""

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise ConfigError("data.max_seq_length must be >= 8")
        check_algorithm(self.algorithm)
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")


@dataclass(kw_only=True)
class TokenClassificationRunConfig(RunConfig):
    """A token classification run (kind: token_classification; python -m bert_ipu)."""
    script: ClassVar[str] = "-m bert_ipu"
    kind: str = "token_classification"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: TokenDataConfig
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
