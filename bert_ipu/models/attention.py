"""Attention over packs without cross-contamination: the backends, a registry by name.

    attention = attention_for(sequence_ids, "mask", dtype=torch.float32, causal=False)   # once per forward
    out = attention(q, k, v, dropout_p=0.1)     # in every layer: (B, heads, S, D) -> (B, heads, S, D)

Keys and values may have fewer heads than queries (grouped-query attention): each key/value head serves
heads / kv_heads consecutive query heads.

A token attends only to the tokens of its own sequence (`sequence_ids`: 1..k per sequence, 0 = padding); with
`causal` (decoders) only to those at or before it. Every backend computes the same numbers; they differ in
speed, in where they run and in what they need of the layout:

    mask       the custom op's additive (B, 1, S, S) mask + SDPA (default; built by `make`; a CPU backward)
    reference  the same mask built with plain PyTorch ops (no custom op needed)
    flex       FlexAttention with a document block mask, compiled on GPU, where it skips fully masked blocks:
               blocks of one sequence only exist where its tokens are contiguous, so a model whose layout
               scatters them permutes each pack as for varlen. Forward only on the CPU (PyTorch has no
               FlexAttention backward there)
    varlen     CUDA only: flash attention over cumulative sequence lengths (`aten._flash_attention_forward`,
               with its attention dropout), half precision. It needs every sequence's tokens contiguous
               (`Backend.contiguous`): a model whose layout scatters them (BERT pretraining's MLM-first /
               [CLS]-last) permutes each pack once with `contiguous_order` and back

flex applies no attention-probability dropout (its kernel has none); training with it set warns once. varlen
applies it (flash attention's own dropout). Adding a backend is one `register(Backend(...))`: its name then
works in every config, model and profile (`BACKENDS` is the one list of names).

Sequence parallelism (DeepSpeed-Ulysses) wraps any backend from outside the model: `sequence_parallel(group)`
makes `attention_for` gather the row's sequence ids over the group and return a `UlyssesAttention`, which
turns "this rank's tokens, all heads" into "all tokens, this rank's heads" with one all-to-all, attends over
whole packs with the inner backend's document mask, and turns the result back with a second all-to-all. No
document is padded or aligned to the split: a document may straddle the ranks.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..ops import packed_attention_mask, reference_packed_attention_mask


@dataclass(frozen=True)
class Backend:
    """An attention backend: `build(sequence_ids, dtype, causal, slots)` makes what every layer calls as
    `attention(q, k, v, dropout_p, scale)`."""
    name: str
    build: Callable
    cuda_only: bool = False       # no kernel off CUDA
    cpu_backward: bool = True     # trains on the CPU (flex: forward only there)
    contiguous: bool = False      # wants each sequence's tokens contiguous, in id order, then padding: needs them
                                  # (varlen), or skips masked blocks only then (flex)
    skips_masked: bool = False    # on CUDA its time grows with each document's square, not the whole pack's
    half_only: bool = False       # computes in float16 / bfloat16 only (flash attention): needs autocast
    dropout: bool = True          # applies attention-probability dropout (flex's kernel has none)
    summary: str = ""


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def backend(name: str) -> Backend:
    """The backend called `name`; a ValueError naming the choices for any other name."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)}")
    return BACKENDS[name]


FLEX_MIN_HEAD_DIM = 16
"""compiled FlexAttention's smallest head dimension on CUDA (its Triton kernel: "NYI: embedding dimension of the
query, key, and value must be at least 16")"""
FLASH_HEAD_DIMS = (8, 256)
"""flash attention's head dimensions: a multiple of 8, at most 256"""


def check_head_dim(name: str, head_dim: int, device: torch.device | str) -> None:
    """A ValueError (one line, naming the head dimension and the backends that work) where the backend's kernel
    cannot take the model's head dimension on `device`: flex below 16 on CUDA, varlen outside flash attention's."""
    kind = torch.device(device).type
    if name == "flex" and kind == "cuda" and head_dim < FLEX_MIN_HEAD_DIM:
        raise ValueError(f"attention backend flex on CUDA needs a head dimension of at least {FLEX_MIN_HEAD_DIM} "
                         f"(compiled FlexAttention), and this model's is {head_dim}; use mask or reference")
    step, most = FLASH_HEAD_DIMS
    if name == "varlen" and (head_dim % step or head_dim > most):
        raise ValueError(f"attention backend varlen (flash attention) takes head dimensions that are multiples of "
                         f"{step} up to {most}, and this model's is {head_dim}; use mask, reference or flex")


