"""SQuAD v1.1 fine-tuning and evaluation, packed or unpacked: `main(cfg)` (run_squad.py calls it).

1. Read the training and/or evaluation file, make the reference's windowed features (features.py) and say
   what was left out and why.
2. Pack each split's features (`data.algorithm`; `none` = unpacked, one feature per row) at one depth
   limit K (`data.max_sequences_per_pack`, or auto: the smallest depth that packs the training features
   into as few packs as unlimited depth).
3. Fine-tune PackedBertForQuestionAnswering from `model.init_checkpoint` (any Hugging Face BERT folder, ours
   included): updates of about `train.global_batch_size` features (packed data: 1/p as many packs), split
   into micro-batches of `train.micro_batch_size` rows; the loss of an update is its summed per-feature loss
   over the update's count of features, so packed and unpacked updates weigh every feature the same.
   AdamW (or LAMB), linear warm-up over `warmup_proportion`, then decay; one process (cpu or cuda).
4. Evaluate: start/end logits per feature -> n-best spans -> predictions.json, and EM/F1 (official v1.1
   normalisation) over every question of the file.

Writes OUTPUT/config.yaml, metrics.jsonl, hf/ (a BertForQuestionAnswering folder with vocab.txt),
predictions.json and results.json; files are written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from ..config import SquadRunConfig, to_dict
from ..data.instances import WordPiece, default_vocab
from ..data.text import DataInputError
from ..modeling import IGNORE_INDEX, PackedBertForQuestionAnswering
from ..packing import PackingInputError
from ..training import TrainingError, autocast, make_optimizer, pick_device
from . import metrics, postprocess
from .features import (Features, PackedFeatures, SquadExample, SquadInputError, auto_depth, make_features,
                       micro_batches, pack_features, read_squad)


def resolve_vocab(cfg: SquadRunConfig) -> Path:
    if cfg.data.vocab:
        return Path(cfg.data.vocab)
    if cfg.model.init_checkpoint and (Path(cfg.model.init_checkpoint) / "vocab.txt").is_file():
        return Path(cfg.model.init_checkpoint) / "vocab.txt"
    return default_vocab()


def build_model(cfg: SquadRunConfig, vocab_size: int, depth: int) -> PackedBertForQuestionAnswering:
    m = cfg.model
    if m.init_checkpoint:
        if not (Path(m.init_checkpoint) / "config.json").is_file():
            raise TrainingError(f"model.init_checkpoint {m.init_checkpoint} is not a Hugging Face model folder "
                                "(no config.json); give the hf/ folder of a pretraining run or a transformers BERT")
        model = PackedBertForQuestionAnswering.from_pretrained(m.init_checkpoint, max_sequences_per_pack=depth,
                                                               attention_backend=m.attention_backend)
    else:
        model = PackedBertForQuestionAnswering(m.bert_config(vocab_size), depth, m.attention_backend)
    if model.config.vocab_size < vocab_size:
        raise TrainingError(f"the vocab has {vocab_size} tokens but the model only {model.config.vocab_size}; give "
                            "the vocab the model was trained with (data.vocab=PATH/vocab.txt)")
    if model.config.max_position_embeddings < cfg.data.max_seq_length:
        raise TrainingError(f"data.max_seq_length {cfg.data.max_seq_length} is longer than the model's "
                            f"{model.config.max_position_embeddings} positions; lower data.max_seq_length")
    return model


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
                           desc="evaluating", unit="batch", disable=not progress, leave=False):
        with autocast(device, precision):
            out = model(**to_device({k: batch[k] for k in inputs}, device))
        start[idx] = out.start_logits[:len(idx)].float().cpu().numpy()
        end[idx] = out.end_logits[:len(idx)].float().cpu().numpy()
    model.train(was_training)
    return start, end


def evaluate(model, examples: list[SquadExample], dropped: list[SquadExample], features: Features,
             packed: PackedFeatures, cfg: SquadRunConfig, device, progress: bool = False) -> tuple[dict, dict]:
    """(predictions for every question of the file, EM/F1 when it has answers)."""
    start, end = predict(model, packed, cfg.train.micro_batch_size, device, progress, cfg.train.precision)
    logits = postprocess.feature_logits(features, packed, start, end)
    preds = postprocess.predictions(examples, features, logits, cfg.data.n_best_size, cfg.data.max_answer_length)
    preds |= {e.qid: "" for e in dropped}  # left-out questions are answered with nothing: they score 0
    answers = {e.qid: e.answers for e in [*examples, *dropped] if e.answers}
    scores = metrics.evaluate(answers, preds) if answers else {}
    return preds, scores


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def _updates(packed: PackedFeatures, packs_per_update: int, micro_batch_size: int, seed: int):
    """Forever: (epoch, micro-batches of one update), a new seeded shuffle of the packs every epoch."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(packed.packs)
        for lo in range(0, len(order), packs_per_update):
            yield epoch, [b for _, b in micro_batches(packed, micro_batch_size, order[lo:lo + packs_per_update])]
        epoch += 1


