"""The data steps on the local pool and on Dask: throughput at 1 and 2 workers, the engine's overheads, and a model
of all English Wikipedia on a cluster.

    .venv/bin/python benchmarks/distributed_data.py [--mb 8] [--seq 128 512] [--nodes 8 --cores 32 --dump-gb 22]

1. A synthetic MediaWiki dump of about --mb MB of XML (benchmarks/wikipedia_benchmark.py's generator), bz2.
2. The engines alone: a Dask local cluster's start and stop; the cost of one task (a no-op mapped 2,000 times,
   bounded read-ahead as the steps map) on the local pool and on Dask; MB/s of data through each (4 MB pieces
   sent to a worker and back); and how fast the main process reads the dump (bz2, XML, page kinds), the part of
   dump -> text that does not spread.
3. Each step (dump -> text, text -> instances at the first --seq, packing with CGHP) with --engine local and
   --engine dask (a cluster the command starts and stops: its start is in the time), 1 and 2 workers: MB/s and
   whether the output is the same bytes as the local pool's with 1 worker (shards and manifests less timings).
4. The model: each step's wall time for --dump-gb GB of bz2 on --nodes x --cores worker processes, as the
   largest of (work / cores, what goes through the main process, the scheduler's task rate), from the figures
   measured here, and the piece size that keeps the scheduler under 10% busy.

This machine has 2 cores, shared: 2 workers beside a main process that reads and writes gain little or nothing
over 1 (the figures say how much); ratios are taken in one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from wikipedia_benchmark import synthetic_dump  # noqa: E402

from bert_ipu.arguments import Parser, at_least, positive
from bert_ipu.data.instances import InstanceConfig  # noqa: E402
from bert_ipu.data.jobs import open_engine  # noqa: E402
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data  # noqa: E402
from bert_ipu.data.shards import PackedDataset  # noqa: E402
from bert_ipu.data.wikipedia import iter_pages, page_kind, prepare  # noqa: E402

ENGINES = [("local", 1), ("local", 2), ("dask", 1), ("dask", 2)]
TIMINGS = {"seconds", "solver_seconds"}


def _noop(x):
    return x


def _without(value):
    if isinstance(value, dict):
        return {k: _without(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_without(v) for v in value]
    return value


def digest(folder: Path) -> str:
    """One sha256 over every file of a step's output (a manifest less its timings)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name in ("manifest.json", "wikipedia.json"):
            data = json.dumps(_without(json.loads(data)), sort_keys=True).encode()
        h.update(str(path.relative_to(folder)).encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def engine_overheads(n_tasks: int = 2000) -> dict:
    """Seconds a task costs the engine (no-op, in input order, read-ahead 2 x workers) and MB/s through it."""
    from distributed import LocalCluster

    out = {}
    start = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    out["cluster_start"] = time.perf_counter() - start
    payload = b"x" * (4 << 20)
    try:
        for name, kw in (("local", {}), ("dask", {"address": cluster.scheduler_address})):
            with open_engine(name, 2, **kw) as runner:
                list(runner.map(_noop, range(20)))  # warm: workers started, functions imported
                start = time.perf_counter()
                list(runner.map(_noop, range(n_tasks)))
                out[f"{name}_task"] = (time.perf_counter() - start) / n_tasks
                start = time.perf_counter()
                n = sum(len(x) for x in runner.map(_noop, (payload for _ in range(50))))
                out[f"{name}_mb_s"] = 2 * n / 1e6 / (time.perf_counter() - start)  # there and back
    finally:
        start = time.perf_counter()
        cluster.close()
        out["cluster_stop"] = time.perf_counter() - start
    return out


def driver_read(dump: Path) -> float:
    """Seconds for the main process's share of dump -> text: decompress, parse, classify every page."""
    start = time.perf_counter()
    for page in iter_pages(dump):
        page_kind(page)
    return time.perf_counter() - start


def main() -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=positive, default=8.0, help="MB of XML in the synthetic dump")
    p.add_argument("--seq", type=at_least(1), nargs="+", default=[128, 512],
                   help="sequence lengths: the steps run at the "
                   "first; text -> instances is also timed on 1 process at the others, for the model")
    p.add_argument("--repeat", type=at_least(1), default=2,
                   help="runs of each measurement: the fastest counts (a shared "
                   "machine's load comes and goes)")
    p.add_argument("--nodes", type=at_least(1), default=8)
    p.add_argument("--cores", type=at_least(1), default=32, help="worker processes a node")
    p.add_argument("--dump-gb", type=positive, default=22.0, help="GB of bz2 (all English Wikipedia: about 22)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="distributed_data_"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> None:
    dump = work / "dump.xml.bz2"
    xml_bytes, _ = synthetic_dump(dump, args.mb)
    bz2_mb = dump.stat().st_size / 1e6
    print(f"1. synthetic dump: {xml_bytes / 1e6:.1f} MB of XML, {bz2_mb:.2f} MB as bz2 "
          f"({xml_bytes / 1e6 / bz2_mb:.1f}x); {os.cpu_count()} cores listed, load {os.getloadavg()[0]:.1f}")

    o = min((engine_overheads() for _ in range(args.repeat)), key=lambda x: x["dask_task"])
    read_s = min(driver_read(dump) for _ in range(args.repeat))
    print("\n2. the engines alone")
    print(f"  (the fastest of {args.repeat}) Dask local cluster of 2: start {o['cluster_start']:.2f} s, "
          f"stop {o['cluster_stop']:.2f} s")
    print(f"  a task (no-op, 2 workers, in order, read-ahead 4): local pool {o['local_task'] * 1e3:.2f} ms, "
          f"Dask {o['dask_task'] * 1e3:.2f} ms ({o['dask_task'] / o['local_task']:.1f}x)")
    print(f"  data through the engine (4 MB pieces there and back): local pool {o['local_mb_s']:.0f} MB/s, "
          f"Dask {o['dask_mb_s']:.0f} MB/s")
    print(f"  the main process reading the dump (bz2 + XML + page kinds): {bz2_mb / read_s:.2f} MB/s of bz2 "
          f"({xml_bytes / 1e6 / read_s:.1f} MB/s of XML)")

    seq = args.seq[0]
    print(f"\n3. the steps (at {seq}), the command's own cluster's start and stop included for Dask; the fastest of "
          f"{args.repeat} rounds")
    times: dict = {}
    reference: dict = {}
    same: dict = {}
    text_dir = inst_dir = None
    for i, (engine, workers) in enumerate(ENGINES * args.repeat):  # in turn, --repeat rounds; the fastest counts
        kw = {"engine": engine, "workers": workers, "overwrite": True}
        tag = f"{engine}_{workers}"
        row = {}
        start = time.perf_counter()
        m = prepare(dump, work / f"text_{tag}", docs_per_shard=500, progress=False, **kw)
        row["text"] = time.perf_counter() - start
        text_dir = text_dir or work / f"text_{tag}"
        text_bytes = m["counts"]["bytes"]
        start = time.perf_counter()
        mi = create_pretraining_data([str(text_dir)], work / f"inst_{tag}", InstanceConfig(max_seq_length=seq),
                                     docs_per_shard=200, validation_fraction=0.0, progress=False, **kw)
        row["instances"] = time.perf_counter() - start
        inst_dir = inst_dir or work / f"inst_{tag}"
        start = time.perf_counter()
        mp = pack_pretraining_data(inst_dir, work / f"packed_{tag}", packs_per_shard=1000, progress=False, **kw)
        row["packed"] = time.perf_counter() - start
        if tag in times:
            row = {k: min(v, times[tag][k]) for k, v in row.items()}
        for step in ("text", "inst", "packed"):
            d = digest(work / f"{step}_{tag}")
            reference.setdefault(step, d)
            same[tag] = same.get(tag, True) and d == reference[step]
        n_inst = mi["counts"]["instances"]["train"]
        packs = mp["splits"]["train"]["packs"]
        packed_mb = size_of(work / f"packed_{tag}") / 1e6
        inst_mb = size_of(work / f"inst_{tag}") / 1e6
        times[tag] = row
        if i < len(ENGINES) * (args.repeat - 1):
            continue
        print(f"  {engine:5} {workers} worker(s): dump -> text {row['text']:5.1f} s ({bz2_mb / row['text']:.3f} MB/s "
              f"of bz2, {len(m['shards'])} shards); text -> instances {row['instances']:5.1f} s "
              f"({text_bytes / 1e6 / row['instances']:.2f} MB/s of text, {n_inst:,} instances in "
              f"{len(mi['splits']['train']['shards'])} pieces); packing {row['packed']:5.2f} s ({packs:,} packs, "
              f"{packed_mb / row['packed']:.1f} MB/s written); same bytes as local 1: {same[tag]}")
    base = times["local_1"]
    for tag, row in times.items():
        if tag != "local_1":
            print(f"  speed over local 1, {tag}: " + ", ".join(f"{k} {base[k] / v:.2f}x" for k, v in row.items()))

    # text -> instances at the other lengths, 1 process, for the model
    c2 = {seq: base["instances"] / (text_bytes / 1e6)}
    inst_ratio = {seq: inst_mb / (text_bytes / 1e6)}
    n_per_text_mb = {seq: n_inst / (text_bytes / 1e6)}
    for other in args.seq[1:]:
        start = time.perf_counter()
        mo = create_pretraining_data([str(text_dir)], work / f"inst_{other}", InstanceConfig(max_seq_length=other),
                                     docs_per_shard=200, validation_fraction=0.0, progress=False)
        c2[other] = (time.perf_counter() - start) / (text_bytes / 1e6)
        inst_ratio[other] = size_of(work / f"inst_{other}") / text_bytes
        n_per_text_mb[other] = mo["counts"]["instances"]["train"] / (text_bytes / 1e6)
        print(f"  text -> instances at {other}, local 1: {1 / c2[other]:.2f} MB/s of text")

    # the packing step's serial share: the histogram's packing and every instance's assignment, on the main process
    from bert_ipu import packing
    from bert_ipu.data.layout import lengths_of

    import numpy as np

    src = PackedDataset(inst_dir)
    lengths = lengths_of(src.read("train")["sequence_ids"])
    start = time.perf_counter()
    result = packing.pack(packing.histogram_of(lengths, seq), "cghp", 3)
    solve_s = time.perf_counter() - start
    many = np.tile(lengths, -(-2_000_000 // len(lengths)))  # the assignment's cost per instance, at 2 M
    result = packing.pack(packing.histogram_of(many, seq), "cghp", 3)
    start = time.perf_counter()
    packing.assign(many, result.mixture, seq, seed=0)
    assign_s = (time.perf_counter() - start) / len(many)
    print(f"  packing's main-process share: CGHP on the histogram {solve_s:.2f} s, then assigning "
          f"{assign_s * 1e6:.2f} us an instance (timed on {len(many):,})")

    # peak memory of a worker process: the three steps on a cluster of 2 that outlives them
    import resource

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster, set_as_default=False) as client:
        kw = {"engine": "dask", "address": cluster.scheduler_address}
        prepare(dump, work / "rss_text", docs_per_shard=500, progress=False, **kw)
        create_pretraining_data([str(text_dir)], work / "rss_inst", InstanceConfig(max_seq_length=args.seq[-1]),
                                docs_per_shard=200, validation_fraction=0.0, progress=False, **kw)
        pack_pretraining_data(work / "rss_inst", work / "rss_packed", packs_per_shard=1000, progress=False, **kw)
        rss = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(f"  peak RSS of a Dask worker after the three steps (at {args.seq[-1]}; batches of at most 512 articles or "
          f"0.5 MB of wikitext, 200-document chunks, 1,000-pack shards): {max(rss.values()) / 1024:.0f} MB")

    docs_per_text_mb = m["counts"]["articles_kept"] / (text_bytes / 1e6)
    model(args, o, read_s, bz2_mb, xml_bytes, text_bytes, base, c2, inst_ratio, n_per_text_mb, n_inst, assign_s,
          solve_s, docs_per_text_mb)


def model(args, o, read_s, bz2_mb, xml_bytes, text_bytes, base, c2, inst_ratio, n_per_text_mb, n_inst,
          assign_s, solve_s, docs_per_text_mb) -> None:
    """Each step's wall time: the largest of its terms (work spread over the cores; what passes through the main
    process, which is serial; the scheduler's cost per task times the tasks, at the default piece sizes). The
    chain: the sum of its steps (each starts when the previous one has finished)."""
    P = args.nodes * args.cores
    N = args.dump_gb * 1000  # MB of bz2
    text_mb = N * text_bytes / 1e6 / bz2_mb
    xml_mb = N * xml_bytes / 1e6 / bz2_mb
    c1 = base["text"] / bz2_mb  # core-s per MB of bz2, one process doing everything (reading included)
    read = N * read_s / bz2_mb  # the main process's serial share of dump -> text
    xfer = o["dask_mb_s"] / 2  # MB/s one way through the engine (measured there and back on this machine)
    task = o["dask_task"]  # s a task costs, measured with 2 workers: taken as the scheduler's cost per task
    print(f"\n4. model: {args.dump_gb:g} GB of bz2 on {args.nodes} x {args.cores} = {P} worker processes "
          f"(this run's per-MB costs; the engine's costs as measured on this 2-core machine)")
    print(f"  dump -> text: {c1:.2f} core-s per MB of bz2; {text_mb / 1e3:.1f} GB of text, {xml_mb / 1e3:.0f} GB of "
          f"XML; the scheduler at {task * 1e3:.2f} ms a task; {xfer:.0f} MB/s one way through the engine")
    # piece size: P workers finishing a piece every t seconds ask P / t tasks a second of the scheduler; keep that
    # under 10% of 1 / task
    t_piece = 10 * P * task
    pack_core = base["packed"] / n_inst  # s per instance of the packing step, 1 process (about 1 pack)
    biggest = {seq: int(1e9 / (seq * 16)) for seq in c2}  # packs of a 1 GB shard (16 bytes a token, derived included)
    print(f"  pieces of at least {t_piece:.1f} s keep the scheduler under 10% busy: dump -> text batches of "
          f"{t_piece / c1 * xml_mb / N:.1f} MB of wikitext (batch_bytes; default 0.5 MB), text -> instances "
          f"chunks of {t_piece / c2[args.seq[0]]:.1f} MB of text (--docs-per-shard), packing shards of "
          f"{t_piece / pack_core:,.0f} packs (--packs-per-shard; at most "
          + ", ".join(f"{n:,} at {seq}" for seq, n in biggest.items()) + " for 1 GB a worker)")
    t1 = {"work / cores": c1 * N / P, "main process reads the dump": read, "wikitext through the engine": xml_mb / xfer,
          "scheduler (0.5 MB batches)": xml_mb / 0.5 * task}
    print(f"  dump -> text: {_terms(t1)}")
    total = {seq: max(t1.values()) for seq in c2}
    for seq in c2:
        n = n_per_text_mb[seq] * text_mb
        t2 = {"work / cores": c2[seq] * text_mb / P,
              "instances back through the engine": text_mb * inst_ratio[seq] / xfer,
              "scheduler (2,000-document chunks)": text_mb * docs_per_text_mb / 2000 * task}
        t3 = {"work / cores": pack_core * n / P, "scheduler (4,096-pack shards)": n / 4096 * task}
        serial = solve_s + assign_s * n  # before the parallel writes
        print(f"  at {seq}: {n / 1e6:.0f} M instances; text -> instances: {_terms(t2)}; packing: main process solves "
              f"and assigns {serial / 60:.1f} min, then {_terms(t3)}")
        total[seq] += max(t2.values()) + serial + max(t3.values())
    for seq, seconds in total.items():
        print(f"  chain at {seq}: {seconds / 60:.0f} min on {P} workers (the work alone, spread: "
              f"{(c1 * N + c2[seq] * text_mb) / P / 60:.0f} min; at 1.25 core-hours per GB of bz2, the chain's "
              f"cost measured on 2026-11-21: {1.25 * 3600 * N / 1000 / P / 60:.0f} min)")


def _terms(terms: dict) -> str:
    worst = max(terms, key=terms.get)
    return ", ".join(f"{k} {v / 60:.1f} min" for k, v in terms.items()) + f" -> {terms[worst] / 60:.1f} min ({worst})"


if __name__ == "__main__":
    main()
