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
    """mask (custom op + SDPA), reference (plain PyTorch mask), flex, or varlen (CUDA, half precision: flash
    attention over the packs' sequences, put in sequence order for the encoder)"""
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
        if self.attention_backend not in ("mask", "reference", "flex", "varlen"):
            raise ConfigError(f"model.attention_backend {self.attention_backend!r}: choose mask, reference, flex or "
                              "varlen")

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
    betas: tuple = (0.9, 0.999)
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
    log_every: int = 10
    """a metrics row (and, off a terminal, a log line) every this many updates"""
    validate_every: int | None = 50
    """evaluate every this many updates (and at the end); null: at the end only"""
    validation_batches: int = 8
    checkpoint_every: int | None = 100
    """checkpoint every this many updates (and at the end); null: at the end only"""
    keep_checkpoints: int = 2
    balance: str = "none"
    """none: each replica takes its share of an update's packs in the loader's (shuffled) order; attention:
    the update's packs are dealt to replicas and micro-batches so that each gets the same attention cost (sum
    of squared sequence lengths, read from the data's sequence ids; bert_ipu.packing.balance). The same packs
    per update either way (only who computes which changes); deterministic"""

    def __post_init__(self):
        if self.balance not in ("none", "attention"):
            raise ConfigError(f"train.balance {self.balance!r}: choose none or attention")
        self.betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2
                and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"train.betas {self.betas!r}: give two numbers in [0, 1), e.g. [0.9, 0.999]")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"train.precision {self.precision!r}: choose fp32 or bf16")
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
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ConfigError("train.clip_grad_norm must be > 0 (or null: no clipping)")
        if self.log_every < 1 or self.keep_checkpoints < 1 or self.validation_batches < 1:
            raise ConfigError("train.log_every, keep_checkpoints and validation_batches must be >= 1")
        for key in ("validate_every", "checkpoint_every"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1 (or null: at the end only)")
        if self.seed < 0:
            raise ConfigError("train.seed must be >= 0")


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
    processes are data-parallel replicas x pipeline stages x this (bert_ipu/engine/tensor.py); fp32 or bf16"""

    def __post_init__(self):
        if self.pipeline_stages < 1 or self.schedule not in ("1f1b", "gpipe"):
            raise ConfigError("parallel.pipeline_stages must be >= 1 and parallel.schedule 1f1b or gpipe")
        if not isinstance(self.tensor_parallel, int) or self.tensor_parallel < 1:
            raise ConfigError(f"parallel.tensor_parallel must be an integer >= 1, got {self.tensor_parallel!r}")

    @property
    def processes(self) -> int:
        """Processes of one data-parallel replica: pipeline stages x tensor-parallel ranks."""
        return self.pipeline_stages * self.tensor_parallel


@dataclass
class RunConfig:
    """A pretraining run (kind: pretraining; run_pretraining.py)."""
    kind: str = "pretraining"
    name: str = "unnamed"
    """defaults to the config file's name"""
    output_dir: str | None = None
    """the run's folder (checkpoints, metrics, export); default runs/NAME"""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        _common_checks(self)


def _single_stage(cfg, what: str) -> None:
    """A task without a pipeline plan: one process or data parallel only."""
    if cfg.parallel.pipeline_stages != 1:
        raise ConfigError(f"{what} runs on one process or data parallel (torchrun); set parallel.pipeline_stages=1")


def _common_checks(cfg) -> None:
    if cfg.output_dir is None:
        cfg.output_dir = f"runs/{cfg.name}"
    if not isinstance(cfg.output_dir, str) or not cfg.output_dir.strip():
        raise ConfigError(f"output_dir {cfg.output_dir!r}: give a folder path")
    if cfg.parallel.pipeline_stages > 1 and cfg.train.precision != "fp32":
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
    backends: list | None = None
    """attention backends to measure (mask, reference, flex, varlen), each with every algorithm; None = the model's"""
    hf_baseline: bool = False
    """also time transformers' BertForPreTraining on NONE's rows (row 'hf'); OH of the others stays over our NONE"""
    compile: bool = False
    """also time torch.compile per algorithm: one compilation per distinct batch shape"""
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
    """data-parallel ranks for the balance metrics (ABR, DBR, padding ratio; README "Balance across devices")
    of updates of ranks x micro_batch_size packs drawn from each packing, dealt in order and balanced; None = none"""
    balance_updates: int = 200
    """updates drawn for the balance metrics"""

    def __post_init__(self):
        from .packing import ALGORITHMS

        if self.ranks is not None and self.ranks < 1 or self.balance_updates < 1:
            raise ConfigError("profile.ranks must be >= 1 (or null) and profile.balance_updates >= 1")
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
                raise ConfigError(f"profile.backends {self.backends!r}: a non-empty list of mask, reference, flex, "
                                  "varlen (or null for model.attention_backend)")
            bad = [b for b in self.backends if b not in ("mask", "reference", "flex", "varlen")]
            if bad:
                raise ConfigError(f"profile.backends: unknown backend(s) {', '.join(map(repr, bad))}; choose from "
                                  "mask, reference, flex, varlen")
        if self.scaling_batches < 2:
            raise ConfigError(f"profile.scaling_batches {self.scaling_batches}: must be >= 2")


@dataclass
class ProfilingRunConfig:
    """A profile (kind: profile; run_profiling.py)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    name: str = "unnamed"
    kind: str = "profile"


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


@dataclass
class FinetuneConfig(TrainConfig):
    """TrainConfig with fine-tuning defaults (the reference's SQuAD recipe)."""
    micro_batch_size: int = 4
    global_batch_size: int = 32
    """about this many sequences (features) per update: packed data takes 1/p as many packs"""
    batch_unit: str = "sequences"
    optimizer: str = "adamw"
    learning_rate: float = 3e-5
    max_steps: int | None = None
    """stop after this many updates (None: num_train_epochs)"""
    num_train_epochs: float | None = 2.0
    warmup_steps: int | None = None
    warmup_proportion: float = 0.1
    """linear warm-up over this fraction of the updates, then polynomial decay"""
    validate_every: int | None = None
    checkpoint_every: int | None = None


@dataclass
class SquadRunConfig:
    """A SQuAD fine-tuning run (kind: squad; run_squad.py)."""
    data: SquadDataConfig
    kind: str = "squad"
    name: str = "unnamed"
    output_dir: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        _common_checks(self)
        _single_stage(self, "SQuAD fine-tuning")


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
        check_algorithm(self.algorithm)
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")


@dataclass
class GlueRunConfig:
    """A GLUE fine-tuning run (kind: glue; run_glue.py)."""
    data: GlueDataConfig
    kind: str = "glue"
    name: str = "unnamed"
    output_dir: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        _common_checks(self)
        _single_stage(self, "GLUE fine-tuning")


@dataclass
class CausalModelConfig:
    family: str = "llama"
    """llama (RoPE, RMSNorm, SwiGLU, grouped-query attention) or gpt2 (learned positions); ignored with
    init_checkpoint (its config.json says)"""
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    """llama: key/value heads (grouped-query attention; = num_attention_heads for plain multi-head)"""
    intermediate_size: int = 344
    max_position_embeddings: int = 256
    dropout: float = 0.0
    """gpt2: embedding, attention and residual dropout; llama: attention dropout"""
    tie_word_embeddings: bool = True
    attention_backend: str = "mask"
    """mask (custom op, causal + SDPA), reference, flex, or varlen (CUDA: flash attention from cumulative
    sequence lengths, bf16)"""
    init_checkpoint: str | None = None
    """start from a Hugging Face GPT-2 or Llama folder (ours or transformers'); None = from scratch"""

    def __post_init__(self):
        if self.family not in ("llama", "gpt2"):
            raise ConfigError(f"model.family {self.family!r}: choose llama or gpt2")
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} = {getattr(self, key)}: must be >= 1")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                              f"{self.num_attention_heads}, and that of num_key_value_heads {self.num_key_value_heads}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout = {self.dropout}: a probability in [0, 1)")
        if self.attention_backend not in ("mask", "reference", "flex", "varlen"):
            raise ConfigError(f"model.attention_backend {self.attention_backend!r}: choose mask, reference, flex or "
                              "varlen")

    def hf_config(self, tokenizer, min_positions: int = 0):
        """The `transformers` config of a model built from scratch with this section's sizes."""
        from transformers import GPT2Config, LlamaConfig

        ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=self.tie_word_embeddings)
        positions = max(self.max_position_embeddings, min_positions)
        if self.family == "gpt2":
            return GPT2Config(n_embd=self.hidden_size, n_layer=self.num_hidden_layers, n_head=self.num_attention_heads,
                              n_inner=self.intermediate_size, n_positions=positions, resid_pdrop=self.dropout,
                              embd_pdrop=self.dropout, attn_pdrop=self.dropout, **ids)
        return LlamaConfig(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           intermediate_size=self.intermediate_size, max_position_embeddings=positions,
                           attention_dropout=self.dropout, **ids)


