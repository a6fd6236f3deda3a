"""Run configuration: YAML overlays, `key=value` overrides, typing, and the sections every task shares.

    cfg = bert_ipu.tasks.load_config("pretrain_tiny_128_packed", ["train.max_steps=20", "model.hidden_size=64"])

NAME is a file in configs/ (without .yaml) or a path. A file may start from another with `inherit: OTHER_NAME`
and then override single fields (sections merge key by key). Unknown keys are errors that list the valid ones;
`section.key=value` overrides are parsed as YAML scalars and typed against the field. The `kind:` of a config
(inherited like any key) picks the task, whose folder in bert_ipu/tasks/ holds its root dataclass and its own
sections (`load_config` here takes that registry; `bert_ipu.tasks.load_config` passes it).

Shared sections: `ModelConfig` (BERT's sizes, the attention backend, an init checkpoint), `TrainConfig` (the
engine's: batches, optimizer, schedule, precision, cadence), `ParallelConfig` (pipeline stages, tensor
parallelism). One dataclass per section, a docstring under each field, validation in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    pass


def check_backend(name: str, key: str = "model.attention_backend") -> None:
    """An attention backend of bert_ipu/models/attention.py (its registry is the one list of names)."""
    from .models.attention import BACKENDS

    if name not in BACKENDS:
        raise ConfigError(f"{key} {name!r}: choose {', '.join(BACKENDS)}")


@dataclass(kw_only=True)
class RunConfig:
    """The root of a training run's config: what every run has besides its task's sections (which a task's
    root adds: model, data, train, parallel). Class attributes: `script`, the entry point that runs the kind (for
    errors and model cards), and `pipeline`, whether the task has a pipeline plan (else one stage only)."""
    script: ClassVar[str]
    pipeline: ClassVar[bool] = False
    invocation: ClassVar[tuple] = ()
    """set by load_config on the instance: the config as named and its overrides (the command a model card gives)"""
    kind: str
    name: str = "unnamed"
    """defaults to the config file's name"""
    output_dir: str | None = None
    """the run's folder (checkpoints, metrics, export); default runs/NAME"""

    def __post_init__(self):
        check_run(self, self.pipeline, f"the {self.kind} task")


def check_run(cfg, pipeline: bool = True, what: str = "this task") -> None:
    """What every root config checks: the output folder (default runs/NAME), and the parallel layout a task can
    run (`pipeline`: whether it has a pipeline plan)."""
    if cfg.output_dir is None:
        cfg.output_dir = f"runs/{cfg.name}"
    if not isinstance(cfg.output_dir, str) or not cfg.output_dir.strip():
        raise ConfigError(f"output_dir {cfg.output_dir!r}: give a folder path")
    if not pipeline and cfg.parallel.pipeline_stages != 1:
        raise ConfigError(f"{what} runs on one process or data parallel (torchrun); set parallel.pipeline_stages=1")
    lengths = getattr(getattr(cfg, "data", None), "pack_lengths", None)
    levels = getattr(cfg.train, "levels", None)
    if levels and lengths is None:
        raise ConfigError(f"train.levels sets one level a pack length of data.pack_lengths (a causal LM's list of "
                          f"lengths), and this run packs into one length: drop train.levels (train.micro_batch_size, "
                          "parallel.sequence_parallel and model settings apply)")
    if levels and isinstance(lengths, list) and len(levels) != len(lengths):
        raise ConfigError(f"train.levels has {len(levels)} entries for {len(lengths)} pack lengths "
                          f"(data.pack_lengths {lengths}); give one (or null) a length")
    if cfg.parallel.pipeline_stages > 1 and cfg.train.precision != "fp32":
        raise ConfigError("train.precision=bf16 is not supported with pipeline stages yet; use fp32 or "
                          "parallel.pipeline_stages=1")


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
    """a backend of bert_ipu/models/attention.py: mask (custom op + SDPA), reference (plain PyTorch mask), flex, or
    varlen (CUDA, half precision: flash attention over the packs' sequences, put in sequence order for the
    encoder)"""
    init_checkpoint: str | None = None
    """start from a Hugging Face BERT folder (ours or transformers'); None = from scratch"""

    def __post_init__(self):
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} = {getattr(self, key)}: must be >= 1")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"model.{key} = {getattr(self, key)}: a probability in [0, 1)")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} is not a multiple of "
                              f"model.num_attention_heads {self.num_attention_heads}")
        check_backend(self.attention_backend)

    def parameter_estimate(self, vocab_size: int = 30522) -> int:
        """About how many parameters a model of these sizes has (what a machine must hold per process)."""
        layer = 12 * self.hidden_size ** 2 + 2 * self.hidden_size * self.intermediate_size
        return self.num_hidden_layers * layer + (vocab_size + self.max_position_embeddings) * self.hidden_size

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