def check_flex_dtype(dtype: torch.dtype, device: torch.device | str) -> None:
    """A ValueError (one line) for float64 on CUDA, where compiled FlexAttention's Triton kernel fails to build
    (an inductor traceback, seen on an H200); a plain function so that the CPU tests assert the contract."""
    if torch.device(device).type == "cuda" and dtype == torch.float64:
        raise ValueError("attention backend flex on CUDA has no float64 kernel (compiled FlexAttention's Triton "
                         "kernel fails to build); use float32 or bf16, or the mask or reference backend")


def model_attention_dropout(config) -> float:
    """The attention-probability dropout of a `transformers` config (BERT's attention_probs_dropout_prob, Llama's
    attention_dropout, GPT-2's attn_pdrop; 0 where it has none)."""
    for key in ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop"):
        if getattr(config, key, None) is not None:
            return float(getattr(config, key))
    return 0.0


def check_dropout(name: str, p: float) -> None:
    """Warn once (a RuntimeWarning) where training with backend `name` would drop attention dropout `p`: the
    trainer's check at model build, since inside a compiled step the backend cannot warn (a warning there is a
    graph break in every layer)."""
    if p > 0 and not backend(name).dropout:
        warn_no_attention_dropout(p)


def model_head_dim(config) -> int:
    """The attention head dimension of a `transformers` config (its head_dim, or hidden size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_device(name: str, device: torch.device | str, training: bool = True) -> None:
    """The one device check of a backend: a ValueError (one line, naming the fix) where it cannot run: varlen
    off CUDA (unless a test put in the reference kernel), flex training off CUDA (no backward there)."""
    b, kind = backend(name), torch.device(device).type
    if b.cuda_only and kind != "cuda" and VARLEN_KERNEL is None:
        raise ValueError(f"attention backend {name} needs CUDA (flash attention), and this run is on {kind}; "
                         f"use {' or '.join(n for n, x in BACKENDS.items() if x.cpu_backward and not x.cuda_only)}")
    if training and not b.cpu_backward and kind != "cuda":
        raise ValueError(f"attention backend {name} has no backward on {kind} (PyTorch's FlexAttention trains on "
                         f"CUDA only); train with "
                         f"{' or '.join(n for n, x in BACKENDS.items() if x.cpu_backward and not x.cuda_only)}, "
                         f"or use {name} for evaluation only (--eval-only, in the tasks that have it)")


def attention_for(sequence_ids: torch.Tensor, name: str, dtype: torch.dtype, causal: bool = False,
                  slots: int | None = None):
    """What every layer attends with, for packs laid out by `sequence_ids` (B, S). `slots` (K, the most
    sequences a pack holds) sizes varlen's segments (which refuses None). Under `sequence_parallel`,
    `sequence_ids` is this rank's share of every row, and the attention covers whole rows."""
    if _COUNTING is not None:
        return CountingAttention(causal, _COUNTING)
    group = _SEQUENCE_GROUP
    if group is not None:
        sequence_ids = gather_tokens(sequence_ids, group)
    inner = backend(name).build(sequence_ids, dtype, causal, slots)
    return inner if group is None else UlyssesAttention(inner, group)


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, kv_heads, S, D) -> (B, heads, S, D): grouped-query attention's shared keys/values, each key/value head
    serving heads / kv_heads consecutive query heads."""
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


# --- mask + SDPA -------------------------------------------------------------------------------------------

class MaskAttention:
    """SDPA with an additive (B, 1, S, S) mask: 0 within a sequence, the dtype's lowest value elsewhere."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask

    def __call__(self, q, k, v, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask.to(q.dtype), dropout_p=dropout_p,
                                              scale=scale)


