"""GLUE sequence classification (and STS-B regression), packed or unpacked: a task of the engine.

    python run_glue.py --config glue_tiny_packed

1. Read the task's splits (official TSV files of a GLUE task folder, or a `datasets` dataset on disk in the
   glue/<task> layout; data.py), tokenize each example as [CLS] a [SEP] (b [SEP]), and say
   what was left out or cut and why.
2. Pack the examples back to back (bert_ipu/data/contiguous.py) with any packing algorithm (`data.algorithm`;
   `none` = one example per row) at one depth limit K (`data.max_sequences_per_pack`: N, max, or auto = the
   smallest depth that packs the training examples as tightly as unlimited depth). Each row keeps K slots:
   the position of each example's [CLS] token and its label.
3. Fine-tune PackedBertForSequenceClassification (HF BertForSequenceClassification names) on the engine:
   updates of about `train.global_batch_size` examples (packed data: 1/p as many rows), the loss of an update
   its summed per-example loss over its count of examples (the reference's mean over examples).
4. Evaluate (rank 0) on the dev split(s): predictions per example id (`predictions_<split>.json`, the same
   packed and unpacked) and the GLUE metrics (scikit-learn / scipy); `data.predict_split` (e.g. test)
   writes predictions only.
"""

from __future__ import annotations

import time
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
from ...models.bert import PackedBertForSequenceClassification
from ...models.hf_io import export_model
from ...models.losses import classification_loss_sums
from ...packing import PackingInputError
from ..base import TaskBase
from ..common import card, check_model_fits, load_checkpoint, pack_depth, packing_line, resolve_vocab
from .data import TASKS, GlueInputError, featurize, one_dataset, read_split
from .metrics import compute

INPUTS = ("input_ids", "position_ids", "token_type_ids", "sequence_ids", "cls_positions")


def eval_splits(cfg) -> list[str]:
    if cfg.data.eval_splits is not None:
        return list(cfg.data.eval_splits)
    return ["dev_matched", "dev_mismatched"] if cfg.data.task == "mnli" else ["dev"]


