"""Profiling harness: packing overhead and realized speed-up of each algorithm, measured on the real model.

For every algorithm the length histogram is packed, micro-batches of packs (or, for NONE and SORT, of single
sequences) are made with the real lengths and random tokens (BERT's speed does not depend on which tokens
it sees), and the same model trains on all of them (forward, backward, optimizer step) with the algorithms
interleaved round by round; the first round is warm-up. Reported per algorithm:

    EFF        real tokens / computed tokens of the packing (SORT: of its padded batches)
    p          packing factor: sequences per pack (row)
    theory     the speed-up bound over NONE if time were proportional to tokens
    realized   real sequences per second over NONE's, measured: sequences per step (the packing's average
               p x micro-batch, so that the few sampled packs add no noise; SORT: its rows) over the median
               step time (SORT: the mean, as its batches differ by design)
    OH         extra time per step over NONE at the same shape (packs of S tokens vs rows of S tokens):
               what the packed model costs beyond vanilla (mask, positions, K NSP slots); SORT: n/a
    FLOPs      per step: the model's FLOPs with attention counted within the documents (bert_ipu.engine.flops:
               the same for every backend, flex included); the Hugging Face baseline's by
               torch.utils.flop_counter (its attention over the padded rows). Deterministic, noise-free
    shapes     distinct batch shapes: 1 for every packer; SORT needs one compiled graph per shape

With `profile.ranks` N (no measurement, packing arithmetic only): updates of N x micro-batch packs drawn
from each packing (NONE: single sequences) dealt to N data-parallel ranks, one micro-batch each, in loader
order and by `bert_ipu.packing.balance.balanced_order`; the mean attention balance ratio (ABR), data balance
ratio (DBR) of both and the padding ratio (`balance_of`; SORT: n/a, its rows differ in length).

`summarize` holds the arithmetic; `profile` the measurement; `run` a whole profile from its config
(`ProfilingRunConfig`, config.py: run_profiling.py is its command line).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ... import packing
from ...data.instances import InstanceConfig, mlm_slots_for
from ...data.layout import IGNORE_INDEX, Instance, PackLayout, pack_instances, stack_packs
from ...config import to_yaml
from ...files import describe_os_error, is_png, output_file_problem, save_png, write_atomic
from ...engine.flops import StepFlops, peak_flops
from ...engine.runtime import RunError, autocast, pick_device
from ...models.attention import check_device

STATIC = ("none", "greedy", "spfhp", "lpfhp", "nnlshp", "cghp")


@dataclass
class Measurement:
    algorithm: str
    result: packing.PackingResult
    step_seconds: list[float] = field(default_factory=list)   # measured steps (warm-up dropped)
    sequences_per_step: float = 0.0
    tokens_per_step: float = 0.0
    flops_per_step: float = 0.0
    shapes: int = 1
    peak_memory_bytes: int | None = None
    compile_seconds: float | None = None  # torch.compile: total compilation time over the batches' shapes


def summarize(measurements: dict[str, Measurement], peak_flops: float | None = None) -> list[dict]:
    """Rows of the table. realized = (sequences/s) / NONE's; OH = median step time / NONE's - 1 (static
    shapes only); MFU = counted FLOPs per step / median step time / `peak_flops` (the device's peak)."""
    base = measurements.get("none")

    def rate(m: Measurement) -> float:
        # static shapes: every step costs the same, so the median step resists the shared machine's outliers;
        # SORT's steps differ by design (each batch its own length), so its mean over the batches counts
        if m.algorithm == "sort":
            return m.sequences_per_step * len(m.step_seconds) / sum(m.step_seconds)
        return m.sequences_per_step / statistics.median(m.step_seconds)

    rows = []
    for name, m in measurements.items():
        median = statistics.median(m.step_seconds)
        rows.append({
            "algorithm": name,
            "efficiency": m.result.efficiency,
            "packing_factor": m.result.packing_factor,
            "theoretical_speedup": m.result.speedup_upper_bound,
            "realized_speedup": rate(m) / rate(base) if base else None,
            "overhead": (median / statistics.median(base.step_seconds) - 1) if base and name in STATIC else None,
            "sequences_per_second": rate(m),
            "tokens_per_second": rate(m) * m.tokens_per_step / m.sequences_per_step,
            "step_ms_median": median * 1e3,
            "step_ms_min": min(m.step_seconds) * 1e3,
            "step_ms_max": max(m.step_seconds) * 1e3,
            "flops_per_step": m.flops_per_step,
            "mfu": m.flops_per_step / median / peak_flops if peak_flops else None,
            "shapes": m.shapes,
            "compile_seconds": m.compile_seconds,
            "peak_memory_mb": None if m.peak_memory_bytes is None else m.peak_memory_bytes / 2**20,
        })
    return rows


COLUMNS = [("backend", 9, "{}"), ("algorithm", 9, "{}"), ("EFF", 8, "{:.2%}"), ("p", 6, "{:.3f}"),
           ("theory", 7, "{:.3f}x"), ("realized", 9, "{:.3f}x"), ("OH", 7, "{:+.1%}"), ("seq/s", 8, "{:.1f}"),
           ("tok/s", 9, "{:.0f}"),
           ("step ms", 8, "{:.1f}"), ("min-max", 13, "{}"), ("GFLOP/step", 10, "{:.2f}"), ("shapes", 6, "{}"),
           ("MFU", 6, "{:.1%}"), ("peak MB", 8, "{}"), ("compile s", 9, "{:.1f}")]


def format_table(rows) -> str:
    """The rows of `summarize` as a fixed-width text table."""
    lines = ["  ".join(f"{h:>{w}}" for h, w, _ in COLUMNS)]
    for r in rows:
        values = [r.get("backend", "-"), r["algorithm"], r["efficiency"], r["packing_factor"], r["theoretical_speedup"],
                  r["realized_speedup"], r["overhead"], r["sequences_per_second"], r["tokens_per_second"],
                  r["step_ms_median"], f"{r['step_ms_min']:.0f}-{r['step_ms_max']:.0f}", r["flops_per_step"] / 1e9,
                  r["shapes"], r["mfu"], "n/a" if r["peak_memory_mb"] is None else f"{r['peak_memory_mb']:.0f}",
                  r["compile_seconds"]]
        cells = ["n/a" if v is None else f.format(v) for (_, w, f), v in zip(COLUMNS, values)]
        lines.append("  ".join(f"{c:>{w}}" for (_, w, _), c in zip(COLUMNS, cells)))
    return "\n".join(lines)


class WithPrecision(torch.nn.Module):
    """`model`'s forward under bert_ipu.engine.runtime.autocast (bf16) so every helper here times the same step."""

    def __init__(self, model, device, precision: str):
        super().__init__()
        self.model, self.device, self.precision = model, device, precision

    def forward(self, **batch):
        with autocast(self.device, self.precision):
            return self.model(**batch)


class CompiledStep(torch.nn.Module):
    """`model` (a WithPrecision) under torch.compile with static shapes: mode "compile"; or also replayed as CUDA
    graphs, mode "cudagraphs" (torch.compile's reduce-overhead). Forward and backward are compiled; the optimizer
    step stays eager. Each step is marked as a new iteration, so the graphs' output buffers can be reused."""

    def __init__(self, model, mode: str):
        super().__init__()
        self.model, self.cudagraphs = model, mode == "cudagraphs"
        self.compiled = torch.compile(model, dynamic=False, mode="reduce-overhead" if self.cudagraphs else None)

    def forward(self, **batch):
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(**batch)


class HFPreTrainingBaseline(torch.nn.Module):
    """transformers' own `BertForPreTraining` on the unpacked (NONE) rows: what a user would otherwise run.
    Same shapes: (B, S) tokens with an attention mask, the MLM labels of the row's masked tokens, NSP on the
    row's one sequence; HF computes the MLM head on every position, as its users do."""

    def __init__(self, config):
        super().__init__()
        from transformers import BertForPreTraining

        self.model = BertForPreTraining(config)

    def forward(self, input_ids, token_type_ids, sequence_ids, masked_lm_labels, next_sentence_labels, **_):
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, :masked_lm_labels.shape[1]] = masked_lm_labels  # the layout puts the masked tokens first
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                          attention_mask=(sequence_ids > 0).long(), labels=labels,
                          next_sentence_label=next_sentence_labels[:, -1])