register(Backend("mask", lambda ids, dtype, causal, slots: MaskAttention(packed_attention_mask(ids, dtype, causal)),
                 summary="the custom op's additive mask + SDPA"))
register(Backend("reference",
                 lambda ids, dtype, causal, slots: MaskAttention(reference_packed_attention_mask(ids, dtype, causal)),
                 summary="the same mask in plain PyTorch"))


# --- flex --------------------------------------------------------------------------------------------------

@functools.cache
def _flex_attention(device: torch.device):
    """FlexAttention, compiled on GPU (its fused kernel skips fully masked blocks; eager flex is a slow
    reference); eager on the CPU, where the compiled kernel has no backward either."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_attention


@functools.cache
def warn_no_attention_dropout(p: float) -> None:
    import warnings

    warnings.warn(f"attention dropout {p} is not applied by the flex attention backend (its kernel has none); use "
                  "mask, reference or varlen to train with it, or set it to 0", RuntimeWarning, stacklevel=3)


class FlexAttention:
    """FlexAttention with a document (or document-causal) block mask."""

    def __init__(self, sequence_ids: torch.Tensor, causal: bool):
        from torch.nn.attention.flex_attention import create_block_mask

        def same_sequence(b, h, q, kv):
            return sequence_ids[b, q] == sequence_ids[b, kv]

        def same_sequence_causal(b, h, q, kv):
            return (sequence_ids[b, q] == sequence_ids[b, kv]) & (kv <= q)

        B, S = sequence_ids.shape
        self.block_mask = create_block_mask(same_sequence_causal if causal else same_sequence, B, None, S, S,
                                            device=sequence_ids.device, _compile=sequence_ids.device.type == "cuda")

    def __call__(self, q, k, v, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()
        if dropout_p > 0 and not compiling:  # (a warning inside a compiled step is a graph break in every layer)
            warn_no_attention_dropout(dropout_p)
        check_head_dim("flex", q.shape[-1], q.device)  # before inductor's traceback
        check_flex_dtype(q.dtype, q.device)
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        if compiling:  # a compiled step compiles it with everything else
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention(q, k, v, block_mask=self.block_mask, scale=scale)
        return _flex_attention(q.device)(q, k, v, block_mask=self.block_mask, scale=scale)


register(Backend("flex", lambda ids, dtype, causal, slots: FlexAttention(ids, causal), cpu_backward=False,
                 skips_masked=True, contiguous=True, dropout=False,
                 summary="FlexAttention with a document block mask (compiled on GPU)"))


# --- varlen ------------------------------------------------------------------------------------------------

class Varlen:
    """Variable-length attention's view of a batch of packs whose sequences are contiguous, in id order 1..K
    and then the row's padding: every slot's sequence and each row's padding run as one segment of the
    flattened (B * S) tokens, from cumulative lengths of fixed size B * (K + 1) + 1 (empty slots are segments
    of length 0), so the shapes stay static. `causal`: attention within a segment only to earlier tokens.

    K (`slots`) is the most sequences a pack of the data holds, not the pack length: the kernel's work grows
    with the segments (each launches over `max_len`, empty or not), so B * (K + 1) segments of a pack's
    documents, not B * (S + 1) of which nearly all are empty (8,193 a row at 8K: 13x slower, measured)."""

    def __init__(self, sequence_ids: torch.Tensor, slots: int, causal: bool = False):
        B, S = sequence_ids.shape
        ones = torch.ones_like(sequence_ids, dtype=torch.int32)
        counts = torch.zeros(B, slots + 1, dtype=torch.int32, device=sequence_ids.device).scatter_add_(
            1, sequence_ids.long(), ones)                          # (B, K + 1): padding, slot 1..K
        lengths = torch.cat([counts[:, 1:], counts[:, :1]], 1).flatten()  # slots, then the padding run
        self.cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        self.max_len = S
        self.causal = causal

    def __call__(self, q, k, v, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
        return varlen_attention(q, k, v, self, dropout_p, scale)


def _build_varlen(sequence_ids, dtype, causal, slots):
    check_device("varlen", sequence_ids.device, training=False)
    if slots is None:
        raise ValueError("attention backend varlen sizes its segments by the most sequences a pack holds: give the "
                         "model max_sequences_per_pack (the data's depth), or use another backend")
    return Varlen(sequence_ids, slots, causal)


register(Backend("varlen", _build_varlen, cuda_only=True, contiguous=True, skips_masked=True, half_only=True,
                 summary="flash attention over cumulative sequence lengths (CUDA)"))


def flash_varlen(q, k, v, cu, max_len: int, *, dropout_p: float = 0.0, causal: bool = False,
                 scale: float | None = None) -> torch.Tensor:
    """Flash attention over cumulative lengths `cu` (int32), CUDA only: (T, H, D) queries and (T, H_kv, D) keys
    and values, H_kv dividing H (grouped-query attention in the kernel), half precision -> (T, H, D).

    torch's own op (`aten._flash_attention_forward`, what SDPA's flash path and `varlen_attn` call): it applies
    attention-probability dropout, which `torch.nn.attention.varlen.varlen_attn` does not take, and replays the
    same dropout in its backward from the RNG state it returns; it has autograd, a meta function and an
    inductor fallback, so a compiled step keeps it whole."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, dropout_p, causal, False,
                                                   scale=scale)[0]


