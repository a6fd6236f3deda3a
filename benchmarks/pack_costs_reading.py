"""Time reading every training pack's attention cost at start (`train.balance: attention`): from the shards'
stored `sequence_lengths` (K numbers a pack) against computing them from `sequence_ids` (S numbers a pack, what
datasets written before the stored field fall back to), on one synthetic packed dataset, in the same run.

    .venv/bin/python benchmarks/pack_costs_reading.py                      # 200,000 packs of 512 tokens, K = 3
    .venv/bin/python benchmarks/pack_costs_reading.py --packs 20000 --pack-len 128

The dataset is written through `DatasetWriter` (4,096 packs a shard, as `pack_pretraining_data` writes) into a
temporary folder that is removed afterwards (about 1 GB at the defaults). Both readings run on pages the
write left in the page cache; from a cold disk the stored field (12 bytes a pack) wins by more, since the
sequence ids are 1,024 bytes a pack. Prints the time per reading (best of --repeats, alternating) and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bert_ipu.arguments import Parser, at_least
from bert_ipu.data.layout import FIELDS, PackLayout
from bert_ipu.data.loader import ShardSource, source_pack_costs
from bert_ipu.data.shards import STORAGE, DatasetWriter, PackedDataset
from bert_ipu.packing import balance  # noqa: F401 - imported here, not inside the first timed reading


def synthesise(out: Path, packs: int, S: int, K: int, seed: int = 0, per_shard: int = 4096) -> None:
    """Packs of 1..K sequences filling 60-100% of S tokens; only sequence_ids matter here (the rest zeros)."""
    rng = np.random.default_rng(seed)
    layout = PackLayout(S, 20, K)
    with DatasetWriter(out, layout, overwrite=True) as writer:
        for lo in range(0, packs, per_shard):
            n = min(per_shard, packs - lo)
            k = rng.integers(1, K + 1, size=n)
            used = rng.integers(int(0.6 * S), S + 1, size=n)
            # cut points of each pack's used tokens into k sequences: sequence j covers [cut_{j-1}, cut_j)
            cuts = np.sort(rng.integers(1, used[:, None], size=(n, K - 1)), axis=1)
            cuts = np.where(np.arange(1, K)[None, :] < k[:, None], cuts, used[:, None])
            t = np.arange(S)[None, :]
            ids = 1 + (t[:, :, None] >= cuts[:, None, :]).sum(axis=2)
            ids = np.where(t < used[:, None], ids, 0)
            arrays = {f: np.zeros((n, {"masked_lm_labels": 20}.get(f, K if f.startswith("next") else S)),
                                  dtype=STORAGE[f]) for f in FIELDS}
            arrays["sequence_ids"] = ids.astype(np.int16)
            writer.write_shard("train", arrays)
        writer.finish({"kind": "synthetic"})


def main() -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--packs", type=at_least(1), default=200_000)
    p.add_argument("--pack-len", type=at_least(1), default=512)
    p.add_argument("--depth", type=at_least(1), default=3, help="sequences a pack at most (K)")
    p.add_argument("--repeats", type=at_least(1), default=3)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pack_costs_"))
    try:
        start = time.perf_counter()
        synthesise(folder / "ds", args.packs, args.pack_len, args.depth)
        print(f"wrote {args.packs:,} packs of {args.pack_len} tokens (K = {args.depth}) in "
              f"{time.perf_counter() - start:.1f} s")
        stored = PackedDataset(folder / "ds")
        computed = PackedDataset(folder / "ds")
        computed.manifest.pop("derived_fields")  # read as a dataset written before the stored field
        times: dict[str, list[float]] = {"stored sequence_lengths": [], "computed from sequence_ids": []}
        results = {}
        for _ in range(args.repeats):
            for name, data in zip(times, (stored, computed)):
                source = ShardSource(data, "train")  # the trainer opens it whatever train.balance says
                start = time.perf_counter()
                results[name] = source_pack_costs(source)
                times[name].append(time.perf_counter() - start)
        a, b = results.values()
        assert np.array_equal(a, b), "the stored and the computed costs differ"
        best = {name: min(t) for name, t in times.items()}
        for name, t in best.items():
            print(f"  {name:28s} {t * 1e3:8.1f} ms  ({t / args.packs * 1e6:.3f} us a pack; "
                  f"8.1M packs: {t / args.packs * 8.1e6:.1f} s)")
        ratio = best["computed from sequence_ids"] / best["stored sequence_lengths"]
        print(f"  the same costs for every pack; stored is {ratio:.0f}x faster")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
