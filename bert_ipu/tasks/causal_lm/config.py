"""The causal LM run's config: the model section (a GPT-2 or Llama from scratch, or a checkpoint), the data
section (text or SFT source, tokenizer, packing, loss mode), the train section's causal-LM defaults, and the root
(kind: causal_lm)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import ConfigError, ParallelConfig, RunConfig, TrainConfig, check_algorithm, check_backend, depth_value


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
    loss_chunk_tokens: int | None = None
    """compute the LM head and the vocabulary loss this many tokens at a time, each chunk's logits recomputed in
    the backward pass instead of kept: the (tokens x vocabulary) float32 logits never exist (1 GB for a 32K
    vocabulary at 8K tokens); None = the whole micro-batch's logits at once. One process or data parallelism"""

    def __post_init__(self):
        from ...models import causal_lm_classes

        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 1:
            raise ConfigError(f"model.loss_chunk_tokens = {self.loss_chunk_tokens}: must be >= 1 (or null)")
        if self.family not in causal_lm_classes():
            raise ConfigError(f"model.family {self.family!r}: choose {' or '.join(causal_lm_classes())}")
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} = {getattr(self, key)}: must be >= 1")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                              f"{self.num_attention_heads}, and that of num_key_value_heads {self.num_key_value_heads}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout = {self.dropout}: a probability in [0, 1)")
        check_backend(self.attention_backend)

    def parameter_estimate(self, vocab_size: int = 50257) -> int:
        """About how many parameters a model of these sizes has (what a machine must hold per process)."""
        layer = 4 * self.hidden_size ** 2 + 3 * self.hidden_size * self.intermediate_size
        positions = self.max_position_embeddings * self.hidden_size if self.family == "gpt2" else 0  # Llama: rope
        return self.num_hidden_layers * layer + 2 * vocab_size * self.hidden_size + positions

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
    pack_lengths: list | str | None = None
    """packs of several lengths in one run (Hierarchical Balance Packing's levels), e.g. [128, 256, 512]: the
    multi-size packer chooses how many packs of each length hold the training sequences (the fewest computed
    tokens, with a proven bound); every update takes packs of one length (train.levels, train.level_order). The
    longest must hold data.max_seq_length. auto: the lengths (and each one's sequence-parallel size and
    checkpointing) a model of the step time picks (bert_ipu.packing.levels; the table is printed). null: one
    length, data.max_seq_length"""
    level_memory_tokens: int | None = None
    """pack_lengths auto: the tokens of one pack a process holds with its activations (longer packs are split
    over sequence-parallel ranks, then checkpointed); null: any pack fits"""
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
        if self.level_memory_tokens is not None and self.level_memory_tokens < 8:
            raise ConfigError(f"data.level_memory_tokens {self.level_memory_tokens}: at least 8 tokens (or null)")
        if self.pack_lengths is not None and self.pack_lengths != "auto":
            lengths = self.pack_lengths
            if (not isinstance(lengths, list) or not lengths
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 8 for n in lengths)
                    or len(set(lengths)) != len(lengths)):
                raise ConfigError(f"data.pack_lengths {lengths!r}: a list of different whole numbers >= 8, e.g. "
                                  "[128, 256, 512], or auto")
            if max(lengths) < self.max_seq_length:
                raise ConfigError(f"data.pack_lengths {lengths}: the longest, {max(lengths)}, must hold "
                                  f"data.max_seq_length ({self.max_seq_length}), the longest sequence")
        if self.pack_lengths is not None:
            if self.algorithm != "cghp":
                raise ConfigError("data.pack_lengths: packs of several lengths are chosen by the multi-size packer; "
                                  "use data.algorithm=cghp")


@dataclass
class CausalTrainConfig(TrainConfig):
    """TrainConfig with causal-LM defaults: AdamW, about `global_batch_size` sequences per update."""
    batch_unit: str = "sequences"
    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    betas: list | tuple = (0.9, 0.95)
    micro_batch_size: int = 8
    global_batch_size: int = 32


@dataclass(kw_only=True)
class CausalLMRunConfig(RunConfig):
    """A causal language model run, pretraining or SFT (kind: causal_lm; run_causal_lm.py)."""
    script: ClassVar[str] = "run_causal_lm.py"
    kind: str = "causal_lm"
    model: CausalModelConfig = field(default_factory=CausalModelConfig)
    data: CausalDataConfig = field(default_factory=CausalDataConfig)
    train: CausalTrainConfig = field(default_factory=CausalTrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        super().__post_init__()
        if self.data.pack_lengths == "auto" and self.train.levels:
            raise ConfigError("train.levels with data.pack_lengths=auto: the model picks each level's settings; "
                              "give data.pack_lengths as a list to set train.levels")
