"""Packed Llama SFT on long-context lengths (issue 29): our packed rows (varlen, flex, mask attention) against
Hugging Face's padding-free path (`DataCollatorWithFlattening`: one row of the same documents back to back,
positions restarting) on the same documents; tokens/s, MFU, peak memory, and each variant's first loss.

    python benchmarks/llama_long_context.py --device cuda --model 1b --pack-length 8192 32768   # a GPU
    .venv/bin/python benchmarks/llama_long_context.py --model tiny --pack-length 512 \\
        --variants mask reference hf-sdpa --steps 2 --rounds 2                                      # CPU smoke

Data: `bert_ipu.packing.synthetic.long_context_lengths` (log-normal, median 600 tokens, 1% above 16K,
truncated to the pack length), packed with LPFHP (no depth limit) into packs of `--pack-length` tokens, as the
packing benchmarks do. Each step trains on `--micro-batch` packs drawn in proportion to the packing's
strategies, with random tokens (speed does not depend on them). Variants:

- `varlen`, `flex`, `mask`, `reference`: `PackedLlamaForCausalLM` with that attention backend on the packs
  (B, S), padding included (the static shape a compiler and CUDA graphs want), its varlen segments sized by the
  deepest pack (K + 1 a row); `varlen+compile`, `flex+cudagraphs`, ...: the same step as the engine's
  train.compile runs it (forward and loss under torch.compile with static shapes, or also replayed as CUDA
  graphs), which a flattened row of a new length every step cannot;
- `hf-sdpa`, `hf-flex`, `hf-flash`: transformers' `LlamaForCausalLM` with that `attn_implementation` on
  `DataCollatorWithFlattening`'s rows of the same documents: (1, real tokens), no padding, a new shape every
  step. `hf-flash` needs the flash-attn package (skipped without it).

Every variant starts from the same weights, drawn with std 0.1 rather than Llama's 0.02 (speed does not depend
on them): sharp enough attention that a crossed document boundary moves the loss by about 5e-3 relative,
against 1e-5 at 0.02. Before timing, each variant computes the loss of the first step without updating (the
mean next-token cross-entropy over the documents' tokens: equal by definition for every exact variant) and
compares it with the reference: transformers' `LlamaForCausalLM` on each document alone (unpacked), in
float32. A variant off the reference by more than 2e-5 relative in float32, or in bf16 by more than twice
Hugging Face's own unpacked bf16 error against it (the equivalence tests' rule), is flagged and the script
exits 1: a wrong mask or a cross-contaminated row cannot pass as a speed-up. (Outside `Trainer`, which sets
`use_cache=False`, transformers ignores the flattened row's `position_ids` while its default cache is on, and
attention crosses the documents: this script passes `use_cache=False`.) Timed: forward, loss, backward,
AdamW step; rounds interleave the variants, the first round is warm-up; medians. MFU counts the useful
FLOPs (6 x matmul parameters x real tokens + 6 x layers x hidden x the sum of squared document lengths: causal
attention within documents only) over the step time and the GPU's dense bf16 peak
(`bert_ipu.engine.flops.PEAK_BF16`). A variant that runs out of memory is reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from bert_ipu.arguments import Parser, at_least, device_name
from bert_ipu.files import is_benchmark_json, write_rows
from bert_ipu import packing
from bert_ipu.data.contiguous import rows_from_packs
from bert_ipu.engine.runtime import autocast
from bert_ipu.models import attention as attn
from bert_ipu.models.llama import PackedLlamaForCausalLM
from bert_ipu.models.losses import HiddenStates, chunked_causal_lm_loss_sums
from bert_ipu.packing.histogram import histogram_of
from bert_ipu.packing.synthetic import long_context_lengths
from bert_ipu.engine.flops import peak_flops

# Llama shapes: TinyLlama-1.1B's for "1b" (22 layers, hidden 2048, 32 heads, 4 key/value heads, SwiGLU 5632)
MODELS = {
    "tiny": dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    "350m": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
}
BACKENDS = ("varlen", "flex", "mask", "reference")
MODES = ("compile", "cudagraphs")  # the engine's train.compile modes
OURS = (*BACKENDS, *(f"{b}+{m}" for b in ("varlen", "flex", "mask") for m in MODES))
HF = {"hf-sdpa": "sdpa", "hf-flex": "flex_attention", "hf-flash": "flash_attention_2"}
FP32_TOLERANCE = 2e-5  # relative: the same terms summed in another order
INIT_STD = 0.1  # see the module docstring: makes the loss check sensitive to a crossed document boundary


def llama_config(name: str, pack_length: int):
    import transformers

    return transformers.LlamaConfig(**MODELS[name], max_position_embeddings=pack_length, rope_theta=500000.0,
                                    attention_dropout=0.0, tie_word_embeddings=False, initializer_range=INIT_STD)


def draw_packs(pack_length: int, sequences: int, packs: int, seed: int):
    """`packs` packs (each a list of document lengths) drawn from the LPFHP packing of `sequences` long-context
    lengths in proportion to its strategies' counts, and the packing's result."""
    lengths = long_context_lengths(sequences, pack_length, seed=seed)
    result = packing.pack(histogram_of(lengths, pack_length), "lpfhp", None)
    mix = result.mixture
    picks = np.random.default_rng(seed).choice(len(mix.counts), size=packs, p=mix.counts / mix.counts.sum())
    return [mix.flat[mix.offsets[i]:mix.offsets[i + 1]].tolist() for i in picks], result


def packed_rows(docs_per_row: list[list[np.ndarray]], S: int) -> dict:
    """Our layout (`bert_ipu.data.contiguous.rows_from_packs`, the one row packer): (B, S) rows of documents back
    to back then padding; labels = the next token of the same document (-100 at each document's last token and
    on padding)."""
    docs = [doc for row in docs_per_row for doc in row]
    fields = {"input_ids": np.concatenate(docs), "labels": np.concatenate([np.append(d[1:], -100) for d in docs])}
    offsets = np.cumsum([0] + [len(row) for row in docs_per_row])
    rows, *_ = rows_from_packs(np.array([len(d) for d in docs]), fields, S, offsets, np.arange(len(docs)),
                               {"labels": -100})
    return {k: torch.from_numpy(v) for k, v in rows.items()}


def flattened_rows(docs_per_row: list[list[np.ndarray]]) -> dict:
    """Hugging Face's padding-free layout of the same documents (DataCollatorWithFlattening, all in one row)."""
    from transformers import DataCollatorWithFlattening

    features = [{"input_ids": doc.tolist()} for docs in docs_per_row for doc in docs]
    return dict(DataCollatorWithFlattening(return_tensors="pt")(features))


