"""Packing at long context and against peers: one table of packs, efficiency, gap to the bound and time.

    .venv/bin/python benchmarks/packing_scale.py [--time-limit 60] [--sequences 1000000] [--only long]
    .venv/bin/pip install -r requirements-benchmarks.txt    # TRL and binpacking, for their rows

Cases (all seeded, so every run packs the same lengths):
- Wikipedia-style at 1024 and 2048 tokens, depth 3 and unlimited: the Wikipedia-512 histogram stretched
  (`bert_ipu.packing.synthetic.stretch_histogram`: every length l becomes one of (f(l-1), fl], 16.3M
  sequences). The issue's goals are checked on held-out real histograms; these stand in for them.
- Long context: 1M log-normal lengths (median 600, 1% above 16K, truncated to the pack length;
  `long_context_lengths`) at 8,192, 32,768 and 131,072 tokens, depth 8 and unlimited.

Algorithms: this library's LPFHP, SPFHP and CGHP (CGHP under --time-limit); on the long-context cases (the
peers are pure Python, one step per sequence: minutes on 16M Wikipedia sequences) a first-fit-decreasing (FFD,
below: a segment tree over packs, copies of a length placed together); TRL's best-fit-decreasing: the loop
of `trl.data_utils._pack_bfd` with TRL's own `_SegmentTree`, run on the lengths (TRL packs an Arrow table;
its table handling is left out, and TRL has no depth limit, so it runs at unlimited depth only). A check at
the end runs TRL's real `pack_dataset` on 20,000 sequences against the loop, and the PyPI `binpacking`
package (Python, O(sequences x packs)) on those 20,000 only.

"gap" is packs over the best lower bound proven for that case (CGHP's, or the cheap bound: tokens, long
sequences, depth), so a positive gap may be the bound's weakness as much as the packer's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bert_ipu.arguments import Parser, at_least, positive
from bert_ipu.packing import histogram_of, lower_bound, pack
from bert_ipu.packing.synthetic import long_context_lengths, stretch_histogram

HERE = Path(__file__).resolve().parent


def ffd(histogram: np.ndarray, depth: int | None) -> int:
    """First-fit decreasing on a histogram: every sequence, longest first, into the first pack (in opening
    order) with room and fewer than `depth` sequences. Returns the number of packs. A max segment tree over
    the packs' usable space finds the first fit in O(log n); copies of one length go into the first fitting
    pack together, which is what first fit does one at a time (packs before it are unchanged)."""
    max_len = len(histogram)
    depth = depth or max_len
    size = 1
    bound = int(histogram.sum())
    while size < bound:
        size *= 2
    tree = [-1] * (2 * size)   # usable space of each pack (-1: not open or full by depth)
    space, count = [0] * size, [0] * size
    opened = 0

    def update(i, value):
        i += size
        tree[i] = value
        i //= 2
        while i:
            a, b = tree[2 * i], tree[2 * i + 1]
            tree[i] = a if a >= b else b
            i //= 2

    for length in range(max_len, 0, -1):
        todo = int(histogram[length - 1])
        while todo:
            if tree[1] >= length:      # leftmost pack whose usable space fits
                i = 1
                while i < size:
                    i = 2 * i if tree[2 * i] >= length else 2 * i + 1
                b = i - size
            else:
                b = opened
                opened += 1
                space[b], count[b] = max_len, 0
            k = min(todo, space[b] // length, depth - count[b])
            space[b] -= k * length
            count[b] += k
            todo -= k
            update(b, space[b] if count[b] < depth and space[b] > 0 else -1)
    return opened


def trl_bfd(lengths: np.ndarray, seq_length: int) -> int:
    """TRL's best-fit-decreasing loop (`trl.data_utils._pack_bfd`, TRL 1.16) on lengths; returns packs."""
    from collections import defaultdict, deque

    from trl.data_utils import _SegmentTree

    segment_tree = _SegmentTree(seq_length)
    segment_tree.add(seq_length)
    space_to_bin = defaultdict(deque)
    bins = 0
    for length in np.sort(lengths)[::-1].tolist():
        space = segment_tree.search(length)
        if space < seq_length:
            bin_ = space_to_bin[space].popleft()
        else:
            bins += 1
            bin_ = bins
        if space < seq_length and not space_to_bin[space]:
            segment_tree.remove(space)
        space = space - length
        space_to_bin[space].append(bin_)
        if space > 0:
            segment_tree.add(space)
    return bins


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def cases(args):
    if args.only in (None, "wikipedia"):
        wiki = np.array(json.loads((HERE / "histograms" / "wikipedia_512.json").read_text()))
        for factor in (2, 4):
            hist = stretch_histogram(wiki, factor, seed=0)
            yield f"Wikipedia-style {512 * factor}", hist, None, (3, None)
    if args.only in (None, "long"):
        for max_len in (8192, 32768, 131072):
            lengths = long_context_lengths(args.sequences, max_len, seed=0)
            yield f"long-context {max_len}", histogram_of(lengths, max_len), lengths, (8, None)


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=positive, default=60.0, help="CGHP's time limit per case (seconds)")
    parser.add_argument("--sequences", type=at_least(1), default=1_000_000, help="long-context sequences per case")
    parser.add_argument("--only", choices=["wikipedia", "long"], help="run one family of cases")
    args = parser.parse_args()
    try:
        import trl  # noqa: F401
        have_trl = True
    except ImportError:
        have_trl = False
    header = (f"{'case':>22} {'depth':>5} {'algorithm':>9} {'packs':>11} {'efficiency':>10} {'gap to bound':>18} "
              f"{'time':>8}")
    print(header)
    goals = []
    for name, hist, lengths, depths in cases(args):
        max_len = len(hist)
        tokens = int((np.arange(1, max_len + 1) * hist).sum())
        for depth in depths:
            rows = []
            for algorithm in ("lpfhp", "spfhp", "cghp"):
                limit = args.time_limit if algorithm == "cghp" else None
                r = pack(hist, algorithm, depth, time_limit=limit)
                label = algorithm + ("*" if r.time_limit_reached else "")
                rows.append((label, r.packs, r.seconds, r.lower_bound_packs))
            if lengths is not None:  # peers on the long-context cases (16M Wikipedia sequences take minutes)
                packs, seconds = timed(lambda: ffd(hist, depth))
                rows.append(("ffd", packs, seconds, 0))
                if depth is None and have_trl:
                    packs, seconds = timed(lambda: trl_bfd(lengths, max_len))
                    rows.append(("trl-bfd", packs, seconds, 0))
            bound = max([lower_bound(hist, depth)] + [b for *_, b in rows])
            d = "max" if depth is None else depth
            for label, packs, seconds, _ in rows:
                gap = (packs - bound) / bound
                print(f"{name:>22} {d:>5} {label:>9} {packs:>11,} {tokens / (packs * max_len):>10.4%} "
                      f"{packs - bound:>7,} ({gap:>8.5%}) {seconds:>7.2f}s", flush=True)
            cghp_row = next(r for r in rows if r[0].startswith("cghp"))
            peers = [p for label, p, _, _ in rows if label in ("ffd", "trl-bfd")]
            gap = (cghp_row[1] - bound) / bound
            if name.startswith("Wikipedia"):
                limit = 2 if max_len == 1024 else 5
                goals.append((f"{name} depth {d}: CGHP within 0.001% of the bound in < {limit} s",
                              gap <= 1e-5 and cghp_row[2] < limit, f"{gap:.5%} in {cghp_row[2]:.2f} s"))
            else:
                goals.append((f"{name} depth {d}: CGHP no more packs than FFD/BFD, within 0.1%, < 10 s",
                              cghp_row[1] <= min(peers) and gap <= 1e-3 and cghp_row[2] < 10,
                              f"{cghp_row[1]:,} vs {min(peers):,}, {gap:.4%}, {cghp_row[2]:.2f} s"))
    print("* = stopped at the time limit; best packing and bound so far")
    if have_trl:
        peers_check()
    print("\ngoals:")
    for text, ok, value in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {text}: {value}")