# The varlen kernel, called as `kernel(q, k, v, cu, max_len, dropout_p=, causal=, scale=)`: None = `flash_varlen`
# (CUDA only); the CPU tests set a `FlashStandIn`, which refuses what flash attention refuses and records what it
# is given.
VARLEN_KERNEL = None

HALF = (torch.float16, torch.bfloat16)


# the device types with autocast, asked once at import (not in a forward: see compute_dtype)
AUTOCAST_DEVICES = tuple(kind for kind in ("cpu", "cuda", "xpu", "mps", "hpu")
                         if torch.amp.is_autocast_available(kind))


def compute_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The dtype a forward computes in on `device`: autocast's where it is on, else `default` (the meta device,
    where FLOPs are counted, has no autocast). Without `torch.amp.is_autocast_available`: torch 2.11's dynamo
    cannot trace it, and the graph break it made in every layer of a compiled step cost varlen a quarter of a
    BERT-large layer's time on an H200 (docs/results/gpu.md); `is_autocast_enabled` and `get_autocast_dtype` it
    folds into constants."""
    kind = torch.device(device).type
    if kind not in AUTOCAST_DEVICES:
        return default
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else default


def varlen_dtype(q: torch.Tensor) -> torch.dtype:
    """What flash attention computes in: the autocast dtype when autocast is on (q and k may leave it: RoPE
    computes in float32, as transformers' flash path knows), else the inputs' own. A ValueError, one line, when
    that is not half precision: flash attention has no float32 kernel."""
    dtype = compute_dtype(q.device, q.dtype)
    if dtype not in HALF:
        raise ValueError(f"attention backend varlen (flash attention) computes in float16 or bfloat16, and this "
                         f"forward runs in {dtype}; train with train.precision=bf16 (autocast), or use another "
                         "backend")
    return dtype


def varlen_attention(q, k, v, attention: Varlen, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """(B, heads, S, D) queries and (B, kv_heads, S, D) keys, values -> (B, heads, S, D), attending within the
    segments of `attention` (tokens in sequence order: see `contiguous_order`), with attention-probability
    dropout `dropout_p`. The inputs go to the kernel as (B * S, heads, D) in the autocast dtype: one copy where a
    tensor is in another dtype or layout (RoPE's float32 q and k), none for a projection's (B, S, heads, D)
    output; keys and values keep their fewer heads (the kernel takes grouped-query attention)."""
    B, H, S, D = q.shape
    if H % k.shape[1]:
        raise ValueError(f"varlen attention: {k.shape[1]} key/value heads do not divide {H} query heads; give the "
                         "model a num_key_value_heads that divides num_attention_heads")
    dtype = varlen_dtype(q)
    kernel = flash_varlen if VARLEN_KERNEL is None else VARLEN_KERNEL
    flat = [tokens_major(x, dtype).view(B * S, x.shape[1], D) for x in (q, k, v)]
    out = kernel(*flat, attention.cu, attention.max_len, dropout_p=dropout_p, causal=attention.causal, scale=scale)
    return out.view(B, S, H, D).transpose(1, 2)


def tokens_major(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, heads, S, D) -> a contiguous (B, S, heads, D) in `dtype`: the tensor itself where it already is one (a
    projection's output viewed as heads), else one copy that casts and transposes at once."""
    y = x.transpose(1, 2)
    if y.dtype == dtype and y.is_contiguous():
        return y
    return torch.empty(y.shape, dtype=dtype, device=y.device).copy_(y)


def reference_varlen_attn(q, k, v, cu, max_len, *, dropout_p=0.0, causal=False, scale=None):
    """What `flash_varlen` computes, in plain PyTorch (SDPA with a block-diagonal mask over the flattened tokens;
    its dropout is drawn from torch's generator, not flash attention's, so only its statistics match). (T, H, D)
    queries, (T, H_kv, D) keys and values -> (T, H, D)."""
    T = q.shape[0]
    segment = torch.searchsorted(cu[1:].long(), torch.arange(T, device=q.device), right=True)
    allowed = segment[:, None] == segment[None, :]
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), attn_mask=allowed,
                                         dropout_p=dropout_p, scale=scale)
    return out[0].transpose(0, 1)


