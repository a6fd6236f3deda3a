"""Packed causal language models: GPT-2 and Llama on packs of several sequences, computing what
`transformers.GPT2LMHeadModel` / `LlamaForCausalLM` compute on each sequence alone.

Attribute names are Hugging Face's (state dicts load both ways with `strict=True`); packing changes three
things, as for BERT (bert_ipu/modeling.py):

- positions restart at 0 in every sequence (`position_ids` is an input: GPT-2 looks it up in `wpe`, Llama
  rotates by it with RoPE);
- attention is document-causal: token i attends to token j only if they share a sequence id and j <= i (the
  custom op with causal=True, its plain-PyTorch reference, FlexAttention's block mask, or on CUDA
  variable-length flash attention from cumulative sequence lengths);
- the labels (bert_ipu/data/causal.py) never cross a sequence: the last token of a sequence predicts nothing.

Inputs per micro-batch of B packs of length S, sequences back to back then padding:

    input_ids, position_ids, sequence_ids: (B, S) int; sequence_ids 1..k in order, 0 = padding
    labels: (B, S) int, the next token of the same sequence where the loss counts, -100 elsewhere

`forward` returns the logits (B, S, V); `causal_lm_loss_sums` turns them into the loss sums and counts of
every loss mode (per token, per sequence, sum), one definition for the model and every engine.

Attention backends (`attention_backend`): "mask" (default; custom op + SDPA), "reference", "flex" (forward
only on the CPU), "varlen" (CUDA only: torch.nn.attention.varlen, flash attention, half precision; needs
sequences stored contiguously, as this layout does).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .modeling import (IGNORE_INDEX, Varlen, _flex_attention, _from_hf, _save_as_hf, attention_for, init_weights,
                       require_varlen_device, varlen_attention, warn_no_attention_dropout, whole)

CAUSAL_BACKENDS = ("mask", "reference", "flex", "varlen")
LOSS_MODES = ("token", "sequence", "sum")


# --- attention ---------------------------------------------------------------------------------------------

def attend(q, k, v, attention, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """(B, heads, S, D) queries, keys, values (as many key as query heads) -> (B, heads, S, D)."""
    if isinstance(attention, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention.to(q.dtype), dropout_p=dropout_p,
                                              scale=scale)
    if dropout_p > 0:
        warn_no_attention_dropout(dropout_p)
    if isinstance(attention, Varlen):
        return varlen_attention(q, k, v, attention, scale)  # causal within each segment
    return _flex_attention(q.device)(q, k, v, block_mask=attention, scale=scale)


def causal_attention_for(sequence_ids: torch.Tensor, backend: str, dtype: torch.dtype, slots: int):
    if backend == "varlen":
        require_varlen_device(sequence_ids.device)
        return Varlen(sequence_ids, slots, causal=True)
    if backend not in CAUSAL_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {', '.join(CAUSAL_BACKENDS)}")
    return attention_for(sequence_ids, backend, dtype, causal=True)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, kv_heads, S, D) -> (B, kv_heads * groups, S, D): grouped-query attention's shared keys/values."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


# --- the loss ----------------------------------------------------------------------------------------------

def causal_lm_loss_sums(logits, labels, sequence_ids, slots: int) -> dict:
    """The next-token loss as sums and counts, for every loss mode:

        token_loss_sum   cross-entropy summed over label tokens            (mode token: / label_tokens)
        label_tokens     tokens with a label
        sequence_loss_sum  sum over sequences of their mean cross-entropy  (mode sequence: / labelled_sequences)
        labelled_sequences sequences with at least one label token

    `slots` is K, the most sequences a pack holds (static shapes: a (B, K + 1) scatter by sequence id). In at
    least float32, also under bf16 autocast."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    B, S = labels.shape
    each = whole(F.cross_entropy(logits.flatten(0, 1).to(dtype), labels.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="none")).view(B, S)
    has = (labels != IGNORE_INDEX).to(dtype)
    ids = sequence_ids.long()
    per_sum = torch.zeros(B, slots + 1, dtype=dtype, device=logits.device).scatter_add(1, ids, each)[:, 1:]
    per_count = torch.zeros(B, slots + 1, dtype=dtype, device=logits.device).scatter_add(1, ids, has)[:, 1:]
    return {"token_loss_sum": each.sum(), "label_tokens": has.sum(),
            "sequence_loss_sum": (per_sum / per_count.clamp_min(1)).sum(),
            "labelled_sequences": (per_count > 0).sum()}


