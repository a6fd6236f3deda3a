"""Packed Llama: RoPE, RMSNorm, SwiGLU and grouped-query attention, with Hugging Face `LlamaForCausalLM`'s names,
on packs of several sequences (bert_ipu/models/causal_lm.py says what packing changes). RoPE rotates by the
restarting `position_ids`, with Hugging Face's own rotary embedding.

    model = PackedLlamaForCausalLM(LlamaConfig(...), attention_backend="mask")
    logits = model(input_ids, position_ids, sequence_ids)      # (B, S) each -> (B, S, V)
"""

from __future__ import annotations

from torch import nn

from .causal_lm import PackedCausalLM


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
        # keys and values keep their kv_heads: the attention repeats them for the query heads (after a
        # sequence-parallel all-to-all, which then moves kv_heads, not heads)
        out = attention(q, k, v, self.dropout_p if self.training else 0.0, self.head_dim ** -0.5)
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
        # Hugging Face's own RoPE (its buffers are not in the state dict); PackedLlamaForCausalLM refuses the rope
        # types under which a packed row's short sequences would rotate differently from the same sequences alone
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids, position_ids, attention):
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(hidden, position_ids)
        for layer in self.layers.values():
            hidden = layer(hidden, attention, cos, sin)
        return self.norm(hidden)


# Rope types whose frequencies depend on the longest sequence a row holds: longrope picks its short or long
# factors by the batch's largest position, so in a pack a short sequence next to a long one would rotate with the
# long factors (alone, with the short ones). Hugging Face does the same to a padded batch; packing must not.
# (dynamic NTK also scales by the largest position, but only above max_position_embeddings, which no sequence of
# the causal LM task exceeds: there it is the default rope. default, linear, yarn and llama3 are fixed by the config.)
LENGTH_DEPENDENT_ROPE = ("longrope",)


def rope_type(config) -> str:
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return parameters.get("rope_type", parameters.get("type", "default"))


class PackedLlamaForCausalLM(PackedCausalLM):
    """Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention); HF `LlamaForCausalLM` names. Every rope type of
    `transformers` except those in LENGTH_DEPENDENT_ROPE, which are refused for packed rows (more than one
    sequence a row): they would make a packed sequence differ from the same sequence alone. Dynamic NTK is exact
    while a row's positions stay below max_position_embeddings (past it, transformers rescales the whole row by
    its longest sequence: a short one beside it differs from itself alone, 3e-5 measured); the causal-LM task
    refuses rows longer than that, and a caller of this model must keep its packs within it."""

    model_type, hf_class_name, base, embeddings = "llama", "LlamaForCausalLM", "model", "embed_tokens"
    decoder_class = LlamaModel

    def __init__(self, config, attention_backend: str = "mask", max_sequences_per_pack: int | None = None):
        heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
        if kv_heads and heads % kv_heads:  # (an SDPA shape error deep in the forward, in transformers' too)
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}: "
                             "each key/value head serves a whole group of query heads; give a divisor")
        if rope_type(config) in LENGTH_DEPENDENT_ROPE and max_sequences_per_pack != 1:
            raise ValueError(f"rope type {rope_type(config)} scales its frequencies by the longest sequence of a row, "
                             "so a packed row's short sequences would differ from the same sequences alone; train "
                             "it unpacked (data.algorithm=none) or with another rope type")
        super().__init__(config, attention_backend, max_sequences_per_pack)

    def init_family_weights(self, std: float) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        for module in self.modules():
            if isinstance(module, LlamaRMSNorm):
                nn.init.ones_(module.weight)