@dataclass
class CausalDataConfig:
    source: str = "builtin"
    """format text: builtin, or text files / folders / a saved datasets dataset (as create_pretraining_data
    reads them); format sft: a JSON-lines file of chats ({"messages": [...]}) or prompt/response pairs"""
    format: str = "text"
    """text (every next token is a label) or sft (labels on the assistant's tokens only)"""
    tokenizer: str | None = None
    """a Hugging Face tokenizer folder; None = the init checkpoint's, else a byte-level BPE trained on the source"""
    vocab_size: int = 4096
    """of a tokenizer trained on the source"""
    max_seq_length: int = 256
    """the pack length (and the longest sequence)"""
    algorithm: str = "cghp"
    """packing algorithm; none = unpacked (one sequence per row, padded)"""
    max_sequences_per_pack: int | str = "auto"
    """depth limit: N, max, or auto (the smallest that packs as tightly as unlimited depth)"""
    loss_mode: str = "token"
    """token: mean over the label tokens of the update (all micro-batches and ranks); sequence: mean over its
    sequences of each one's mean; sum: the sum over label tokens"""
    too_long: str = "error"
    """sft: an example longer than max_seq_length is an error, or drop (skipped and counted)"""
    validation_fraction: float = 0.05
    """sequences held out for validation loss and perplexity (0: none)"""

    def __post_init__(self):
        if self.format not in ("text", "sft"):
            raise ConfigError(f"data.format {self.format!r}: choose text or sft")
        if self.loss_mode not in ("token", "sequence", "sum"):
            raise ConfigError(f"data.loss_mode {self.loss_mode!r}: choose token, sequence or sum")
        if self.too_long not in ("error", "drop"):
            raise ConfigError(f"data.too_long {self.too_long!r}: choose error or drop")
        if self.max_seq_length < 8 or self.vocab_size < 300:
            raise ConfigError("data.max_seq_length must be >= 8 and data.vocab_size >= 300 (256 bytes + specials)")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"data.validation_fraction {self.validation_fraction}: a fraction in [0, 1)")
        check_algorithm(self.algorithm)
        self.max_sequences_per_pack = depth_value(self.max_sequences_per_pack, "data.max_sequences_per_pack")


