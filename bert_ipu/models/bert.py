"""Packed BERT: BERT for pretraining on packs of several sequences, computing what vanilla BERT computes on
each sequence alone.

The architecture is Hugging Face's `BertForPreTraining`, with its attribute names (so its state dict loads
with `strict=True` and ours loads back into `transformers`), changed in the three places packing needs:

- positions restart at 0 in every sequence (`position_ids` is an input, looked up in the position table);
- attention is block-diagonal: a token attends only to tokens of its own sequence (`sequence_ids`);
- the heads run on fixed slices: the MLM head on the first `mlm_slots` positions (where the data pipeline
  puts the masked tokens) and the NSP head (pooler + classifier) on the last `max_sequences_per_pack`
  positions (where it puts each sequence's [CLS] token). No gather with data-dependent shapes.

Packed inputs, per micro-batch of B packs of length S (see bert_ipu/data/layout.py for how they are made):

    input_ids, position_ids, token_type_ids, sequence_ids: (B, S) int; sequence_ids 1..k, 0 = padding
    masked_lm_labels:      (B, M) int, the token to predict at each of the first M positions, -100 = none
    next_sentence_labels:  (B, K) int, NSP label of the sequence whose [CLS] sits at position S - K + i
    next_sentence_weights: (B, K) float, 1 where that slot holds a [CLS] token, 0 otherwise

`PackedBertForQuestionAnswering` (at the end) is the SQuAD twin: HF `BertForQuestionAnswering` names, packs of
contiguous features, start/end logits per feature masked to its own candidate positions.

Attention is any backend of bert_ipu/models/attention.py (`attention_backend`: mask, reference, flex, varlen),
all giving the same numbers. A backend that wants each sequence's tokens contiguous (varlen, flex) gets them: the
pretraining layout puts the MLM tokens first and the [CLS] tokens last, so `PackedBertModel` permutes each
pack's tokens once into sequence order (a stable sort of the sequence ids, static shapes) before the encoder
and back after it; the heads still read the first M and last K slots. Attention in a bidirectional encoder
does not depend on the order within a sequence (positions come from `position_ids`), so the numbers are the
other backends'.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import BertConfig
from transformers.activations import ACT2FN

from . import attention as attn
from .hf_io import from_hf, init_weights, save_as_hf
from .losses import classification_loss_sums, pretraining_loss_sums, span_loss_sums


# --- encoder -----------------------------------------------------------------------------------------------

class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, position_ids, token_type_ids):
        # all (B, S) -> (B, S, H); position_ids restart in every sequence of a pack
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not a multiple of "
                             f"num_attention_heads {config.num_attention_heads}")
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, hidden, attention):
        # hidden: (B, S, H); attention: what bert_ipu.models.attention.attention_for built for the batch
        B, S, _ = hidden.shape
        # (B, nh, S, hd); nh = this rank's heads under tensor parallelism (the projections hold whole heads)
        q, k, v = (proj(hidden).view(B, S, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        out = attention(q, k, v, self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2).reshape(B, S, -1)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden, attention):
        return self.output(self.self(hidden, attention), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden):
        return self.intermediate_act_fn(self.dense(hidden))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden, attention):
        hidden = self.attention(hidden, attention)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        # keyed "0".."N-1" like HF's ModuleList, but a dict: a pipeline stage deletes the layers it does not
        # own and the remaining keys (and checkpoint names) stay as they were
        self.layer = nn.ModuleDict({str(i): BertLayer(config) for i in range(config.num_hidden_layers)})

    def forward(self, hidden, attention):
        for layer in self.layer.values():
            hidden = layer(hidden, attention)
        return hidden


class BertPooler(nn.Module):
    """HF's pooler (dense + tanh), applied to every [CLS] slot of a pack instead of position 0 only."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, cls_hidden):  # (B, K, H) -> (B, K, H)
        return self.activation(self.dense(cls_hidden))


