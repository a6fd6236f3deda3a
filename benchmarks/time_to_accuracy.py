"""Time to accuracy: does packed pretraining reach the same accuracy about p times sooner? (issue 14)

    .venv/bin/python benchmarks/time_to_accuracy.py --quick                  # a few minutes: pipeline check
    .venv/bin/python benchmarks/time_to_accuracy.py                          # full: about an hour, 2-core CPU idle
    .venv/bin/python benchmarks/time_to_accuracy.py --size base --device cuda --precision bf16   # a GPU
    options: --out DIR (default runs/time_to_accuracy[_quick]) --seeds N --updates N --downstream all|first|none

What it does, in order (everything under --out; a rerun reuses data and the phase-1 checkpoint):

1. Data: the built-in corpus as BERT instances at 128 (phase 1) and at 512 (phase 2), both with the same
   held-out documents (same seed and validation fraction). Phase 2 is packed with CGHP (depth 3) and
   unpacked (NONE) from the SAME instances, so both validation splits hold the same masked tokens.
2. The starting checkpoint, as MLPerf starts from one: the main job's recipe (`pretrain_tiny_128_packed`,
   hidden 128, 2 layers; --quick: a smaller model, fewer steps) pretrained at 128 from scratch here, with 512
   position embeddings so that phase 2 can start from its export (`model.init_checkpoint`). Our own small
   BERT rather than the real MiniLM encoder: its vocabulary, corpus and recipe are this project's, it is
   cheap enough to train at 512 on a CPU, and phase 2 then continues a real phase 1 instead of adapting
   a foreign model (MiniLM at 512 would be ~5x slower per step here).
3. Start accuracy a0: the checkpoint evaluated on the 512 validation split (a one-update run with learning
   rate 0), packed and unpacked (the same tokens, so the same figure up to float rounding).
4. Target, fixed BEFORE the measured runs: a pilot unpacked run with a seed that is not reused gives its
   final accuracy a_pilot; target = a0 + FRACTION x (a_pilot - a0) (--target-fraction, default 0.8). A
   fraction of the gain rather than a fraction of the accuracy, because a0 is already far from 0.
5. Timing pass: one update of each layout (unpacked G rows; packed about G sequences; packed G packs),
   forward + backward of all its micro-batches + the LAMB step, interleaved round by round in one process,
   first round dropped, medians. This shared 2-core machine runs other jobs, so wall times of separate runs
   are not comparable; time-to-target = (updates to reach the target) x (this median update time).
6. Protocol 1 (the paper's, `batch_unit: sequences`): unpacked and packed, equal sequences per update on
   average, same hyper-parameters, schedule and number of updates, --seeds seeds each. Validation MLM
   accuracy (and loss) on the whole held-out split every --updates/10 updates.
7. Protocol 2 (`batch_unit: packs`: G packs per update, p times more sequences, 1/p as many updates): betas
   ** p with learning rate x sqrt(p) (LAMB's square-root scaling rule; our choice), betas ** p alone, and
   unadjusted. Seed 0 only.
8. Downstream: every pretrained result fine-tuned on the SQuAD fixture (squad_tiny_packed) and the SST-2
   fixture (glue_tiny_packed). The fixtures hold 19 questions and 8 dev sentences: a pipeline check, not a
   quality claim.
9. Report: curves against sequences seen and against (modelled) time to --out/*.png, summary.json, and the
   figures: final accuracy per layout (mean, sd, range over seeds), updates and time to target, ratio
   unpacked / packed per seed with its spread, against the realized per-update speed-up; raw wall times of
   the runs too, with a warning.

The pure logic (target rule, updates-to-target from a curve, ratios with spread) is tested in
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

# sleeping OpenMP threads: spinning ones become several times slower when another job shares the machine
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# --- pure logic (tested) ----------------------------------------------------------------------------------
def choose_target(start: float, pilot_final: float, fraction: float) -> float:
    """The target accuracy: start + fraction x (pilot_final - start). A pilot that did not improve on the
    start gives no meaningful target: an error."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not pilot_final > start:
        raise ValueError(f"the pilot ended at {pilot_final:.4f}, not above the start {start:.4f}: no target")
    return start + fraction * (pilot_final - start)