def _instance(n: int, vocab: int, rng: np.random.Generator) -> Instance:
    ids = rng.integers(5, vocab, size=n)
    ids[0] = 2
    types = np.zeros(n, dtype=np.int64)
    types[n // 2:] = 1
    labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
    if n > 1:
        where = rng.choice(np.arange(1, n), size=min(n - 1, max(1, round(0.15 * n))), replace=False)
        labels[where] = ids[where]
    return Instance(ids, types, labels, int(rng.integers(0, 2)))


BALANCE_KEYS = ("abr_loader", "abr_balanced", "dbr_loader", "dbr_balanced", "padding_ratio")


def balance_of(mixture, pack_length: int, ranks: int, micro_batch: int, updates: int, seed: int) -> dict:
    """Balance of `updates` updates of ranks x micro_batch packs drawn from the mixture (strategies in
    proportion to their counts, as the profiled batches are): `bert_ipu.packing.balance.update_balance`'s
    means (keys BALANCE_KEYS and "updates"), each rank taking one micro-batch."""
    from ...packing.balance import update_balance

    packs = ranks * micro_batch
    picks = np.random.default_rng(seed).choice(len(mixture.counts), size=packs * updates,
                                               p=mixture.counts / mixture.counts.sum())
    sizes = np.diff(mixture.offsets)[picks]
    ends = np.cumsum(sizes)
    flat = mixture.flat[np.repeat(mixture.offsets[picks], sizes) + np.arange(ends[-1]) - np.repeat(ends - sizes, sizes)]
    return update_balance(flat, np.concatenate([[0], ends]), ranks, packs, pack_length, updates, micro_batch)


def format_balance(rows, ranks: int, micro_batch: int) -> str:
    """The balance columns of the rows (one per algorithm) as a fixed-width text table."""
    lines = [f"balance over {ranks} ranks, updates of {ranks} x {micro_batch} packs (mean over the updates; 0 = "
             "balanced)", f"{'algorithm':>9}  {'ABR order':>9}  {'ABR bal.':>9}  {'DBR order':>9}  {'DBR bal.':>9}  "
             f"{'padding':>8}"]
    for r in rows:
        cells = ["n/a" if r.get(k) is None else f"{r[k]:.4f}" for k in BALANCE_KEYS]
        lines.append(f"{r['algorithm']:>9}  " + "  ".join(f"{c:>9}" for c in cells[:4]) + f"  {cells[4]:>8}")
    return "\n".join(lines)


def padded_batch(lengths, M: int, K: int, vocab: int, rng) -> dict:
    """One sequence per row, padded to the batch's own longest (the shape changes with the content)."""
    width = int(max(max(lengths), K + 1))
    layout = PackLayout(width, min(M, width - K), K)
    return stack_packs([pack_instances([_instance(int(n), vocab, rng)], layout) for n in lengths])


def packed_batch(mixture, micro_batch: int, S: int, M: int, K: int, vocab: int, rng) -> dict:
    """micro_batch packs of S tokens, strategies drawn in proportion to the mixture's counts."""
    picks = rng.choice(len(mixture.counts), size=micro_batch, p=mixture.counts / mixture.counts.sum())
    return stack_packs([pack_instances([_instance(int(n), vocab, rng) for n in mixture.strategies[i] if n > 0],
                                       PackLayout(S, M, K)) for i in picks])


def make_batches(histogram: np.ndarray, algorithm: str, depth: int, micro_batch: int, steps: int, vocab: int,
                 sort_batch: int, seed: int):
    """(PackingResult, list of micro-batches as dicts of tensors) for one algorithm."""
    S, K = len(histogram), depth
    M = mlm_slots_for(InstanceConfig(max_seq_length=S), S, K)
    rng = np.random.default_rng(seed)
    if algorithm == "sort":
        result = packing.pack(histogram, "sort", batch_size=sort_batch)
        lengths = packing.expand_histogram(histogram)
        if len(lengths) < micro_batch:   # (numpy's "high <= 0" before)
            raise ProfilingError(f"SORT takes {micro_batch} consecutive sequences a micro-batch and the histogram "
                                 f"holds {len(lengths)}: give profile.micro_batch_size at most {len(lengths)}, or "
                                 "leave sort out of the algorithms")
        batches = []
        for _ in range(steps):  # consecutive sequences of the sorted data: SORT's batches
            start = int(rng.integers(0, len(lengths) - micro_batch + 1))
            batches.append(padded_batch(lengths[start:start + micro_batch], M, K, vocab, rng))
    else:
        result = packing.pack(histogram, algorithm, None if algorithm == "none" else depth)
        batches = [packed_batch(result.mixture, micro_batch, S, M, K, vocab, rng) for _ in range(steps)]
    tensors = [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
    return result, tensors


def train_step(model, opt, batch) -> None:
    model(**batch).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed_step(model, opt, batch, device) -> float:
    """Seconds of one training step, the device synchronised before and after."""
    return timed_call(lambda: train_step(model, opt, batch), device)


def timed_call(fn, device) -> float:
    """Seconds of `fn()`, the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def timed_rounds(out: dict, batches: dict, rounds: int, device, step, say=print) -> None:
    """`rounds` rounds over every algorithm's batches, interleaved, `step(name, batch)` returning a step's seconds;
    from round 1 on (round 0 is warm-up) the seconds and the peak memory go into `out[name]` (Measurements)."""
    for r in range(rounds):
        for name, bs in batches.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            for b in bs:
                seconds = step(name, b)
                if r:
                    out[name].step_seconds.append(seconds)
            if device.type == "cuda" and r:
                out[name].peak_memory_bytes = max(out[name].peak_memory_bytes or 0, torch.cuda.max_memory_allocated())
        say(f"round {r + 1}/{rounds} done{' (warm-up)' if r == 0 else ''}")


def count_flops(model, batch) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def compile_cost(model, batches: list[dict]) -> float:
    """Seconds torch.compile spends on these batches: every new shape compiles the step again (a static-shape
    compiler's recompilation), measured as first call minus a second call of the same shape."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    total, seen = 0.0, set()
    for b in batches:
        shape = tuple(b["input_ids"].shape)
        if shape in seen:
            continue
        seen.add(shape)
        timings = []
        # no cache of compiled graphs: every algorithm pays for its own shapes, whatever ran before it
        with torch._inductor.config.patch(fx_graph_cache=False):
            for _ in range(2):
                start = time.perf_counter()
                train_step(compiled, opt, b)
                timings.append(time.perf_counter() - start)
        total += max(0.0, timings[0] - timings[1])
    torch._dynamo.reset()
    return total


def profile(model, batches: dict, results: dict, rounds: int, device, trace_dir=None, say=print,
            compile_step: bool = False, models: dict | None = None, step_mode: str = "eager",
            trace_prefix: str = "") -> dict:
    """Interleaved measurement of every algorithm's batches on `model` (or on `models[name]` where given: the
    Hugging Face baseline), its steps run as `step_mode` says (eager, or a `CompiledStep`: FLOPs are counted on
    the eager model). Returns {algorithm: Measurement}."""
    models = {name: (models or {}).get(name, model) for name in batches}
    opts = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-5) for m in models.values()}
    # FLOPs: ours from the documents (bert_ipu.engine.flops: any backend, flex too), a baseline's by FlopCounterMode
    counters = {id(m): (StepFlops(m.model, lambda twin, b: twin(**b).loss).of if isinstance(m, WithPrecision)
                        and not isinstance(m.model, HFPreTrainingBaseline) else lambda b, m=m: count_flops(m, b))
                for m in models.values()}
    opt = opts[id(model)]
    if step_mode == "eager":
        timed = models
    else:
        torch.compiler.reset()  # no graphs of an earlier mode or backend count against the recompilation limit
        wrapped = {id(m): CompiledStep(m, step_mode) for m in models.values()}
        timed = {name: wrapped[id(m)] for name, m in models.items()}
    out = {}
    for name, bs in batches.items():
        bs[:] = [{k: v.to(device) for k, v in b.items()} for b in bs]
        m = Measurement(name, results[name])
        rows = bs[0]["input_ids"].shape[0]
        if name == "sort":  # one sequence per row; its real tokens are those of the sampled batches
            m.sequences_per_step = rows
            m.tokens_per_step = statistics.mean((b["sequence_ids"] > 0).sum().item() for b in bs)
        else:  # the mixture's averages: a handful of sampled packs would add noise to the rates
            m.sequences_per_step = rows * results[name].packing_factor
            m.tokens_per_step = rows * results[name].max_len * results[name].efficiency
        m.flops_per_step = statistics.mean(counters[id(models[name])](b) for b in bs)
        m.shapes = len({tuple(b["input_ids"].shape) for b in bs})
        out[name] = m
    timed_rounds(out, batches, rounds, device,
                 lambda name, b: timed_step(timed[name], opts[id(models[name])], b, device), say)
    if compile_step:
        compile_cost(model, next(iter(batches.values()))[:1])  # warm-up: the compiler's own first-use costs
        for name, bs in batches.items():
            say(f"compiling the step for {name} ({out[name].shapes} shape(s)) ...")
            out[name].compile_seconds = compile_cost(models[name], bs)
    if trace_dir is not None:
        write_traces(model, opt, {k: v for k, v in batches.items() if models[k] is model}, trace_dir, trace_prefix)
    return out


def write_traces(model, opt, batches: dict, trace_dir, prefix: str = "") -> None:
    """One torch.profiler trace per algorithm (Chrome/Perfetto JSON and TensorBoard), and an op table; `prefix`
    names the backend where several are profiled (each backend's traces replaced the one's before)."""
    from pathlib import Path

    import shutil

    from torch.profiler import ProfilerActivity, profile as torch_profile

    trace_dir = Path(trace_dir)
    claim_trace_dir(trace_dir)
    (trace_dir / "tensorboard").mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for name, bs in batches.items():
        with torch_profile(activities=activities) as prof:
            train_step(model, opt, bs[0])
        name = prefix + name
        (trace_dir / f"{name}_ops.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                                             row_limit=25))
        chrome = trace_dir / f"{name}.trace.json"  # chrome://tracing, ui.perfetto.dev
        prof.export_chrome_trace(str(chrome))
        # the TensorBoard profiler plugin reads *.pt.trace.json files under its log folder
        shutil.copyfile(chrome, trace_dir / "tensorboard" / f"{name}.pt.trace.json")


def expected_max(samples: np.ndarray, n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of `samples` (exact, not sampled):
    with sorted x_1..x_m, P(max = x_(i)) = (i/m)^n - ((i-1)/m)^n."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    m = len(x)
    cdf = (np.arange(1, m + 1) / m) ** n
    return float((x * np.diff(np.concatenate([[0.0], cdf]))).sum())


def scaling_study(model, histogram: np.ndarray, packed_algorithm: str, depth: int, micro_batch: int, batches: int,
                  vocab: int, device, seed: int = 0, devices=(1, 2, 4, 8, 16, 32, 64)) -> list[dict]:
    """The paper's Section E, measured: un-padded batches (random sequences, each batch padded only to its own
    longest, so its time varies with its content) against packed batches (constant shape), timed one by one.
    With n data-parallel devices every step waits for the slowest, so a step takes E[max of n batch times];
    the speed-up of packing at n devices is (packed sequences / E[max packed]) / (sequences / E[max un-padded])."""
    rng = np.random.default_rng(seed)
    S, K = len(histogram), depth
    M = mlm_slots_for(InstanceConfig(max_seq_length=S), S, K)
    lengths = packing.expand_histogram(histogram)
    result = packing.pack(histogram, packed_algorithm, depth)
    mix = result.mixture
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = {"unpadded": [], "packed": []}
    for i in range(batches + 1):
        unpadded = padded_batch(rng.choice(lengths, size=micro_batch), M, K, vocab, rng)
        packed = packed_batch(mix, micro_batch, S, M, K, vocab, rng)
        for name, arrays in (("unpadded", unpadded), ("packed", packed)):
            seconds = timed_step(model, opt, {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}, device)
            if i:  # the first pair is warm-up
                times[name].append(seconds)
    rows = []
    for n in devices:
        unpadded_rate = micro_batch / expected_max(times["unpadded"], n)
        packed_rate = micro_batch * result.packing_factor / expected_max(times["packed"], n)
        rows.append({"devices": n, "unpadded_sequences_per_second_per_device": unpadded_rate,
                     "packed_sequences_per_second_per_device": packed_rate, "speedup": packed_rate / unpadded_rate})
    return rows


class ProfilingError(ValueError):
    """A profile that cannot run or measure nothing; the message says why. run_profiling.py prints it and exits 2."""


VOCAB = 30522
"""the profiled model's vocabulary: bert-base's"""


def check_memory(cfg, pack_length: int, device: torch.device) -> None:
    """Refuse a profile whose attention scores alone cannot fit: micro-batch x heads x S x S float32 values, kept
    for the backward pass with their probabilities and gradient (about 3 copies), plus the weights and AdamW's
    state (16 bytes a parameter). Estimated before anything is allocated (a pack length of 1e5 asked for tens of
    TB and died in the allocator)."""
    from ...engine.launch import _available_memory

    prof, m = cfg.profile, cfg.model
    B = prof.micro_batch_size
    scores = B * m.num_attention_heads * pack_length ** 2 * 4 * 3
    # the activations kept for the backward pass (about 8 hidden-wide and 2 intermediate-wide float32 tensors a
    # token a layer) and the MLM head's logits with their gradient: a micro-batch of 100,000 asked for 134 GB
    # there and died in the allocator
    slots = max(1, round(0.2 * pack_length))  # (the MLM slots: about 15% of the tokens, and a few)
    activations = B * pack_length * m.num_hidden_layers * (8 * m.hidden_size + 2 * m.intermediate_size) * 4
    logits = B * slots * VOCAB * 4 * 2
    need = scores + activations + logits + 16 * m.parameter_estimate()
    have = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _available_memory()
    if have is not None and need > have:
        raise ProfilingError(f"a pack length of {pack_length:,} (the histogram's length) with micro-batch "
                             f"{prof.micro_batch_size} and {m.num_attention_heads} heads needs about "
                             f"{need / 2**30:,.1f} GiB for its activations, the attention scores and the model, but "
                             f"{have / 2**30:,.1f} GiB are free; give a shorter histogram or lower "
                             "profile.micro_batch_size")


def run(cfg, say=print) -> dict:
    """The whole profile of `cfg` (a `ProfilingRunConfig`): pack the histogram with every algorithm (NONE
    added first: the baseline), measure each attention backend (and the Hugging Face baseline), print the
    table, and write what `cfg.profile` asks for (JSON rows and the config beside them, traces, plots, the
    Section E scaling study). Returns {"rows": the table's rows, "scaling": the study's rows or None}.
    Bad input raises a ValueError (packing.PackingInputError for the histogram, ProfilingError otherwise)."""
    from ...models.bert import PackedBertForPreTraining

    prof = cfg.profile
    check_outputs(prof)
    histogram = packing.load_histogram(prof.histogram)
    algorithms = list(dict.fromkeys(prof.algorithms))
    unknown = [a for a in algorithms if a not in packing.ALGORITHMS]
    if unknown:
        raise ProfilingError(f"profile.algorithms: unknown {', '.join(unknown)}; choose from "
                             f"{', '.join(packing.ALGORITHMS)}")
    if "none" not in algorithms:
        algorithms = ["none", *algorithms]  # the baseline every speed-up is measured against
    try:
        device = pick_device(prof.device)
    except RunError as e:
        raise ProfilingError(str(e).replace("train.device", "profile.device")) from None
    depth = prof.max_sequences_per_pack
    S = len(histogram)
    if depth > S:  # (torch's "Expected input batch_size (128) to match target batch_size (200000)")
        raise ProfilingError(f"profile.max_sequences_per_pack {depth:,} is more than the pack length {S:,} (the "
                             "histogram's length): a pack holds at most one sequence a token; give at most that")
    check_memory(cfg, S, device)
    config = cfg.model.bert_config(VOCAB, S, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(prof.seed)
    base = PackedBertForPreTraining(config, depth, cfg.model.attention_backend).to(device).train()
    say(f"[profile] {cfg.name}: {sum(q.numel() for q in base.parameters()) / 1e6:.1f} M parameters on {device}, "
        f"{prof.precision}, pack length {S}, depth {depth}, micro-batch {prof.micro_batch_size}, {prof.steps} "
        f"steps x {prof.rounds} rounds (first = warm-up)")
    batches, results = {}, {}
    for name in algorithms:
        say(f"[profile] packing with {name} ...")
        results[name], batches[name] = make_batches(histogram, name, depth, prof.micro_batch_size, prof.steps,
                                                    config.vocab_size, prof.sort_batch_size, prof.seed)
    peak = peak_flops(device, prof.precision)
    extra = {}
    if prof.hf_baseline:  # timed again in every backend's run, interleaved with it
        results["hf"] = results["none"]
        extra["hf"] = WithPrecision(HFPreTrainingBaseline(config).to(device).train(), device, prof.precision)
    rows = []
    for backend in prof.backends or [cfg.model.attention_backend]:
        try:
            check_device(backend, device, training=True)
        except ValueError as e:
            say(f"[profile] backend {backend}: skipped: {e}")
            continue
        model = PackedBertForPreTraining(config, depth, backend).to(device).train()
        model.load_state_dict(base.state_dict())
        for mode in prof.step_modes:
            if mode == "cudagraphs" and device.type != "cuda":
                say(f"[profile] backend {backend}, cudagraphs: skipped: CUDA graphs need a CUDA device")
                continue
            eager = mode == "eager"
            # SORT's batch shape changes with its content: a static-shape compiler would recompile for each
            runs = {k: [dict(b) for b in v] for k, v in batches.items() if eager or k != "sort"}
            if prof.hf_baseline:
                runs["hf"] = runs["none"]
            label = backend if eager else f"{backend}+{mode}"
            say(f"[profile] backend {label} ...")
            measurements = profile(WithPrecision(model, device, prof.precision), runs, results, prof.rounds, device,
                                   prof.trace_dir if eager else None, say=lambda m: say(f"[profile] {m}"),
                                   compile_step=prof.compile and eager, models=extra, step_mode=mode,
                                   trace_prefix=f"{backend}_" if len(prof.backends or ()) > 1 else "")
            rows += [r | {"backend": label} for r in summarize(measurements, peak)]
            if prof.engine:  # the application's step on the same batches (its optimizer, its compile mode)
                label = f"{backend}+engine" + ("" if eager else f"+{mode}")
                say(f"[profile] {label} ...")
                torch.compiler.reset()
                step = EngineStep(model, cfg, device, prof.precision, mode)
                packed = {k: v for k, v in batches.items() if k != "sort"}
                measurements = profile_engine(step, packed, results, prof.rounds, device,
                                              StepFlops(model, lambda twin, b: twin(**b).loss),
                                              say=lambda m: say(f"[profile] {m}"))
                rows += [r | {"backend": label} for r in summarize(measurements, peak)]
    if not rows:
        raise ProfilingError(f"no backend could be measured on {device}: "
                             f"profile.backends={prof.backends or [cfg.model.attention_backend]}; "
                             "add mask or reference")
    if prof.ranks:
        balance = {name: dict.fromkeys(BALANCE_KEYS) if name == "sort" else
                   balance_of(results[name].mixture, S, prof.ranks, prof.micro_batch_size, prof.balance_updates,
                              prof.seed) for name in algorithms}
        balance["hf"] = balance["none"]
        rows = [r | {k: balance[r["algorithm"]][k] for k in BALANCE_KEYS} for r in rows]
    say(format_table(rows))
    if prof.ranks:
        say(format_balance([r for r in rows if r["backend"] == rows[0]["backend"]], prof.ranks,
                           prof.micro_batch_size))
    measured = list(dict.fromkeys(r["backend"] for r in rows))
    if len(measured) > 1:  # the harness's choice: the backend with the most sequences/s per algorithm
        for name in algorithms:
            best = max((r for r in rows if r["algorithm"] == name), key=lambda r: r["sequences_per_second"])
            say(f"[profile] fastest backend for {name}: {best['backend']} ({best['sequences_per_second']:.1f} seq/s)")
    for backend in measured:
        mine = {r["algorithm"]: r for r in rows if r["backend"] == backend}
        if "hf" in mine:
            say(f"[profile] {backend}: our NONE step vs transformers BertForPreTraining at the same shape: "
                f"{mine['none']['step_ms_median'] / mine['hf']['step_ms_median'] - 1:+.1%} (OH over HF)")
    try:  # the outputs were checked before the run; a disk can still fill
        if prof.json:
            write_atomic(Path(prof.json), "".join(json.dumps(r) + "\n" for r in rows))
            write_config(cfg, Path(f"{prof.json}.config.yaml"))
        if prof.trace_dir:
            claim_trace_dir(Path(prof.trace_dir))
            write_config(cfg, Path(prof.trace_dir) / "config.yaml")
        if prof.plot:
            plot(prof.plot, histogram, rows)
        study = None
        if prof.scaling:
            say(f"[profile] Section E: timing {prof.scaling_batches} un-padded and packed (cghp) batches ...")
            # (in the profile's precision, as the table's rows: it ran in float32 under profile.precision=bf16)
            study = scaling_study(WithPrecision(base, device, prof.precision), histogram, "cghp", depth,
                                  prof.micro_batch_size, prof.scaling_batches, config.vocab_size, device, prof.seed)
            say(format_scaling(study))
            plot_scaling(prof.scaling, study)
    except OSError as e:
        raise ProfilingError(f"cannot write the profile's outputs: {describe_os_error(e)}") from None
    return {"rows": rows, "scaling": study}


class EngineStep:
    """The training application's step for one micro-batch (profile.engine): the engine's LocalParallel with
    `mode` as train.compile, the pretraining task's loss, the gradient norm clipped, LAMB (multi-tensor) and the
    schedule; the counts taken on the host and the batch copied through pinned memory, as the trainer does. Called
    with a batch of CPU tensors."""

    def __init__(self, model, cfg, device: torch.device, precision: str, mode: str):
        from ...config import TrainConfig
        from ...engine.optim import build_optimizer
        from ...engine.parallel import LocalParallel
        from ...engine.runtime import Runtime
        from ..pretraining.task import PretrainingTask

        self.task = PretrainingTask(cfg)
        self.task.expected = None
        self.rt = Runtime(device)
        self.engine = LocalParallel(model, self.task, self.rt, precision, compile_mode="none" if mode == "eager" else mode)
        train = TrainConfig(optimizer="lamb", learning_rate=1e-5, warmup_steps=1, max_steps=10 ** 6)
        self.opt, self.sched = build_optimizer(model, train, 10 ** 6, 1, (0.9, 0.999))

    def __call__(self, batch: dict) -> None:
        from ...engine.parallel import global_counts, to_device

        self.engine.model.mlm_slots = batch["masked_lm_labels"].shape[1]  # the task's model knows M from its data
        counts = global_counts(self.task, self.engine, [batch])
        self.engine.train_step([to_device(batch, self.rt.device)], self.task.normalizers(counts))
        self.engine.clip(1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)


def profile_engine(step: EngineStep, batches: dict, results: dict, rounds: int, device, flops: StepFlops,
                   say=print) -> dict:
    """`EngineStep` timed on every algorithm's batches (CPU tensors), rounds interleaved, the first dropped: the
    same Measurements as `profile`."""
    out = {}
    for name, bs in batches.items():
        m = Measurement(name, results[name])
        m.sequences_per_step = bs[0]["input_ids"].shape[0] * results[name].packing_factor
        m.tokens_per_step = bs[0]["input_ids"].shape[0] * results[name].max_len * results[name].efficiency
        m.flops_per_step = statistics.mean(flops.of(b) for b in bs)
        out[name] = m
    timed_rounds(out, batches, rounds, device, lambda name, b: timed_call(lambda: step(b), device), say)
    return out


def _our_rows(head: bytes) -> bool:
    """The first line of a JSON-lines file of profile rows (each has an algorithm and a backend)."""
    try:
        row = json.loads(head.split(b"\n", 1)[0])
    except ValueError:
        return False
    return isinstance(row, dict) and "algorithm" in row and "backend" in row


def _our_config(head: bytes) -> bool:
    """A profile's config as `write_config` writes it (`kind: profile` at the start of a line)."""
    return head.startswith(b"kind: profile") or b"\nkind: profile" in head


def check_outputs(prof) -> None:
    """Refuse, before anything is measured, output files that cannot be written (`output_file_problem`: a missing
    or read-only folder, a folder given for a file, a file this project did not write, which is never replaced)."""
    outputs = [("profile.json", prof.json, _our_rows), ("profile.plot", prof.plot, is_png),
               ("profile.scaling", prof.scaling, is_png)]
    if prof.json:
        outputs.append(("profile.json", f"{prof.json}.config.yaml", _our_config))
    seen = {}
    for flag, path, _ in outputs:
        other = path and seen.setdefault(Path(path).resolve(), flag)
        if other and other != flag:  # (the later output replaced the earlier: --json X --plot X left a PNG)
            raise ProfilingError(f"{other} and {flag} are both {Path(path).resolve()}; give each output its own file")
    for flag, path, ours in outputs:
        problem = path and output_file_problem(path, flag, ours)
        if problem:
            raise ProfilingError(problem)
    if prof.trace_dir and Path(prof.trace_dir).exists() and not Path(prof.trace_dir).is_dir():
        raise ProfilingError(f"profile.trace_dir {prof.trace_dir} is a file, not a folder; give a folder for the "
                             "traces (it is created if missing)")
    if prof.trace_dir and Path(prof.trace_dir).is_dir() and any(Path(prof.trace_dir).iterdir()) \
            and not (Path(prof.trace_dir) / TRACE_MARKER).is_file() and not _old_traces(Path(prof.trace_dir)):
        raise ProfilingError(f"profile.trace_dir {prof.trace_dir} holds files this project did not write (no "
                             f"{TRACE_MARKER} marker), and traces would replace some (config.yaml, ALGORITHM_ops.txt); "
                             "give a new or empty folder")


TRACE_MARKER = ".bert_ipu_traces"
"""written into a trace folder before its first file: profile.trace_dir writes only into an empty folder or one
holding this marker, never over a user's files that share the traces' names"""


def _old_traces(folder: Path) -> bool:
    """A trace folder a profile wrote before TRACE_MARKER was: its profile config.yaml, ALGORITHM_ops.txt and
    ALGORITHM.trace.json files and tensorboard/*.pt.trace.json, nothing else."""
    def ours(p: Path) -> bool:
        if p.name == "config.yaml":
            return p.is_file() and _our_config(p.read_bytes()[:4096])
        if p.name == "tensorboard":
            return p.is_dir() and all(q.name.endswith(".pt.trace.json") for q in p.iterdir())
        return p.is_file() and (p.name.endswith("_ops.txt") or p.name.endswith(".trace.json"))
    return all(ours(p) for p in folder.iterdir())


def claim_trace_dir(folder: Path) -> None:
    """Create the trace folder (if missing) and mark it as this project's (`check_outputs` allowed it)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / TRACE_MARKER).is_file():
        write_atomic(folder / TRACE_MARKER, json.dumps({"written_by": "bert_ipu", "kind": "profile traces"}) + "\n")


def write_config(cfg, path: Path) -> None:
    """The effective config as YAML: `load_config(path)` runs the same profile again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, to_yaml(cfg))


def format_scaling(study) -> str:
    """The rows of `scaling_study` as a fixed-width text table."""
    lines = [f"{'devices':>8} {'un-padded seq/s/device':>23} {'packed seq/s/device':>20} {'speed-up':>9}"]
    for r in study:
        lines.append(f"{r['devices']:>8} {r['unpadded_sequences_per_second_per_device']:>23.1f} "
                     f"{r['packed_sequences_per_second_per_device']:>20.1f} {r['speedup']:>8.3f}x")
    return "\n".join(lines)


def plot(path, histogram, rows) -> None:
    """The histogram, and the theoretical and realized speed-ups of every row, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 3]})
    a.bar(np.arange(1, len(histogram) + 1), histogram, width=1.0)
    a.set(title=f"{int(histogram.sum()):,} sequences", xlabel="sequence length", ylabel="sequences")
    x = np.arange(len(rows))
    b.bar(x - 0.2, [r["theoretical_speedup"] for r in rows], 0.4, label="theoretical (tokens)")
    b.bar(x + 0.2, [r["realized_speedup"] for r in rows], 0.4, label="realized (sequences/s)")
    several = len({r.get("backend") for r in rows}) > 1   # (one label an algorithm read "none, cghp, none, cghp")
    b.set_xticks(x, [f"{r['algorithm']}\n{r['backend']}" if several else r["algorithm"] for r in rows],
                 fontsize=8 if several else None)
    b.set(title="speed-up over NONE", ylabel="x")
    b.legend()
    fig.tight_layout()
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)


def plot_scaling(path, study) -> None:
    """The Section E speed-up of packing over un-padded batches against the data-parallel devices, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["devices"] for r in study], [r["speedup"] for r in study], marker="o")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="data-parallel devices", ylabel="speed-up of packing over un-padding",
           title="every step waits for the slowest device")
    fig.tight_layout()
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)