class PackedBertModel(nn.Module):
    """Embeddings + encoder (+ pooler), HF `BertModel` names. Returns the encoder output (B, S, H); the heads
    apply the pooler where they need it."""

    def __init__(self, config: BertConfig, attention_backend: str = "mask", add_pooling_layer: bool = True,
                 slots: int | None = None):
        super().__init__()
        attn.backend(attention_backend)  # a ValueError naming the choices for an unknown name
        for setting, what in (("is_decoder", "a causal decoder"), ("add_cross_attention", "cross-attention")):
            if getattr(config, setting, False):  # transformers honours both; packed BERT would silently not
                raise ValueError(f"the BERT config sets {setting}=True ({what}), which packed BERT does not "
                                 f"implement: its outputs would differ from transformers'; use a config with "
                                 f"{setting}=False (a packed causal LM is GPT-2's or Llama's)")
        self.config = config
        self.attention_backend = attention_backend
        self.slots = slots  # K, the most sequences a pack holds (varlen's segments; None: the pack length)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None  # HF's QA model has none

    def forward(self, input_ids, position_ids, token_type_ids, sequence_ids):
        """(B, S) ids -> encoder output (B, S, H). On a pipeline stage without the embeddings (deleted),
        `input_ids` is the previous stage's hidden state (B, S, H) and passes straight to the layers."""
        hidden = input_ids if self.embeddings is None else self.embeddings(input_ids, position_ids, token_type_ids)
        slots = self.slots or sequence_ids.shape[1]
        if not attn.backend(self.attention_backend).contiguous:
            return self.encoder(hidden, attn.attention_for(sequence_ids, self.attention_backend, hidden.dtype,
                                                           slots=slots))
        if attn.sequence_parallel_on():  # each rank would reorder its own share: the gathered row would not be
            raise ValueError(f"attention backend {self.attention_backend} reorders each pack into sequence order, "
                             "which a share of each row per rank (sequence parallelism) cannot; use the mask or "
                             "reference backend")
        # sequences made contiguous for the encoder (the attention built on the reordered ids), and back
        order, inverse = attn.contiguous_order(sequence_ids, slots)
        attention = attn.attention_for(sequence_ids.gather(1, order), self.attention_backend, hidden.dtype,
                                       slots=slots)
        return attn.take(self.encoder(attn.take(hidden, order), attention), inverse)


# --- heads -------------------------------------------------------------------------------------------------

class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden):
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = self.decoder.bias  # HF keeps both names for one tensor

    def forward(self, hidden):
        return self.decoder(self.transform(hidden))


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, mlm_hidden, pooled):  # (B, M, H), (B, K, H) -> (B, M, V), (B, K, 2), as HF's
        return self.predictions(mlm_hidden), self.seq_relationship(pooled)


class PackedPreTrainingOutput(tuple):
    """(mlm_logits (B, M, V), nsp_logits (B, K, 2)): a tuple, so that a pipeline's last stage can return it,
    with the logits and, when labels were given, the losses as attributes:
    loss = mlm_loss + nsp_loss; mlm_loss_sum / mlm_count (masked tokens of the micro-batch); nsp_loss_sum /
    nsp_count (present sequences)."""

    LOSSES = ("loss", "mlm_loss", "nsp_loss", "mlm_loss_sum", "mlm_count", "nsp_loss_sum", "nsp_count")

    def __new__(cls, mlm_logits: torch.Tensor, nsp_logits: torch.Tensor, **losses):
        out = super().__new__(cls, (mlm_logits, nsp_logits))
        out.mlm_logits, out.nsp_logits = mlm_logits, nsp_logits
        for name in cls.LOSSES:
            setattr(out, name, losses.get(name))
        return out


