"""Packs of several lengths (Hierarchical Balance Packing's levels) against everything in packs of the longest
length: measured on this CPU, and modelled for GPU clusters at 128K (issue 27).

    .venv/bin/python benchmarks/levels.py                       # both parts (the model part takes minutes)
    .venv/bin/python benchmarks/levels.py --part measured       # or --part modelled

measured: a long-tailed corpus (3,000 documents, log-normal around 40 tokens, and 32 of 512-1024) packed by the
multi-size packer into the lengths `bert_ipu.packing.levels` picks, and into packs of 1024 only. A packed Llama
(hidden 128, 2 layers, grouped-query attention, vocabulary 2048, the `mask` backend, float32, 1 process) times a
forward and backward of a micro-batch of about 2048 tokens of each length (the fastest of interleaved rounds: the
least disturbed by other jobs). Under a mask every pack of a length costs the same, so an epoch is the packs of
each length times their measured time: it says whether the shorter packs pay for their extra rows here, beside the
ratio the model predicts for the same packs (`StepModel(document_attention=False)`: a mask computes every pair).

modelled: a 128K corpus (20,000 documents, log-normal, median about 3,000 tokens, clipped at 131,072) on Llama-3-8B
(32 layers, hidden 4096, 8 kv heads) with document attention (varlen), 40% of an H100's 989 bf16 TFLOP/s, a pack
share of 32K tokens fitting one GPU, 4M tokens an update; 8 GPUs at 200 GB/s a GPU for all-to-alls (one NVLink
node) and 64 GPUs at 25 GB/s (across nodes). These are the model's seconds, not measurements: the GPU
measurement is issue 29.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bert_ipu.arguments import Parser, at_least
from bert_ipu.data.contiguous import pack_levels  # noqa: E402
from bert_ipu.packing.histogram import histogram_of  # noqa: E402
from bert_ipu.packing.levels import StepModel, choose_levels, evaluate, format_choice, level_costs  # noqa: E402

SHAPE = dict(hidden=128, layers=2, heads=4, kv=2, intermediate=344, vocab=2048)


def long_tail(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    short = np.clip(rng.lognormal(np.log(40), 0.8, size=3000).astype(int), 8, 1024)
    return np.concatenate([short, np.full(12, 1024), rng.integers(512, 1024, 20)])


def llama():
    from transformers import LlamaConfig

    from bert_ipu.models.llama import PackedLlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=SHAPE["vocab"], hidden_size=SHAPE["hidden"], num_hidden_layers=SHAPE["layers"],
                         num_attention_heads=SHAPE["heads"], num_key_value_heads=SHAPE["kv"],
                         intermediate_size=SHAPE["intermediate"], max_position_embeddings=1024)
    return PackedLlamaForCausalLM(config, "mask", max_sequences_per_pack=64)


def measured(rounds: int) -> None:
    lengths = long_tail()
    hist = histogram_of(lengths, 1024)
    model = StepModel(SHAPE["layers"], SHAPE["hidden"], SHAPE["heads"], SHAPE["kv"], SHAPE["intermediate"],
                      vocab=SHAPE["vocab"], devices=1, document_attention=False)
    choice = choose_levels(hist, model, tokens_per_update=16 * 1024, max_levels=3, max_sequences_per_pack=64)
    print(format_choice(choice, 4))
    sets = {"levels": choice.lengths, "1024 only": [1024]}
    rng = np.random.default_rng(0)
    tokens = {"input_ids": [rng.integers(0, SHAPE["vocab"], n) for n in lengths]}
    flat = {"input_ids": np.concatenate(tokens["input_ids"])}
    packed = {name: pack_levels(lengths, flat, ls, 64, costs=level_costs(model, ls)) for name, ls in sets.items()}
    net = llama()
    batches = {}
    for n, p in {**packed["levels"], **packed["1024 only"]}.items():
        micro = max(1, 2048 // n)
        rows = p.rows
        batches[n] = {"input_ids": torch.as_tensor(rows["input_ids"][:micro]),
                      "position_ids": torch.as_tensor(rows["position_ids"][:micro]),
                      "sequence_ids": torch.as_tensor(rows["sequence_ids"][:micro])}
    times = {n: [] for n in batches}
    for r in range(rounds + 1):  # interleaved; round 0 warms up
        for n, b in batches.items():
            start = time.perf_counter()
            net(**b).float().logsumexp(-1).mean().backward()  # the head's cost without the loss's bookkeeping
            net.zero_grad(set_to_none=True)
            if r:
                times[n].append(time.perf_counter() - start)
    per_pack = {n: min(t) / len(batches[n]["input_ids"]) for n, t in times.items()}  # least disturbed
    print(f"\nmeasured on this CPU ({torch.get_num_threads()} threads, float32, mask backend), forward + backward")
    print(f"{'pack length':>11} {'ms a pack':>10}")
    for n in sorted(per_pack):
        print(f"{n:>11} {per_pack[n] * 1e3:>10.1f}")
    epoch = {name: sum(p.packs * per_pack[n] for n, p in levels.items()) for name, levels in packed.items()}
    real = int(lengths.sum())
    for name, levels in packed.items():
        computed = sum(p.packs * n for n, p in levels.items())
        print(f"{name:10} {str({n: p.packs for n, p in levels.items()}):32} epoch {epoch[name]:7.2f} s, "
              f"{real / epoch[name]:8.0f} real tokens/s, padding {1 - real / computed:.1%}")
    predicted = (evaluate(hist, [1024], model, 16 * 1024, max_sequences_per_pack=64).seconds
                 / evaluate(hist, choice.lengths, model, 16 * 1024, max_sequences_per_pack=64).seconds)
    print(f"levels vs 1024 only: measured {epoch['1024 only'] / epoch['levels']:.2f}x, the model predicts "
          f"{predicted:.2f}x")


def modelled() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(3000), 1.5, size=20000).astype(int), 64, 131072)
    hist = histogram_of(lengths, 131072)
    print(f"\n128K corpus: {len(lengths):,} documents, median {int(np.median(lengths)):,}, mean {lengths.mean():,.0f}, "
          f"{(lengths == 131072).sum()} at 131,072 tokens")
    for devices, bandwidth in ((8, 200e9), (64, 25e9)):
        model = StepModel(32, 4096, 32, 8, 14336, vocab=128256, devices=devices, flops_per_second=0.4 * 989e12,
                          bytes_per_second=bandwidth, memory_tokens=32768)
        start = time.perf_counter()
        choice = choose_levels(hist, model, tokens_per_update=4 * 1024 * 1024, max_levels=3)
        print(f"\n{devices} GPUs, all-to-all {bandwidth / 1e9:.0f} GB/s a GPU (modelled seconds an epoch; chosen in "
              f"{time.perf_counter() - start:.0f} s)")
        print(format_choice(choice, 5))
        print(f"best {choice.lengths}: {choice.speedup:.2f}x the naive packing (model)")


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["measured", "modelled", "both"], default="both")
    ap.add_argument("--rounds", type=at_least(1), default=5)
    args = ap.parse_args()
    if args.part in ("measured", "both"):
        measured(args.rounds)
    if args.part in ("modelled", "both"):
        modelled()


if __name__ == "__main__":
    main()
