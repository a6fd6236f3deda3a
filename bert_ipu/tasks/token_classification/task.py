"""Token classification (named entities) on packed sentences: the task the engine trains.

1. Read the CoNLL files (data.py); the training file's tags, sorted with "O" first, are the labels.
2. Pack whole sentences back to back (bert_ipu/data/contiguous.py) with any packing algorithm at depth K.
3. Fine-tune PackedBertForTokenClassification (model.py) on the engine: about `train.global_batch_size`
   sentences per update, the loss summed over the update's labelled words and divided by their count (the
   mean over words, as Hugging Face's unpacked loss), so packing never changes a word's weight.
4. Evaluate on rank 0: a word's tag is the argmax at its first sub-token; entity precision, recall and F1 and
   word accuracy (metrics.py); predictions.json holds every sentence's tags.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...data.contiguous import pack_sequences
from ...data.instances import WordPiece
from ...data.layout import IGNORE_INDEX
from ...data.loader import ArraySource
from ...data.text import DataInputError
from ...engine.runtime import RunError, Runtime, autocast
from ...files import write_json
from ...models import plans
from ...models.hf_io import export_model
from ...models.losses import classification_loss_sums
from ...packing import PackingInputError
from ..base import TaskBase
from ..common import card, check_model_fits, load_checkpoint, pack_depth, packing_line, resolve_vocab
from .data import featurize, read_conll
from .metrics import score
from .model import PackedBertForTokenClassification

INPUTS = ("input_ids", "position_ids", "token_type_ids", "sequence_ids")


class TokenClassificationTask(TaskBase):
    name = "token_classification"
    input_fields = INPUTS
    target_fields = ("labels",)
    stat_names = ("loss_sum", "correct")
    pipeline_plan = None
    drop_last = False
    headline = ("entity_f1", "word_accuracy")
    progress_keys = ("loss", "accuracy", "sequences_per_second")

    def __init__(self, cfg, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.eval_result: dict = {}

    # --- data ----------------------------------------------------------------------------------------------
    def prepare(self, rt: Runtime) -> None:
        self.rt = rt
        d = self.cfg.data
        try:
            self.wp = WordPiece(resolve_vocab(self.cfg))
            self.sentences, reports = {}, {}
            for split, path in (("train", d.train_file), ("eval", d.eval_file)):
                if path:
                    self.sentences[split], reports[split] = read_conll(path)
            tags = {t for s in self.sentences["train"] for _, t in s}
            self.labels = sorted(tags, key=lambda t: (t != "O", t))
            if len(self.labels) < 2:  # (one label would make the head a regression on the tag ids)
                raise DataInputError(f"{d.train_file}: every word has the tag {self.labels[0]}; token "
                                     "classification needs at least 2 tags: train on data that has them")
            features = {split: featurize(s, self.wp, self.labels, d.max_seq_length, reports[split])
                        for split, s in self.sentences.items()}
            self.depth = pack_depth(features["train"].lengths, d.max_seq_length, d.algorithm,
                                    d.max_sequences_per_pack)
            self.packed_splits = {split: pack_sequences(f.lengths, {"input_ids": f.input_ids, "labels": f.labels},
                                                        d.max_seq_length, d.algorithm, self.depth,
                                                        seed=self.cfg.train.seed, fill={"labels": IGNORE_INDEX})
                                  for split, f in features.items()}
        except (DataInputError, PackingInputError) as e:
            raise RunError(str(e)) from None
        self.features, self.reports = features, reports
        for split, p in self.packed_splits.items():
            rt.say(f"{split}: {reports[split].summary()}", self.name)
            rt.say(packing_line(split, d.algorithm, "sentences", p, d.max_seq_length), self.name)
        for p in self.packed_splits.values():
            p.rows["token_type_ids"] = np.zeros_like(p.rows["input_ids"])
        self.packing_factor = self.packed_splits["train"].packing_factor
        self.packed = self.depth > 1

    def train_source(self):
        return ArraySource(self.packed_splits["train"].rows, label_fields=("labels",))

    def layout_record(self) -> dict:
        return {"pack_len": self.cfg.data.max_seq_length, "max_sequences_per_pack": self.depth,
                "algorithm": self.cfg.data.algorithm, "packing_factor": self.packing_factor, "labels": self.labels}

    def describe(self) -> str:
        p = self.packed_splits["train"]
        return (f"{p.packs} rows of {len(p.row)} sentences (S={self.cfg.data.max_seq_length}, K={self.depth}, "
                f"p={p.packing_factor:.3f}), labels {', '.join(self.labels)}")

    # --- model and loss ------------------------------------------------------------------------------------
    def build_model(self) -> PackedBertForTokenClassification:
        m, d = self.cfg.model, self.cfg.data
        id2label = dict(enumerate(self.labels))
        if m.init_checkpoint:
            model = load_checkpoint(m.init_checkpoint, ("bert",), lambda path: PackedBertForTokenClassification
                                    .from_pretrained(path, id2label, max_sequences_per_pack=self.depth,
                                                     attention_backend=m.attention_backend))
        else:
            config = m.bert_config(len(self.wp), d.max_seq_length, num_labels=len(self.labels), id2label=id2label,
                                   label2id={v: k for k, v in id2label.items()})
            model = PackedBertForTokenClassification(config, self.depth, m.attention_backend)
        return check_model_fits(model, len(self.wp), d.max_seq_length)

    def tensor_plan(self, model):
        return plans.BERT

    def counts(self, micro: list[dict]) -> dict:
        return {"words": sum((b["labels"] != IGNORE_INDEX).sum() for b in micro),
                "sequences": sum(torch.amax(b["sequence_ids"], 1).sum() for b in micro),  # ids are 1..k in order
                "tokens": sum((b["sequence_ids"] > 0).sum() for b in micro)}

    def normalizers(self, counts: dict) -> dict:
        return {"words": max(counts["words"], 1.0)}

    def loss(self, logits, targets: dict, normalizers: dict):
        labels = targets["labels"]
        loss_sum = classification_loss_sums(logits, labels).loss_sum
        with torch.no_grad():
            correct = ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
        return loss_sum / normalizers["words"], {"loss_sum": loss_sum, "correct": correct}

    @staticmethod
    def summarize(s: dict) -> dict:
        n = max(s.get("words", 0.0), 1.0)
        return {"loss": s["loss_sum"] / n, "accuracy": s["correct"] / n, "sequences": s.get("sequences", 0.0),
                "tokens": s.get("tokens", 0.0)}

    # --- evaluation and export -----------------------------------------------------------------------------
    @property
    def has_evaluation(self) -> bool:
        return "eval" in self.packed_splits

    @torch.no_grad()
    def predict(self, model, split: str) -> list[list[str]]:
        """Every sentence's predicted tags, word by word (words cut at the pack length, and words the tokenizer
        makes no token of, get "O")."""
        packed, t = self.packed_splits[split], self.cfg.train
        was_training = model.training
        model.eval()
        best = np.empty(packed.rows["input_ids"].shape, np.int64)
        for lo in range(0, packed.packs, t.micro_batch_size):
            batch = {k: torch.from_numpy(packed.rows[k][lo:lo + t.micro_batch_size]).to(self.rt.device)
                     for k in INPUTS}
            with autocast(self.rt.device, t.precision):
                best[lo:lo + t.micro_batch_size] = model(**batch).argmax(-1).cpu().numpy()
        model.train(was_training)
        out = []
        for i, sentence in enumerate(self.sentences[split]):
            features, tags = self.features[split], ["O"] * len(sentence)
            first = np.array(features.first[i], np.int64)
            for word, j in zip(features.words[i], best[packed.row[i], packed.offset[i] + first]):
                tags[word] = self.labels[j]
            out.append(tags)
        return out

    def evaluate(self, engine, rt: Runtime, step: int) -> dict:
        """Entity F1 and word accuracy on the evaluation file, on rank 0 (the others wait)."""
        model = engine.full_model()  # a collective under tensor parallelism: every rank takes part
        if not rt.main:
            return {}
        predicted = self.predict(model, "eval")
        gold = [[t for _, t in s] for s in self.sentences["eval"]]
        out = Path(self.cfg.output_dir)
        write_json(out / "predictions.json", predicted)
        self.eval_result = score(gold, predicted)
        rt.say(", ".join(f"{k} {v:.4f}" for k, v in self.eval_result.items()), self.name)
        return self.eval_result

    def export(self, model, folder: Path, info: dict) -> None:
        d = self.cfg.data
        about = card(self.cfg, "token classification (named entities)", "token-classification",
                     f"{d.train_file} ({len(self.sentences['train']):,} sentences)", self.depth, self.packing_factor,
                     info, ("loss", "accuracy", *self.headline))
        export_model(model, folder, self.wp.path, card=about, lowercase=self.wp.lowercase)

    def result_extra(self) -> dict:
        return {"labels": self.labels, "max_sequences_per_pack": self.depth,
                "packing": {split: {"rows": p.packs, "sentences": len(p.row), "packing_factor": p.packing_factor,
                                    "efficiency": p.efficiency} for split, p in self.packed_splits.items()},
                "input": {split: vars(r) for split, r in self.reports.items()}} | self.eval_result
