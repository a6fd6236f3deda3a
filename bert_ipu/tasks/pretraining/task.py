"""BERT pretraining (MLM + NSP) on packed shards: the first task of the engine.

    python run_pretraining.py --config pretrain_tiny_128_packed

The dataset manifest is the single source of truth for the packed layout (pack length S, MLM slots M, NSP
slots K): a config whose data settings disagree with an existing dataset is an error naming both values, a
missing dataset is created from `data.prepare_input` (never over an existing folder), and the run records
the layout it trained on. Per update the loss is the summed MLM loss over the update's masked tokens plus the
summed NSP loss over its sequences (counts summed over accumulation and replicas; or the expected counts,
with `loss_balancing`), so packing, accumulation and parallelism never change the weight of a token or a
sequence. With `batch_unit: packs` on packed data the betas become beta ** p (the paper's correction).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...data.layout import IGNORE_INDEX
from ...data.loader import ShardSource, evaluation_rows
from ...data.pipeline import check_dataset_matches, dataset_settings, prepare_dataset
from ...data.shards import DatasetError, PackedDataset
from ...data.text import DataInputError
from ...engine.parallel import global_counts
from ...engine.runtime import RunError, Runtime
from ...models import plans
from ...models.bert import PackedBertForPreTraining
from ...models.hf_io import export_model
from ...models.losses import pretraining_loss_sums, whole
from ...packing import PackingInputError
from ..base import TaskBase
from ..common import command, load_checkpoint


class PretrainingTask(TaskBase):
    name = "pretraining"
    input_fields = ("input_ids", "position_ids", "token_type_ids", "sequence_ids")
    target_fields = ("masked_lm_labels", "next_sentence_labels", "next_sentence_weights")
    stat_names = ("mlm_loss_sum", "mlm_correct", "nsp_loss_sum", "nsp_correct")
    pipeline_plan = plans.BERT_PRETRAINING_PIPELINE
    drop_last = True
    has_evaluation = True
    headline = ("loss", "val_mlm_accuracy", "val_nsp_accuracy")
    progress_keys = ("loss", "mlm_accuracy", "nsp_accuracy", "sequences_per_second", "tokens_per_second")

    def __init__(self, cfg, progress: bool = True):
        self.cfg = cfg
        self.expected = None

    # --- data ----------------------------------------------------------------------------------------------
    def prepare(self, rt: Runtime) -> None:
        self.rt = rt
        error = None
        if rt.main:  # rank 0 creates a missing dataset; every rank learns the outcome
            try:
                prepare_dataset(self.cfg.data, say=rt.say)
            except (DatasetError, DataInputError, PackingInputError) as e:
                error = str(e)
        error = rt.broadcast_error(error)
        if error:
            raise RunError(error)
        path = Path(self.cfg.data.dataset)
        try:
            self.data = PackedDataset(path)
            check_dataset_matches(path, self.data.manifest, self.cfg.data)
        except DatasetError as e:
            raise RunError(str(e)) from None
        error = None
        if rt.main:  # the shards' sha256 against the manifest, once a run (about 1 s per GB): a flipped bit stops it
            try:
                self.data.verify_checksums()
            except DatasetError as e:
                error = str(e)
        error = rt.broadcast_error(error)
        if error:
            raise RunError(error)
        self.path = path
        data, world, t = self.data, rt.dp_world, self.cfg.train
        check_splits(data, path)
        self.has_evaluation = "validation" in data.splits
        if not self.has_evaluation:  # made with --validation-fraction 0 (a dump too small to split): trains all the same
            rt.say(f"{path} has no validation split (made with --validation-fraction 0): validation is skipped")
        elif data.packs("validation") < world:
            raise RunError(f"{path} has {data.packs('validation')} validation packs, fewer than the {world} replicas "
                           "(each evaluates its own); recreate it with a larger --validation-fraction, or with 0 to "
                           "train without validation")
        if data.packs("train") < t.micro_batch_size * world:
            raise RunError(f"{path} holds {data.packs('train')} training packs: not one micro-batch of "
                           f"{t.micro_batch_size} for each of {world} replica(s)")
        self.layout = data.layout
        manifest = data.manifest
        self.packing_factor = manifest["packing"]["train"]["packing_factor"] if "packing" in manifest else 1.0
        self.packed = self.layout.max_sequences_per_pack > 1
        if t.loss_balancing:  # expected counts per pack, from the whole training split
            from ...engine.optim import fitted_micro_batch_size, packs_per_update

            masked = sum(int((s["masked_lm_labels"] != IGNORE_INDEX).sum()) for s in data.shards("train"))
            # (the loader's: with batch_unit sequences the micro-batch may shrink to fit the update, and with it
            # the packs of an update; counts from the configured one scaled the loss by their ratio)
            P = packs_per_update(t, self.packing_factor, world,
                                 fitted_micro_batch_size(t, self.packing_factor, world))
            self.expected = {"mlm": P * masked / data.packs("train"), "nsp": P * self.packing_factor}

    def train_source(self):
        return ShardSource(self.data, "train")

    def layout_record(self) -> dict:
        m = self.data.manifest
        return {"dataset": str(self.path), "pack_len": self.layout.pack_len, "mlm_slots": self.layout.mlm_slots,
                "max_sequences_per_pack": self.layout.max_sequences_per_pack,
                "algorithm": dataset_settings(m)["algorithm"], "depth_limit": dataset_settings(m)["max_sequences_per_pack"],
                "packing_factor": self.packing_factor}

    def describe(self) -> str:
        return (f"{'packed' if self.packed else 'unpacked'} data {self.path} (S={self.layout.pack_len}, "
                f"K={self.layout.max_sequences_per_pack}, p={self.packing_factor:.3f})")

    # --- model ---------------------------------------------------------------------------------------------
    def build_model(self) -> PackedBertForPreTraining:
        m, lay = self.cfg.model, self.layout
        kwargs = dict(max_sequences_per_pack=lay.max_sequences_per_pack, attention_backend=m.attention_backend,
                      mlm_slots=lay.mlm_slots)
        if m.init_checkpoint:
            model = load_checkpoint(m.init_checkpoint, ("bert",),
                                    lambda path: PackedBertForPreTraining.from_pretrained(path, **kwargs))
            if model.config.max_position_embeddings < lay.pack_len:
                raise RunError(f"model.init_checkpoint has {model.config.max_position_embeddings} positions, fewer "
                               f"than the dataset's pack length {lay.pack_len}")
            return model
        config = m.bert_config(self.data.manifest["vocab"]["size"], lay.pack_len)
        return PackedBertForPreTraining(config, **kwargs)

    def tensor_plan(self, model):
        return plans.BERT

    # --- loss ----------------------------------------------------------------------------------------------
    def counts(self, micro: list[dict]) -> dict:
        return {"mlm_count": sum((b["masked_lm_labels"] != IGNORE_INDEX).sum() for b in micro),
                "sequences": sum(b["next_sentence_weights"].sum() for b in micro),
                "tokens": sum((b["sequence_ids"] > 0).sum() for b in micro)}

    def normalizers(self, counts: dict) -> dict:
        if self.expected is not None:
            return self.expected
        return {"mlm": max(counts["mlm_count"], 1.0), "nsp": max(counts["sequences"], 1.0)}

    def loss(self, out, targets: dict, normalizers: dict):
        mlm_logits, nsp_logits = out  # PackedPreTrainingOutput, or the plain tuple of a pipeline's last stage
        labels = targets["masked_lm_labels"]
        weights = targets["next_sentence_weights"]
        sums = pretraining_loss_sums(mlm_logits, nsp_logits, labels, targets["next_sentence_labels"], weights)
        mlm_sum, nsp_sum = sums.mlm_loss_sum, sums.nsp_loss_sum
        with torch.no_grad():
            mlm_correct = ((whole(mlm_logits.argmax(-1)) == labels) & (labels != IGNORE_INDEX)).sum()
            nsp_correct = ((nsp_logits.argmax(-1) == targets["next_sentence_labels"]).float() * weights.float()).sum()
        loss = mlm_sum / normalizers["mlm"] + nsp_sum / normalizers["nsp"]
        return loss, {"mlm_loss_sum": mlm_sum, "mlm_correct": mlm_correct, "nsp_loss_sum": nsp_sum,
                      "nsp_correct": nsp_correct}

    @staticmethod
    def summarize(s: dict) -> dict:
        mlm_n, nsp_n = max(s.get("mlm_count", 0.0), 1.0), max(s.get("sequences", 0.0), 1.0)
        return {"loss": s["mlm_loss_sum"] / mlm_n + s["nsp_loss_sum"] / nsp_n, "mlm_loss": s["mlm_loss_sum"] / mlm_n,
                "nsp_loss": s["nsp_loss_sum"] / nsp_n, "mlm_accuracy": s["mlm_correct"] / mlm_n,
                "nsp_accuracy": s["nsp_correct"] / nsp_n, "sequences": s.get("sequences", 0.0),
                "tokens": s.get("tokens", 0.0)}

    # --- evaluation and export -----------------------------------------------------------------------------
    def evaluate(self, engine, rt: Runtime, step: int) -> dict:
        """MLM and NSP loss and accuracy on the first `validation_batches` x `micro_batch_size` packs of the
        held-out split (or all of it), each evaluated once over the data-parallel replicas (evaluation_rows)."""
        t = self.cfg.train
        source = ShardSource(self.data, "validation")
        rows = evaluation_rows(source.packs, t.validation_batches * t.micro_batch_size, t.micro_batch_size,
                               rt.dp_rank, rt.dp_world, engine.eval_group)
        batches = [{k: torch.from_numpy(v).to(rt.device) for k, v in source.gather(chunk).items()} for chunk in rows]
        counts = global_counts(self, engine, batches)
        sums = engine.evaluate(batches, self.normalizers(counts)) | counts
        return {f"val_{k}": v for k, v in self.summarize(sums).items()}

    def export(self, model, folder: Path, info: dict) -> None:
        m = self.data.manifest
        metrics = {k: v for k, v in info["metrics"].items() if k in ("loss", "mlm_accuracy", "nsp_accuracy",
                                                                      "val_loss", "val_mlm_accuracy",
                                                                      "val_nsp_accuracy")}
        card = {"task": "pretraining (masked language modelling + next sentence prediction)",
                "pipeline_tag": "fill-mask", "base_model": self.cfg.model.init_checkpoint or "from scratch",
                "data": f"{self.path} ({self.data.packs('train'):,} training packs of {self.layout.pack_len} tokens)",
                "steps": info["steps"], "sequences_seen": int(info["sequences_seen"]),
                "packing": {"algorithm": dataset_settings(m)["algorithm"],
                            "max_sequences_per_pack": self.layout.max_sequences_per_pack,
                            "packing_factor": round(self.packing_factor, 4)},
                "metrics": metrics, "command": command(self.cfg)}
        export_model(model, folder, self.path / "vocab.txt", card=card, lowercase=m.get("vocab", {}).get("lowercase"))

    def result_extra(self) -> dict:
        return {"dataset": str(self.path), "layout": self.layout_record()}



def check_splits(data: PackedDataset, path) -> None:
    """A dataset to pretrain on holds a train split with packs (one line, not a KeyError deep in the loader)."""
    if "train" not in data.splits or data.packs("train") == 0:
        raise RunError(f"{path} holds no training packs (splits: {', '.join(data.splits) or 'none'}); recreate it "
                       "with a --validation-fraction that leaves documents for training")


def preflight(cfg) -> None:
    """Before processes are launched: the dataset exists (or can be made from data.prepare_input) and holds a
    train split; the error names how to make it."""
    d = cfg.data
    path = Path(d.dataset)
    if not (path / "manifest.json").is_file():
        if path.exists() or d.prepare_input is not None:
            return  # prepare() makes it from data.prepare_input, or refuses a folder that is not a dataset
        raise RunError(f"data.dataset {path} does not exist; make it with `make wikipedia DUMP=FILE` (a Wikipedia "
                       "dump -> runs/data/wikipedia_{128,512}_packed, then both phases; phase 2 starts from phase "
                       "1's export), or data/create_pretraining_data.py then data/pack_pretraining_data.py, or set "
                       "data.prepare_input=TEXT_FILE")
    try:
        check_splits(PackedDataset(path), path)
    except DatasetError as e:
        raise RunError(str(e)) from None