def train(model, packed: PackedFeatures, cfg: SquadRunConfig, device, out: Path, say, progress: bool) -> dict:
    from tqdm import tqdm

    t = cfg.train
    micro = t.micro_batch_size
    p = packed.packing_factor
    packs_per_update = max(micro, round(t.global_batch_size / p / micro) * micro)
    updates_per_epoch = math.ceil(packed.packs / packs_per_update)
    total = t.max_steps or max(1, math.ceil(t.num_train_epochs * updates_per_epoch))
    opt, sched = make_optimizer(model.named_parameters(), t, total, int(total * t.warmup_proportion), t.betas)
    say(f"fine-tuning: {packed.packs} packs of {len(packed.row)} features (p = {p:.3f}), {packs_per_update} packs "
        f"(~{packs_per_update * p:.0f} features) per update in micro-batches of {micro}, {total} updates, {device}")
    model.train()
    window = np.zeros(3)  # loss sum, features, tokens
    seen = 0
    last = {}
    log = open(out / "metrics.jsonl", "a")
    bar = tqdm(total=total, desc="fine-tuning", unit="update", disable=not progress or None)
    start_time = window_start = time.perf_counter()
    try:
        for step, (epoch, batches) in zip(range(1, total + 1), _updates(packed, packs_per_update, micro, t.seed)):
            count = sum(int((b["start_positions"] != IGNORE_INDEX).sum()) for b in batches)
            loss_sum = 0.0
            for batch in batches:
                with autocast(device, t.precision):
                    o = model(**to_device(batch, device), normalizer=max(count, 1))
                o.loss.backward()
                loss_sum += o.loss_sum.item()
                window[2] += int((batch["sequence_ids"] > 0).sum())
            if not math.isfinite(loss_sum):
                raise TrainingError(f"update {step}: the loss is {loss_sum}; lower train.learning_rate or check "
                                    "the data")
            if t.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            window[:2] += (loss_sum, count)
            seen += count
            if step % t.log_every == 0 or step == total:
                seconds = time.perf_counter() - window_start
                last = {"step": step, "epoch": epoch, "loss": window[0] / max(window[1], 1),
                        "lr": sched.get_last_lr()[0], "sequences_per_second": window[1] / seconds,
                        "tokens_per_second": window[2] / seconds}
                log.write(json.dumps(last) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{last['loss']:.3f}", seq_s=f"{last['sequences_per_second']:.1f}")
                window[:] = 0
                window_start = time.perf_counter()
            bar.update(1)
    finally:
        bar.close()
        log.close()
    seconds = time.perf_counter() - start_time
    return {"updates": total, "train_seconds": seconds, "train_features_per_second": seen / seconds,
            "packs_per_update": packs_per_update, "final_loss": last.get("loss")}


def _split(path, wp: WordPiece, cfg: SquadRunConfig, training: bool, say, progress: bool):
    examples, dropped, report = read_squad(path, training)
    features = make_features(examples, wp, cfg.data.max_seq_length, cfg.data.doc_stride, cfg.data.max_query_length,
                             training, report, progress)
    say(f"{'training' if training else 'evaluation'} data {path}: {report.summary()}")
    return examples, dropped, features


def main(cfg: SquadRunConfig, progress: bool = True) -> dict:
    say = lambda msg: print(f"[squad] {msg}", flush=True)  # noqa: E731
    device = pick_device(cfg.train.device)
    d = cfg.data
    try:
        wp = WordPiece(resolve_vocab(cfg))
        train_split = _split(d.train_file, wp, cfg, True, say, progress) if d.train_file else None
        eval_split = _split(d.predict_file, wp, cfg, False, say, progress) if d.predict_file else None
        lengths = (train_split or eval_split)[2].lengths
        if d.algorithm == "none":
            depth = 1
        elif d.max_sequences_per_pack == "auto":
            depth = auto_depth(lengths, d.max_seq_length, d.algorithm)
        else:
            depth = d.max_sequences_per_pack
        packed = {name: pack_features(split[2], d.max_seq_length, d.algorithm, depth, seed=cfg.train.seed)
                  for name, split in (("train", train_split), ("eval", eval_split)) if split}
    except (SquadInputError, DataInputError, PackingInputError) as e:
        raise TrainingError(str(e)) from None
    for name, pf in packed.items():
        say(f"{name}: {d.algorithm} packs {len(pf.row)} features into {pf.packs} rows of {d.max_seq_length} "
            f"(at most {pf.max_sequences_per_pack} a row): packing factor {pf.packing_factor:.3f}, "
            f"efficiency {pf.efficiency:.1%}")

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    torch.manual_seed(cfg.train.seed)  # the new span head's initial weights
    model = build_model(cfg, len(wp), depth).to(device)
    result = {"output_dir": str(out), "algorithm": d.algorithm, "max_sequences_per_pack": depth,
              "packing": {name: {"packs": pf.packs, "features": len(pf.row), "packing_factor": pf.packing_factor,
                                 "efficiency": pf.efficiency} for name, pf in packed.items()}}
    if train_split:
        result["report_train"] = vars(train_split[2].report)
        result |= train(model, packed["train"], cfg, device, out, say, progress)
        export = out / "hf"
        partial = out / "hf.partial"
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        shutil.copy(wp.path, partial / "vocab.txt")
        shutil.rmtree(export, ignore_errors=True)
        os.replace(partial, export)
        result["export"] = str(export)
        say(f"fine-tuned in {result['train_seconds']:.1f} s ({result['train_features_per_second']:.1f} features/s); "
            f"Hugging Face export {export}")
    if eval_split:
        examples, dropped, features = eval_split
        start = time.perf_counter()
        preds, scores = evaluate(model, examples, dropped, features, packed["eval"], cfg, device, progress)
        result["eval_seconds"] = time.perf_counter() - start
        result["report_eval"] = vars(features.report)
        _write_json(out / "predictions.json", preds)
        result["predictions"] = str(out / "predictions.json")
        result |= scores
        if scores:
            say(f"evaluation: exact match {scores['exact_match']:.2f}, F1 {scores['f1']:.2f} over "
                f"{scores['questions']} questions ({result['eval_seconds']:.1f} s); {out / 'predictions.json'}")
    _write_json(out / "results.json", result)
    return result
