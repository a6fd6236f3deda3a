"""SQuAD v1.1 fine-tuning and evaluation, packed or unpacked: the second task of the engine.

    python run_squad.py --config squad_tiny_packed

1. Read the training and/or evaluation file, make the reference's windowed features (features.py) and say
   what was left out and why.
2. Pack each split's features (`data.algorithm`; `none` = unpacked, one feature per row) at one depth limit K
   (`data.max_sequences_per_pack`: N, max, or auto = the smallest depth that packs the training features as
   tightly as unlimited depth).
3. Fine-tune PackedBertForQuestionAnswering from `model.init_checkpoint` on the engine (one process or data
   parallel, checkpoints, exact resume, metrics, bf16): updates of about `train.global_batch_size` features
   (packed data: 1/p as many packs); the loss of an update is its summed per-feature loss over the update's
   count of features, so packed and unpacked updates weigh every feature the same. Every pack is seen once
   an epoch (the last update is filled up with empty rows).
4. Evaluate on rank 0: start/end logits per feature -> n-best spans -> predictions.json, and EM/F1 (official
   v1.1 normalisation) over every question of the file.

Writes OUTPUT/config.yaml, metrics.jsonl, checkpoints/, hf/ (a BertForQuestionAnswering folder with the
tokenizer and a model card), predictions.json and results.json; files are written under a temporary name and
renamed.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from ...data.instances import WordPiece
from ...data.layout import IGNORE_INDEX
from ...data.loader import ArraySource
from ...data.text import DataInputError
from ...engine.runtime import RunError, Runtime, autocast
from ...files import write_json
from ...models import plans
from ...models.bert import PackedBertForQuestionAnswering
from ...models.hf_io import export_model
from ...models.losses import span_loss_sums
from ...packing import PackingInputError
from ..base import TaskBase
from ..common import card, check_model_fits, load_checkpoint, pack_depth, packing_line, resolve_vocab
from . import metrics, postprocess
from .features import (SLOT_FIELDS, Features, PackedFeatures, SquadExample, SquadInputError, make_features,
                       micro_batches, pack_features, read_squad)


def build_model(cfg, vocab_size: int, depth: int) -> PackedBertForQuestionAnswering:
    m = cfg.model
    if m.init_checkpoint:
        model = load_checkpoint(m.init_checkpoint, ("bert",), lambda path: PackedBertForQuestionAnswering
                                .from_pretrained(path, max_sequences_per_pack=depth,
                                                 attention_backend=m.attention_backend))
    else:
        model = PackedBertForQuestionAnswering(m.bert_config(vocab_size), depth, m.attention_backend)
    return check_model_fits(model, vocab_size, cfg.data.max_seq_length)


def to_device(batch: dict, device) -> dict:
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


@torch.no_grad()
def predict(model: PackedBertForQuestionAnswering, packed: PackedFeatures, micro_batch_size: int, device,
            progress: bool = False, precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """Masked start and end logits of every pack, (P, K, S) float32 each."""
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    start = np.empty((packed.packs, packed.max_sequences_per_pack, packed.rows["input_ids"].shape[1]), np.float32)
    end = np.empty_like(start)
    inputs = ("input_ids", "position_ids", "token_type_ids", "sequence_ids", "candidate_mask")
    for idx, batch in tqdm(micro_batches(packed, micro_batch_size), total=math.ceil(packed.packs / micro_batch_size),
                           desc="evaluating", unit="batch", disable=not progress or None, leave=False):
        with autocast(device, precision):
            out = model(**to_device({k: batch[k] for k in inputs}, device))
        start[idx] = out.start_logits[:len(idx)].float().cpu().numpy()
        end[idx] = out.end_logits[:len(idx)].float().cpu().numpy()
    model.train(was_training)
    return start, end


def evaluate(model, examples: list[SquadExample], dropped: list[SquadExample], features: Features,
             packed: PackedFeatures, cfg, device, progress: bool = False) -> tuple[dict, dict]:
    """(predictions for every question of the file, EM/F1 when it has answers)."""
    start, end = predict(model, packed, cfg.train.micro_batch_size, device, progress, cfg.train.precision)
    logits = postprocess.feature_logits(features, packed, start, end)
    preds = postprocess.predictions(examples, features, logits, cfg.data.n_best_size, cfg.data.max_answer_length)
    preds |= {e.qid: "" for e in dropped}  # left-out questions are answered with nothing: they score 0
    answers = {e.qid: e.answers for e in [*examples, *dropped] if e.answers}
    scores = metrics.evaluate(answers, preds) if answers else {}
    return preds, scores


class SquadTask(TaskBase):
    name = "squad"
    input_fields = ("input_ids", "position_ids", "token_type_ids", "sequence_ids", "candidate_mask")
    target_fields = ("start_positions", "end_positions")
    stat_names = ("loss_sum",)
    pipeline_plan = None
    drop_last = False
    headline = ("exact_match", "f1")
    progress_keys = ("loss", "sequences_per_second")

    def __init__(self, cfg, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.eval_result: dict = {}

    @property
    def trains(self) -> bool:
        return self.cfg.data.train_file is not None

    # --- data ----------------------------------------------------------------------------------------------
    def _split(self, path, training: bool, say):
        examples, dropped, report = read_squad(path, training)
        d = self.cfg.data
        features = make_features(examples, self.wp, d.max_seq_length, d.doc_stride, d.max_query_length, training,
                                 report, self.progress)
        say(f"{'training' if training else 'evaluation'} data {path}: {report.summary()}")
        return examples, dropped, features

    def prepare(self, rt: Runtime) -> None:
        self.rt = rt
        d = self.cfg.data
        say = lambda msg: rt.say(msg, "squad")  # noqa: E731
        try:
            self.wp = WordPiece(resolve_vocab(self.cfg))
            self.train_split = self._split(d.train_file, True, say) if d.train_file else None
            self.eval_split = self._split(d.predict_file, False, say) if d.predict_file else None
            lengths = (self.train_split or self.eval_split)[2].lengths
            self.depth = depth = pack_depth(lengths, d.max_seq_length, d.algorithm, d.max_sequences_per_pack)
            self.packed_splits = {name: pack_features(split[2], d.max_seq_length, d.algorithm, depth,
                                                      seed=self.cfg.train.seed)
                                  for name, split in (("train", self.train_split), ("eval", self.eval_split)) if split}
        except (SquadInputError, DataInputError, PackingInputError) as e:
            raise RunError(str(e)) from None
        for name, pf in self.packed_splits.items():
            say(packing_line(name, d.algorithm, "features", pf, d.max_seq_length))
        main = self.packed_splits.get("train") or self.packed_splits["eval"]
        self.packing_factor = main.packing_factor
        self.packed = depth > 1

    def train_source(self):
        return ArraySource(self.packed_splits["train"].rows, label_fields=SLOT_FIELDS)

    def layout_record(self) -> dict:
        return {"pack_len": self.cfg.data.max_seq_length, "max_sequences_per_pack": self.depth,
                "algorithm": self.cfg.data.algorithm, "packing_factor": self.packing_factor}

    def describe(self) -> str:
        pf = self.packed_splits["train"]
        return (f"{pf.packs} packs of {len(pf.row)} features (S={self.cfg.data.max_seq_length}, K={self.depth}, "
                f"p={pf.packing_factor:.3f})")

    # --- model and loss ------------------------------------------------------------------------------------
    def tensor_plan(self, model):
        return plans.BERT

    def build_model(self) -> PackedBertForQuestionAnswering:
        return build_model(self.cfg, len(self.wp), self.depth)

    def counts(self, micro: list[dict]) -> dict:
        return {"sequences": sum((b["start_positions"] != IGNORE_INDEX).sum() for b in micro),
                "tokens": sum((b["sequence_ids"] > 0).sum() for b in micro)}

    def normalizers(self, counts: dict) -> dict:
        return {"features": max(counts["sequences"], 1.0)}

    def loss(self, out, targets: dict, normalizers: dict):
        loss_sum = span_loss_sums(out.start_logits, out.end_logits, targets["start_positions"],
                                  targets["end_positions"]).loss_sum
        return loss_sum / normalizers["features"], {"loss_sum": loss_sum}

    @staticmethod
    def summarize(s: dict) -> dict:
        return {"loss": s["loss_sum"] / max(s.get("sequences", 0.0), 1.0), "sequences": s.get("sequences", 0.0),
                "tokens": s.get("tokens", 0.0)}

    # --- evaluation and export -----------------------------------------------------------------------------
    @property
    def has_evaluation(self) -> bool:
        return self.eval_split is not None

    def evaluate(self, engine, rt: Runtime, step: int) -> dict:
        """EM/F1 on the evaluation file, on rank 0 (the others wait); writes predictions.json."""
        model = engine.full_model() if rt.stages == 1 else None  # a collective under tensor parallelism
        if not rt.main:
            return {}
        return self._evaluate(model)

    def _evaluate(self, model) -> dict:
        examples, dropped, features = self.eval_split
        start = time.perf_counter()
        preds, scores = evaluate(model, examples, dropped, features, self.packed_splits["eval"], self.cfg,
                                 self.rt.device, self.progress)
        out = Path(self.cfg.output_dir)
        write_json(out / "predictions.json", preds)
        self.eval_result = {"eval_seconds": time.perf_counter() - start, "report_eval": vars(features.report),
                            "predictions": str(out / "predictions.json")} | scores
        if scores:
            self.rt.say(f"evaluation: exact match {scores['exact_match']:.2f}, F1 {scores['f1']:.2f} over "
                        f"{scores['questions']} questions ({self.eval_result['eval_seconds']:.1f} s); "
                        f"{out / 'predictions.json'}", "squad")
        return scores

    def export(self, model, folder: Path, info: dict) -> None:
        data = f"{self.cfg.data.train_file} ({len(self.packed_splits['train'].row):,} features)"
        about = card(self.cfg, "SQuAD v1.1 question answering (span extraction)", "question-answering", data,
                     self.depth, self.packing_factor, info, ("loss", "exact_match", "f1"))
        export_model(model, folder, self.wp.path, card=about, lowercase=self.wp.lowercase)

    def result_extra(self) -> dict:
        out = {"algorithm": self.cfg.data.algorithm, "max_sequences_per_pack": self.depth,
               "packing": {name: {"packs": pf.packs, "features": len(pf.row), "packing_factor": pf.packing_factor,
                                  "efficiency": pf.efficiency} for name, pf in self.packed_splits.items()}}
        if self.train_split:
            out["report_train"] = vars(self.train_split[2].report)
        return out | self.eval_result

