"""Packed GPT-2: learned positions, LayerNorm, GELU MLP, Conv1D projections, with Hugging Face
`GPT2LMHeadModel`'s names, on packs of several sequences (bert_ipu/models/causal_lm.py says what packing
changes).

    model = PackedGPT2LMHeadModel(GPT2Config(...), attention_backend="mask")
    logits = model(input_ids, position_ids, sequence_ids)      # (B, S) each -> (B, S, V)
"""

from __future__ import annotations

import math

from torch import nn

from .causal_lm import PackedCausalLM


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
        out = attention(q, k, v, self.dropout_p if self.training else 0.0, self.scale)
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


class PackedGPT2LMHeadModel(PackedCausalLM):
    """GPT-2 (learned positions, LayerNorm, GELU MLP, Conv1D projections); HF `GPT2LMHeadModel` names."""

    model_type, hf_class_name, base, embeddings = "gpt2", "GPT2LMHeadModel", "transformer", "wte"
    decoder_class = GPT2Model

    def init_family_weights(self, std: float) -> None:
        """Conv1D projections as Linear, and GPT-2's scheme: residual projections scaled by 1 / sqrt(2 x layers)."""
        for module in self.modules():
            if type(module).__name__ == "Conv1D":
                nn.init.normal_(module.weight, std=std)
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.config.num_hidden_layers))