def useful_flops(config, doc_lengths: list[int]) -> float:
    """Training FLOPs of one step over these documents: 6 x (matmul parameters) x tokens for the projections,
    MLPs and LM head, plus 6 x layers x (heads x head size) x sum(len^2) for causal attention within documents."""
    h, L = config.hidden_size, config.num_hidden_layers
    hd = h // config.num_attention_heads
    kv = config.num_key_value_heads * hd
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * config.intermediate_size  # q, o; k, v; gate, up, down
    matmul = L * per_layer + h * config.vocab_size
    tokens = sum(doc_lengths)
    return 6.0 * matmul * tokens + 6.0 * L * config.num_attention_heads * hd * float(sum(n * n for n in doc_lengths))


class Variant:
    """One row of the table: a model (shared with the other variants of its kind: ours or Hugging Face's, with
    one optimizer each), the attention it runs with, and its batches."""

    def __init__(self, name, model, opt, batches, device, precision, loss_chunk=None):
        self.name, self.model, self.opt, self.batches = name, model, opt, batches
        self.loss_chunk = loss_chunk  # tokens of the LM head and loss at a time (None: all at once)
        self.device, self.precision = device, precision
        self.seconds, self.peak, self.error = [], None, None
        self.backend, _, self.mode = name.partition("+")
        self._ours = self._ours_loss
        if self.mode:
            self._ours = torch.compile(self._ours_loss, dynamic=False,
                                       mode="reduce-overhead" if self.mode == "cudagraphs" else None)

    def _ours_loss(self, batch):
        out = self.model(batch["input_ids"], batch["position_ids"], batch["sequence_ids"])
        if isinstance(out, HiddenStates):  # --loss-chunk: the head and the loss chunk by chunk, as the task runs them
            labels = batch["labels"]
            sums, _ = chunked_causal_lm_loss_sums(out, labels, torch.zeros_like(labels, dtype=torch.float32),
                                                  self.loss_chunk)
            return sums.token_loss_sum / sums.label_tokens.clamp_min(1)
        return F.cross_entropy(out.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def loss(self, batch):
        with autocast(self.device, self.precision):
            if self.name in OURS:
                self.model.attention_backend = self.backend  # read at every forward
                if self.mode == "cudagraphs":
                    torch.compiler.cudagraph_mark_step_begin()
                return self._ours(batch)
            self.model.config._attn_implementation = HF[self.name]  # read at every forward
            # HF shifts the labels itself (the first of each document is -100). use_cache=False, or HF ignores the
            # position_ids (no packed-sequence mask while a cache exists) and attention crosses the documents
            return self.model(**batch, use_cache=False).loss

    def step(self, batch) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.loss(batch).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start


def build_variants(names, config, state, packs, S, micro_batch, device, precision, say, loss_chunk=None):
    """One Variant per name that can run here. Two models at most, each loaded with the same weights and given
    one AdamW: ours (every backend of ours runs on it) and transformers' (every attn_implementation runs on it)."""
    import transformers

    docs_rng = np.random.default_rng(1)
    docs = [[docs_rng.integers(3, config.vocab_size, size=n) for n in pack] for pack in packs]
    steps = [docs[i:i + micro_batch] for i in range(0, len(docs) - micro_batch + 1, micro_batch)]
    models, out = {}, []

    depth = max(len(pack) for pack in packs)  # K: varlen's segments a row

    def model_of(kind):
        if kind not in models:
            model = (PackedLlamaForCausalLM(config, "mask", max_sequences_per_pack=depth) if kind == "ours" else
                     transformers.LlamaForCausalLM(config)).to(device)
            if kind == "ours":
                model.head_in_loss = loss_chunk is not None
            model.load_state_dict(state)
            # one fused kernel a step on CUDA, as the engine and transformers' Trainer (adamw_torch_fused) take it
            fused = True if device.type == "cuda" else None
            models[kind] = (model.train(), torch.optim.AdamW(model.parameters(), lr=1e-6, fused=fused))
        return models[kind]

    for name in names:
        if name in OURS:
            backend, _, mode = name.partition("+")
            if mode == "cudagraphs" and device.type != "cuda":
                say(f"{name}: skipped: CUDA graphs need CUDA")
                continue
            try:
                attn.check_device(backend, device, training=True)
            except ValueError as e:
                say(f"{name}: skipped: {e}")
                continue
            kind, batches = "ours", [{k: v.to(device) for k, v in packed_rows(s, S).items()} for s in steps]
        else:
            if HF[name] == "flash_attention_2" and not _has_flash_attn():
                say(f"{name}: skipped: the flash-attn package is not installed")
                continue
            if HF[name] == "flex_attention" and device.type != "cuda":
                say(f"{name}: skipped: FlexAttention is measured on CUDA only")
                continue
            kind, batches = "hf", [{k: v.to(device) for k, v in flattened_rows(s).items()} for s in steps]
        out.append(Variant(name, *model_of(kind), batches, device, precision, loss_chunk if kind == "ours" else None))
    return out, steps, model_of("hf")[0]


def _has_flash_attn() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--model", choices=sorted(MODELS), default="1b")
    parser.add_argument("--pack-length", type=at_least(1), nargs="+", default=[8192, 32768])
    parser.add_argument("--variants", nargs="+", choices=[*OURS, *HF], default=["varlen", "flex", "hf-sdpa",
                                                                                "hf-flex", "hf-flash"])
    parser.add_argument("--micro-batch", type=at_least(1), default=1,
                        help="packs a step (HF: their documents in one row)")
    parser.add_argument("--steps", type=at_least(1), default=4, help="steps a round, each on its own packs")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="rounds (the first is warm-up)")
    parser.add_argument("--sequences", type=at_least(1), default=100_000, help="long-context lengths packed per case")
    parser.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                        help="default: bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--loss-chunk", type=at_least(1), default=None, metavar="TOKENS",
                        help="our variants compute the LM head and the loss this many tokens at a time "
                             "(model.loss_chunk_tokens), never the whole float32 logits")
    parser.add_argument("--json", default=None, help="write one JSON object per pack length and variant")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("need --rounds >= 2 (the first is warm-up)")
    parser.check_output(args.json, "--json", is_benchmark_json)  # before anything is measured
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    peak = peak_flops(device, precision)
    say = print
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(f"device {gpu}, torch {torch.__version__}, {precision}, model {args.model}, peak "
        f"{'n/a' if peak is None else f'{peak / 1e12:.1f} TFLOP/s (dense bf16)'}")
    rows = []
    for S in args.pack_length:
        packs, result = draw_packs(S, args.sequences, args.micro_batch * args.steps, args.seed)
        config = llama_config(args.model, S)
        torch.manual_seed(args.seed)
        state = PackedLlamaForCausalLM(config, "mask").state_dict()
        say(f"\npack length {S:,}: {result.sequences:,} lengths packed by LPFHP into {result.packs:,} packs "
            f"(efficiency {result.efficiency:.1%}, {result.packing_factor:.2f} documents a pack); "
            f"{sum(p.numel() for p in state.values()) / 1e6:,.1f} M parameters")
        variants, steps, hf_model = build_variants(args.variants, config, state, packs, S, args.micro_batch, device,
                                                precision, say, args.loss_chunk)
        del state
        doc_lengths = [[len(d) for docs in s for d in docs] for s in steps]
        flops = statistics.mean(useful_flops(config, lengths) for lengths in doc_lengths)
        tokens = statistics.mean(sum(lengths) for lengths in doc_lengths)
        first, reference, tolerance = first_losses(variants, hf_model, [d for docs in steps[0] for d in docs],
                                                   precision)
        say(f"loss check: reference {reference:.6f} (transformers, each document alone, float32), tolerance "
            f"{tolerance:.2e}")
        for r in range(args.rounds):
            for v in variants:
                if v.error:
                    continue
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    seconds = [v.step(b) for b in v.batches]
                except torch.OutOfMemoryError:
                    v.error = "out of memory"
                    v.opt.zero_grad(set_to_none=True)
                    _free(device)
                    continue
                except Exception as e:  # a kernel or compiler failure: reported in its row, the others go on
                    v.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    v.opt.zero_grad(set_to_none=True)
                    say(f"{v.name}: failed: {v.error}")
                    continue
                if r:
                    v.seconds += seconds
                    if device.type == "cuda":
                        v.peak = max(v.peak or 0, torch.cuda.max_memory_allocated(device))
            say(f"round {r + 1}/{args.rounds} done{' (warm-up)' if r == 0 else ''}")
        say(f"{'variant':<18} {'loss':>8} {'step ms':>9} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9}  note")
        for v in variants:
            loss = first.get(v.name)
            off = loss is not None and abs(loss - reference) > tolerance
            row = {"pack_length": S, "variant": v.name, "model": args.model, "precision": precision, "device": gpu,
                   "torch": torch.__version__, "first_loss": loss, "reference_loss": reference,
                   "loss_tolerance": tolerance, "loss_off": bool(off), "error": v.error,
                   "tokens_per_step": tokens, "flops_per_step": flops, "step_ms_median": None,
                   "tokens_per_second": None, "mfu": None, "peak_memory_bytes": v.peak,
                   "step_ms": [s * 1e3 for s in v.seconds]}
            if v.seconds:
                median = statistics.median(v.seconds)
                row.update(step_ms_median=median * 1e3, tokens_per_second=tokens / median,
                           mfu=None if peak is None else flops / median / peak)
            rows.append(row)
            cells = ["-" if loss is None else f"{loss:.4f}",
                     "-" if row["step_ms_median"] is None else f"{row['step_ms_median']:.1f}",
                     "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:,.0f}",
                     "-" if row["mfu"] is None else f"{row['mfu']:.1%}",
                     "-" if v.peak is None else f"{v.peak / 2**30:.1f}"]
            note = v.error or ("LOSS DIFFERS from the reference beyond the tolerance" if off else "")
            say(f"{v.name:<18} {cells[0]:>8} {cells[1]:>9} {cells[2]:>10} {cells[3]:>6} {cells[4]:>9}  {note}")
        best_hf = max((r for r in rows if r["pack_length"] == S and r["variant"].startswith("hf-")
                       and r["tokens_per_second"]), key=lambda r: r["tokens_per_second"], default=None)
        if best_hf:
            for r in rows:
                if r["pack_length"] == S and r["variant"] in OURS and r["tokens_per_second"]:
                    say(f"{r['variant']}: {r['tokens_per_second'] / best_hf['tokens_per_second']:.3f}x the tokens/s "
                        f"of the fastest Hugging Face path ({best_hf['variant']})")
        del variants
        _free(device)
    if args.json:
        write_rows(args.json, rows, "llama_long_context.py")
    nothing = rows and not any(r["tokens_per_second"] for r in rows)  # (every variant failed: it exited 0)
    if nothing:
        say("every variant failed: nothing was measured")
    return 1 if nothing or any(r["loss_off"] for r in rows) else 0


