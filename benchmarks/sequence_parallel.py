"""Sequence parallelism (DeepSpeed-Ulysses over packed documents): bytes all-to-all'd per layer, measured, against
the Ulysses formula, and the step time at sequence 2 against one process (issue 27).

    .venv/bin/python benchmarks/sequence_parallel.py                  # Llama shapes, 2 processes, gloo, CPU
    .venv/bin/python benchmarks/sequence_parallel.py --ranks 4 --rounds 3

Communication: one training step (forward and backward) of a packed Llama whose rows are split over the ranks,
under a dispatch mode that records every all-to-all with its payload, at L and 2L layers: the difference / L is
one layer. The formula: a rank sends its queries and outputs (b x n/S x h each: b rows of n tokens, S ranks,
h = heads x head size) and its keys and values (b x n/S x h_kv each, grouped-query attention moves kv heads)
through one all-to-all each, forward, and the same four backward:

    bytes per layer per rank = 2 x 2 x b x (n / S) x (h + h_kv) x bytes per element

of which a fraction (S - 1) / S leaves the rank (the rest is its own share). DeepSpeed's paper counts the
forward's 4 x n x h / S per link for equal q, k, v heads. What does not scale with L (the gathered sequence ids)
is reported apart.

Step time: rounds interleave one process on whole rows (1 thread, and the ranks' thread count) with the split
rows on every rank (1 thread each), forward + backward, medians after a warm-up round. On 2 CPU cores through
loopback TCP, sequence parallelism cannot pay (it exists for rows that do not fit one device); the figures say
what it costs here, not what it gains on GPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bert_ipu.arguments import Parser, at_least

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, pack length, rows, sequences a row
    "small": dict(hidden=256, layers=2, heads=8, kv=4, intermediate=688, vocab=4096, seq=1024, batch=2, docs=5),
    "long": dict(hidden=256, layers=2, heads=8, kv=2, intermediate=688, vocab=4096, seq=4096, batch=1, docs=9),
}


def model(shape: dict, layers: int):
    from transformers import LlamaConfig

    from bert_ipu.models.llama import PackedLlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=layers,
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"],
                         intermediate_size=shape["intermediate"], max_position_embeddings=shape["seq"])
    return PackedLlamaForCausalLM(config, "mask", max_sequences_per_pack=shape["docs"])


def batch(shape: dict) -> dict:
    """Rows of `docs` documents of random lengths (cut anywhere by the split), positions restarting."""
    g = torch.Generator().manual_seed(0)
    n, B, docs = shape["seq"], shape["batch"], shape["docs"]
    ids = torch.zeros(B, n, dtype=torch.long)
    for row in range(B):
        cuts = torch.sort(torch.randperm(n - 1, generator=g)[:docs - 1] + 1).values.tolist()
        for k, (a, b) in enumerate(zip([0, *cuts], [*cuts, n]), 1):
            ids[row, a:b] = k
    positions = torch.zeros_like(ids)
    for row in range(B):
        for k in range(1, docs + 1):
            where = ids[row] == k
            positions[row, where] = torch.arange(int(where.sum()))
    tokens = torch.randint(1, shape["vocab"], (B, n), generator=g)
    return {"input_ids": tokens, "position_ids": positions, "sequence_ids": ids}


def step(m, b: dict, group=None) -> None:
    from bert_ipu.models.attention import sequence_parallel

    with sequence_parallel(group):
        logits = m(b["input_ids"], b["position_ids"], b["sequence_ids"])
    logits.float().square().mean().backward()


def share(b: dict, rank: int, ranks: int) -> dict:
    n = b["input_ids"].shape[1] // ranks
    return {k: v[:, rank * n:(rank + 1) * n] for k, v in b.items()}


class CollectiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records (operation, bytes of the tensor it sends) of every collective dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace in ("_c10d_functional", "c10d") and name in ("all_to_all_single", "allgather_",
                                                                       "all_gather_into_tensor"):
            sent = args[1] if name == "allgather_" else args[0]  # (outputs, inputs, ...) for the legacy gather
            while isinstance(sent, (list, tuple)):
                sent = sent[0]
            self.calls.append((name, sent.numel() * sent.element_size()))
        return func(*args, **(kwargs or {}))


def worker(rank: int, ranks: int, port: int, shapes: list[str], rounds: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    torch.set_num_threads(1)
    group = dist.group.WORLD
    for name in shapes:
        shape = SHAPES[name]
        b = batch(shape)
        mine = share(b, rank, ranks)
        sent = {}
        for layers in (shape["layers"], 2 * shape["layers"]):
            m = model(shape, layers)
            with CollectiveBytes() as record:
                step(m, mine, group)
            sent[layers] = record.calls
        per_layer = (sum(x for _, x in sent[2 * shape["layers"]]) - sum(x for _, x in sent[shape["layers"]])) \
            / shape["layers"]
        head = shape["hidden"] // shape["heads"]
        formula = 2 * 2 * shape["batch"] * shape["seq"] // ranks * head * (shape["heads"] + shape["kv"]) * 4
        fixed = sum(x for op, x in sent[shape["layers"]] if op != "all_to_all_single")
        split_times, whole_times = [], {1: [], ranks: []}
        m = model(shape, shape["layers"])
        for r in range(rounds + 1):
            dist.barrier()
            start = time.perf_counter()
            step(m, mine, group)
            split_times.append(time.perf_counter() - start)
            if rank == 0:  # one process on whole rows, with 1 thread and with as many as the ranks use
                for threads in whole_times:
                    torch.set_num_threads(threads)
                    start = time.perf_counter()
                    step(m, b)
                    whole_times[threads].append(time.perf_counter() - start)
                torch.set_num_threads(1)
            dist.barrier()
        if rank == 0:
            med = lambda xs: statistics.median(xs[1:])  # noqa: E731 - the first round warms up
            tokens = shape["batch"] * shape["seq"]
            out.put(dict(shape=name, ranks=ranks, per_layer=per_layer, formula=formula, fixed=fixed,
                         split_ms=1e3 * med(split_times), whole1_ms=1e3 * med(whole_times[1]),
                         wholeN_ms=1e3 * med(whole_times[ranks]), tokens=tokens))
    dist.destroy_process_group()


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    ap.add_argument("--ranks", type=at_least(1), default=2)
    ap.add_argument("--rounds", type=at_least(2), default=4, help="rounds, the first a warm-up (default 4)")
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(worker, args=(args.ranks, port, args.shapes, args.rounds, out), nprocs=args.ranks)
    print(f"sequence parallel over {args.ranks} ranks (gloo, CPU, float32); bytes per rank")
    print(f"{'shape':6} {'per layer measured':>20} {'formula':>14} {'ratio':>6} {'not per layer':>14} "
          f"{'split ms':>9} {'whole 1t':>9} {'whole ' + str(args.ranks) + 't':>9} {'tokens':>7}")
    while not out.empty():
        r = out.get()
        print(f"{r['shape']:6} {r['per_layer']:>20,.0f} {r['formula']:>14,} {r['per_layer'] / r['formula']:>6.3f} "
              f"{r['fixed']:>14,} {r['split_ms']:>9.1f} {r['whole1_ms']:>9.1f} {r['wholeN_ms']:>9.1f} "
              f"{r['tokens']:>7}")


if __name__ == "__main__":
    main()
