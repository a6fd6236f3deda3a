"""Run configuration: one dataclass per section, loaded from YAML with validation.

    cfg = load_config("pretrain_tiny_128_packed", ["train.max_steps=20", "model.hidden_size=64"])

NAME is a file in configs/ (without .yaml) or a path. A file may start from another with
`inherit: OTHER_NAME` and then override single fields. Unknown keys are errors that list the valid ones;
`key.sub=value` overrides are parsed as YAML scalars.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    hidden_size: int = 128
    """width of the encoder"""
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    attention_backend: str = "mask"
    """mask (custom op + SDPA), reference (plain PyTorch mask) or flex"""
    init_checkpoint: str | None = None
    """start from a Hugging Face BERT folder (ours or transformers'); None = from scratch"""

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} is not a multiple of "
                              f"model.num_attention_heads {self.num_attention_heads}")
        if self.attention_backend not in ("mask", "reference", "flex"):
            raise ConfigError(f"model.attention_backend {self.attention_backend!r}: choose mask, reference or flex")

    def bert_config(self, vocab_size: int, min_positions: int = 0, **overrides):
        """The `transformers.BertConfig` of a model built from scratch with this section's sizes (at least
        `min_positions` position embeddings); `overrides` replace single fields (e.g. dropout 0 to profile)."""
        from transformers import BertConfig

        fields = dict(vocab_size=vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                      num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                      max_position_embeddings=max(self.max_position_embeddings, min_positions),
                      hidden_dropout_prob=self.hidden_dropout_prob,
                      attention_probs_dropout_prob=self.attention_probs_dropout_prob)
        return BertConfig(**(fields | overrides))


@dataclass
class DataConfig:
    dataset: str = "runs/data/packed_128"
    """packed (or unpacked) dataset folder; created from `prepare_input` when missing"""
    prepare_input: str | None = "builtin"
    """text to create the dataset from when it does not exist (None: the dataset must exist)"""
    max_seq_length: int = 128
    algorithm: str = "cghp"
    """packing algorithm used when the dataset is created; none = unpacked"""
    max_sequences_per_pack: int = 3
    validation_fraction: float = 0.05
    """documents held out for validation when the dataset is created"""

    def __post_init__(self):
        if self.max_seq_length < 8 or self.max_sequences_per_pack < 1 or not 0 < self.validation_fraction < 1:
            raise ConfigError("data.max_seq_length must be >= 8, data.max_sequences_per_pack >= 1 and "
                              "data.validation_fraction in (0, 1)")


@dataclass
class OptimizerConfig:
    """What pretraining and fine-tuning share: batches, optimizer, schedule shape, clipping, seed, device."""
    micro_batch_size: int = 8
    """packs (or rows) per forward pass on one replica"""
    global_batch_size: int = 32
    """per optimizer update, counted in `batch_unit`"""
    optimizer: str = "lamb"
    """lamb or adamw"""
    learning_rate: float = 2e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    decay_power: float = 1.0
    """polynomial decay to 0 after warm-up (1 = linear)"""
    clip_grad_norm: float | None = 1.0
    seed: int = 1234
    log_every: int = 10
    device: str = "auto"
    """auto (cuda if available), cpu or cuda"""
    precision: str = "fp32"
    """fp32, or bf16: bfloat16 autocast of the forward pass; weights, gradients and optimizer state stay float32"""

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"train.precision {self.precision!r}: choose fp32 or bf16")
        if self.optimizer not in ("lamb", "adamw"):
            raise ConfigError(f"train.optimizer {self.optimizer!r}: choose lamb or adamw")
        if min(self.micro_batch_size, self.global_batch_size) < 1:
            raise ConfigError("train.micro_batch_size and global_batch_size must be >= 1")


@dataclass
class TrainConfig(OptimizerConfig):
    batch_unit: str = "packs"
    """packs: the global batch holds that many packs (use the packing correction of the betas); sequences:
    it holds about that many sequences, so packed data takes 1/p as many packs per update"""
    max_steps: int = 200
    warmup_steps: int = 20
    packing_beta_correction: bool = True
    """with batch_unit=packs: beta ** p (p = packing factor), as the paper derives"""
    loss_balancing: bool = False
    """the paper's loss balancing: divide by the expected counts of masked tokens and sequences per update
    (from the dataset's averages) instead of the real counts of the update"""
    validate_every: int = 50
    validation_batches: int = 8
    checkpoint_every: int = 100
    keep_checkpoints: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.batch_unit not in ("packs", "sequences"):
            raise ConfigError(f"train.batch_unit {self.batch_unit!r}: choose packs or sequences")
        if self.max_steps < 1:
            raise ConfigError("train.max_steps must be >= 1")
        if self.keep_checkpoints < 1:
            raise ConfigError("train.keep_checkpoints must be >= 1")


