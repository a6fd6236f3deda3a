"""Time to accuracy: does packed pretraining reach the same accuracy about p times sooner? (issue 14)

    .venv/bin/python benchmarks/time_to_accuracy.py --quick                   # pipeline check, a few minutes idle
    .venv/bin/python benchmarks/time_to_accuracy.py --size small --metric loss  # 3 seeds, ~40 min on a busy CPU
    .venv/bin/python benchmarks/time_to_accuracy.py                           # tiny: phase-1 start, 76 min at load 4-6
    .venv/bin/python benchmarks/time_to_accuracy.py --size base --device cuda --precision bf16   # a GPU
    options: --out DIR (default runs/time_to_accuracy_SIZE) --plot PNG --seeds N --updates N --sequences G
             --lr LR --start phase1|scratch --metric accuracy|loss --target-fraction F --downstream all|first|none

What it does, in order (everything under --out; a rerun reuses data, finished runs and the timing
pass with the same settings):

1. Data: the built-in corpus as BERT instances at 128 (phase 1) and at 512 (phase 2), both holding out the
   same documents (same seed and validation fraction). Phase 2 is packed with CGHP (depth 3) and unpacked
   (NONE) from the SAME instances; validation runs on every held-out pack (full_validation_task), so both
   layouts are scored on the same masked tokens.
2. The starting point. `--start phase1` (sizes tiny and base), as MLPerf starts from a checkpoint: the main
   job's recipe (`pretrain_tiny_128_packed`: hidden 128, 2 layers, 300 updates) pretrained at 128 here, with
   512 position embeddings, and phase 2 starts from its export (`model.init_checkpoint`). Our own BERT
   rather than the MiniLM encoder: its vocabulary, corpus and recipe are this project's, and MiniLM (22.7 M
   parameters) would be ~10x slower per update at 512 on this CPU. `--start scratch` (sizes quick and small):
   phase 2 from random weights. Measured here: a phase-1 checkpoint small enough for this busy 2-core CPU
   (hidden 64, 200 updates, validation MLM accuracy 0.046) sits on the unigram plateau, and a phase-2 pilot
   at 512 (lr 0.02, 32 sequences per update) moved it by nothing measurable in 36 updates (accuracy 0.052
   -> 0.054, loss 6.51 -> 6.63 -> 6.56: the position embeddings past 128 start untrained), so no target
   could be set above the noise; from scratch the loss falls steadily.
3. Start point: the start weights evaluated on the 512 validation split (a one-update run with learning
   rate 0), packed and unpacked (the same tokens, so the same figures up to float rounding).
4. Target, fixed BEFORE the measured runs: a pilot unpacked run with a seed that is not reused (999) ends at
   pilot; target = start + FRACTION x (pilot - start) (--target-fraction, default 0.8) on the validation
   MLM accuracy or loss (--metric; the same rule on the other metric is reported beside it). A fraction of
   the gain rather than of the value, because neither the start accuracy nor the start loss is 0.
5. Timing pass: one update of each layout (unpacked G rows; packed about G sequences; packed G packs),
   forward + backward of all its micro-batches (the same micro-batch shape for both layouts) + the LAMB
   step, interleaved round by round in one process, first round dropped, medians. This shared 2-core machine
   runs other jobs, so wall times of separate runs are not comparable: time-to-target = (updates to reach
   the target, interpolated between validations) x (this median update time). Raw wall times are reported
   too, with a warning.
6. Protocol 1 (the paper's, `batch_unit: sequences`): unpacked and packed, equal sequences per update on
   average (G is rounded up so that both use one micro-batch shape: choose_batch), the same hyper-parameters,
   schedule and number of updates, --seeds seeds each; validation every updates/6.
7. Protocol 2 (`batch_unit: packs`: G packs per update, about p times more sequences, 1/p as many updates):
   betas ** p with the learning rate x sqrt(p) (LAMB's square-root rule; our choice), betas ** p alone, and
   unadjusted. Seed 0 only.
8. Downstream: pretrained results fine-tuned on the SQuAD fixture (squad_tiny_packed) and the SST-2 fixture
   (glue_tiny_packed); 19 questions and 8 dev sentences: a pipeline check, not a quality claim.
9. Report: the plot (--plot, default OUT/time_to_accuracy.png: accuracy and loss against sequences seen,
   modelled time and raw time, all variants), OUT/summary.json, and the figures as progress lines.

The pure logic (target rule, updates-to-target from a curve, ratios with spread, batch choice) is tested in
tests/test_time_to_accuracy.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bert_ipu.arguments import Parser, at_least, device_name, positive
from bert_ipu.files import is_png, save_png

# sleeping OpenMP threads: spinning ones become several times slower when another job shares the machine
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# --- pure logic (tested) ----------------------------------------------------------------------------------
def choose_target(start: float, pilot_final: float, fraction: float, higher_is_better: bool = True) -> float:
    """The target: start + fraction x (pilot_final - start) (an accuracy, or a loss with higher_is_better
    False). A pilot that did not improve on the start gives no meaningful target: an error."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not (pilot_final > start if higher_is_better else pilot_final < start):
        raise ValueError(f"the pilot ended at {pilot_final:.4f}, no better than the start {start:.4f}: no target")
    return start + fraction * (pilot_final - start)


