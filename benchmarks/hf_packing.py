"""bert_ipu.hf against what Hugging Face users pack with: packing time, peak memory, packs and efficiency, and the
realized training speed-up of `transformers.Trainer` with PackedDataCollator, in one run (ratios, because the
machine is shared).

    python benchmarks/hf_packing.py                        # 1M SFT-like sequences at 2048, then the training part
    python benchmarks/hf_packing.py --sequences 100000 --train-sequences 600  # quicker

Packing (each variant in a forked process of its own, so that its peak RSS is its own): `pack_dataset` (CGHP,
depth auto, num_proc 1 and 2) and TRL's `pack_dataset(strategy="bfd")` (if trl is installed) on the same
`datasets.Dataset` on disk; `DataCollatorWithFlattening`'s implicit packing (one row per mini-batch of B
sequences) is counted from the lengths: it has no packing step, its rows vary in length, and a fixed-shape
(compiled, CUDA graph) step pads each row to the longest.

Training: a tiny Llama (sdpa, float32, CPU) through `Trainer` for one epoch over the same sequences: padded
mini-batches of B sequences, packs (PackedDataCollator, the packs of about B sequences per step), and
DataCollatorWithFlattening (B sequences a row; Llama's sdpa isolates them from position_ids). Sequences per second
and the ratios to padded.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bert_ipu.arguments import Parser, at_least, positive
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def sft_lengths(n: int, seed: int, median: float, sigma: float, longest: int) -> np.ndarray:
    """Log-normal sequence lengths (SFT-like: a long right tail), clipped to [8, longest]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(math.log(median), sigma, size=n)), 8, longest).astype(np.int64)


def write_source(path: Path, lengths: np.ndarray, vocab: int, seed: int) -> None:
    """A datasets Arrow file of random token ids with these lengths, written a slice at a time."""
    import datasets
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    rng = np.random.default_rng(seed)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    with ArrowWriter(path=str(path), features=features) as writer:
        for a in range(0, len(lengths), 100_000):
            part = lengths[a:a + 100_000]
            flat = rng.integers(3, vocab, size=int(part.sum()), dtype=np.int32)
            offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int32)
            writer.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, flat)}))
        writer.finalize()


def _measured(queue, fn, args):
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        result = fn(*args)
    except BaseException as error:  # the parent waits on the queue: it must hear of a failure too
        queue.put(error)
        raise
    queue.put((time.perf_counter() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss) / 1024,
               result))