def causal_lm_loss(sums: dict, mode: str, normalizers: dict | None = None):
    """The loss of a mode from `causal_lm_loss_sums`: token = mean over the label tokens of the update (pass the
    update's global count in `normalizers["label_tokens"]`: accumulation and ranks), sequence = mean over its
    sequences of each sequence's mean, sum = the plain sum over label tokens."""
    n = normalizers or {}
    if mode == "token":
        return sums["token_loss_sum"] / n.get("label_tokens", sums["label_tokens"].clamp_min(1))
    if mode == "sequence":
        return sums["sequence_loss_sum"] / n.get("labelled_sequences", sums["labelled_sequences"].clamp_min(1))
    if mode == "sum":
        return sums["token_loss_sum"]
    raise ValueError(f"unknown loss mode {mode!r}; choose from {', '.join(LOSS_MODES)}")


# --- GPT-2 -------------------------------------------------------------------------------------------------

class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        E = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = E // self.num_heads
        self.c_attn = Conv1D(3 * E, E)
        self.c_proj = Conv1D(E, E)
        self.dropout_p = config.attn_pdrop
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        scale = 1 / math.sqrt(self.head_dim) if config.scale_attn_weights else 1.0
        self.scale = scale / (layer_idx + 1) if config.scale_attn_by_inverse_layer_idx else scale

    def forward(self, hidden, attention):
        B, S, E = hidden.shape
        q, k, v = (x.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
                   for x in self.c_attn(hidden).split(E, dim=2))
        out = attend(q, k, v, attention, self.dropout_p if self.training else 0.0, self.scale)
        return self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(B, S, E)))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

        E = config.hidden_size
        self.ln_1 = nn.LayerNorm(E, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(E, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config.n_inner or 4 * E, config)

    def forward(self, hidden, attention):
        hidden = hidden + self.attn(self.ln_1(hidden), attention)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.drop = nn.Dropout(config.embd_pdrop)
        # a dict keyed "0".."N-1": HF's ModuleList names, and a pipeline stage can delete layers
        self.h = nn.ModuleDict({str(i): GPT2Block(config, i) for i in range(config.num_hidden_layers)})
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, input_ids, position_ids, attention):
        hidden = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h.values():
            hidden = block(hidden, attention)
        return self.ln_f(hidden)


# --- Llama -------------------------------------------------------------------------------------------------

class LlamaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.dropout_p = config.attention_dropout

    def forward(self, hidden, attention, cos, sin):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, S, _ = hidden.shape
        # (B, heads, S, hd): this rank's heads under tensor parallelism (the projections hold whole heads)
        q, k, v = (proj(hidden).view(B, S, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # rotated by the restarting positions
        groups = self.num_heads // self.num_kv_heads
        out = attend(q, repeat_kv(k, groups), repeat_kv(v, groups), attention,
                     self.dropout_p if self.training else 0.0, self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, attention, cos, sin):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), attention, cos, sin)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleDict({str(i): LlamaDecoderLayer(config) for i in range(config.num_hidden_layers)})
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # Hugging Face's own RoPE (every rope type it knows; its buffers are not in the state dict)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids, position_ids, attention):
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(hidden, position_ids)
        for layer in self.layers.values():
            hidden = layer(hidden, attention, cos, sin)
        return self.norm(hidden)


