"""Packed BERT for token classification: Hugging Face `BertForTokenClassification`'s names (`bert` without a
pooler, `dropout`, `classifier`) on packed rows. A token's logits depend only on its own sequence (attention is
block-diagonal, positions restart), so they are what Hugging Face computes for that sentence alone.

    model = PackedBertForTokenClassification(config, max_sequences_per_pack=3)
    logits = model(input_ids, position_ids, token_type_ids, sequence_ids)     # (B, S) each -> (B, S, labels)
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ...models.bert import PackedBertModel
from ...models.hf_io import from_hf, init_weights, save_as_hf


class PackedBertForTokenClassification(nn.Module):
    def __init__(self, config, max_sequences_per_pack: int = 3, attention_backend: str = "mask"):
        super().__init__()
        self.config = config
        self.max_sequences_per_pack = max_sequences_per_pack
        self.bert = PackedBertModel(config, attention_backend, add_pooling_layer=False, slots=max_sequences_per_pack)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(self, input_ids, position_ids, token_type_ids, sequence_ids):
        hidden = self.bert(input_ids, position_ids, token_type_ids, sequence_ids)    # (B, S, H)
        return self.classifier(self.dropout(hidden))                                 # (B, S, labels)

    @classmethod
    def from_pretrained(cls, path: str | Path, id2label: dict, **kwargs) -> "PackedBertForTokenClassification":
        """Any Hugging Face BERT folder: a fine-tuned `BertForTokenClassification` with these labels (its head
        too), or a pretrained BERT (the classifier starts fresh: seed torch's generator)."""
        from transformers import BertForTokenClassification

        labels = {"num_labels": len(id2label), "id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
        return from_hf(cls, BertForTokenClassification, path, {"ignore_mismatched_sizes": True, **labels}, kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that `transformers.BertForTokenClassification.from_pretrained` loads."""
        from transformers import BertForTokenClassification

        save_as_hf(self, BertForTokenClassification, path)
