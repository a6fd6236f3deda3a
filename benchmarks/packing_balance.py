"""Balance across data-parallel ranks: attention balance ratio of an update's packs dealt in loader order
(random: the loader shuffles) against `bert_ipu.packing.balance.balanced_order`.

    .venv/bin/python benchmarks/packing_balance.py [--updates 200] [--ranks 8]

Packs: CGHP (depth 3) on Wikipedia-512, and LPFHP (unlimited) on 1M long-context lengths at 32,768 tokens,
sequences assigned with `assign_ragged` (a shuffled pack order, as the loader's). An update is ranks x
micro-batches x packs per micro-batch packs; ABR = 1 - mean / max of the ranks' sums of squared sequence
lengths (docs/packing.md, "Balance across devices"). Prints the mean and worst ABR over --updates updates, the floor no dealing
can beat (1 - even share / max(costliest pack, even share), averaged), and the dealing time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bert_ipu.arguments import Parser, at_least
from bert_ipu.packing import assign_ragged, expand_histogram, histogram_of, pack
from bert_ipu.packing.balance import balance_metrics, balanced_order, pack_costs
from bert_ipu.packing.synthetic import long_context_lengths

HERE = Path(__file__).resolve().parent


def run(name, lengths, max_len, algorithm, depth, ranks, micro, per_micro, updates):
    result = pack(histogram_of(lengths, max_len), algorithm, depth)
    offsets, indices = assign_ragged(lengths, result.mixture, max_len, seed=0)
    flat, sizes = lengths[indices], np.diff(offsets)
    per_update = ranks * micro * per_micro
    plain, fair, floor, seconds = [], [], [], 0.0
    for u in range(min(updates, len(sizes) // per_update)):
        packs = [flat[offsets[p]:offsets[p + 1]] for p in range(u * per_update, (u + 1) * per_update)]
        sz = sizes[u * per_update:(u + 1) * per_update]
        f, o = np.concatenate(packs), np.concatenate([[0], np.cumsum(sz)])
        costs = pack_costs(f, o)
        # no dealing beats this: the costliest pack alone may exceed a rank's even share
        floor.append(1 - (costs.sum() / ranks) / max(costs.max(), costs.sum() / ranks))
        plain.append(balance_metrics(f, o, ranks, max_len))
        start = time.perf_counter()
        order = balanced_order(costs, ranks, per_micro)
        seconds += time.perf_counter() - start
        f2, o2 = np.concatenate([packs[i] for i in order]), np.concatenate([[0], np.cumsum(sz[order])])
        fair.append(balance_metrics(f2, o2, ranks, max_len))
    abr = lambda ms: [m.attention_balance_ratio for m in ms]
    dbr = lambda ms: [m.data_balance_ratio for m in ms]
    print(f"| {name} | {ranks} x {micro} x {per_micro} | {np.mean(abr(plain)):.4f} | {np.mean(abr(fair)):.4f} "
          f"(worst {np.max(abr(fair)):.4f}) | {np.mean(floor):.4f} | {np.mean(dbr(plain)):.4f} / {np.mean(dbr(fair)):.4f} | "
          f"{np.mean([m.padding_ratio for m in fair]):.4%} | {seconds / len(fair) * 1e3:.1f} ms |", flush=True)


def main() -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=at_least(1), default=200)
    parser.add_argument("--ranks", type=at_least(1), default=8)
    args = parser.parse_args()
    print("| packs | ranks x micro-batches x packs | ABR loader order | ABR balanced | ABR floor | "
          "DBR loader / balanced | padding | dealing time per update |")
    print("|---|---|---|---|---|---|---|---|")
    wiki = np.array(json.loads((HERE / "histograms" / "wikipedia_512.json").read_text()))
    lengths = np.random.default_rng(0).permutation(expand_histogram(wiki))
    for micro, per_micro in ((4, 2), (1, 32)):
        run("Wikipedia-512, CGHP depth 3", lengths, 512, "cghp", 3, args.ranks, micro, per_micro, args.updates)
    long = long_context_lengths(1_000_000, 32768, seed=0)
    for micro, per_micro in ((4, 1), (4, 4), (1, 32)):
        run("long-context 32K, LPFHP max", long, 32768, "lpfhp", None, args.ranks, micro, per_micro, args.updates)


if __name__ == "__main__":
    main()