TRACKERS = ("tensorboard", "wandb", "mlflow")
"""the names train.report_to takes (besides none)"""


def report_to(value) -> list[str]:
    """train.report_to as a list of tracker names, each once, in order: a single name is a list of one, and
    [] or [none] is no tracker. Raises ValueError (one line) for anything else."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"train.report_to {value!r}: give a list of tracker names, e.g. [tensorboard, wandb]")
    names = [n.strip().lower() for n in names]
    unknown = [n for n in names if n not in (*TRACKERS, "none")]
    if unknown:
        raise ValueError(f"train.report_to: unknown tracker {unknown[0]!r}; choose from {', '.join(TRACKERS)} "
                         "(or none)")
    if "none" in names and len(set(names)) > 1:
        raise ValueError(f"train.report_to {names}: none means no tracker; give it alone or leave it out")
    return [n for i, n in enumerate(names) if n != "none" and n not in names[:i]]


@dataclass
class TrainConfig:
    """The engine's section, the same for every task: batches, optimizer, schedule, precision, cadence."""
    micro_batch_size: int = 8
    """packs (or rows) per forward pass on one replica"""
    global_batch_size: int = 32
    """per optimizer update, counted in `batch_unit`"""
    batch_unit: str = "packs"
    """packs: the global batch holds that many packs (use the packing correction of the betas); sequences:
    it holds about that many sequences, so packed data takes 1/p as many packs per update"""
    optimizer: str = "lamb"
    """lamb or adamw"""
    learning_rate: float = 2e-3
    betas: list | tuple = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    decay_power: float = 1.0
    """polynomial decay to 0 after warm-up (1 = linear)"""
    clip_grad_norm: float | None = 1.0
    packing_beta_correction: bool = True
    """with batch_unit=packs: beta ** p (p = packing factor), as the paper derives"""
    loss_balancing: bool = False
    """the paper's loss balancing: divide by the expected counts per update (from the dataset's averages)
    instead of the real counts of the update"""
    max_steps: int | None = 200
    """optimizer updates; null: num_train_epochs decides"""
    num_train_epochs: float | None = None
    """passes over the training packs, when max_steps is null"""
    warmup_steps: int | None = 20
    """linear warm-up; null: warmup_proportion of the updates"""
    warmup_proportion: float = 0.0
    seed: int = 1234
    device: str = "auto"
    """auto (cuda if available), cpu or cuda"""
    precision: str = "fp32"
    """fp32, or bf16: bfloat16 autocast of the forward pass; weights, gradients and optimizer state stay float32"""
    compile: str = "none"
    """none; compile: the model's forward, the task's loss and their backward under torch.compile with static
    shapes (the first update compiles, about a minute for BERT-large; the loss, metrics and checkpoints are
    eager's); layers: each layer of the model's stack compiled alone, once for all of them (what torchtitan
    does: a fraction of the compile time, the embeddings, heads and loss eager); cudagraphs: the whole step,
    replayed as CUDA graphs (torch.compile's reduce-overhead; CUDA only). One process or data-parallel replicas"""
    log_every: int = 10
    """a metrics row (and, off a terminal, a log line) every this many updates"""
    validate_every: int | None = 50
    """evaluate every this many updates (and at the end); null: at the end only"""
    validation_batches: int = 8
    """evaluate the first validation_batches x micro_batch_size packs of the validation split (all of it when
    smaller), each once, whatever the number of processes"""
    checkpoint_every: int | None = 100
    """checkpoint every this many updates (and at the end); null: at the end only"""
    keep_checkpoints: int = 2
    balance: str = "none"
    """none: each replica takes its share of an update's packs in the loader's (shuffled) order; attention:
    the update's packs are dealt to replicas and micro-batches so that each gets the same attention cost (sum
    of squared sequence lengths, read from the data's sequence ids; bert_ipu.packing.balance). The same packs
    per update either way (only who computes which changes); deterministic"""
    levels: list | None = None
    """packs of several lengths (a task's data.pack_lengths): per level, in the order of the pack lengths, a
    mapping of micro_batch_size (packs a micro-batch), sequence_parallel (ranks each row's tokens are split
    over) and checkpointed_layers (layers that recompute their activations in the backward pass); a key left out
    or null: the default (micro-batches of about as many tokens as micro_batch_size packs of the longest length,
    no sequence parallelism, no checkpointing)"""
    level_order: str = "random"
    """the order of the levels' updates in an epoch: random (seeded) or curriculum (short packs first)"""
    report_to: list | str = dataclasses.field(default_factory=lambda: ["tensorboard"])
    """trackers that get the run's config and every metrics row besides metrics.jsonl: tensorboard
    (OUTPUT/tensorboard), wandb, mlflow (installed apart: requirements-benchmarks.txt); [] or [none]: metrics.jsonl
    only. Their own environment variables (WANDB_MODE, MLFLOW_TRACKING_URI, ...) say where they write
    (bert_ipu/engine/trackers.py)"""

    LEVEL_KEYS: ClassVar[dict] = {"micro_batch_size": 1, "sequence_parallel": 1, "checkpointed_layers": 0}

    def __post_init__(self):
        try:
            self.report_to = report_to(self.report_to)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.balance not in ("none", "attention"):
            raise ConfigError(f"train.balance {self.balance!r}: choose none or attention")
        if self.level_order not in ("random", "curriculum"):
            raise ConfigError(f"train.level_order {self.level_order!r}: choose random or curriculum")
        if self.levels is not None:
            if not isinstance(self.levels, list) or not all(isinstance(x, dict) or x is None for x in self.levels):
                raise ConfigError(f"train.levels {self.levels!r}: a list with one mapping (or null) a pack length, "
                                  "e.g. [{micro_batch_size: 8}, {micro_batch_size: 2, sequence_parallel: 2}]")
            for i, level in enumerate(x or {} for x in self.levels):
                for key, value in level.items():
                    if key not in self.LEVEL_KEYS:
                        raise ConfigError(f"train.levels[{i}]: unknown key {key!r}; valid: {', '.join(self.LEVEL_KEYS)}")
                    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                              or value < self.LEVEL_KEYS[key]):
                        raise ConfigError(f"train.levels[{i}].{key} = {value!r}: a whole number >= "
                                          f"{self.LEVEL_KEYS[key]} (or null)")
        self.betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2
                and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"train.betas {self.betas!r}: give two numbers in [0, 1), e.g. [0.9, 0.999]")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"train.precision {self.precision!r}: choose fp32 or bf16")
        if self.compile not in ("none", "compile", "layers", "cudagraphs"):
            raise ConfigError(f"train.compile {self.compile!r}: choose none, compile, layers or cudagraphs")
        if self.optimizer not in ("lamb", "adamw"):
            raise ConfigError(f"train.optimizer {self.optimizer!r}: choose lamb or adamw")
        if self.batch_unit not in ("packs", "sequences"):
            raise ConfigError(f"train.batch_unit {self.batch_unit!r}: choose packs or sequences")
        if min(self.micro_batch_size, self.global_batch_size) < 1:
            raise ConfigError("train.micro_batch_size and global_batch_size must be >= 1")
        if self.max_steps is None and self.num_train_epochs is None:
            raise ConfigError("give train.max_steps or train.num_train_epochs")
        if (self.max_steps is not None and self.max_steps < 1) or (self.num_train_epochs is not None
                                                                    and self.num_train_epochs <= 0):
            raise ConfigError("train.max_steps must be >= 1 and train.num_train_epochs > 0 (or null)")
        if self.warmup_steps is not None and self.warmup_steps < 0 or not 0 <= self.warmup_proportion < 1:
            raise ConfigError("train.warmup_steps must be >= 0 and train.warmup_proportion in [0, 1)")
        if self.learning_rate < 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ConfigError("train.learning_rate and weight_decay must be >= 0 and train.eps > 0")
        if self.learning_rate > 10:
            raise ConfigError(f"train.learning_rate {self.learning_rate:g}: no optimizer here trains above 10 (the "
                              "weights would leave float range); check the exponent, e.g. 1e-3")
        if self.decay_power < 0:
            raise ConfigError(f"train.decay_power {self.decay_power:g}: the learning rate decays as (1 - progress) "
                              "** power; give a power >= 0 (1 linear, 0 constant)")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ConfigError("train.clip_grad_norm must be > 0 (or null: no clipping)")
        if self.log_every < 1 or self.keep_checkpoints < 1 or self.validation_batches < 1:
            raise ConfigError("train.log_every, keep_checkpoints and validation_batches must be >= 1")
        for key in ("validate_every", "checkpoint_every"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1 (or null: at the end only)")
        if not 0 <= self.seed < 2 ** 63:
            raise ConfigError(f"train.seed must be >= 0 (and below 2**63, what torch's generators take), not "
                              f"{self.seed}")


@dataclass
class ParallelConfig:
    pipeline_stages: int = 1
    """> 1: split the encoder into this many stages, one process each (torchrun --nproc-per-node N)"""
    layers_per_stage: list | None = None
    """encoder layers of each stage (default: as even as possible)"""
    schedule: str = "1f1b"
    """1f1b or gpipe; the micro-batches of a pipeline update are its gradient-accumulation steps"""
    tensor_parallel: int = 1
    """> 1: split every layer over this many processes (Megatron-style, torch.distributed.tensor): attention
    heads and the MLP's hidden units, and the vocabulary of the embeddings and the tied output layer; the
    processes are data-parallel replicas x pipeline stages x sequence x this (bert_ipu/engine/tensor.py); fp32
    or bf16"""
    sequence_parallel: int = 1
    """> 1: split every row's tokens over this many processes (DeepSpeed-Ulysses: an all-to-all before and after
    attention turns "my tokens, all heads" into "all tokens, my heads"); any split of the documents, none padded.
    The attention heads (and key/value heads) must divide by it (x tensor_parallel), the pack length too; causal
    LM task"""

    def __post_init__(self):
        if self.pipeline_stages < 1 or self.schedule not in ("1f1b", "gpipe"):
            raise ConfigError("parallel.pipeline_stages must be >= 1 and parallel.schedule 1f1b or gpipe")
        split = self.layers_per_stage
        if split is not None and (not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in split)
                                  or len(split) != self.pipeline_stages):
            raise ConfigError(f"parallel.layers_per_stage {split} does not give parallel.pipeline_stages="
                              f"{self.pipeline_stages} stages; set parallel.layers_per_stage=null (as even as "
                              f"possible) or a list of {self.pipeline_stages} layer counts")
        for key in ("tensor_parallel", "sequence_parallel"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"parallel.{key} must be an integer >= 1, got {value!r}")

    @property
    def processes(self) -> int:
        """Processes of one data-parallel replica: pipeline stages x sequence-parallel x tensor-parallel ranks."""
        return self.pipeline_stages * self.sequence_parallel * self.tensor_parallel


