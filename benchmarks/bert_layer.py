"""Where a packed BERT layer's time goes on a GPU: N encoder layers of BERT-large (`bert_ipu.models.bert.BertLayer`,
the application's own module) on packs of the Wikipedia-512 lengths, forward and backward under bf16 autocast,
compiled as `train.compile=compile` compiles them, once per attention variant, with each variant's kernel time
split by kind (matrix products, attention, inductor's fused element-wise kernels, the rest) from torch.profiler.

    python benchmarks/bert_layer.py --device cuda                          # a GPU: BERT-large, 32 packs of 512
    .venv/bin/python benchmarks/bert_layer.py --hidden 64 --heads 4 --intermediate 128 --micro-batch 2 \\
        --variants mask none --iters 2 --no-compile                          # CPU smoke

A layer's cost is what the whole model multiplies by its depth; the application's step minus 24 of these is
the embeddings, the heads, the loss, the optimizer and the loader. Kernel kinds: `attention` (flash,
memory-efficient, cuDNN), `template` (inductor's Triton templates other than attention, e.g. max-autotune's GEMMs; compiled
FlexAttention's kernels are named `..._flex_attention...` and count as attention), `gemm`, `fused`
(inductor's element-wise kernels), `other`. Variants (each the model's own backend where
one exists):

- `mask`: the mask backend (an additive (B, 1, S, S) mask and SDPA, which picks its kernel: memory-efficient
  attention, with dropout);
- `mask-cudnn`: the same call restricted to cuDNN's attention (`sdpa_kernel(CUDNN_ATTENTION)`);
- `varlen`: the varlen backend (flash attention over the documents, with its dropout);
- `varlen-nodrop`: the same without attention dropout; `flex`: the flex backend (no dropout: its kernel has none);
- `dense`: SDPA with no mask at all (flash attention over the whole pack, with dropout): not a correct packed
  model, a yardstick for what attention over S x S costs in the fastest kernel;
- `none`: no attention (the layer returns v): the floor the rest of the layer sets.

The packs' documents are contiguous (sequence ids in order), which every backend computes the same on; their
lengths come from CGHP at depth 3 on `benchmarks/histograms/wikipedia_512.json`. Useful FLOPs: the linear layers
over every position of the packs (as the application counts them) and attention within the documents only; x3
for training. Prints a table (ms a layer, useful TFLOP/s, MFU over the device's dense bf16 peak, kernel time by
kind) and writes JSON rows with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bert_ipu.files import is_benchmark_json, write_rows
from bert_ipu.arguments import Parser, at_least, device_name
from bert_ipu import packing  # noqa: E402
from bert_ipu.engine.flops import peak_flops  # noqa: E402
from bert_ipu.models import attention as attn  # noqa: E402
from bert_ipu.models.bert import BertLayer  # noqa: E402

VARIANTS = ("mask", "mask-cudnn", "varlen", "varlen-nodrop", "flex", "dense", "none")
HISTOGRAM = Path(__file__).resolve().parent / "histograms" / "wikipedia_512.json"


def pack_ids(micro_batch: int, seq_len: int, depth: int, seed: int) -> tuple[torch.Tensor, int]:
    """(B, S) contiguous sequence ids of packs drawn from CGHP's mixture on the Wikipedia lengths (truncated to
    seq_len), and the sum over documents of their squared lengths."""
    hist = np.asarray(json.loads(HISTOGRAM.read_text()), dtype=np.int64)
    if seq_len < len(hist):
        hist = np.concatenate([hist[:seq_len - 1], [hist[seq_len - 1:].sum()]])
    mix = packing.pack(hist, "cghp", depth).mixture
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(mix.counts), size=micro_batch, p=mix.counts / mix.counts.sum())
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.int64)
    squares = 0
    for row, i in enumerate(picks):
        start = 0
        for j, n in enumerate(int(n) for n in mix.strategies[i] if n > 0):
            ids[row, start:start + n] = j + 1
            start, squares = start + n, squares + n * n
    return ids, squares


class Layers(torch.nn.Module):
    def __init__(self, config, n: int, variant: str, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(BertLayer(config) for _ in range(n))
        self.variant, self.depth = variant, depth

    def attention(self, ids, dtype):
        v = self.variant
        if v == "none":
            return lambda q, k, val, p=0.0, scale=None: val
        if v == "dense":
            return lambda q, k, val, p=0.0, scale=None: torch.nn.functional.scaled_dot_product_attention(
                q, k, val, dropout_p=p)
        inner = attn.attention_for(ids, {"mask-cudnn": "mask", "varlen-nodrop": "varlen"}.get(v, v), dtype,
                                   slots=self.depth)
        if v == "varlen-nodrop":
            return lambda q, k, val, p=0.0, scale=None: inner(q, k, val, 0.0, scale)
        if v == "mask-cudnn":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def cudnn(q, k, val, p=0.0, scale=None):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return inner(q, k, val, p, scale)
            return cudnn
        return inner

    def forward(self, x, ids):
        att = self.attention(ids, torch.bfloat16 if x.is_cuda else x.dtype)
        for layer in self.layers:
            x = layer(x, att)
        return x


# kernel kinds by name, first match wins: attention kernels first (flash's names carry `cutlass::bfloat16_t`,
# memory-efficient attention's are `fmha_cutlassF...`, cuDNN's `...sdpa_sm90...`: all would read as matrix
# products, and compiled FlexAttention's are `triton_tem_fused_flex_attention_...`), then inductor's other
# templates (`triton_tem_fused_...`: max-autotune's GEMMs)
KINDS = (("attention", ("fmha", "flash", "sdpa", "attention", "attn", "cudnn")),
         ("template", ("triton_tem",)),
         ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "sm90_", "sm80_")),
         ("fused", ("triton_",)))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, words in KINDS if any(w in low for w in words)), "other")


def kernel_split(step, iters: int) -> dict:
    """Milliseconds a step of device time by kernel kind (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    split, top = {}, {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t <= 0 or e.key.startswith("ProfilerStep"):
            continue
        k = kind_of(e.key)
        split[k] = split.get(k, 0.0) + t / 1e3 / iters
        top[e.key] = top.get(e.key, 0.0) + t / 1e3 / iters
    return {"split": split, "top": sorted(top.items(), key=lambda kv: -kv[1])[:8]}


def run_variant(args, variant: str, ids: torch.Tensor, squares: int, device) -> dict:
    config = BertConfig(hidden_size=args.hidden, num_attention_heads=args.heads, intermediate_size=args.intermediate,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    model = Layers(config, args.layers, variant, args.depth).to(device).train()
    B, S = ids.shape
    x = torch.randn(B, S, args.hidden, device=device, requires_grad=True)
    grad = torch.randn(B, S, args.hidden, device=device)
    ids = ids.to(device)
    fwd = model if args.no_compile else torch.compile(model, dynamic=False, mode=args.mode)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def step():
        with amp:
            out = fwd(x, ids)
        out.backward(grad.to(out.dtype))

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    sync()
    ms = (time.perf_counter() - t0) / args.iters * 1e3
    h, inter, n = args.hidden, args.intermediate, args.layers
    linear = 2 * B * S * (4 * h * h + 2 * h * inter)
    attention = 0 if variant == "none" else 4 * h * squares
    flops = 3 * n * (linear + attention)
    peak = peak_flops(device, "bf16")
    row = {"variant": variant, "ms_per_layer": ms / n, "first_s": first, "tflops": flops / (ms / 1e3) / 1e12,
           "mfu": None if peak is None else flops / (ms / 1e3) / peak, "layers": n, "micro_batch": B, "seq_len": S}
    if device.type == "cuda" and not args.no_profile:
        prof = kernel_split(step, 3)
        row["kernel_ms_per_layer"] = {k: v / n for k, v in prof["split"].items()}
        row["top"] = [(k[:90], v / n) for k, v in prof["top"]]
    return row


def main(argv=None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--layers", type=at_least(1), default=2, help="layers compiled and timed together (default 2)")
    p.add_argument("--hidden", type=at_least(1), default=1024)
    p.add_argument("--heads", type=at_least(1), default=16)
    p.add_argument("--intermediate", type=at_least(1), default=4096)
    p.add_argument("--seq-len", type=at_least(1), default=512)
    p.add_argument("--depth", type=at_least(1), default=3, help="most documents a pack (CGHP's depth; varlen's slots)")
    p.add_argument("--micro-batch", type=at_least(1), default=32)
    p.add_argument("--iters", type=at_least(1), default=20)
    p.add_argument("--no-compile", action="store_true", help="eager (the CPU smoke)")
    p.add_argument("--mode", default=None, help="torch.compile mode (default: its default; e.g. "
                   "max-autotune-no-cudagraphs: Triton GEMM templates with fused epilogues, tuned at compile time)")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel split")
    p.add_argument("--json", type=Path, help="write one JSON row a variant here")
    args = p.parse_args(argv)
    p.check_output(args.json, "--json", is_benchmark_json)  # before anything is measured
    device = torch.device(args.device)
    ids, squares = pack_ids(args.micro_batch, args.seq_len, args.depth, seed=0)
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{args.layers} layers of hidden {args.hidden}, {args.micro_batch} packs of {args.seq_len}, "
          f"{int((ids > 0).sum())} real tokens, {int(ids.max(1).values.sum())} documents", flush=True)
    rows = []
    for variant in args.variants:
        try:
            row = run_variant(args, variant, ids, squares, device)
        except Exception as e:  # a variant that cannot run here is a row that says so
            row = {"variant": variant, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        rows.append(row)
        if args.json:  # after every variant: a part stopped by its time cap keeps the rows it has
            write_rows(args.json, rows, "bert_layer.py")
        if "error" in row:
            print(f"{variant:>14}  failed: {row['error']}", flush=True)
            continue
        mfu = "" if row["mfu"] is None else f"  MFU {100 * row['mfu']:5.1f}%"
        split = "  ".join(f"{k} {v:.3f}" for k, v in sorted(row.get("kernel_ms_per_layer", {}).items()))
        print(f"{variant:>14}  {row['ms_per_layer']:8.3f} ms a layer  {row['tflops']:7.1f} TFLOP/s{mfu}  "
              f"(first step {row['first_s']:.1f} s)  kernels ms a layer: {split}", flush=True)
        for name, v in row.get("top", []):
            print(f"{'':>16}{v:8.3f}  {name}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