def peers_check(n: int = 20_000, max_len: int = 8192) -> None:
    """TRL's real pack_dataset and the binpacking package on n long-context sequences."""
    import binpacking
    import datasets
    from trl import pack_dataset

    lengths = long_context_lengths(n, max_len, seed=1)
    hist = histogram_of(lengths, max_len)
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * int(l) for l in lengths]})
    packed, t_trl = timed(lambda: pack_dataset(ds, max_len, strategy="bfd", map_kwargs={"batch_size": len(ds)}))
    loop, t_loop = timed(lambda: trl_bfd(lengths, max_len))
    bp, t_bp = timed(lambda: binpacking.to_constant_volume(lengths.tolist(), max_len))
    ours = pack(hist, "cghp", None)
    print(f"\npeers on {n:,} long-context sequences at {max_len} (bound {ours.lower_bound_packs:,}): "
          f"TRL pack_dataset bfd {len(packed):,} packs ({t_trl:.2f} s, Arrow included), its loop on lengths "
          f"{loop:,} ({t_loop:.2f} s), binpacking.to_constant_volume {len(bp):,} ({t_bp:.2f} s), "
          f"CGHP {ours.packs:,} ({ours.seconds:.2f} s), LPFHP {pack(hist, 'lpfhp', None).packs:,}")


if __name__ == "__main__":
    main()
