"""Where the models split, by Hugging Face module path: tensor-parallel and pipeline plans. The engine applies
them from outside the unchanged model (engine/tensor.py, engine/parallel.py), as torchtitan's parallelize.py
does; a task names the plans of the model it trains.

BERT (every BERT task: pretraining, SQuAD, GLUE): query/key/value and the first MLP projection column-parallel,
the attention output and the second MLP projection row-parallel, the word embeddings and the tied MLM decoder
split along the vocabulary; pooler and the NSP/QA/classification heads replicated (they are small: a row
split would add an all-reduce for H x 2 weights). Llama: the same for q/k/v/o and gate/up/down, embed_tokens
and lm_head along the vocabulary. GPT-2 has no plan: its fused c_attn (Conv1D, [q | k | v] in one weight)
would need a split of each third, which ColwiseParallel does not do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorPlan:
    """Where a model splits, by module path (`fnmatch` patterns: "*" stands for a layer key)."""
    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]
    vocab_embedding: str | None = None
    vocab_output: str | None = None
    rng_region: tuple[str, ...] = ()
    shared_input: tuple[tuple[str, int], ...] = ()
    """(module, its number of positional inputs): a module whose first input feeds several column-parallel
    projections (attention: query, key and value). That input becomes one replicated DTensor, so autograd
    sums the projections' input gradients on each rank and all-reduces once, as Megatron's fused QKV does,
    instead of once per projection"""
    head_counts: tuple[str, ...] = ()
    """attributes of `model.config` that must divide by the tensor-parallel size (each rank holds whole heads)"""


@dataclass(frozen=True)
class PipelinePlan:
    """Where a model splits, by module path: `first` modules live on stage 0, `last` on the last stage,
    `layers` is a ModuleDict keyed "0".."N-1" cut at layer boundaries; `tied` names a weight of the first
    stage and its tied twin on the last (their gradients are summed, as in Megatron)."""
    first: tuple[str, ...]
    layers: str
    last: tuple[str, ...]
    tied: tuple[str, str] | None = None


_BERT_LAYER = "bert.encoder.layer.*."

BERT = TensorPlan(
    colwise=tuple(_BERT_LAYER + m for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                                            "intermediate.dense")),
    rowwise=(_BERT_LAYER + "attention.output.dense", _BERT_LAYER + "output.dense"),
    vocab_embedding="bert.embeddings.word_embeddings",
    vocab_output="cls.predictions.decoder",
    rng_region=(_BERT_LAYER + "attention.self",),
    shared_input=((_BERT_LAYER + "attention.self", 2),),
    head_counts=("num_attention_heads",),
)

_LLAMA_LAYER = "model.layers.*."

LLAMA = TensorPlan(
    colwise=tuple(_LLAMA_LAYER + m for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "mlp.gate_proj", "mlp.up_proj")),
    rowwise=(_LLAMA_LAYER + "self_attn.o_proj", _LLAMA_LAYER + "mlp.down_proj"),
    vocab_embedding="model.embed_tokens",
    vocab_output="lm_head",
    rng_region=(_LLAMA_LAYER + "self_attn",),
    shared_input=((_LLAMA_LAYER + "self_attn", 4), (_LLAMA_LAYER + "mlp", 1)),
    head_counts=("num_attention_heads", "num_key_value_heads"),
)


# BERT pretraining: embeddings on the first stage, pooler and heads on the last, the tied MLM decoder summed with
# the word embeddings
BERT_PRETRAINING_PIPELINE = PipelinePlan(
    first=("bert.embeddings",), layers="bert.encoder.layer", last=("bert.pooler", "cls"),
    tied=("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"),
)