def unpacked_loss(model, docs: list[np.ndarray], device, precision: str) -> float:
    """The mean next-token cross-entropy of transformers' model over `docs`, each run alone (no packing)."""
    total, count = 0.0, 0
    for doc in docs:
        ids = torch.from_numpy(doc)[None].to(device)
        with autocast(device, precision):
            logits = model(input_ids=ids, use_cache=False).logits
        total += float(F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="sum"))
        count += len(doc) - 1
    return total / count


def first_losses(variants, hf_model, docs, precision):
    """({variant: its first step's loss}, the reference, the tolerance), computed without updating. The
    reference is `unpacked_loss` in float32; in bf16 the tolerance is twice that of Hugging Face's own unpacked
    bf16 run (at least the float32 tolerance). A variant that runs out of memory here is marked so."""
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        reference = unpacked_loss(hf_model, docs, device, "fp32")
        tolerance = FP32_TOLERANCE * abs(reference)
        if precision != "fp32":
            tolerance = max(tolerance, 2 * abs(unpacked_loss(hf_model, docs, device, precision) - reference))
        first = {}
        for v in variants:
            try:
                first[v.name] = float(v.loss(v.batches[0]))
            except torch.OutOfMemoryError:
                v.error = "out of memory"
                _free(v.device)
            except Exception as e:  # reported in its row; the other variants go on
                v.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return first, reference, tolerance


def _free(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