class FlashStandIn:
    """A strict CPU stand-in for flash attention's varlen kernel (`VARLEN_KERNEL`): it refuses what the CUDA
    kernel refuses, with the kernel's words (float32 or float64 inputs, mixed dtypes, head dimensions it has no
    kernel for, key/value heads that do not divide the query heads, int64 or unsorted cumulative lengths, a
    `max_len` shorter than a segment, which flash attention would silently cut, a dropout outside [0, 1)),
    records what it is handed (`calls`: dtype, heads, segments, max_len, tokens, dropout), and computes what it
    computes: float32 accumulation of half-precision inputs, the output in their dtype. So CI fails where the
    GPU would."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, q, k, v, cu, max_len, *, dropout_p=0.0, causal=False, scale=None):
        if q.dtype not in HALF or k.dtype != q.dtype or v.dtype != q.dtype:
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        D = q.shape[-1]
        if D % FLASH_HEAD_DIMS[0] or D > FLASH_HEAD_DIMS[1]:
            raise RuntimeError(f"FlashAttention forward only supports head dimension at most 256 (a multiple of 8), "
                               f"got {D}")
        if q.shape[1] % k.shape[1] or v.shape[1] != k.shape[1]:
            raise RuntimeError("Number of heads in key/value must divide number of heads in query")
        if cu.dtype != torch.int32:
            raise RuntimeError("cu_seqlens_q must have dtype int32")
        if not 0.0 <= dropout_p < 1.0:
            raise RuntimeError(f"dropout probability has to be in [0, 1), got {dropout_p}")
        lengths = cu.diff()
        if (lengths < 0).any() or int(cu[-1]) != q.shape[0]:
            raise RuntimeError("cu_seqlens_q must be non-decreasing and end at the number of tokens")
        if int(lengths.max()) > max_len:
            raise RuntimeError(f"a segment of {int(lengths.max())} tokens is longer than max_seqlen_q {max_len}: "
                               "flash attention would attend over its first max_seqlen_q tokens only")
        self.calls.append({"dtype": q.dtype, "heads": q.shape[1], "kv_heads": k.shape[1], "head_dim": D,
                           "segments": len(cu) - 1, "nonempty": int((lengths > 0).sum()), "max_len": max_len,
                           "tokens": q.shape[0], "dropout_p": dropout_p})
        out = reference_varlen_attn(q.float(), k.float(), v.float(), cu, max_len, dropout_p=dropout_p,
                                    causal=causal, scale=scale)
        return out.to(q.dtype)


def contiguous_order(sequence_ids: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) permutations: `order` puts each pack's tokens in sequence order (ids 1..slots, then padding;
    stable, so a sequence keeps its tokens' order) and `inverse` undoes it."""
    key = torch.where(sequence_ids > 0, sequence_ids.long(), slots + 1)
    order = torch.argsort(key, dim=1, stable=True)
    return order, torch.argsort(order, dim=1)