class PackedBertForPreTraining(nn.Module):
    """BERT with MLM and NSP heads on packed inputs; HF `BertForPreTraining` names and state dict."""

    def __init__(self, config: BertConfig, max_sequences_per_pack: int = 3, attention_backend: str = "mask",
                 mlm_slots: int | None = None):
        super().__init__()
        if not getattr(config, "tie_word_embeddings", True):
            # (the decoder is the word embeddings here, and pipeline parallelism sums their gradients as one)
            raise ValueError("the BERT config sets tie_word_embeddings=False (an MLM decoder of its own), which "
                             "packed BERT pretraining does not implement: loaded, the decoder's weights would "
                             "replace the word embeddings; use a checkpoint with tied embeddings")
        self.config = config
        self.max_sequences_per_pack = max_sequences_per_pack
        self.mlm_slots = mlm_slots  # M, when no labels say it (a pipeline's last stage)
        self.bert = PackedBertModel(config, attention_backend, slots=max_sequences_per_pack)
        self.cls = BertPreTrainingHeads(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied, as in HF
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(self, input_ids, position_ids, token_type_ids, sequence_ids, masked_lm_labels=None,
                next_sentence_labels=None, next_sentence_weights=None, mlm_normalizer=None, nsp_normalizer=None,
                mlm_slots: int | None = None):
        """Shapes in the module docstring. The losses are sums divided by a count: by default this
        micro-batch's masked tokens and present sequences; pass `mlm_normalizer` / `nsp_normalizer` to divide
        by a global count instead (gradient accumulation, data parallelism) or by an expected count (the
        paper's loss balancing). `mlm_slots` (M) defaults to masked_lm_labels.shape[1], then self.mlm_slots.

        A pipeline stage is this model with modules deleted (set to None): without `bert.embeddings`,
        `input_ids` is the previous stage's hidden state; without the heads (`cls`), it returns what the next
        stage takes, (hidden, position_ids, token_type_ids, sequence_ids)."""
        hidden = self.bert(input_ids, position_ids, token_type_ids, sequence_ids)  # (B, S, H)
        if self.cls is None:
            return hidden, position_ids, token_type_ids, sequence_ids
        if mlm_slots is None:
            mlm_slots = masked_lm_labels.shape[1] if masked_lm_labels is not None else self.mlm_slots
            if mlm_slots is None:
                raise ValueError("give masked_lm_labels or mlm_slots: the MLM head runs on the first M positions")
        pooled = self.bert.pooler(hidden[:, -self.max_sequences_per_pack:])          # (B, K, H)
        mlm_logits, nsp_logits = self.cls(hidden[:, :mlm_slots], pooled)            # (B, M, V), (B, K, 2)
        out = PackedPreTrainingOutput(mlm_logits, nsp_logits)
        if masked_lm_labels is None or next_sentence_labels is None or next_sentence_weights is None:
            return out
        sums = pretraining_loss_sums(mlm_logits, nsp_logits, masked_lm_labels, next_sentence_labels,
                                     next_sentence_weights)
        out.mlm_loss_sum, out.mlm_count, out.nsp_loss_sum, out.nsp_count = (
            sums.mlm_loss_sum, sums.mlm_count, sums.nsp_loss_sum, sums.nsp_count)
        # clamp keeps an all-padding micro-batch at loss 0 instead of 0/0, with no data-dependent branch
        mlm_div = out.mlm_count.clamp_min(1) if mlm_normalizer is None else mlm_normalizer
        nsp_div = out.nsp_count.clamp_min(1) if nsp_normalizer is None else nsp_normalizer
        out.mlm_loss = out.mlm_loss_sum / mlm_div
        out.nsp_loss = out.nsp_loss_sum / nsp_div
        out.loss = out.mlm_loss + out.nsp_loss
        return out

    # --- Hugging Face interoperability -----------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> "PackedBertForPreTraining":
        """Load a Hugging Face `BertForPreTraining` folder (config.json + weights), or one saved by us."""
        from transformers import BertForPreTraining

        hf = BertForPreTraining.from_pretrained(str(path))
        model = cls(hf.config, **kwargs)
        model.load_state_dict(hf.state_dict(), strict=True)
        return model

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.BertForPreTraining.from_pretrained` loads."""
        from transformers import BertForPreTraining

        save_as_hf(self, BertForPreTraining, path)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())



# --- question answering (SQuAD) ----------------------------------------------------------------------------

@dataclass
class PackedQuestionAnsweringOutput:
    start_logits: torch.Tensor          # (B, K, S): slot k's logits, its own candidate positions only
    end_logits: torch.Tensor            # (B, K, S)
    loss: torch.Tensor | None = None    # loss_sum / count (or / normalizer)
    loss_sum: torch.Tensor | None = None  # sum over present sequences of (start CE + end CE) / 2
    count: torch.Tensor | None = None     # present sequences (slots with a label)


class PackedBertForQuestionAnswering(nn.Module):
    """BERT with a span head on packed inputs; HF `BertForQuestionAnswering` names (`bert`, no pooler,
    `qa_outputs`) and state dict.

    Inputs, per micro-batch of B packs of length S holding up to K = `max_sequences_per_pack` features, each
    contiguous ([CLS] question [SEP] context [SEP]) and in slot order (see bert_ipu/squad/features.py):

        input_ids, position_ids, token_type_ids, sequence_ids: (B, S) int; sequence_ids 1..k, 0 = padding
        candidate_mask:  (B, S) bool, positions that may start or end an answer: context tokens, and each
                         feature's [CLS] (the reference's label for "the answer is not in this window")
        start_positions, end_positions: (B, K) int, positions in the pack of slot k's answer, -100 = no slot

    Slot k's logits are the token logits with every position outside sequence k + 1, or not a candidate, set
    to the lowest float: its softmax covers only its own candidates, so one feature can never pick a position
    of another, and an unpacked row (K = 1) gives the same numbers. The loss is the reference's
    (start CE + end CE) / 2 per feature, summed and divided by the count of features (or `normalizer`: a
    global count over gradient accumulation).
    """

    def __init__(self, config: BertConfig, max_sequences_per_pack: int = 3, attention_backend: str = "mask"):
        super().__init__()
        if config.num_labels != 2:  # the span head has two outputs (start, end), as the config must say (with 3,
            # the export failed); a copy: the caller's config is theirs
            kept = {k: v for k, v in config.to_dict().items() if k not in ("id2label", "label2id")}
            config = config.__class__.from_dict({**kept, "num_labels": 2})
        self.config = config
        self.max_sequences_per_pack = max_sequences_per_pack
        self.bert = PackedBertModel(config, attention_backend, add_pooling_layer=False, slots=max_sequences_per_pack)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def token_logits(self, input_ids, position_ids, token_type_ids, sequence_ids):
        """Unmasked start and end logits per token, (B, S) each: what HF's model computes per position."""
        hidden = self.bert(input_ids, position_ids, token_type_ids, sequence_ids)  # (B, S, H)
        start, end = self.qa_outputs(hidden).unbind(-1)
        return start, end

    def forward(self, input_ids, position_ids, token_type_ids, sequence_ids, candidate_mask,
                start_positions=None, end_positions=None, normalizer=None) -> PackedQuestionAnsweringOutput:
        start, end = self.token_logits(input_ids, position_ids, token_type_ids, sequence_ids)
        K = self.max_sequences_per_pack
        slots = torch.arange(1, K + 1, device=sequence_ids.device)
        keep = (sequence_ids[:, None, :] == slots[None, :, None]) & candidate_mask[:, None, :].bool()  # (B, K, S)
        dtype = torch.promote_types(start.dtype, torch.float32)  # softmax in at least float32 (bf16 autocast)
        lowest = torch.finfo(dtype).min
        start_logits = start.to(dtype)[:, None, :].masked_fill(~keep, lowest)
        end_logits = end.to(dtype)[:, None, :].masked_fill(~keep, lowest)
        out = PackedQuestionAnsweringOutput(start_logits, end_logits)
        if start_positions is None or end_positions is None:
            return out
        sums = span_loss_sums(start_logits, end_logits, start_positions, end_positions)
        out.loss_sum, out.count = sums.loss_sum, sums.count
        out.loss = out.loss_sum / (out.count.clamp_min(1) if normalizer is None else normalizer)
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> "PackedBertForQuestionAnswering":
        """Load any Hugging Face BERT folder: a fine-tuned `BertForQuestionAnswering` (the span head too), or a
        pretrained `BertForPreTraining` / `BertModel` (ours or transformers'; the span head starts fresh, drawn
        from torch's generator, so seed it)."""
        from transformers import BertForQuestionAnswering

        # (a checkpoint with another head, say a token classifier of 7 labels, says num_labels 7: the span head has
        # 2 outputs, and one of another shape starts fresh, as a missing one does)
        return from_hf(cls, BertForQuestionAnswering, path, {"num_labels": 2, "ignore_mismatched_sizes": True},
                       kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.BertForQuestionAnswering.from_pretrained` loads."""
        from transformers import BertForQuestionAnswering

        save_as_hf(self, BertForQuestionAnswering, path)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --- sequence classification (GLUE) ------------------------------------------------------------------------

@dataclass
class PackedSequenceClassifierOutput:
    logits: torch.Tensor                # (B, K, num_labels): slot k's example
    loss: torch.Tensor | None = None    # loss_sum / count (or / normalizer)
    loss_sum: torch.Tensor | None = None  # summed over labelled slots: cross-entropy, or squared error (regression)
    count: torch.Tensor | None = None     # labelled slots


class PackedBertForSequenceClassification(nn.Module):
    """BERT with a sequence-classification head on packed inputs; HF `BertForSequenceClassification` names
    (`bert` with its pooler, `dropout`, `classifier`) and state dict.

    Inputs, per micro-batch of B packs of length S holding up to K = `max_sequences_per_pack` examples, each
    contiguous ([CLS] a [SEP] (b [SEP])), positions restarting at 0, sequence ids 1..k in slot order:

        input_ids, position_ids, token_type_ids, sequence_ids: (B, S) int
        cls_positions: (B, K) int, where slot k's [CLS] token is in the pack (0 for an empty slot)
        labels: (B, K) int class (-100 = no example), or float score for regression (NaN = no example)

    The pooler and classifier run on the K [CLS] tokens (a gather at fixed slots: static shapes), so slot k's
    logits are exactly what HF computes for that example alone: no logit of one example depends on another.
    """

    def __init__(self, config: BertConfig, max_sequences_per_pack: int = 3, attention_backend: str = "mask"):
        super().__init__()
        self.config = config
        self.num_labels = config.num_labels
        self.max_sequences_per_pack = max_sequences_per_pack
        self.bert = PackedBertModel(config, attention_backend, slots=max_sequences_per_pack)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(self, input_ids, position_ids, token_type_ids, sequence_ids, cls_positions, labels=None,
                normalizer=None) -> PackedSequenceClassifierOutput:
        hidden = self.bert(input_ids, position_ids, token_type_ids, sequence_ids)   # (B, S, H)
        index = cls_positions[..., None].expand(-1, -1, hidden.shape[-1])            # (B, K, H)
        pooled = self.bert.pooler(hidden.gather(1, index))                          # (B, K, H)
        out = PackedSequenceClassifierOutput(self.classifier(self.dropout(pooled)))   # (B, K, num_labels)
        if labels is None:
            return out
        sums = classification_loss_sums(out.logits, labels)
        out.loss_sum, out.count = sums.loss_sum, sums.count
        out.loss = out.loss_sum / (out.count.clamp_min(1) if normalizer is None else normalizer)
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path, num_labels: int | None = None, id2label: dict | None = None,
                        **kwargs) -> "PackedBertForSequenceClassification":
        """Any Hugging Face BERT folder: a fine-tuned `BertForSequenceClassification` (its head and label names
        too, unless `num_labels` asks for another number of outputs; None: the folder's, as
        `AutoModelForSequenceClassification`), or a pretrained BERT (ours or transformers'; the classifier
        starts fresh, drawn from torch's generator, so seed it)."""
        from transformers import BertForSequenceClassification

        labels = {} if id2label is None else {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
        if num_labels is not None:
            labels["num_labels"] = num_labels
        return from_hf(cls, BertForSequenceClassification, path, {"ignore_mismatched_sizes": True, **labels}, kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.BertForSequenceClassification.from_pretrained` loads."""
        from transformers import BertForSequenceClassification

        save_as_hf(self, BertForSequenceClassification, path)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