def check_algorithm(name: str) -> None:
    """data.algorithm: any packing algorithm that gives rows of one length (not sort)."""
    from .packing import ALGORITHMS

    if name not in ALGORITHMS or name == "sort":
        raise ConfigError(f"data.algorithm {name!r}: choose one of {', '.join(a for a in ALGORITHMS if a != 'sort')}")


def depth_value(value, key: str):
    """A depth limit as the config holds it: an int >= 1, "max" or "auto" (one type everywhere)."""
    from .packing import PackingInputError, parse_depth

    try:
        depth = parse_depth(value)
    except PackingInputError as e:
        raise ConfigError(f"{key}: {e}") from None
    return "max" if depth is None else depth


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
    """`value` checked against a field's type: int, float, str, bool, list or dict, optionally `| None` (or a
    union of them). A float field also takes an int or a string such as 2e-4 (which YAML 1.1 reads as a
    string), and only a finite number: .inf and .nan pass no range check (nan < 0 is False), so they are refused
    here, for every float field at once."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return value
    kinds = [t for t in allowed if isinstance(t, type) and t is not type(None)]
    as_float = (float in allowed and isinstance(value, (int, str, float)) and not isinstance(value, bool)
                and not any(isinstance(value, t) for t in (int, str) if t in allowed))
    if as_float:
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{key} = {value!r}: give a finite number")
            return number
    if kinds and not any(isinstance(value, t) and not (t in (int, float) and isinstance(value, bool))
                         for t in kinds):
        names = " or ".join(t.__name__ for t in kinds)
        raise ConfigError(f"{key} = {value!r}: expected {names}{' (or null)' if type(None) in allowed else ''}")
    return value


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last silently: a second
    `train:` block in a config dropped the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise DuplicateKey(f"{key!r} is given twice in one mapping (line {key_node.start_mark.line + 1}"
                                       "; YAML would drop the first): give it once")
                seen.add(key)
            except TypeError:  # (an unhashable key: SafeLoader's own error follows)
                pass
        return super().construct_mapping(node, deep=deep)


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping of a config (`_StrictLoader`)."""