def take(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden (B, S, H) with its tokens reordered by index (B, S)."""
    return hidden.gather(1, index[..., None].expand_as(hidden))


# --- counting FLOPs (bert_ipu/engine/flops.py) ---------------------------------------------------------------

_COUNTING = None  # while `counting` is on: the list every attention call's geometry is appended to


class CountingAttention:
    """What every layer attends with while FLOPs are counted: no matrix product (its FLOPs are added from the
    documents instead), gradients still flowing to q, k and v (so their projections' backward is counted), and
    each call's geometry recorded: (heads, head dimension, causal)."""

    def __init__(self, causal: bool, calls: list):
        self.causal, self.calls = causal, calls

    def __call__(self, q, k, v, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
        self.calls.append((q.shape[1], q.shape[-1], self.causal))
        return q + repeat_kv(k, q.shape[1]) + repeat_kv(v, q.shape[1])


@contextmanager
def counting(calls: list):
    """Within this context `attention_for` returns `CountingAttention`s that append to `calls`."""
    global _COUNTING
    saved, _COUNTING = _COUNTING, calls
    try:
        yield calls
    finally:
        _COUNTING = saved


# --- sequence parallelism (DeepSpeed-Ulysses) ----------------------------------------------------------------

_SEQUENCE_GROUP = None  # the process group of this rank's sequence-parallel ranks, while sequence_parallel is on


@contextmanager
def sequence_parallel(group):
    """Within this context every `attention_for` spans the ranks of `group` (None: no sequence parallelism),
    each holding an equal, contiguous share of every row's tokens in rank order (bert_ipu/engine/parallel.py
    splits the rows and turns it on around the forward and backward passes)."""
    global _SEQUENCE_GROUP
    saved, _SEQUENCE_GROUP = _SEQUENCE_GROUP, group
    try:
        yield
    finally:
        _SEQUENCE_GROUP = saved


def sequence_parallel_on() -> bool:
    """Whether a `sequence_parallel` context with a group is on (attention spans the ranks of a row)."""
    return _SEQUENCE_GROUP is not None


def gather_tokens(x: torch.Tensor, group) -> torch.Tensor:
    """(B, T) of every rank of `group` -> (B, T x ranks), in rank order (no gradient: ids only)."""
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def heads_to_tokens(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H, T, D) with this rank's T tokens and all H heads -> (B, H / n, T x n, D) with every rank's tokens
    and this rank's n-th of the heads: one all-to-all (differentiable: its backward is the reverse all-to-all)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    n = group.size()
    B, H, T, D = x.shape
    chunks = x.reshape(B, n, H // n, T, D).transpose(0, 1).contiguous()          # (n, B, H/n, T, D): chunk j -> j
    got = all_to_all_single_autograd(chunks.flatten(0, 1), None, None, group)    # chunk i <- rank i's tokens
    return got.reshape(n, B, H // n, T, D).permute(1, 2, 0, 3, 4).reshape(B, H // n, n * T, D)


def tokens_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse of `heads_to_tokens`: (B, H / n, T x n, D) -> (B, H, T, D)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    n = group.size()
    B, h, L, D = x.shape
    T = L // n
    chunks = x.reshape(B, h, n, T, D).permute(2, 0, 1, 3, 4).contiguous()        # (n, B, H/n, T, D): tokens of i
    got = all_to_all_single_autograd(chunks.flatten(0, 1), None, None, group)    # chunk j <- rank j's heads
    return got.reshape(n, B, h, T, D).transpose(0, 1).reshape(B, n * h, T, D)


class UlyssesAttention:
    """Sequence parallelism over `group` around an inner attention built for whole rows (see the module
    docstring). Heads and key/value heads must divide by the group's size (checked by the engine up front)."""

    def __init__(self, inner, group):
        self.inner, self.group = inner, group

    def __call__(self, q, k, v, dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
        q, k, v = (heads_to_tokens(x, self.group) for x in (q, k, v))
        return tokens_to_heads(self.inner(q, k, v, dropout_p, scale), self.group)
