"""Data-pipeline benchmark: the figures behind the data goals, printed.

    .venv/bin/python benchmarks/data_benchmark.py [--copies 8] [--instances 1000000] [--skip-large]

1. Text -> unpacked instances, end to end (reading, WordPiece, NSP pairs, masking, writing shards), in MB of
   raw text per second, on the built-in corpus (exported once to BERT's text format) and on a concatenation
   of --copies copies of it, with 1 and 2 workers.
2. Packing and writing --instances 512-token instances whose lengths follow Wikipedia-512: the unpacked
   input is synthesised directly in the shard format (random tokens; the packer never looks at them), then
   data/pack_pretraining_data.py's function runs in a child process whose peak memory (max RSS) is read.
3. Packing efficiency and factor of the built-in corpus at 128 and 512 with each algorithm.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bert_ipu.arguments import Parser, at_least
from bert_ipu import packing
from bert_ipu.data.instances import InstanceConfig, default_vocab
from bert_ipu.data.layout import IGNORE_INDEX, PackLayout
from bert_ipu.data.pipeline import create_pretraining_data
from bert_ipu.data.shards import DatasetWriter
from bert_ipu.data.text import builtin_documents

HERE = Path(__file__).resolve().parent


def export_builtin(path: Path, copies: int) -> int:
    text = "\n\n".join("\n".join(doc) for doc in builtin_documents() if doc) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            f.write(text + "\n")
    return path.stat().st_size


def text_throughput(work: Path, copies: int) -> None:
    print("\n1. text -> unpacked instances (max_seq_length 128, end to end)")
    for n in (1, copies):
        src = work / f"builtin_x{n}.txt"
        size = export_builtin(src, n)
        for workers in (1, 2):
            out = work / f"inst_{n}_{workers}"
            start = time.perf_counter()
            create_pretraining_data([str(src)], out, InstanceConfig(max_seq_length=128), workers=workers,
                                    overwrite=True, progress=False)
            seconds = time.perf_counter() - start
            rate = size / 1e6 / seconds
            print(f"  {size / 1e6:6.1f} MB, {workers} worker(s): {seconds:6.1f} s, {rate:5.2f} MB/s, "
                  f"{rate / workers:5.2f} MB/s per core")
            shutil.rmtree(out)


def synthesise_instances(out: Path, n: int, seed: int = 0) -> None:
    """n unpacked 512-token-max instances in the shard format, lengths drawn from Wikipedia-512."""
    hist = np.array(json.loads((HERE / "histograms" / "wikipedia_512.json").read_text()))
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.arange(1, 513), size=n, p=hist / hist.sum())
    lengths = np.maximum(lengths, 5)
    S, M = 512, 76
    config = InstanceConfig(max_seq_length=512)
    with DatasetWriter(out, PackLayout(S, M, 1), overwrite=True) as writer:
        shutil.copyfile(default_vocab(), writer.partial / "vocab.txt")
        for lo in range(0, n, 65536):
            ln = lengths[lo:lo + 65536]
            rows = len(ln)
            t = np.arange(S)
            body = t[None, :] < (ln - 1)[:, None]
            ids = np.where(body, rng.integers(1000, 30000, size=(rows, S)), 0)
            ids[:, -1] = 101
            pos = np.where(body, t[None, :] + 1, 0)
            seq = body.astype(np.int64)
            seq[:, -1] = 1
            masked = np.minimum(M, np.round(0.15 * ln).astype(int))
            labels = np.where(t[None, :M] < masked[:, None], rng.integers(1000, 30000, size=(rows, M)), IGNORE_INDEX)
            writer.write_shard("train", {
                "input_ids": ids, "position_ids": pos, "token_type_ids": np.zeros((rows, S), dtype=np.int64),
                "sequence_ids": seq, "masked_lm_labels": labels,
                "next_sentence_labels": rng.integers(0, 2, size=(rows, 1)),
                "next_sentence_weights": np.ones((rows, 1))})
        from dataclasses import asdict
        writer.finish({"kind": "instances", "instance_config": asdict(config), "vocab": {"size": 30522}})


CHILD = """
import resource, sys, time
from bert_ipu.data.pipeline import pack_pretraining_data
start = time.perf_counter()
m = pack_pretraining_data(sys.argv[1], sys.argv[2], "cghp", 3, overwrite=True, progress=False)
seconds = time.perf_counter() - start
info = m["packing"]["train"]
print(f"{seconds:.1f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} "
      f"{info['packs']} {info['efficiency']:.5f} {info['packing_factor']:.4f}")
"""


def large_packing(work: Path, n: int) -> None:
    print(f"\n2. packing and writing {n:,} instances of up to 512 tokens (CGHP, depth 3)")
    src, dst = work / "synthetic_instances", work / "synthetic_packed"
    start = time.perf_counter()
    synthesise_instances(src, n)
    print(f"  (synthesised the unpacked input in {time.perf_counter() - start:.1f} s)")
    out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dst)], capture_output=True, text=True,
                         check=True).stdout.split()
    seconds, peak_gb, packs, eff, p = float(out[0]), float(out[1]), int(out[2]), float(out[3]), float(out[4])
    print(f"  {seconds:.1f} s end to end, peak memory {peak_gb:.2f} GB (max RSS), {packs:,} packs, "
          f"efficiency {eff:.3%}, packing factor {p:.3f}")
    shutil.rmtree(src)
    shutil.rmtree(dst)


def builtin_packing(work: Path) -> None:
    print("\n3. built-in corpus: packing per algorithm (train split)")
    for S in (128, 512):
        out = work / f"builtin_{S}"
        create_pretraining_data(["builtin"], out, InstanceConfig(max_seq_length=S), overwrite=True, progress=False)
        from bert_ipu.data.shards import PackedDataset
        from bert_ipu.data.layout import lengths_of

        data = PackedDataset(out)
        lengths = np.concatenate([lengths_of(s["sequence_ids"]) for s in data.shards("train")])
        hist = packing.histogram_of(lengths, S)
        print(f"  max_seq_length {S}: {len(lengths):,} instances, mean length {lengths.mean():.1f}")
        for algorithm, depth in (("none", 1), ("greedy", 3), ("spfhp", 3), ("lpfhp", 3), ("nnlshp", 3),
                                 ("cghp", 3), ("cghp", None)):
            r = packing.pack(hist, algorithm, depth)
            print(f"    {algorithm:>7} depth {'max' if depth is None else depth:>3}: {r.packs:>6,} packs, "
                  f"efficiency {r.efficiency:7.3%}, packing factor {r.packing_factor:.3f}")
        shutil.rmtree(out)


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=at_least(1), default=8)
    parser.add_argument("--instances", type=at_least(1), default=1_000_000)
    parser.add_argument("--skip-large", action="store_true", help="skip part 2 (needs ~5 GB of disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text_throughput(work, args.copies)
        if not args.skip_large:
            large_packing(work, args.instances)
        builtin_packing(work)


if __name__ == "__main__":
    main()