def _safe_load(text: str):
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)


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
        raw = _safe_load(path.read_text(encoding="utf-8")) or {}
    except DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML text file (not UTF-8); give a config .yaml") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    parent = raw.pop("inherit", None)
    if parent is not None and not isinstance(parent, str):
        raise ConfigError(f"{path}: inherit: {parent!r}; give the name of one config (e.g. inherit: test_tiny)")
    merged = _read(parent, (*seen, path)) if parent else {}
    for key, value in raw.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif value is None and isinstance(merged.get(key), dict):
            continue  # an empty section (`train:` with its keys commented out) changes nothing it inherits
        else:
            merged[key] = value
    return merged


def _value(key: str, text: str):
    """An override's value, read as YAML (safely: a python tag is refused, never run)."""
    try:
        return _safe_load(text)
    except DuplicateKey as e:
        raise ConfigError(f"override {key}={text}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key}={text}: not a YAML value ({str(e).splitlines()[0]}); give a number, a "
                          "word, true/false, null or a [list]") from None


def _apply(raw: dict, overrides) -> None:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.max_steps=100)")
        key, value = item.split("=", 1)
        parts = key.split(".")
        if len(parts) == 2:
            section = raw.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ConfigError(f"override {key!r}: {parts[0]} is not a section")
            section[parts[1]] = _value(key, value)
        elif len(parts) == 1:
            value = _value(key, value)
            if isinstance(raw.get(key), dict):  # a section: its keys are merged, as a child config's are
                if not isinstance(value, dict):
                    raise ConfigError(f"override {item!r}: {key} is a section; set its keys ({key}.KEY=VALUE, or "
                                      f"{key}={{KEY: VALUE}})")
                raw[key] = {**raw[key], **value}
            else:
                raw[key] = value
        else:
            raise ConfigError(f"override {key!r}: use section.key (e.g. train.max_steps)")