def steps_to_target(curve: list[tuple[float, float]], target: float, higher_is_better: bool = True) -> float | None:
    """Updates until the curve [(update, value), ...] (ascending updates) first reaches `target` (at or
    above it; at or below for a loss), linearly interpolated between the last point short of it and the
    first that reaches it; None if never reached."""
    if not higher_is_better:
        return steps_to_target([(x, -y) for x, y in curve], -target)
    prev = None
    for x, y in curve:
        if y >= target:
            if prev is None or y == prev[1]:
                return float(x)
            px, py = prev
            return px + (target - py) / (y - py) * (x - px)
        prev = (x, y)
    return None


def spread(values: list[float]) -> dict:
    """mean, sample sd (0 for one value), min, max and n of `values`."""
    n = len(values)
    if not n:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    return {"n": n, "mean": statistics.fmean(values), "sd": statistics.stdev(values) if n > 1 else 0.0,
            "min": min(values), "max": max(values)}


def paired_ratios(numerators: list[float | None], denominators: list[float | None]) -> dict:
    """Ratios numerator_i / denominator_i per seed (pairs with a missing value are left out and counted),
    with their spread, and the ratio of the means over the complete pairs."""
    pairs = [(a, b) for a, b in zip(numerators, denominators) if a is not None and b is not None and b > 0]
    ratios = [a / b for a, b in pairs]
    out = spread(ratios) | {"ratios": ratios, "left_out": len(numerators) - len(pairs)}
    out["ratio_of_means"] = (statistics.fmean(a for a, _ in pairs) / statistics.fmean(b for _, b in pairs)
                             if pairs else math.nan)
    return out


def within_seed_spread(a: list[float], b: list[float]) -> bool:
    """Are the means of a and b within the spread between seeds: |mean a - mean b| <= the larger of the two
    ranges (max - min over seeds)? With one seed each there is no spread: False unless equal."""
    ra, rb = spread(a), spread(b)
    return abs(ra["mean"] - rb["mean"]) <= max(ra["max"] - ra["min"], rb["max"] - rb["min"])


def packed_micro_batch(sequences: int, packing_factor: float, candidates=(8, 4, 2, 1), tolerance=0.03) -> int:
    """The largest micro-batch size for which `batch_unit: sequences` rounds an update of `sequences`
    sequences to whole micro-batches of packs holding within `tolerance` of that many sequences on average
    (the engine rounds the packs per update to whole micro-batches: packs_per_update)."""
    for m in candidates:
        packs = max(m, round(sequences / packing_factor / m) * m)
        if abs(packs * packing_factor - sequences) <= tolerance * sequences:
            return m
    return candidates[-1]


def choose_batch(sequences: int, packing_factor: float, tolerance=0.025) -> tuple[int, int]:
    """(sequences per update G, micro-batch m) with G >= `sequences` (at most twice), the smallest such G
    for which both layouts use the same micro-batch shape m (8, 4 or 2, the largest that fits): G unpacked rows and round(G/p/m) x m
    packs holding within `tolerance` of G sequences on average. Same shape, so the timing compares like with
    like; without such a G: (sequences, the packed micro-batch of packed_micro_batch)."""
    for G in range(sequences, 2 * sequences + 1):
        for m in (8, 4, 2):
            packs = round(G / packing_factor / m) * m
            if G % m == 0 and packs >= m and abs(packs * packing_factor - G) <= tolerance * G:
                return G, m
    return sequences, packed_micro_batch(sequences, packing_factor)