def steps_to_target(curve: list[tuple[float, float]], target: float) -> float | None:
    """Updates until the curve [(update, accuracy), ...] (ascending updates) first reaches `target`, linearly
    interpolated between the last point below it and the first at or above it; None if never reached."""
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


def raw_seconds(rows: list[dict]) -> list[tuple[int, float]]:
    """Cumulative raw wall seconds of training per update from metrics.jsonl rows logged every update
    (seconds of a row = sequences / sequences_per_second). The update after a validation also timed the
    validation (the engine restarts its clock before evaluating): it is replaced by the median update."""
    steps = [r for r in rows if "sequences_per_second" in r]
    secs = {r["step"]: r["sequences"] / r["sequences_per_second"] for r in steps if r["sequences_per_second"] > 0}
    validated = {r["step"] for r in rows if "val_mlm_accuracy" in r}
    med = statistics.median(secs.values()) if secs else 0.0
    total, out = 0.0, []
    for s in sorted(secs):
        total += med if (s - 1) in validated else secs[s]
        out.append((s, total))
    return out


# --- sizes -------------------------------------------------------------------------------------------------
SIZES = {
    # model: hidden, layers, heads, intermediate; phase 1 steps at 128; phase 2: sequences per update, updates,
    # learning rate; seeds; timing rounds
    "quick": dict(model=(64, 2, 2, 256), phase1_steps=80, sequences=16, updates=40, lr=0.01, seeds=2, rounds=4,
                  dupe=1),
    "tiny": dict(model=(128, 2, 2, 512), phase1_steps=300, sequences=32, updates=160, lr=0.01, seeds=3, rounds=8,
                 dupe=1),
    "base": dict(model=(768, 12, 12, 3072), phase1_steps=2000, sequences=256, updates=1000, lr=0.002, seeds=3,
                 rounds=8, dupe=5),
}