def load_config(name: str, overrides=(), kinds: dict | None = None, expected: str | None = None):
    """The config NAME (a file in configs/ without .yaml, or a path) with `section.key=value` overrides, built as
    the root dataclass of its `kind:`. `kinds` maps a kind to what knows its config (`.config`, the root
    dataclass, and `.script`, its entry point: the task registry). `expected`, when given, is the kind the
    caller runs: a config of another kind is an error naming its entry point; a config without `kind:` is of
    that kind. `name` defaults to the file's name, `output_dir` to runs/NAME."""
    kinds = kinds or {}
    raw = _read(name)
    raw.setdefault("name", _resolve(name).stem)
    _apply(raw, overrides)
    kind = raw.get("kind")
    if kind is None:
        kind = raw["kind"] = expected or "pretraining"
    if kind not in kinds:
        raise ConfigError(f"kind {kind!r}: choose one of {', '.join(kinds)}")
    if expected is not None and kind != expected:
        raise ConfigError(f"config {name!r} is of kind {kind}: run it with {kinds[kind].script}")
    root = kinds[kind].config
    top = {f.name for f in dataclasses.fields(root)}
    unknown = set(raw) - top
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(top))}")
    try:
        sections = _sections(root)
        kwargs = {}
        for k, v in raw.items():
            if k in sections:
                if v is not None and not isinstance(v, dict):
                    raise ConfigError(f"section {k} must be a mapping of keys, got {v!r}")
                kwargs[k] = _build(sections[k], v or {}, f"{k}.")
            else:
                kwargs[k] = _typed(v, typing.get_type_hints(root)[k], k)
        cfg = root(**kwargs)
        cfg.invocation = (str(name), *overrides)
        return cfg
    except TypeError as e:
        raise ConfigError(str(e)) from None


def to_yaml(cfg) -> str:
    """A config as the YAML that loads back into it (every field, resolved: what --print-config shows)."""
    return yaml.safe_dump(_plain(dataclasses.asdict(cfg)), sort_keys=False)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