class GlueTask(TaskBase):
    name = "glue"
    input_fields = INPUTS
    target_fields = ("labels",)
    stat_names = ("loss_sum", "correct")
    pipeline_plan = None
    drop_last = False
    progress_keys = ("loss", "accuracy", "sequences_per_second")

    def __init__(self, cfg, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.eval_result: dict = {}

    @property
    def trains(self) -> bool:
        return self.cfg.data.train_split is not None

    # --- data ----------------------------------------------------------------------------------------------
    def prepare(self, rt: Runtime) -> None:
        self.rt = rt
        d = self.cfg.data
        say = lambda msg: rt.say(msg, "glue")  # noqa: E731
        self.spec = TASKS[d.task]
        self.regression = self.spec.labels is None
        self.num_labels = 1 if self.regression else len(self.spec.labels)
        splits = ([d.train_split] if d.train_split else []) + eval_splits(self.cfg) + \
            ([d.predict_split] if d.predict_split else [])
        try:
            self.wp = WordPiece(resolve_vocab(self.cfg))
            self.features, self.reports = {}, {}
            if len(set(splits)) > 1 and one_dataset(d.task, d.data_dir):
                # (each split read the same rows: a run trained and was scored on its training data)
                raise GlueInputError(f"{d.data_dir} is one saved dataset, not a DatasetDict of splits, so the splits "
                                     f"{', '.join(dict.fromkeys(splits))} would all be its rows: save the splits "
                                     f"together (load_dataset('nyu-mll/glue', '{d.task}').save_to_disk(...)), or "
                                     "use it for one split (data.train_split=null, data.eval_splits=[dev], "
                                     "data.predict_split=null)")
            for split in dict.fromkeys(splits):
                examples, report = read_split(d.task, d.data_dir, split)
                if not examples:
                    raise GlueInputError(f"{d.data_dir}: split {split} has no usable example ({report.summary()})")
                self.features[split] = featurize(examples, self.wp, d.max_seq_length, report,
                                                  regression=self.regression)
                self.reports[split] = report
                say(f"{d.task} {split}: {report.summary()}")
            if d.train_split and (self._labels(self.features[d.train_split]) == 0).all():
                raise GlueInputError(f"{d.data_dir}: the training split {d.train_split} has no labels; train on a "
                                     "labelled split (a test split only gets predictions: data.predict_split)")
            lengths = self.features[d.train_split or splits[0]].lengths
            self.depth = depth = pack_depth(lengths, d.max_seq_length, d.algorithm, d.max_sequences_per_pack)
            self.by_split = {split: self._pack(f) for split, f in self.features.items()}
        except (GlueInputError, DataInputError, PackingInputError, OSError) as e:
            raise RunError(str(e)) from None
        for split, p in self.by_split.items():
            say(packing_line(split, d.algorithm, "examples", p, d.max_seq_length))
        main = self.by_split[d.train_split or splits[0]]
        self.packing_factor = main.packing_factor
        self.packed = depth > 1  # the engine's: packed data (betas ** p with batch_unit packs)

    def _labels(self, features) -> np.ndarray:
        """1 where an example has a label."""
        return ~np.isnan(features.labels) if self.regression else features.labels != IGNORE_INDEX

    def _pack(self, features):
        d = self.cfg.data
        packed = pack_sequences(features.lengths, {"input_ids": features.input_ids,
                                                   "token_type_ids": features.token_type_ids},
                                d.max_seq_length, d.algorithm, self.depth, seed=self.cfg.train.seed)
        packed.rows["cls_positions"] = packed.slot_values(packed.offset, 0)
        packed.rows["labels"] = packed.slot_values(features.labels, np.nan if self.regression else IGNORE_INDEX)
        return packed

    def train_source(self):
        return ArraySource(self.by_split[self.cfg.data.train_split].rows, label_fields=("labels",))

    def layout_record(self) -> dict:
        return {"pack_len": self.cfg.data.max_seq_length, "max_sequences_per_pack": self.depth,
                "algorithm": self.cfg.data.algorithm, "packing_factor": self.packing_factor}

    def describe(self) -> str:
        p = self.by_split[self.cfg.data.train_split]
        return (f"{self.cfg.data.task}: {p.packs} rows of {len(p.row)} examples (S={self.cfg.data.max_seq_length}, "
                f"K={self.depth}, p={p.packing_factor:.3f})")

    # --- model and loss ------------------------------------------------------------------------------------
    def tensor_plan(self, model):
        return plans.BERT

    def build_model(self) -> PackedBertForSequenceClassification:
        m, d = self.cfg.model, self.cfg.data
        id2label = None if self.regression else dict(enumerate(self.spec.labels))
        if m.init_checkpoint:
            model = load_checkpoint(m.init_checkpoint, ("bert",), lambda path: PackedBertForSequenceClassification
                                    .from_pretrained(path, num_labels=self.num_labels, id2label=id2label,
                                                     max_sequences_per_pack=self.depth,
                                                     attention_backend=m.attention_backend))
        else:
            labels = {} if id2label is None else {"id2label": id2label,
                                                  "label2id": {v: k for k, v in id2label.items()}}
            config = m.bert_config(len(self.wp), d.max_seq_length, num_labels=self.num_labels, **labels)
            model = PackedBertForSequenceClassification(config, self.depth, m.attention_backend)
        check_model_fits(model, len(self.wp), d.max_seq_length)
        model.config.problem_type = "regression" if self.regression else "single_label_classification"
        return model

    def _present(self, labels: torch.Tensor) -> torch.Tensor:
        return ~torch.isnan(labels) if self.regression else labels != IGNORE_INDEX

    def counts(self, micro: list[dict]) -> dict:
        return {"sequences": sum(self._present(b["labels"]).sum() for b in micro),
                "tokens": sum((b["sequence_ids"] > 0).sum() for b in micro)}

    def normalizers(self, counts: dict) -> dict:
        return {"examples": max(counts["sequences"], 1.0)}

    def loss(self, out, targets: dict, normalizers: dict):
        labels = targets["labels"]
        loss_sum = classification_loss_sums(out.logits, labels).loss_sum
        with torch.no_grad():
            correct = (torch.zeros(()) if self.regression else
                       ((out.logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum())
        return loss_sum / normalizers["examples"], {"loss_sum": loss_sum, "correct": correct}

    def summarize(self, s: dict) -> dict:
        n = max(s.get("sequences", 0.0), 1.0)
        out = {"loss": s["loss_sum"] / n, "sequences": s.get("sequences", 0.0), "tokens": s.get("tokens", 0.0)}
        if not self.regression:
            out["accuracy"] = s["correct"] / n
        return out

    # --- evaluation and export -----------------------------------------------------------------------------
    @property
    def has_evaluation(self) -> bool:
        return bool(eval_splits(self.cfg)) or bool(self.cfg.data.predict_split)

    @property
    def headline(self) -> tuple:
        return tuple(f"{split}_{m}" for split in eval_splits(self.cfg) for m in self.spec.metrics)

    @torch.no_grad()
    def predict(self, model, split: str) -> np.ndarray:
        """Per example of the split, in file order: class index, or score (regression)."""
        from tqdm import tqdm

        packed, t = self.by_split[split], self.cfg.train
        was_training = model.training
        model.eval()
        logits = np.empty((packed.packs, packed.max_sequences_per_pack, self.num_labels), np.float32)
        micro = t.micro_batch_size
        for lo in tqdm(range(0, packed.packs, micro), desc=f"evaluating {split}", unit="batch",
                       disable=not self.progress or None, leave=False):
            batch = {k: torch.from_numpy(packed.rows[k][lo:lo + micro]).to(self.rt.device) for k in INPUTS}
            with autocast(self.rt.device, t.precision):
                logits[lo:lo + micro] = model(**batch).logits.float().cpu().numpy()
        model.train(was_training)
        per_example = logits[packed.row, packed.slot]  # (N, num_labels) in file order
        return per_example[:, 0] if self.regression else per_example.argmax(-1)

    def evaluate(self, engine, rt: Runtime, step: int) -> dict:
        """GLUE metrics on the dev split(s), on rank 0 (the others wait); writes predictions_<split>.json."""
        model = engine.full_model()  # a collective under tensor parallelism: every rank takes part
        if not rt.main:
            return {}
        return self._evaluate(model)

    def _evaluate(self, model) -> dict:
        out = Path(self.cfg.output_dir)
        scores = {}
        start = time.perf_counter()
        splits = eval_splits(self.cfg) + ([self.cfg.data.predict_split] if self.cfg.data.predict_split else [])
        for split in dict.fromkeys(splits):
            f = self.features[split]
            preds = self.predict(model, split)
            named = [float(p) if self.regression else self.spec.labels[int(p)] for p in preds]
            write_json(out / f"predictions_{split}.json", dict(zip(f.uids, named)))
            has = self._labels(f)
            if split in eval_splits(self.cfg) and has.any():
                scores |= {f"{split}_{k}": v for k, v in compute(self.cfg.data.task, preds[has], f.labels[has]).items()}
        self.eval_result = {"eval_seconds": time.perf_counter() - start} | scores
        if scores:
            self.rt.say(", ".join(f"{k} {v:.4f}" for k, v in scores.items()), "glue")
        return scores

    def export(self, model, folder: Path, info: dict) -> None:
        d = self.cfg.data
        task = f"GLUE {d.task} sequence {'regression' if self.regression else 'classification'}"
        data = f"{d.data_dir} ({len(self.features[d.train_split]):,} training examples)"
        about = card(self.cfg, task, "text-classification", data, self.depth, self.packing_factor, info,
                     ("loss", "accuracy", *self.headline))
        export_model(model, folder, self.wp.path, card=about, lowercase=self.wp.lowercase)

    def result_extra(self) -> dict:
        return {"task": self.cfg.data.task, "algorithm": self.cfg.data.algorithm, "max_sequences_per_pack": self.depth,
                "packing": {split: {"rows": p.packs, "examples": len(p.row), "packing_factor": p.packing_factor,
                                    "efficiency": p.efficiency} for split, p in self.by_split.items()},
                "input": {split: vars(r) for split, r in self.reports.items()}} | self.eval_result