def downstream_by_variant(scores: dict[str, dict]) -> dict[str, dict]:
    """Downstream scores {"VARIANT_seedI": {score: value}} grouped by variant (the name up to its last
    "_seed"), each score's spread over the seeds; scores that are None are left out."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for name, s in scores.items():
        variant = name.rsplit("_seed", 1)[0]
        for k, v in s.items():
            if v is not None:
                grouped.setdefault(variant, {}).setdefault(k, []).append(float(v))
    return {variant: {k: spread(v) for k, v in s.items()} for variant, s in grouped.items()}


# metrics.jsonl rows whose rates leave validation out (2026-11-29): runs reused only with this format, as the rows of
# earlier runs timed a validation in the update after it
ROWS_FORMAT = 2


def raw_seconds(rows: list[dict]) -> list[tuple[int, float]]:
    """Cumulative raw wall seconds of training per update from metrics.jsonl rows logged every update
    (seconds of a row = sequences / sequences_per_second; the engine leaves validation and checkpoints out of
    them)."""
    steps = [r for r in rows if "sequences_per_second" in r]
    secs = {r["step"]: r["sequences"] / r["sequences_per_second"] for r in steps if r["sequences_per_second"] > 0}
    total, out = 0.0, []
    for s in sorted(secs):
        total += secs[s]
        out.append((s, total))
    return out


# --- sizes -------------------------------------------------------------------------------------------------
SIZES = {
    # model (hidden, layers, heads, intermediate); phase-1 updates at 128; phase 2: sequences per update
    # (rounded up so both layouts share one micro-batch shape), updates, LAMB learning rate; seeds; timing
    # rounds; dupe factor of the 512 instances; start point and target metric (docs/results/time-to-accuracy.md:
    # the small sizes start from scratch and target the loss, since their phase-1 checkpoint gave no
    # measurable phase-2 gain and from scratch the accuracy sits on the unigram plateau)
    "quick": dict(model=(64, 2, 2, 256), phase1_steps=150, sequences=16, updates=24, lr=0.02, seeds=2, rounds=6,
                  dupe=1, start="scratch", metric="loss"),
    "small": dict(model=(64, 2, 2, 256), phase1_steps=200, sequences=32, updates=40, lr=0.02, seeds=3, rounds=6,
                  dupe=1, start="scratch", metric="loss"),
    "tiny": dict(model=(128, 2, 2, 512), phase1_steps=300, sequences=32, updates=80, lr=0.02, seeds=3, rounds=8,
                 dupe=1, start="phase1", metric="accuracy"),
    "base": dict(model=(768, 12, 12, 3072), phase1_steps=2000, sequences=256, updates=1000, lr=0.002, seeds=3,
                 rounds=8, dupe=5, start="phase1", metric="accuracy"),
}


# whole documents held out at both lengths (the same ones: the split depends on seed, chunk and fraction only)
VALIDATION_FRACTION = 0.05


def say(text: str) -> None:
    print(f"[tta {time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- data and runs -----------------------------------------------------------------------------------------
def make_data(out: Path, dupe: int) -> dict:
    from bert_ipu.data.instances import InstanceConfig
    from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data

    paths = {}
    for S in (128, 512):
        inst = out / "data" / f"instances_{S}"
        # each kept only if made from the same input and settings (--if-changed: the data of another --size, its
        # dupe factor, was reused as it was)
        say(f"instances at {S} from the built-in corpus (kept if made with these settings)")
        config = InstanceConfig(max_seq_length=S, dupe_factor=dupe if S == 512 else 1)
        create_pretraining_data(["builtin"], inst, config, validation_fraction=VALIDATION_FRACTION, if_changed=True,
                                progress=False)
        for name, algorithm, depth in (("packed", "cghp", 3), ("unpacked", "none", 1)):
            if S == 128 and name == "unpacked":
                continue
            target = out / "data" / f"{name}_{S}"
            pack_pretraining_data(inst, target, algorithm, depth, if_changed=True, progress=False)
            paths[(name, S)] = target
    return paths


def base_overrides(size: dict, args) -> list[str]:
    h, layers, heads, inter = size["model"]
    return [f"model.hidden_size={h}", f"model.num_hidden_layers={layers}", f"model.num_attention_heads={heads}",
            f"model.intermediate_size={inter}", f"train.device={args.device}", f"train.precision={args.precision}",
            "data.prepare_input=null"]


def full_validation_task(cfg):
    """The pretraining task with validation on EVERY held-out pack. The library's evaluation reads whole
    micro-batches (PackedLoader drops the remainder), so packed and unpacked runs, whose validation splits
    hold different numbers of rows, would be scored on slightly different masked tokens; here the last
    micro-batch is a short one instead. One process only (this benchmark runs no data parallelism)."""
    from bert_ipu.data.loader import PackedLoader
    from bert_ipu.engine.parallel import global_counts
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    class FullValidation(PretrainingTask):
        def evaluate(self, engine, rt, step):
            assert rt.dp_world == 1 and rt.stages == 1, "full_validation_task runs on one process"
            n = self.data.packs("validation")
            whole = next(iter(PackedLoader(self.data, "validation", n, shuffle=False)))
            m = self.cfg.train.micro_batch_size
            batches = [{k: v[i:i + m].to(rt.device) for k, v in whole.items()} for i in range(0, n, m)]
            counts = global_counts(self, engine, batches)
            sums = engine.evaluate(batches, self.normalizers(counts)) | counts
            return {f"val_{k}": v for k, v in self.summarize(sums).items()}

    return FullValidation(cfg)


def run_pretraining(name: str, overrides: list[str], out: Path) -> dict:
    """One engine run (the pretraining task with full validation) into out/runs/NAME; reuses a finished run."""
    from bert_ipu.tasks import load_config
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.engine.trainer import train as engine_train

    def train(cfg, overwrite, progress):
        rt = Runtime.start(cfg.train.device, cfg.parallel.pipeline_stages)
        return engine_train(full_validation_task(cfg), cfg, rt, overwrite=overwrite, progress=progress)

    folder = out / "runs" / name
    done = folder / "wall.json"  # written after the run, with the overrides it ran with and the rows' format
    if (folder / "results.json").is_file() and done.is_file() \
            and json.loads(done.read_text()).get("overrides") == overrides \
            and json.loads(done.read_text()).get("rows") == ROWS_FORMAT:
        say(f"{name}: reusing the finished run in {folder} (same settings)")
        result = json.loads((folder / "results.json").read_text())
        result["wall_seconds"] = json.loads(done.read_text())["seconds"]
    else:
        cfg = load_config("pretrain_tiny_128_packed", overrides + [f"output_dir={folder}", f"name={name}"])
        start = time.perf_counter()
        result = train(cfg, overwrite=True, progress=False)
        result["wall_seconds"] = time.perf_counter() - start
        done.write_text(json.dumps({"seconds": result["wall_seconds"], "overrides": overrides, "rows": ROWS_FORMAT}))
    result["rows"] = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return result


def phase2_overrides(size, args, data: Path, algorithm: str, depth: int, micro: int, updates: int, lr: float,
                     seed: int, batch_unit: str, global_batch: int, beta_correction: bool, init: Path) -> list[str]:
    every = max(1, updates // 6)
    return base_overrides(size, args) + [
        f"model.init_checkpoint={init if init else 'null'}", "model.max_position_embeddings=512", f"data.dataset={data}",
        "data.max_seq_length=512", f"data.algorithm={algorithm}", f"data.max_sequences_per_pack={depth}",
        f"train.batch_unit={batch_unit}", f"train.global_batch_size={global_batch}",
        f"train.micro_batch_size={micro}", f"train.max_steps={updates}", f"train.warmup_steps={max(1, updates // 10)}",
        f"train.learning_rate={lr}", f"train.seed={seed}", f"train.packing_beta_correction={str(beta_correction).lower()}",
        f"train.validate_every={every}", "train.validation_batches=100000", "train.log_every=1",
        f"train.checkpoint_every={updates}", "train.keep_checkpoints=1"]


def curve(result: dict, start: dict) -> list[tuple[int, float, float, float]]:
    """(update, sequences seen, validation MLM accuracy, validation MLM loss), from the start point on."""
    pts = [(0, 0.0, start["val_mlm_accuracy"], start["val_mlm_loss"])]
    pts += [(r["step"], r["sequences_seen"], r["val_mlm_accuracy"], r["val_mlm_loss"]) for r in result["rows"]
            if "val_mlm_accuracy" in r]
    return pts


# --- timing pass -------------------------------------------------------------------------------------------
def time_updates(init: Path | None, bert_config, shapes: dict, rounds: int, device: str, precision: str) -> dict:
    """Median seconds of one whole update per shape {name: (dataset, packs per update, micro-batch)}:
    forward + backward of each micro-batch, then the LAMB step; shapes interleaved round by round (the order
    rotates), round 0 dropped."""
    import torch
    from pytorch_optimizer import Lamb

    from bert_ipu.data.loader import PackedLoader
    from bert_ipu.data.shards import PackedDataset
    from bert_ipu.models.bert import PackedBertForPreTraining

    dev = torch.device("cuda" if device in ("cuda", "auto") and torch.cuda.is_available() else "cpu")
    state = {}
    for name, (path, packs, micro) in shapes.items():
        data = PackedDataset(path)
        kw = dict(max_sequences_per_pack=data.layout.max_sequences_per_pack, mlm_slots=data.layout.mlm_slots)
        model = (PackedBertForPreTraining.from_pretrained(init, **kw) if init else
                 PackedBertForPreTraining(bert_config, **kw)).to(dev).train()
        loader = PackedLoader(data, "train", micro)
        state[name] = dict(model=model, opt=Lamb(model.parameters(), lr=1e-4), it=iter(loader), loader=loader,
                           n=packs // micro, times=[], sequences=[])

    def batch(s):
        try:
            return next(s["it"])
        except StopIteration:
            s["it"] = iter(s["loader"])
            return next(s["it"])

    names = list(shapes)
    for r in range(rounds + 1):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            s = state[name]
            micro = [{k: v.to(dev) for k, v in batch(s).items()} for _ in range(s["n"])]
            if dev.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for b in micro:
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    out = s["model"](**b)
                out.loss.backward()
            s["opt"].step()
            s["opt"].zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if r:
                s["times"].append(time.perf_counter() - start)
                s["sequences"].append(sum(float(b["next_sentence_weights"].sum()) for b in micro))
    return {k: {"median_seconds": statistics.median(s["times"]), "times": s["times"],
                "sequences_per_update": statistics.fmean(s["sequences"])} for k, s in state.items()}


# --- downstream --------------------------------------------------------------------------------------------
def downstream(name: str, export: Path, out: Path, args) -> dict:
    from bert_ipu.tasks import load_config
    from bert_ipu.tasks import run as run_task

    scores = {}
    for task, config in (("squad", "squad_tiny_packed"), ("glue", "glue_tiny_packed")):
        folder = out / "downstream" / f"{name}_{task}"
        done = folder / "results.json"
        # reused only if newer than the pretrained export (a pretraining run redone since makes it stale)
        if done.is_file() and done.stat().st_mtime >= (export / "config.json").stat().st_mtime:
            result = json.loads(done.read_text())
        else:
            cfg = load_config(config, [f"model.init_checkpoint={export}", f"output_dir={folder}",
                                       f"train.device={args.device}", "train.seed=0"])
            result = run_task(cfg, overwrite=True, progress=False)
        if task == "squad":
            scores["squad_em"], scores["squad_f1"] = result["exact_match"], result["f1"]
        else:
            scores["sst2_accuracy"] = result.get("dev_accuracy", result.get("metrics", {}).get("dev_accuracy"))
    say(f"downstream {name}: SQuAD fixture EM {scores['squad_em']:.1f} F1 {scores['squad_f1']:.1f}, "
        f"SST-2 fixture accuracy {scores['sst2_accuracy']}")
    return scores


# --- plots -------------------------------------------------------------------------------------------------
def plot(runs: dict, step_seconds: dict, targets: dict, path: Path, title: str) -> None:
    """Validation MLM accuracy (top) and loss (bottom) of every run against sequences seen, modelled time
    and raw wall time; all variants on the same axes (the paper's Figure 3 middle), targets dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"unpacked": "tab:blue", "packed": "tab:orange", "packs_betas_lr": "tab:green",
               "packs_betas": "tab:red", "packs_unadjusted": "tab:purple"}
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for row, (metric, idx) in enumerate((("accuracy", 2), ("loss", 3))):
        for variant, seeds in runs.items():
            for i, r in enumerate(seeds):
                pts = [q for q in r["curve"] if not math.isnan(q[idx])]
                raw = dict(r["raw_seconds"])
                kw = dict(color=colours.get(variant), alpha=0.8, marker=".", label=variant if i == 0 else None)
                axes[row, 0].plot([q[1] for q in pts], [q[idx] for q in pts], **kw)
                axes[row, 1].plot([q[0] * step_seconds[variant] / 60 for q in pts], [q[idx] for q in pts], **kw)
                axes[row, 2].plot([raw.get(q[0], 0.0) / 60 for q in pts], [q[idx] for q in pts], **kw)
        for ax, xl in zip(axes[row], ("sequences seen", "modelled time: updates x median update time (min)",
                                      "raw wall time (min; separate runs on a shared machine)")):
            if targets.get(metric) is not None:
                ax.axhline(targets[metric], color="grey", ls="--", lw=1, label=f"target {targets[metric]:.4f}")
            ax.set(xlabel=xl, ylabel=f"validation MLM {metric}")
            ax.grid(alpha=0.3)
        axes[row, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=90)
    plt.close(fig)