@dataclass
class ParallelConfig:
    pipeline_stages: int = 1
    """> 1: split the encoder into this many stages, one process each (torchrun --nproc-per-node N)"""
    layers_per_stage: list | None = None
    """encoder layers of each stage (default: as even as possible)"""
    schedule: str = "1f1b"
    """1f1b or gpipe; the micro-batches of a pipeline update are its gradient-accumulation steps"""

    def __post_init__(self):
        if self.pipeline_stages < 1 or self.schedule not in ("1f1b", "gpipe"):
            raise ConfigError("parallel.pipeline_stages must be >= 1 and parallel.schedule 1f1b or gpipe")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    output_dir: str = "runs/pretrain"
    name: str = "unnamed"

    def __post_init__(self):
        if self.parallel.pipeline_stages > 1 and self.train.precision != "fp32":
            raise ConfigError("train.precision=bf16 is not supported with pipeline stages yet; use fp32 or "
                              "parallel.pipeline_stages=1")


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

    def __post_init__(self):
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"profile.precision {self.precision!r}: choose fp32 or bf16")
        if min(self.micro_batch_size, self.steps, self.sort_batch_size) < 1 or self.rounds < 2:
            raise ConfigError("profile.micro_batch_size, steps and sort_batch_size must be >= 1, rounds >= 2")


@dataclass
class ProfilingRunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    name: str = "unnamed"


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
    """depth limit, or auto: the smallest depth that packs the features into as few packs as unlimited depth"""
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
        if not (self.max_sequences_per_pack == "auto" or (isinstance(self.max_sequences_per_pack, int)
                                                          and self.max_sequences_per_pack >= 1)):
            raise ConfigError(f"data.max_sequences_per_pack {self.max_sequences_per_pack!r}: a number >= 1 or auto")
        if min(self.n_best_size, self.max_answer_length) < 1:
            raise ConfigError("data.n_best_size and data.max_answer_length must be >= 1")


@dataclass
class FinetuneConfig(OptimizerConfig):
    micro_batch_size: int = 4
    global_batch_size: int = 32
    """about this many sequences (features) per update: packed data takes 1/p as many packs"""
    optimizer: str = "adamw"
    learning_rate: float = 3e-5
    num_train_epochs: float = 2.0
    max_steps: int | None = None
    """stop after this many updates (None: num_train_epochs)"""
    warmup_proportion: float = 0.1
    """linear warm-up over this fraction of the updates, then polynomial decay"""

    def __post_init__(self):
        super().__post_init__()
        if self.num_train_epochs <= 0 or (self.max_steps is not None and self.max_steps < 1):
            raise ConfigError("train.num_train_epochs must be > 0 and train.max_steps >= 1 (or null)")
        if not 0 <= self.warmup_proportion < 1:
            raise ConfigError("train.warmup_proportion must be in [0, 1)")


@dataclass
class SquadRunConfig:
    data: SquadDataConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    output_dir: str = "runs/squad"
    name: str = "unnamed"


def _sections(root) -> dict:
    """The sections of a root config: its fields whose type is a dataclass (model, data, train, ...)."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root) if dataclasses.is_dataclass(hints[f.name])}


def _build(cls, values: dict, where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(sorted(f'{where}{k}' for k in unknown))}; valid keys: "
                          f"{', '.join(sorted(names))}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _typed(v, hints[k], f"{where}{k}") for k, v in values.items()})


def _typed(value, hint, key: str):
    """`value` checked against a field's type: int, float, str or bool, optionally `| None` (or a union of
    them); a float field also takes an int or a string such as 2e-4 (which YAML 1.1 reads as a string)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return value
    as_float = (float in allowed and isinstance(value, (int, str)) and not isinstance(value, bool)
                and not any(isinstance(value, t) for t in (int, str) if t in allowed))
    if as_float:
        try:
            return float(value)
        except ValueError:
            pass
    scalar = [t for t in allowed if t in (int, float, str, bool)]
    if scalar and not any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in scalar):
        names = " or ".join(t.__name__ for t in allowed if t is not type(None))
        raise ConfigError(f"{key} = {value!r}: expected {names}{' (or null)' if type(None) in allowed else ''}")
    return value


def _resolve(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = CONFIG_DIR / f"{name}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(f"no config {name!r}: give a path to a .yaml file or one of: {', '.join(known)}")


def _read(name: str, seen=()) -> dict:
    path = _resolve(name)
    if path in seen:
        raise ConfigError(f"{path}: inherit loop")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    parent = raw.pop("inherit", None)
    merged = _read(parent, (*seen, path)) if parent else {}
    for key, value in raw.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def load_config(name: str, overrides: list[str] = (), root=RunConfig):
    """A `root` (RunConfig; ProfilingRunConfig for run_profiling.py, SquadRunConfig for run_squad.py) from a
    YAML file and overrides."""
    raw = _read(name)
    raw.setdefault("name", _resolve(name).stem)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.max_steps=100)")
        key, value = item.split("=", 1)
        parts = key.split(".")
        if len(parts) == 2:
            raw.setdefault(parts[0], {})[parts[1]] = yaml.safe_load(value)
        elif len(parts) == 1:
            raw[key] = yaml.safe_load(value)
        else:
            raise ConfigError(f"override {key!r}: use section.key (e.g. train.max_steps)")
    top = {f.name for f in dataclasses.fields(root)}
    unknown = set(raw) - top
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(top))}")
    try:
        sections = _sections(root)
        kwargs = {k: _build(sections[k], v or {}, f"{k}.") if k in sections else v for k, v in raw.items()}
        return root(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e)) from None


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)
