"""What the packed causal language models (bert_ipu/models/gpt2.py, llama.py) share: the document-causal
attention of a pack, the LM head, the Hugging Face round trip.

Each family is a file that subclasses `PackedCausalLM`; `bert_ipu.models.causal_lm_classes()` finds them by
their `model_type` (a new family is a new file). Attribute names are Hugging Face's (state dicts load both
ways with `strict=True`); packing changes three things, as for BERT (bert_ipu/models/bert.py):

- positions restart at 0 in every sequence (`position_ids` is an input: GPT-2 looks it up in `wpe`, Llama
  rotates by it with RoPE);
- attention is document-causal: token i attends to token j only if they share a sequence id and j <= i (any
  backend of bert_ipu/models/attention.py with causal=True);
- the labels (bert_ipu/tasks/causal_lm/data.py) never cross a sequence: the last token of a sequence predicts
  nothing.

Inputs per micro-batch of B packs of length S, sequences back to back then padding:

    input_ids, position_ids, sequence_ids: (B, S) int; sequence_ids 1..k in order, 0 = padding
    labels: (B, S) int, the next token of the same sequence where the loss counts, -100 elsewhere

`forward` returns the logits (B, S, V); `bert_ipu.models.losses.causal_lm_loss_sums` turns them into the loss
sums and counts of every loss mode.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from . import attention as attn
from .hf_io import from_hf, init_weights, save_as_hf
from .losses import HiddenStates


# --- the models --------------------------------------------------------------------------------------------

class PackedCausalLM(nn.Module):
    """What every family shares: the document-causal attention of a pack, the LM head, the HF round trip. A
    family sets the class attributes below and `init_family_weights`."""

    model_type: str       # the Hugging Face config's model_type this class packs (gpt2, llama)
    hf_class_name: str    # the transformers class of the same names (GPT2LMHeadModel, LlamaForCausalLM)
    base: str             # the attribute of the decoder: transformer (GPT-2) or model (Llama)
    embeddings: str       # the decoder's token embeddings (tied to lm_head): wte (GPT-2), embed_tokens (Llama)
    decoder_class: type   # GPT2Model or LlamaModel

    def __init__(self, config, attention_backend: str = "mask", max_sequences_per_pack: int | None = None):
        super().__init__()
        attn.backend(attention_backend)  # a ValueError naming the choices for an unknown name
        self.config = config
        self.attention_backend = attention_backend
        self.max_sequences_per_pack = max_sequences_per_pack  # K: varlen's segments a row (it needs it)
        self.head_in_loss = False  # True: forward returns HiddenStates, the loss applies the LM head in chunks
        self.generation = {}  # settings of the export's generation_config (SFT: the end of a turn stops it)
        setattr(self, self.base, self.decoder_class(config))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._tie_and_init()

    def _tie_and_init(self):
        """Tie the LM head to the input embeddings (unless the config says not to) and initialise as Hugging
        Face does: normal(initializer_range) weights, zero biases, unit norms."""
        embeddings = getattr(self, self.base).get_submodule(self.embeddings)
        if getattr(self.config, "tie_word_embeddings", True):
            self.lm_head.weight = embeddings.weight
        std = self.config.initializer_range
        for module in self.modules():
            init_weights(module, std)  # Linear, Embedding, LayerNorm as BERT's
        self.init_family_weights(std)

    def init_family_weights(self, std: float) -> None:
        """What a family initialises beyond Linear, Embedding and LayerNorm (GPT-2's Conv1D, Llama's RMSNorm)."""

    def forward(self, input_ids, position_ids, sequence_ids):
        """(B, S) ids -> logits (B, S, V)."""
        slots = self.max_sequences_per_pack  # varlen's segments: None is refused there (a segment a position)
        dtype = attn.compute_dtype(input_ids.device, self.lm_head.weight.dtype)
        attention = attn.attention_for(sequence_ids, self.attention_backend, dtype, causal=True, slots=slots)
        hidden = getattr(self, self.base)(input_ids, position_ids, attention)
        if self.head_in_loss:  # the loss applies the head chunk by chunk (losses.chunked_causal_lm_loss_sums)
            return HiddenStates(hidden, self.lm_head.weight)
        return self.lm_head(hidden)

    @classmethod
    def _hf_class(cls):
        import transformers

        return getattr(transformers, cls.hf_class_name)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs):
        """A `transformers` folder of this family (ours or any Hub checkpoint saved locally)."""
        return from_hf(cls, cls._hf_class(), path, {}, kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.AutoModelForCausalLM.from_pretrained` loads."""
        save_as_hf(self, self._hf_class(), path, generation=self.generation)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


