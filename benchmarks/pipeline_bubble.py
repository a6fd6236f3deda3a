"""Pipeline bubble: measured idle fraction of the 1F1B (and GPipe) schedule against its theory.

    .venv/bin/torchrun --nproc-per-node 2 benchmarks/pipeline_bubble.py [--layers 4] [--hidden 256]

Each process is one stage of a BERT split at layer boundaries (as in training). For m micro-batches per
update the step takes T(m) ~= (m + p - 1) t (p stages, t = one micro-batch's forward + backward on one
stage, balanced stages): a straight-line fit of T against m gives t (slope) and the measured bubble
1 - m t / T(m), printed next to the theory (p - 1) / (m + p - 1). Medians over repetitions. Needs one core
per stage to mean anything (2 stages on this 2-core machine).
"""

import argparse
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from transformers import BertConfig

from bert_ipu.arguments import Parser, at_least
from bert_ipu.models.bert import PackedBertForPreTraining
from bert_ipu.engine.parallel import PipelineParallel
from bert_ipu.engine.runtime import Runtime
from bert_ipu.tasks.pretraining.task import PretrainingTask


def batch(n, S, M, K, vocab, rng):
    seq = np.zeros((n, S), dtype=np.int64)
    for b in range(n):
        cut = int(rng.integers(S // 4, 3 * S // 4))
        seq[b, :cut], seq[b, cut:] = 1, 2
    pos = np.where(seq == 1, np.arange(S), np.arange(S) - seq.argmax(1, keepdims=True) * 0)
    t = torch.from_numpy
    labels = t(rng.integers(5, vocab, size=(n, M)))
    return {"input_ids": t(rng.integers(5, vocab, size=(n, S))), "position_ids": t(pos % S),
            "token_type_ids": torch.zeros(n, S, dtype=torch.long), "sequence_ids": t(seq),
            "masked_lm_labels": labels, "next_sentence_labels": t(rng.integers(0, 2, size=(n, K))),
            "next_sentence_weights": torch.ones(n, K)}


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=at_least(1), default=4)
    parser.add_argument("--hidden", type=at_least(1), default=256)
    parser.add_argument("--seq-len", type=at_least(1), default=128)
    parser.add_argument("--micro-batch", type=at_least(1), default=8)
    parser.add_argument("--repeats", type=at_least(1), default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    p, rank = dist.get_world_size(), dist.get_rank()
    config = BertConfig(vocab_size=2000, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=4, intermediate_size=4 * args.hidden, max_position_embeddings=args.seq_len,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(0)
    M, K = 16, 3
    for schedule in ("1f1b", "gpipe"):
        ms, times = [2, 4, 8, 16], []
        for m in ms:
            torch.manual_seed(0)
            model = PackedBertForPreTraining(config, K, mlm_slots=M)
            pipe = PipelineParallel(model, PretrainingTask(None), Runtime(torch.device("cpu"), rank, p, p), m, schedule)
            data = batch(m * args.micro_batch, args.seq_len, M, K, config.vocab_size, rng)
            micro = [{k: v[i * args.micro_batch:(i + 1) * args.micro_batch] for k, v in data.items()} for i in range(m)]
            samples = []
            for r in range(args.repeats + 1):
                dist.barrier()
                start = time.perf_counter()
                pipe.train_step(micro, {"mlm": 1.0, "nsp": 1.0})
                dist.barrier()
                if r:
                    samples.append(time.perf_counter() - start)
                for q in pipe.module.parameters():
                    q.grad = None
            times.append(statistics.median(samples))
        slope, intercept = np.polyfit(ms, times, 1)
        if rank == 0:
            print(f"{schedule}: {p} stages, micro-batch {args.micro_batch} x {args.seq_len}; "
                  f"fit T(m) = {slope * 1e3:.1f} ms x m + {intercept * 1e3:.1f} ms")
            print(f"  {'m':>3} {'T(m) ms':>9} {'measured bubble':>16} {'theory (p-1)/(m+p-1)':>21}")
            for m, T in zip(ms, times):
                print(f"  {m:>3} {T * 1e3:>9.1f} {1 - m * slope / T:>16.3f} {(p - 1) / (m + p - 1):>21.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
