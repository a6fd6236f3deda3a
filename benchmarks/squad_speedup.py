"""Realized SQuAD fine-tuning speed-up, packed over unpacked, measured in one run on the real QA model.

    .venv/bin/python benchmarks/squad_speedup.py [--size minilm|base|large] [--micro-batch 4] [--steps 3]
        [--rounds 5] [--histogram benchmarks/histograms/squad_1_1_384.json] [--json OUT]

Features: one per sequence of the paper's SQuAD 1.1 histogram (88,641 features at 384), as the feature code
lays them out ([CLS] question [SEP] context [SEP], span labels inside the context) with random tokens: the
model's speed does not depend on which tokens it sees. They are packed with CGHP at the depth `auto`
chooses, and unpacked (NONE). One PackedBertForQuestionAnswering trains (forward, backward, AdamW step) on
micro-batches of `--micro-batch` rows drawn from each, the two interleaved round by round, the first round
dropped (bert_ipu.tasks.profile.run.profile). Realized speed-up = features per second packed / unpacked, from the
median step times; OH = packed step time / unpacked step time at the same shape - 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig

from bert_ipu.files import is_benchmark_json, write_rows
from bert_ipu.arguments import Parser, at_least
from bert_ipu.models.bert import PackedBertForQuestionAnswering
from bert_ipu.packing.histogram import expand_histogram, load_histogram
from bert_ipu.engine.flops import peak_flops
from bert_ipu.tasks.profile.run import WithPrecision, format_table, profile, summarize
from bert_ipu.packing import auto_depth
from bert_ipu.packing.histogram import histogram_of
from bert_ipu.tasks.squad.features import Features, micro_batches, pack_features

SIZES = {"minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
         "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
         "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)}


def synthetic_features(lengths: np.ndarray, vocab: int, rng: np.random.Generator) -> Features:
    """Features of the given lengths: a question of up to 16 tokens, the rest context; labels in the context."""
    n, total = len(lengths), int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    q = np.minimum(16, np.maximum(lengths - 4, 0))            # question tokens
    ctx = lengths - q - 3                                     # context tokens (>= 1 for lengths >= 4)
    ids = rng.integers(1000, vocab, size=total).astype(np.int32)
    ids[starts] = 101
    ids[starts + q + 1] = 102
    ids[starts + lengths - 1] = 102
    pos = np.arange(total) - np.repeat(starts, lengths)
    head = np.repeat(q + 2, lengths)
    in_ctx = (pos >= head) & (pos < np.repeat(lengths - 1, lengths))
    offsets = np.where(in_ctx[:, None], np.stack([pos, pos + 1], 1), -1).astype(np.int32)
    a = rng.integers(0, np.maximum(ctx, 1))
    return Features(ids, (pos >= head).astype(np.int8), in_ctx | (pos == 0), in_ctx, offsets, lengths.astype(np.int64),
                    np.arange(n), np.where(ctx >= 1, q + 2 + a, 0), np.where(ctx >= 1, q + 2 + a, 0))


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histogram", default=str(Path(__file__).parent / "histograms" / "squad_1_1_384.json"))
    ap.add_argument("--size", choices=sorted(SIZES), default="minilm")
    ap.add_argument("--micro-batch", type=at_least(1), default=4, help="rows per step, packed and unpacked alike")
    ap.add_argument("--steps", type=at_least(1), default=3, help="micro-batches per layout per round")
    ap.add_argument("--rounds", type=at_least(2), default=5, help="interleaved rounds; the first is warm-up")
    ap.add_argument("--backend", default="mask", choices=["mask", "reference", "flex"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast (a GPU run)")
    ap.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    args = ap.parse_args()
    ap.check_output(args.json, "--json", is_benchmark_json)  # before anything is measured

    hist = load_histogram(args.histogram)
    S = len(hist)
    lengths = expand_histogram(hist)
    lengths = lengths[lengths >= 4]  # [CLS] q [SEP] c [SEP] needs 4 tokens (the histogram's shortest is longer)
    rng = np.random.default_rng(0)
    features = synthetic_features(lengths, 30522, rng)
    depth = auto_depth(histogram_of(features.lengths, S))
    layouts = {"none": pack_features(features, S, "none", depth), "cghp": pack_features(features, S, "cghp", depth)}
    print(f"[squad] {len(features):,} features at {S}: cghp depth {depth} (auto) -> {layouts['cghp'].packs:,} packs, "
          f"p = {layouts['cghp'].packing_factor:.3f}, efficiency {layouts['cghp'].efficiency:.2%}; unpacked "
          f"efficiency {layouts['none'].efficiency:.2%}", flush=True)

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, max_position_embeddings=max(512, S), hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, **SIZES[args.size])
    model = PackedBertForQuestionAnswering(config, depth, args.backend).train()
    batches, results = {}, {}
    for name, pf in layouts.items():
        order = rng.permutation(pf.packs)[:args.micro_batch * args.steps]
        batches[name] = [{k: torch.from_numpy(v) for k, v in b.items()}
                         for _, b in micro_batches(pf, args.micro_batch, order)]
        results[name] = pf.result

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    print(f"[squad] {args.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, micro-batch "
          f"{args.micro_batch} rows, {args.steps} steps x {args.rounds} rounds per layout, {device}", flush=True)
    rows = summarize(profile(WithPrecision(model, device, args.precision), batches, results, args.rounds, device,
                             say=lambda m: print(f"[squad] {m}", flush=True)), peak_flops(device, args.precision))
    print(format_table(rows))
    packed = next(r for r in rows if r["algorithm"] == "cghp")
    print(f"realized fine-tuning speed-up packed over unpacked: {packed['realized_speedup']:.3f}x "
          f"(features/s {packed['sequences_per_second']:.1f} vs "
          f"{next(r for r in rows if r['algorithm'] == 'none')['sequences_per_second']:.1f}; "
          f"token bound {packed['theoretical_speedup']:.3f}x)")
    if args.json:
        write_rows(args.json, rows, "squad_speedup.py", lines=False)


if __name__ == "__main__":
    main()