# --- the models --------------------------------------------------------------------------------------------

class _PackedCausalLM(nn.Module):
    """What both families share: the document-causal attention of a pack, the LM head, the HF round trip."""

    hf_class_name: str
    base: str             # the attribute of the decoder: transformer (GPT-2) or model (Llama)
    decoder_class: type   # GPT2Model or LlamaModel

    def __init__(self, config, attention_backend: str = "mask", max_sequences_per_pack: int | None = None):
        super().__init__()
        if attention_backend not in CAUSAL_BACKENDS:
            raise ValueError(f"unknown attention backend {attention_backend!r}; "
                             f"choose from {', '.join(CAUSAL_BACKENDS)}")
        self.config = config
        self.attention_backend = attention_backend
        self.max_sequences_per_pack = max_sequences_per_pack  # K, for varlen (default: S)
        setattr(self, self.base, self.decoder_class(config))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._tie_and_init()

    def _tie_and_init(self):
        """Tie the LM head to the input embeddings (unless the config says not to) and initialise as Hugging
        Face does: normal(initializer_range) weights, zero biases, unit norms."""
        embeddings = getattr(self, self.base).get_submodule("wte" if self.base == "transformer" else "embed_tokens")
        if getattr(self.config, "tie_word_embeddings", True):
            self.lm_head.weight = embeddings.weight
        std = self.config.initializer_range
        for module in self.modules():
            init_weights(module, std)  # Linear, Embedding, LayerNorm as BERT's
            if type(module).__name__ == "Conv1D":  # GPT-2's projections
                nn.init.normal_(module.weight, std=std)
                nn.init.zeros_(module.bias)
            elif type(module).__name__ == "LlamaRMSNorm":
                nn.init.ones_(module.weight)
        if self.base == "transformer":  # GPT-2's scheme: residual projections scaled by 1 / sqrt(2 x layers)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, std=std / math.sqrt(2 * self.config.num_hidden_layers))

    def forward(self, input_ids, position_ids, sequence_ids):
        """(B, S) ids -> logits (B, S, V)."""
        slots = self.max_sequences_per_pack or input_ids.shape[1]
        dtype = torch.get_autocast_dtype(input_ids.device.type) if torch.is_autocast_enabled(
            input_ids.device.type) else self.lm_head.weight.dtype
        attention = causal_attention_for(sequence_ids, self.attention_backend, dtype, slots)
        hidden = getattr(self, self.base)(input_ids, position_ids, attention)
        return self.lm_head(hidden)

    @classmethod
    def _hf_class(cls):
        import transformers

        return getattr(transformers, cls.hf_class_name)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs):
        """A `transformers` folder of this family (ours or any Hub checkpoint saved locally)."""
        return _from_hf(cls, cls._hf_class(), path, {}, kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.AutoModelForCausalLM.from_pretrained` loads."""
        _save_as_hf(self, self._hf_class(), path)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class PackedGPT2LMHeadModel(_PackedCausalLM):
    """GPT-2 (learned positions, LayerNorm, GELU MLP, Conv1D projections); HF `GPT2LMHeadModel` names."""

    hf_class_name, base, decoder_class = "GPT2LMHeadModel", "transformer", GPT2Model


class PackedLlamaForCausalLM(_PackedCausalLM):
    """Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention); HF `LlamaForCausalLM` names."""

    hf_class_name, base, decoder_class = "LlamaForCausalLM", "model", LlamaModel


FAMILIES = {"gpt2": PackedGPT2LMHeadModel, "llama": PackedLlamaForCausalLM}


def packed_causal_lm_class(config):
    """The packed class of a `transformers` config (by its model_type)."""
    if config.model_type not in FAMILIES:
        raise ValueError(f"model type {config.model_type!r} has no packed causal LM here; choose one of "
                         f"{', '.join(FAMILIES)}")
    return FAMILIES[config.model_type]