def measure(fn, *args):
    """(seconds, peak RSS growth in MiB, fn's result) of fn run in a forked process."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=_measured, args=(queue, fn, args))
    process.start()
    out = queue.get()
    process.join()
    if isinstance(out, BaseException):
        raise RuntimeError(f"{fn.__name__} failed in its process: {out!r}")
    return out


def ours(path, pack_length, num_proc, cache):
    import datasets

    from bert_ipu import hf

    packed = hf.pack_dataset(datasets.Dataset.from_file(path), pack_length, too_long="truncate", num_proc=num_proc,
                             cache_dir=cache, verbose=False)
    report = hf.packing_report(packed)
    return {"packs": len(packed), "efficiency": report["efficiency"], "bound": report["lower_bound_packs"],
            "depth": report["max_sequences_per_pack"]}


def trl_bfd(path, pack_length, cache):
    import datasets
    from trl.data_utils import pack_dataset

    os.environ["HF_DATASETS_CACHE"] = cache
    datasets.disable_progress_bars()   # a bar per map call, on every line of the table
    packed = pack_dataset(datasets.Dataset.from_file(path), pack_length, strategy="bfd")
    return {"packs": len(packed)}


def packing_part(args) -> None:
    lengths = sft_lengths(args.sequences, args.seed, args.median, args.sigma, 2 * args.pack_length)
    kept = np.minimum(lengths, args.pack_length)
    tokens = int(kept.sum())
    work = Path(tempfile.mkdtemp(prefix="packing_", dir=args.work_dir))
    path = str(work / "source.arrow")
    start = time.perf_counter()
    write_source(Path(path), lengths, 32000, args.seed)
    print(f"source: {len(lengths):,} sequences, {int(lengths.sum()):,} tokens (median {np.median(lengths):.0f}, "
          f"mean {lengths.mean():.0f}, {int((lengths > args.pack_length).sum()):,} longer than {args.pack_length}: "
          f"truncated), written in {time.perf_counter() - start:.1f} s to {path}")
    print(f"\n{'packer':<38} {'seconds':>8} {'peak MiB':>9} {'rows':>10} {'efficiency':>10}  note")
    rows = {}
    for num_proc in (1, 2):
        seconds, mib, r = measure(ours, path, args.pack_length, num_proc, str(work / f"ours{num_proc}"))
        rows[f"ours{num_proc}"] = (seconds, r["packs"])
        print(f"{f'bert_ipu.hf.pack_dataset cghp np={num_proc}':<38} {seconds:8.1f} {mib:9.0f} {r['packs']:10,} "
              f"{tokens / (r['packs'] * args.pack_length):10.3%}  depth {r['depth']}, "
              f"{r['packs'] / r['bound'] - 1:+.3%} over the proven bound {r['bound']:,}")
    try:
        import trl  # noqa: F401
    except ImportError:
        print(f"{'trl pack_dataset bfd':<38} not installed")
    else:
        seconds, mib, r = measure(trl_bfd, path, args.pack_length, str(work / "trl"))
        rows["trl"] = (seconds, r["packs"])
        print(f"{'trl pack_dataset bfd (1000-row map batches)':<38} {seconds:8.1f} {mib:9.0f} {r['packs']:10,} "
              f"{tokens / (r['packs'] * args.pack_length):10.3%}  rows of up to {args.pack_length}, no depth limit")
    for batch in args.flatten_batches:
        per_row = np.add.reduceat(kept, np.arange(0, len(kept), batch))
        print(f"{f'DataCollatorWithFlattening B={batch}':<38} {'-':>8} {'-':>9} {len(per_row):10,} "
              f"{tokens / (len(per_row) * per_row.max()):10.3%}  rows of {per_row.mean():.0f} tokens on average, "
              f"up to {per_row.max():,} (efficiency at a fixed shape of the longest row)")
    if "trl" in rows:
        print(f"\nours np=1 vs trl bfd: {rows['trl'][1] / rows['ours1'][1]:.3f}x fewer packs, "
              f"{rows['trl'][0] / rows['ours1'][0]:.2f}x the speed")


def training_part(args) -> None:
    import datasets
    import torch
    import transformers

    from bert_ipu import hf

    torch.set_num_threads(args.threads)
    length = args.train_pack_length
    lengths = sft_lengths(args.train_sequences, args.seed + 1, length / 5, args.sigma, length)
    rng = np.random.default_rng(args.seed)
    src = datasets.Dataset.from_dict({"input_ids": [rng.integers(3, 256, size=int(n)).tolist() for n in lengths]})
    packed = hf.pack_dataset(src, length, cache_dir=tempfile.mkdtemp(prefix="hf_train_", dir=args.work_dir))
    factor = len(src) / len(packed)
    per_step = args.train_batch
    packs_per_step = max(1, round(per_step / factor))
    print(f"\ntraining: tiny Llama (hidden 64, 2 layers, sdpa, float32), {len(src):,} sequences (median "
          f"{np.median(lengths):.0f}, longest {lengths.max()}), one epoch; padded and flattened: {per_step} sequences "
          f"a step; packed: {packs_per_step} packs of {length} a step ({packs_per_step * factor:.1f} sequences)")

    def model():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=length,
                                          attn_implementation="sdpa")
        return transformers.LlamaForCausalLM(config)

    def pad(features):
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, f in enumerate(features):
            ids[i, :len(f["input_ids"])], mask[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"]), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    def run(dataset, collator, batch):
        m = model()
        targs = transformers.TrainingArguments(
            output_dir=tempfile.mkdtemp(dir=args.work_dir), per_device_train_batch_size=batch, num_train_epochs=1,
            report_to=[], save_strategy="no", remove_unused_columns=False, use_cpu=True, disable_tqdm=True,
            logging_strategy="no", learning_rate=1e-3, seed=0, dataloader_drop_last=False)
        out = transformers.Trainer(model=m, args=targs, train_dataset=dataset, data_collator=collator(m)).train()
        return out.metrics["train_runtime"]

    flat = transformers.DataCollatorWithFlattening()
    variants = {"padded": (src, lambda m: pad, per_step),
                "packed (ours)": (packed, hf.PackedDataCollator, packs_per_step),
                "flattened": (src, lambda m: flat, per_step)}
    speeds = {name: [] for name in variants}
    for name, (dataset, collator, batch) in variants.items():  # warm-up (first calls of kernels), not counted
        run(dataset.select(range(min(len(dataset), 8 * batch))), collator, batch)
    for _ in range(args.rounds):  # interleaved: a load change on the shared machine hits every variant
        for name, (dataset, collator, batch) in variants.items():
            speeds[name].append(len(src) / run(dataset, collator, batch))
    base = np.median(speeds["padded"])
    for name, values in speeds.items():
        print(f"{name:<16} {np.median(values):8.1f} sequences/s (runs: {', '.join(f'{v:.1f}' for v in values)})  "
              f"{np.median(values) / base:.3f}x padded")
    bound = padded_tokens(lengths, per_step) / (len(packed) * length)
    print(f"bound from computed tokens, packed vs padded: {bound:.3f}x (padding to each batch's longest, source order)")


def padded_tokens(lengths: np.ndarray, batch: int) -> int:
    starts = np.arange(0, len(lengths), batch)
    return int(sum(lengths[a:a + batch].max() * len(lengths[a:a + batch]) for a in starts))


def _terminated(work: str, *_) -> None:
    """SIGTERM: the measuring processes killed, `work` removed, exit 143, here in the handler. (The handler used to
    raise SystemExit for the with-block to remove the folder; in one CI run under load the run went on and exited
    0 after a SIGTERM: an exception raised in a handler that runs during a finalizer is ignored, the likely way.)"""
    for child in multiprocessing.active_children():
        child.kill()
    shutil.rmtree(work, ignore_errors=True)
    os._exit(143)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=at_least(1), default=1_000_000)
    parser.add_argument("--pack-length", type=at_least(1), default=2048)
    parser.add_argument("--median", type=positive, default=300.0, help="median of the log-normal lengths")
    parser.add_argument("--sigma", type=float, default=0.9, help="sigma of the log-normal lengths")
    parser.add_argument("--flatten-batches", type=at_least(1), nargs="+", default=[8])
    parser.add_argument("--train-sequences", type=at_least(1), default=1000)
    parser.add_argument("--train-pack-length", type=at_least(1), default=256)
    parser.add_argument("--train-batch", type=at_least(1), default=16, help="sequences a step (padded, flattened)")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch threads in the training part")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--work-dir", default=None, help="where the Arrow files go, in a folder removed at the end (default: the temp dir)")
    parser.add_argument("--skip-packing", action="store_true")
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    # everything written (gigabytes at the default size) goes into one folder that is removed at the end, also
    # after an error, Ctrl-C or a SIGTERM
    with tempfile.TemporaryDirectory(prefix="hf_packing_", dir=args.work_dir) as work:
        signal.signal(signal.SIGTERM, functools.partial(_terminated, work))
        args.work_dir = work
        if not args.skip_packing:
            packing_part(args)
        if not args.skip_training:
            training_part(args)


if __name__ == "__main__":
    main()
