"""Tensor-parallel plans of the models the tasks train, by Hugging Face module path (engine/tensor.py applies
them from outside the unchanged model, as torchtitan's parallelize.py does).

BERT (every BERT task: pretraining, SQuAD, GLUE): query/key/value and the first MLP projection column-parallel,
the attention output and the second MLP projection row-parallel, the word embeddings and the tied MLM decoder
split along the vocabulary; pooler and the NSP/QA/classification heads replicated (they are small: a row
split would add an all-reduce for H x 2 weights). Llama: the same for q/k/v/o and gate/up/down, embed_tokens
and lm_head along the vocabulary. GPT-2 has no plan: its fused c_attn (Conv1D, [q | k | v] in one weight)
would need a split of each third, which ColwiseParallel does not do.
"""

from __future__ import annotations

from ..engine.tensor import TensorPlan

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