def say(text: str) -> None:
    print(f"[tta {time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- data and runs -----------------------------------------------------------------------------------------
def make_data(out: Path, dupe: int) -> dict:
    from bert_ipu.data.instances import InstanceConfig
    from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data

    paths = {}
    for S in (128, 512):
        inst = out / "data" / f"instances_{S}"
        if not (inst / "manifest.json").is_file():
            say(f"creating instances at {S} from the built-in corpus")
            create_pretraining_data(["builtin"], inst, InstanceConfig(max_seq_length=S, dupe_factor=dupe if S == 512 else 1),
                                    validation_fraction=0.1, overwrite=True, progress=False)
        for name, algorithm, depth in (("packed", "cghp", 3), ("unpacked", "none", 1)):
            if S == 128 and name == "unpacked":
                continue
            target = out / "data" / f"{name}_{S}"
            if not (target / "manifest.json").is_file():
                say(f"packing {S} ({algorithm}, depth {depth})")
                pack_pretraining_data(inst, target, algorithm, depth, overwrite=True, progress=False)
            paths[(name, S)] = target
    return paths


def base_overrides(size: dict, args) -> list[str]:
    h, layers, heads, inter = size["model"]
    return [f"model.hidden_size={h}", f"model.num_hidden_layers={layers}", f"model.num_attention_heads={heads}",
            f"model.intermediate_size={inter}", f"train.device={args.device}", f"train.precision={args.precision}",
            "data.prepare_input=null"]


def run_pretraining(name: str, overrides: list[str], out: Path) -> dict:
    """One engine run (bert_ipu.tasks.pretraining.main) into out/runs/NAME; reuses a finished run."""
    from bert_ipu.config import load_config
    from bert_ipu.tasks.pretraining import main as train

    folder = out / "runs" / name
    if (folder / "results.json").is_file() and (folder / "wall.json").is_file():
        say(f"{name}: reusing the finished run in {folder}")
        result = json.loads((folder / "results.json").read_text())
        result["wall_seconds"] = json.loads((folder / "wall.json").read_text())["seconds"]
    else:
        cfg = load_config("pretrain_tiny_128_packed", overrides + [f"output_dir={folder}", f"name={name}"])
        start = time.perf_counter()
        result = train(cfg, overwrite=True, progress=False)
        result["wall_seconds"] = time.perf_counter() - start
        (folder / "wall.json").write_text(json.dumps({"seconds": result["wall_seconds"]}))
    result["rows"] = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return result


def phase2_overrides(size, args, data: Path, algorithm: str, depth: int, micro: int, updates: int, lr: float,
                     seed: int, batch_unit: str, global_batch: int, beta_correction: bool, init: Path) -> list[str]:
    every = max(1, updates // 10)
    return base_overrides(size, args) + [
        f"model.init_checkpoint={init}", "model.max_position_embeddings=512", f"data.dataset={data}",
        "data.max_seq_length=512", f"data.algorithm={algorithm}", f"data.max_sequences_per_pack={depth}",
        f"train.batch_unit={batch_unit}", f"train.global_batch_size={global_batch}",
        f"train.micro_batch_size={micro}", f"train.max_steps={updates}", f"train.warmup_steps={max(1, updates // 10)}",
        f"train.learning_rate={lr}", f"train.seed={seed}", f"train.packing_beta_correction={str(beta_correction).lower()}",
        f"train.validate_every={every}", "train.validation_batches=100000", "train.log_every=1",
        f"train.checkpoint_every={updates}", "train.keep_checkpoints=1"]


def curve(result: dict, a0: float) -> list[tuple[int, float, float, float]]:
    """(update, sequences seen, validation MLM accuracy, validation MLM loss), from the start point on."""
    pts = [(0, 0.0, a0, math.nan)]
    pts += [(r["step"], r["sequences_seen"], r["val_mlm_accuracy"], r["val_mlm_loss"]) for r in result["rows"]
            if "val_mlm_accuracy" in r]
    return pts


# --- timing pass -------------------------------------------------------------------------------------------
def time_updates(init: Path, datasets: dict, shapes: dict, rounds: int, device: str, precision: str) -> dict:
    """Median seconds of one whole update per shape {name: (dataset, packs per update, micro-batch)}:
    forward + backward of each micro-batch, then the LAMB step; shapes interleaved round by round (the order
    rotates), round 0 dropped."""
    import torch
    from pytorch_optimizer import Lamb

    from bert_ipu.data.dataset import PackedLoader
    from bert_ipu.data.shards import PackedDataset
    from bert_ipu.modeling import PackedBertForPreTraining

    dev = torch.device("cuda" if device in ("cuda", "auto") and torch.cuda.is_available() else "cpu")
    state = {}
    for name, (path, packs, micro) in shapes.items():
        data = PackedDataset(path)
        model = PackedBertForPreTraining.from_pretrained(init, max_sequences_per_pack=data.layout.max_sequences_per_pack,
                                                         mlm_slots=data.layout.mlm_slots).to(dev).train()
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
    from bert_ipu.config import load_config
    from bert_ipu.tasks import glue, squad

    scores = {}
    for task, config, module in (("squad", "squad_tiny_packed", squad), ("glue", "glue_tiny_packed", glue)):
        folder = out / "downstream" / f"{name}_{task}"
        if (folder / "results.json").is_file():
            result = json.loads((folder / "results.json").read_text())
        else:
            cfg = load_config(config, [f"model.init_checkpoint={export}", f"output_dir={folder}",
                                       f"train.device={args.device}", "train.seed=0"])
            result = module.main(cfg, overwrite=True, progress=False)
        if task == "squad":
            scores["squad_em"], scores["squad_f1"] = result["exact_match"], result["f1"]
        else:
            scores["sst2_accuracy"] = result.get("dev_accuracy", result.get("metrics", {}).get("dev_accuracy"))
    say(f"downstream {name}: SQuAD fixture EM {scores['squad_em']:.1f} F1 {scores['squad_f1']:.1f}, "
        f"SST-2 fixture accuracy {scores['sst2_accuracy']}")
    return scores


# --- plots -------------------------------------------------------------------------------------------------
def plot(runs: dict, step_seconds: dict, target: float, a0: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"unpacked": "tab:blue", "packed": "tab:orange", "packs_betas_lr": "tab:green",
               "packs_betas": "tab:red", "packs_unadjusted": "tab:purple"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for variant, seeds in runs.items():
        for i, r in enumerate(seeds):
            pts = r["curve"]
            kw = dict(color=colours.get(variant), alpha=0.85, marker=".", label=variant if i == 0 else None)
            axes[0].plot([p[1] for p in pts], [p[2] for p in pts], **kw)
            axes[1].plot([p[0] * step_seconds[variant] / 60 for p in pts], [p[2] for p in pts], **kw)
            raw = dict(r["raw_seconds"])
            axes[2].plot([raw.get(p[0], 0.0) / 60 for p in pts], [p[2] for p in pts], **kw)
    for ax, xl in zip(axes, ("sequences seen", "modelled time: updates x median update time (min)",
                             "raw wall time of the run (min; shared machine: not comparable)")):
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.4f}")
        ax.set(xlabel=xl, ylabel="validation MLM accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- main --------------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few updates, 2 seeds: a few minutes")
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="quick | tiny (default) | base (a GPU)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None, help="the main plot (default OUT/time_to_accuracy.png)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--updates", type=int, default=None, help="phase-2 updates of protocol 1")
    parser.add_argument("--sequences", type=int, default=None, help="sequences per update")
    parser.add_argument("--phase1-steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None, help="phase-2 peak learning rate (LAMB)")
    parser.add_argument("--target-fraction", type=float, default=0.8)
    parser.add_argument("--protocol2", choices=("yes", "no"), default="yes")
    parser.add_argument("--downstream", choices=("all", "first", "none"), default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args(argv)
    size_name = args.size or ("quick" if args.quick else "tiny")
    size = dict(SIZES[size_name])
    for key in ("seeds", "updates", "sequences", "lr"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if args.phase1_steps is not None:
        size["phase1_steps"] = args.phase1_steps
    downstream_mode = args.downstream or ("first" if args.quick else "all")
    out = Path(args.out or f"runs/time_to_accuracy_{size_name}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load = os.getloadavg()
    say(f"size {size_name}: {size}; machine load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"on {os.cpu_count()} cores")

    # 1. data
    paths = make_data(out, size["dupe"])
    from bert_ipu.data.shards import PackedDataset

    packed, unpacked = PackedDataset(paths[("packed", 512)]), PackedDataset(paths[("unpacked", 512)])
    p = packed.manifest["packing"]["train"]["packing_factor"]
    say(f"phase-2 data at 512: {unpacked.packs('train')} training / {unpacked.packs('validation')} validation "
        f"sequences; CGHP depth 3 p = {p:.3f}, efficiency {packed.manifest['packing']['train']['efficiency']:.2%} "
        f"vs unpacked {unpacked.manifest['packing']['train']['efficiency']:.2%}")

    # 2. the starting checkpoint
    h, layers, heads, inter = size["model"]
    phase1 = run_pretraining("phase1_128", base_overrides(size, args) + [
        f"data.dataset={paths[('packed', 128)]}", "model.max_position_embeddings=512",
        f"train.max_steps={size['phase1_steps']}", f"train.warmup_steps={max(1, size['phase1_steps'] // 10)}",
        f"train.validate_every={size['phase1_steps']}", f"train.checkpoint_every={size['phase1_steps']}",
        f"train.log_every={max(1, size['phase1_steps'] // 10)}", "train.keep_checkpoints=1"], out)
    init = Path(phase1["export"]) if "export" in phase1 else out / "runs" / "phase1_128" / "hf"
    say(f"phase 1 (128, from scratch, hidden {h}, {layers} layers): {size['phase1_steps']} updates, validation MLM "
        f"accuracy {phase1['metrics']['val_mlm_accuracy']:.4f}, {phase1['wall_seconds']:.0f} s; export {init}")

    G = size["sequences"]
    m_u = max(m for m in (8, 4, 2, 1) if G % m == 0)
    m_p = packed_micro_batch(G, p)
    packs_seq = max(m_p, round(G / p / m_p) * m_p)
    if abs(packs_seq * p - G) > 0.03 * G:
        say(f"warning: {packs_seq} packs x p = {packs_seq * p:.1f} sequences per update against {G}")
    N = size["updates"]
    N2 = max(1, round(N / p))
    lr = size["lr"]

    def p1(data, algorithm, depth, micro, seed, updates=N, learning_rate=lr, unit="sequences", beta=True):
        return phase2_overrides(size, args, data, algorithm, depth, micro, updates, learning_rate, seed, unit, G,
                                beta, init)

    # 3. start accuracy
    a0s = {}
    for name, data, algorithm, depth, micro in (("unpacked", paths[("unpacked", 512)], "none", 1, m_u),
                                                ("packed", paths[("packed", 512)], "cghp", 3, m_p)):
        r = run_pretraining(f"start_{name}", p1(data, algorithm, depth, micro, 0, updates=1, learning_rate=0.0), out)
        a0s[name] = r["metrics"]["val_mlm_accuracy"]
    a0 = a0s["unpacked"]
    say(f"start (phase-1 export at 512): validation MLM accuracy unpacked {a0s['unpacked']:.5f}, packed "
        f"{a0s['packed']:.5f} (same masked tokens)")

    # 4. target from a pilot seed that is not reused
    pilot = run_pretraining("pilot_unpacked", p1(paths[("unpacked", 512)], "none", 1, m_u, 999), out)
    a_pilot = pilot["metrics"]["val_mlm_accuracy"]
    target = choose_target(a0, a_pilot, args.target_fraction)
    say(f"TARGET fixed before the measured runs: a0 + {args.target_fraction} x (pilot final {a_pilot:.4f} - a0 "
        f"{a0:.4f}) = {target:.4f}")

    # 5. timing pass
    shapes = {"unpacked": (paths[("unpacked", 512)], G, m_u), "packed": (paths[("packed", 512)], packs_seq, m_p)}
    if args.protocol2 == "yes":
        shapes["packs"] = (paths[("packed", 512)], G, m_u)
    say(f"timing pass: {size['rounds']} rounds of one update per layout, interleaved")
    timing = time_updates(init, paths, shapes, size["rounds"], args.device, args.precision)
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
    summary = {"size": size_name, "settings": size, "packing_factor": p, "start_accuracy": a0s, "pilot_final": a_pilot,
               "target": target, "target_rule": f"a0 + {args.target_fraction} x (pilot final - a0)",
               "timing": timing, "speedup_per_update": step_speedup, "speedup_sequences_per_second": throughput_speedup,
               "load_average_start": load, "variants": {}}
    for variant, seeds in runs.items():
        rows = []
        for r in seeds:
            r["curve"] = curve(r, a0)
            r["raw_seconds"] = [(0, 0.0)] + raw_seconds(r["rows"])
            steps = steps_to_target([(c[0], c[2]) for c in r["curve"]], target)
            raw = dict(r["raw_seconds"])
            raw_t = None
            if steps is not None:  # raw seconds at the interpolated update, from the cumulative per-update times
                lo, hi = math.floor(steps), math.ceil(steps)
                raw_t = raw.get(lo, 0.0) + (steps - lo) * (raw.get(hi, raw.get(lo, 0.0)) - raw.get(lo, 0.0))
            rows.append({"final_accuracy": r["metrics"]["val_mlm_accuracy"], "final_mlm_loss": r["metrics"]["val_mlm_loss"],
                         "updates": r["step"], "sequences_seen": r["sequences_seen"], "steps_to_target": steps,
                         "time_to_target": None if steps is None else steps * step_seconds[variant],
                         "raw_seconds_to_target": raw_t, "wall_seconds": r["wall_seconds"],
                         "median_update_seconds_in_run": statistics.median(
                             [x["sequences"] / x["sequences_per_second"] for x in r["rows"]
                              if x.get("sequences_per_second")]),
                         "curve": r["curve"]})
        summary["variants"][variant] = rows

    V = summary["variants"]
    say("=" * 100)
    say(f"packing factor p = {p:.3f}; start a0 = {a0:.4f}; target = {target:.4f} ({summary['target_rule']}, pilot "
        f"{a_pilot:.4f}); load average now {os.getloadavg()[0]:.1f}")
    say(f"{'variant':>17} {'final acc (mean sd range)':>30} {'updates to target':>22} {'model time (s)':>16} "
        f"{'raw s':>8} {'wall s':>8}")
    for variant, rows in V.items():
        acc = spread([r["final_accuracy"] for r in rows])
        st = [r["steps_to_target"] for r in rows]
        tt = [r["time_to_target"] for r in rows]
        rw = [r["raw_seconds_to_target"] for r in rows]
        fmt = lambda xs, f: "/".join("-" if x is None else format(x, f) for x in xs)  # noqa: E731
        say(f"{variant:>17} {acc['mean']:.4f} {acc['sd']:.4f} [{acc['min']:.4f},{acc['max']:.4f}] "
            f"{fmt(st, '.1f'):>22} {fmt(tt, '.0f'):>16} {fmt(rw, '.0f'):>8} "
            f"{fmt([r['wall_seconds'] for r in rows], '.0f'):>8}")
    ratio = paired_ratios([r["time_to_target"] for r in V["unpacked"]], [r["time_to_target"] for r in V["packed"]])
    steps_ratio = paired_ratios([r["steps_to_target"] for r in V["unpacked"]], [r["steps_to_target"] for r in V["packed"]])
    raw_ratio = paired_ratios([r["raw_seconds_to_target"] for r in V["unpacked"]],
                              [r["raw_seconds_to_target"] for r in V["packed"]])
    same = within_seed_spread([r["final_accuracy"] for r in V["unpacked"]], [r["final_accuracy"] for r in V["packed"]])
    summary |= {"time_ratio": ratio, "steps_ratio": steps_ratio, "raw_time_ratio": raw_ratio,
                "final_within_seed_spread": same}
    say(f"time-to-target ratio unpacked / packed (protocol 1, per seed): "
        f"{', '.join(f'{x:.3f}' for x in ratio['ratios'])}; mean {ratio['mean']:.3f} sd {ratio['sd']:.3f}, range "
        f"[{ratio['min']:.3f}, {ratio['max']:.3f}]; seeds not reaching the target left out: {ratio['left_out']}")
    say(f"  = updates ratio {steps_ratio['mean']:.3f} (sd {steps_ratio['sd']:.3f}) x per-update speed-up "
        f"{step_speedup:.3f}; goal: >= 0.9 x realized speed-up ({0.9 * throughput_speedup:.3f} on sequences/s): "
        f"{'MET' if ratio['mean'] >= 0.9 * throughput_speedup else 'NOT met'}")
    say(f"final accuracy packed vs unpacked within the spread between seeds: {'yes' if same else 'NO'}")
    say(f"raw wall-time ratio (separate runs on a shared machine: NOT a sound basis): mean {raw_ratio['mean']:.3f} "
        f"[{raw_ratio['min']:.3f}, {raw_ratio['max']:.3f}]")
    for variant in ("packs_betas_lr", "packs_betas", "packs_unadjusted"):
        if variant in V:
            t = V[variant][0]["time_to_target"]
            u = spread([r["time_to_target"] for r in V["unpacked"] if r["time_to_target"] is not None])["mean"]
            say(f"protocol 2 {variant}: time to target "
                + ("not reached" if t is None else f"{t:.0f} s, unpacked mean / this = {u / t:.3f}"))

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

    plot_path = Path(args.plot) if args.plot else out / "time_to_accuracy.png"
    plot(runs, step_seconds, target, a0, plot_path,
         f"packed (CGHP depth 3, p={p:.2f}) vs unpacked at 512, {size_name}: validation MLM accuracy")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    say(f"wrote {plot_path} and {out / 'summary.json'}; {time.perf_counter() - t0:.0f} s in all")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