# --- main --------------------------------------------------------------------------------------------------
def phase1_checkpoint(size: dict, args, paths: dict, out: Path) -> Path:
    """Phase 1: the main job's recipe at 128 from scratch, with 512 position embeddings; returns its export."""
    h, layers = size["model"][:2]
    phase1 = run_pretraining("phase1_128", base_overrides(size, args) + [
        f"data.dataset={paths[('packed', 128)]}", "model.max_position_embeddings=512",
        f"train.max_steps={size['phase1_steps']}", f"train.warmup_steps={max(1, size['phase1_steps'] // 10)}",
        f"train.validate_every={size['phase1_steps']}", f"train.checkpoint_every={size['phase1_steps']}",
        f"train.log_every={max(1, size['phase1_steps'] // 10)}", "train.keep_checkpoints=1"], out)
    init = Path(phase1["export"]) if "export" in phase1 else out / "runs" / "phase1_128" / "hf"
    say(f"phase 1 (128, from scratch, hidden {h}, {layers} layers): {size['phase1_steps']} updates, validation MLM "
        f"accuracy {phase1['metrics']['val_mlm_accuracy']:.4f}, {phase1['wall_seconds']:.0f} s; export {init}")
    return init


def main(argv=None) -> dict:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few updates, 2 seeds: a few minutes")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="quick | small | tiny (default: the main job's model, 76 min at load 4-6 on 2 cores) | base "
                        "(BERT-base, a GPU)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="the main plot (default OUT/time_to_accuracy.png)")
    parser.add_argument("--seeds", type=at_least(1), default=None)
    parser.add_argument("--updates", type=at_least(1), default=None, help="phase-2 updates of protocol 1")
    parser.add_argument("--sequences", type=at_least(1), default=None, help="sequences per update")
    parser.add_argument("--phase1-steps", type=at_least(1), default=None)
    parser.add_argument("--lr", type=positive, default=None, help="phase-2 peak learning rate (LAMB)")
    parser.add_argument("--target-fraction", type=positive, default=0.8)
    parser.add_argument("--metric", choices=("accuracy", "loss"), default=None,
                        help="what the target is set on: validation MLM accuracy (tiny, base) or loss (quick, small: "
                             "from scratch the accuracy jumps to the unigram plateau within a few updates)")
    parser.add_argument("--start", choices=("phase1", "scratch"), default=None,
                        help="phase 2 from a phase-1 checkpoint at 128 (tiny, base) or from scratch (quick, small)")
    parser.add_argument("--protocol2", choices=("yes", "no"), default="yes")
    parser.add_argument("--downstream", choices=("all", "first", "none"), default=None)
    parser.add_argument("--device", type=device_name, default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        parser.error(f"--out {args.out} is a file; give a folder (created if missing)")
    # (a folder that does not exist yet is made, as --out is)
    parser.check_output(args.plot and Path(args.plot).absolute().parent.is_dir() and args.plot, "--plot", is_png)
    if not 0 < args.target_fraction <= 1:  # (it failed after the data and pilot stages)
        parser.error(f"--target-fraction {args.target_fraction}: give a share of the final accuracy in (0, 1]")
    size_name = args.size or ("quick" if args.quick else "tiny")
    size = dict(SIZES[size_name])
    for key in ("seeds", "updates", "sequences", "lr"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if args.phase1_steps is not None:
        size["phase1_steps"] = args.phase1_steps
    args.start = args.start or size["start"]
    args.metric = args.metric or size["metric"]
    downstream_mode = args.downstream or ("first" if args.quick else "all")
    out = Path(args.out or f"runs/time_to_accuracy_{size_name}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load = os.getloadavg()
    say(f"size {size_name}: {size}; machine load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"on {os.cpu_count()} cores")

    # 1. data
    paths = make_data(out, size["dupe"])
    from bert_ipu.tasks import load_config
    from bert_ipu.data.shards import PackedDataset

    packed, unpacked = PackedDataset(paths[("packed", 512)]), PackedDataset(paths[("unpacked", 512)])
    p = packed.manifest["packing"]["train"]["packing_factor"]
    say(f"phase-2 data at 512: {unpacked.packs('train')} training / {unpacked.packs('validation')} validation "
        f"sequences; CGHP depth 3 p = {p:.3f}, efficiency {packed.manifest['packing']['train']['efficiency']:.2%} "
        f"vs unpacked {unpacked.manifest['packing']['train']['efficiency']:.2%}")

    # 2. the starting point
    h, layers, heads, inter = size["model"]
    init = phase1_checkpoint(size, args, paths, out) if args.start == "phase1" else None

    G, m_p = choose_batch(size["sequences"], p)
    m_u = m_p if G % m_p == 0 else max(m for m in (8, 4, 2, 1) if G % m == 0)
    packs_seq = max(m_p, round(G / p / m_p) * m_p)
    say(f"sequences per update G = {G} (asked {size['sequences']}): unpacked {G} rows in micro-batches of {m_u}; "
        f"packed {packs_seq} packs in micro-batches of {m_p} = {packs_seq * p:.1f} sequences on average")
    N = size["updates"]
    N2 = max(1, round(N / p))
    lr = size["lr"]

    def p1(data, algorithm, depth, micro, seed, updates=N, learning_rate=lr, unit="sequences", beta=True):
        return phase2_overrides(size, args, data, algorithm, depth, micro, updates, learning_rate, seed, unit, G,
                                beta, init)

    # 3. start point (seed 0's initial weights from scratch)
    starts = {}
    for name, data, algorithm, depth, micro in (("unpacked", paths[("unpacked", 512)], "none", 1, m_u),
                                                ("packed", paths[("packed", 512)], "cghp", 3, m_p)):
        r = run_pretraining(f"start_{name}", p1(data, algorithm, depth, micro, 0, updates=1, learning_rate=0.0), out)
        starts[name] = {k: r["metrics"][k] for k in ("val_mlm_accuracy", "val_mlm_loss")}
    start = starts["unpacked"]
    key, higher = ("val_mlm_accuracy", True) if args.metric == "accuracy" else ("val_mlm_loss", False)
    a0 = start[key]
    say(f"start ({'phase-1 export' if init else 'from scratch, seed 0'} at 512): validation MLM accuracy unpacked "
        f"{starts['unpacked']['val_mlm_accuracy']:.5f} / packed {starts['packed']['val_mlm_accuracy']:.5f}, loss "
        f"{starts['unpacked']['val_mlm_loss']:.5f} / {starts['packed']['val_mlm_loss']:.5f} (same masked tokens)")

    # 4. target from a pilot seed that is not reused
    pilot = run_pretraining("pilot_unpacked", p1(paths[("unpacked", 512)], "none", 1, m_u, 999), out)
    a_pilot = pilot["metrics"][key]
    say(f"pilot (unpacked, seed 999, not reused): final validation MLM accuracy "
        f"{pilot['metrics']['val_mlm_accuracy']:.4f}, loss {pilot['metrics']['val_mlm_loss']:.4f}")
    try:
        target = choose_target(a0, a_pilot, args.target_fraction, higher)
    except ValueError as e:
        say(f"stopping before the measured runs: {e}. Phase 2 gains nothing in {N} updates from this start; use a "
            "longer phase 1 (--phase1-steps), more updates (--updates), another --lr, --metric loss or --start scratch")
        raise SystemExit(1) from None
    say(f"TARGET (validation MLM {args.metric}) fixed before the measured runs: start + {args.target_fraction} x "
        f"(pilot final {a_pilot:.4f} - start {a0:.4f}) = {target:.4f}")

    # 5. timing pass
    shapes = {"unpacked": (paths[("unpacked", 512)], G, m_u), "packed": (paths[("packed", 512)], packs_seq, m_p)}
    if args.protocol2 == "yes":
        shapes["packs"] = (paths[("packed", 512)], G, m_u)
    say(f"timing pass: {size['rounds']} rounds of one update per layout, interleaved")
    bert_config = load_config("pretrain_tiny_128_packed", base_overrides(size, args)).model.bert_config(
        unpacked.manifest["vocab"]["size"], 512)
    timing_key = {"shapes": {k: [str(d), n, mb] for k, (d, n, mb) in shapes.items()}, "rounds": size["rounds"],
                  "init": str(init), "model": list(size["model"]), "device": args.device, "precision": args.precision}
    timing_file = out / "timing.json"  # a rerun (e.g. after an interrupted downstream) reuses the same timing
    cached = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
    if cached.get("key") == timing_key:
        say(f"reusing the timing pass in {timing_file} (same shapes)")
        timing = cached["timing"]
    else:
        timing = time_updates(init, bert_config, shapes, size["rounds"], args.device, args.precision)
        timing_file.write_text(json.dumps({"key": timing_key, "timing": timing}))
    for k, v in timing.items():
        say(f"  {k:>8}: median update {v['median_seconds']:.3f} s (spread {min(v['times']):.3f}-{max(v['times']):.3f}), "
            f"{v['sequences_per_update']:.1f} sequences per update, {v['sequences_per_update'] / v['median_seconds']:.1f} "
            "sequences/s")
    step_speedup = timing["unpacked"]["median_seconds"] / timing["packed"]["median_seconds"]
    throughput_speedup = ((timing["packed"]["sequences_per_update"] / timing["packed"]["median_seconds"])
                          / (timing["unpacked"]["sequences_per_update"] / timing["unpacked"]["median_seconds"]))
    say(f"  realized speed-up: per update {step_speedup:.3f}x, sequences/s {throughput_speedup:.3f}x (bound p = {p:.3f})")

    # 6. protocol 1, 7. protocol 2
    runs: dict[str, list] = {"unpacked": [], "packed": []}
    for seed in range(size["seeds"]):
        for name, data, algorithm, depth, micro in (("unpacked", paths[("unpacked", 512)], "none", 1, m_u),
                                                    ("packed", paths[("packed", 512)], "cghp", 3, m_p)):
            say(f"protocol 1: {name} seed {seed}: {N} updates of ~{G} sequences")
            r = run_pretraining(f"{name}_seed{seed}", p1(data, algorithm, depth, micro, seed), out)
            runs[name].append(r)
    step_seconds = {"unpacked": timing["unpacked"]["median_seconds"], "packed": timing["packed"]["median_seconds"]}
    if args.protocol2 == "yes":
        for name, factor, beta in (("packs_betas_lr", math.sqrt(p), True), ("packs_betas", 1.0, True),
                                   ("packs_unadjusted", 1.0, False)):
            say(f"protocol 2: {name}: {N2} updates of {G} packs, lr {lr * factor:.4g}, betas "
                f"{'** p' if beta else 'unchanged'}")
            r = run_pretraining(name, p1(paths[("packed", 512)], "cghp", 3, m_u, 0, updates=N2,
                                         learning_rate=lr * factor, unit="packs", beta=beta), out)
            runs[name] = [r]
            step_seconds[name] = timing["packs"]["median_seconds"]

    # figures
    summary = {"size": size_name, "settings": size | {"G": G, "micro_batch": m_u, "packed_packs_per_update": packs_seq},
               "start": args.start, "metric": args.metric, "packing_factor": p, "start_point": starts,
               "pilot_final": pilot["metrics"], "target": target,
               "target_rule": f"start + {args.target_fraction} x (pilot final - start), validation MLM {args.metric}",
               "timing": timing, "speedup_per_update": step_speedup, "speedup_sequences_per_second": throughput_speedup,
               "load_average_start": load, "variants": {}}
    metrics = {"accuracy": (True, 2, "val_mlm_accuracy"), "loss": (False, 3, "val_mlm_loss")}
    targets = {}
    for m, (hi, _, k) in metrics.items():  # the same rule on the other metric, reported beside the chosen one
        try:
            targets[m] = choose_target(start[k], pilot["metrics"][k], args.target_fraction, hi)
        except ValueError:
            targets[m] = None
    summary["targets"] = targets
    for variant, seeds in runs.items():
        rows = []
        for r in seeds:
            r["curve"] = curve(r, start)
            r["raw_seconds"] = [(0, 0.0)] + raw_seconds(r["rows"])
            raw = dict(r["raw_seconds"])
            row = {"final_accuracy": r["metrics"]["val_mlm_accuracy"], "final_mlm_loss": r["metrics"]["val_mlm_loss"],
                   "updates": r["step"], "sequences_seen": r["sequences_seen"], "wall_seconds": r["wall_seconds"],
                   "median_update_seconds_in_run": statistics.median(
                       [x["sequences"] / x["sequences_per_second"] for x in r["rows"] if x.get("sequences_per_second")]),
                   "curve": r["curve"]}
            for m, (hi, idx, _) in metrics.items():
                steps = (None if targets[m] is None else
                         steps_to_target([(c[0], c[idx]) for c in r["curve"]], targets[m], hi))
                raw_t = None
                if steps is not None:  # raw seconds at the interpolated update, from the cumulative per-update times
                    lo, up = math.floor(steps), math.ceil(steps)
                    raw_t = raw.get(lo, 0.0) + (steps - lo) * (raw.get(up, raw.get(lo, 0.0)) - raw.get(lo, 0.0))
                row[m] = {"steps_to_target": steps, "time_to_target": None if steps is None else steps * step_seconds[variant],
                          "raw_seconds_to_target": raw_t}
            rows.append(row)
        summary["variants"][variant] = rows

    V = summary["variants"]
    fmt = lambda xs, f: "/".join("-" if x is None else format(x, f) for x in xs)  # noqa: E731
    say("=" * 100)
    say(f"packing factor p = {p:.3f}; G = {G} sequences per update; load average now {os.getloadavg()[0]:.1f}")
    say(f"{'variant':>17} {'final accuracy: mean sd [range]':>34} {'final loss: mean sd':>20} {'wall s per run':>16}")
    for variant, rows in V.items():
        acc, los = spread([r["final_accuracy"] for r in rows]), spread([r["final_mlm_loss"] for r in rows])
        say(f"{variant:>17} {acc['mean']:.4f} {acc['sd']:.4f} [{acc['min']:.4f}, {acc['max']:.4f}] "
            f"{los['mean']:10.4f} {los['sd']:.4f} {fmt([r['wall_seconds'] for r in rows], '.0f'):>16}")
    same = within_seed_spread([r["final_accuracy"] for r in V["unpacked"]], [r["final_accuracy"] for r in V["packed"]])
    same_loss = within_seed_spread([r["final_mlm_loss"] for r in V["unpacked"]], [r["final_mlm_loss"] for r in V["packed"]])
    summary |= {"final_accuracy_within_seed_spread": same, "final_loss_within_seed_spread": same_loss}
    say(f"final packed vs unpacked within the spread between seeds (|mean difference| <= the larger range): "
        f"accuracy {'yes' if same else 'NO'}, loss {'yes' if same_loss else 'NO'}")
    for m in sorted(metrics, key=lambda x: x != args.metric):  # the chosen metric first
        hi, idx, k = metrics[m]
        if targets[m] is None:
            say(f"[{m}] no target: the pilot ended at {pilot['metrics'][k]:.4f}, no better than the start "
                f"{start[k]:.4f}")
            continue
        say(f"[{m}{' (chosen)' if m == args.metric else ''}] target {targets[m]:.4f} = start {start[k]:.4f} + "
            f"{args.target_fraction} x (pilot {pilot['metrics'][k]:.4f} - start)")
        for variant, rows in V.items():
            say(f"  {variant:>17}: updates to target {fmt([r[m]['steps_to_target'] for r in rows], '.1f')}, "
                f"modelled time {fmt([r[m]['time_to_target'] for r in rows], '.0f')} s, raw "
                f"{fmt([r[m]['raw_seconds_to_target'] for r in rows], '.0f')} s")
        ratio = paired_ratios([r[m]["time_to_target"] for r in V["unpacked"]], [r[m]["time_to_target"] for r in V["packed"]])
        steps_ratio = paired_ratios([r[m]["steps_to_target"] for r in V["unpacked"]],
                                    [r[m]["steps_to_target"] for r in V["packed"]])
        raw_ratio = paired_ratios([r[m]["raw_seconds_to_target"] for r in V["unpacked"]],
                                  [r[m]["raw_seconds_to_target"] for r in V["packed"]])
        summary[f"{m}_ratios"] = {"time": ratio, "updates": steps_ratio, "raw_time": raw_ratio}
        say(f"  time-to-target ratio unpacked / packed, per seed: {', '.join(f'{x:.3f}' for x in ratio['ratios'])}; "
            f"mean {ratio['mean']:.3f} sd {ratio['sd']:.3f} [{ratio['min']:.3f}, {ratio['max']:.3f}]; pairs left out "
            f"(target not reached): {ratio['left_out']}")
        say(f"  = updates ratio {steps_ratio['mean']:.3f} (sd {steps_ratio['sd']:.3f}) x per-update speed-up "
            f"{step_speedup:.3f}; goal >= 0.9 x realized speed-up (0.9 x {throughput_speedup:.3f} sequences/s = "
            f"{0.9 * throughput_speedup:.3f}): {'MET' if ratio['mean'] >= 0.9 * throughput_speedup else 'NOT met'}")
        say(f"  raw wall-time ratio (separate runs on a shared machine: NOT a sound basis): mean {raw_ratio['mean']:.3f} "
            f"[{raw_ratio['min']:.3f}, {raw_ratio['max']:.3f}]")
        u = spread([r[m]["time_to_target"] for r in V["unpacked"] if r[m]["time_to_target"] is not None])["mean"]
        for variant in ("packs_betas_lr", "packs_betas", "packs_unadjusted"):
            if variant in V:
                t = V[variant][0][m]["time_to_target"]
                say(f"  protocol 2 {variant}: " + ("target not reached" if t is None else
                                                   f"modelled time to target {t:.0f} s; unpacked mean / this {u / t:.3f}"))

    plot_path = Path(args.plot) if args.plot else out / "time_to_accuracy.png"
    title = (f"packed (CGHP depth 3, p={p:.2f}) vs unpacked at 512, {size_name}, "
             f"{'from a phase-1 checkpoint' if init else 'from scratch'}")
    # the pretraining figures first, so that an interrupted downstream stage leaves them behind
    plot(runs, step_seconds, targets, plot_path, title)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))

    # 8. downstream
    if downstream_mode != "none":
        summary["downstream"] = {}
        for variant, seeds in runs.items():
            for i, r in enumerate(seeds):
                if downstream_mode == "first" and (i > 0 or variant not in ("unpacked", "packed")):
                    continue
                name = f"{variant}_seed{i}"
                summary["downstream"][name] = downstream(name, Path(r["export"]) if "export" in r else
                                                         Path(r["output_dir"]) / "hf", out, args)
        say("downstream (fixtures: a pipeline check, not a quality claim):")
        for name, s in summary["downstream"].items():
            say(f"  {name:>22}: SQuAD EM {s['squad_em']:5.1f} F1 {s['squad_f1']:5.1f} | SST-2 acc {s['sst2_accuracy']}")
        side = downstream_by_variant(summary["downstream"])
        summary["downstream_by_variant"] = side
        say("downstream side by side (mean [min, max] over the seeds of each variant):")
        for variant, s in side.items():
            say(f"  {variant:>17} (n={s['squad_f1']['n']}): " + ", ".join(
                f"{k} {v['mean']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for k, v in s.items()))

    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    say(f"wrote {plot_path} and {out / 'summary.json'}; {time.perf_counter() - t0:.0f} s in all")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