@dataclass
class CausalTrainConfig(TrainConfig):
    """TrainConfig with causal-LM defaults: AdamW, about `global_batch_size` sequences per update."""
    batch_unit: str = "sequences"
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    micro_batch_size: int = 8
    global_batch_size: int = 32


@dataclass
class CausalLMRunConfig:
    """A causal language model run, pretraining or SFT (kind: causal_lm; run_causal_lm.py)."""
    kind: str = "causal_lm"
    name: str = "unnamed"
    output_dir: str | None = None
    model: CausalModelConfig = field(default_factory=CausalModelConfig)
    data: CausalDataConfig = field(default_factory=CausalDataConfig)
    train: CausalTrainConfig = field(default_factory=CausalTrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        _common_checks(self)
        _single_stage(self, "causal LM training")


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
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML text file (not UTF-8); give a config .yaml") from None
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


def _kinds() -> dict:
    return {"pretraining": RunConfig, "squad": SquadRunConfig, "glue": GlueRunConfig, "profile": ProfilingRunConfig,
            "causal_lm": CausalLMRunConfig}


def load_config(name: str, overrides: list[str] = (), root=None):
    """The config NAME (a file in configs/ without .yaml, or a path) with `section.key=value` overrides. Its
    `kind:` (inherited like any key) picks the root dataclass: pretraining (RunConfig), squad (SquadRunConfig),
    glue (GlueRunConfig) or profile (ProfilingRunConfig); `root`, when given, is what the caller can run (a
    mismatch is an error that names the right entry point). `name` defaults to the file's name, `output_dir`
    to runs/NAME."""
    raw = _read(name)
    raw.setdefault("name", _resolve(name).stem)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.max_steps=100)")
        key, value = item.split("=", 1)
        parts = key.split(".")
        if len(parts) == 2:
            section = raw.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ConfigError(f"override {key!r}: {parts[0]} is not a section")
            section[parts[1]] = yaml.safe_load(value)
        elif len(parts) == 1:
            raw[key] = yaml.safe_load(value)
        else:
            raise ConfigError(f"override {key!r}: use section.key (e.g. train.max_steps)")
    kinds = _kinds()
    kind = raw.get("kind")
    if kind is None:
        kind = next((k for k, v in kinds.items() if v is root), "pretraining")
        raw["kind"] = kind
    if kind not in kinds:
        raise ConfigError(f"kind {kind!r}: choose one of {', '.join(kinds)}")
    if root is not None and kinds[kind] is not root:
        entry = {"pretraining": "run_pretraining.py", "squad": "run_squad.py", "glue": "run_glue.py",
                 "profile": "run_profiling.py", "causal_lm": "run_causal_lm.py"}[kind]
        raise ConfigError(f"config {name!r} is of kind {kind}: run it with {entry}")
    root = kinds[kind]
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
        return root(**kwargs)
    except TypeError as e:
        raise ConfigError(str(e)) from None


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)
