"""The FLOPs of a training step, counted without running it, for MFU (model FLOPs utilisation).

    flops = StepFlops(model, loss_of)          # loss_of(model, batch) -> the loss to differentiate
    per_micro_batch = flops.of(batch)          # a dict of CPU tensors: forward + backward FLOPs
    mfu = flops_per_second / peak_flops(device, "bf16")

Everything but attention is counted once per batch shape by `torch.utils.flop_counter` on a twin of the model on
the meta device (no memory, no kernels: it works for any backend, flex included, whose compiled kernel the
counter cannot see through), with attention replaced by `models.attention.CountingAttention`, which costs
nothing and records each call's heads, head dimension and causality. Attention is then added from the documents
of each micro-batch: 4 x D FLOPs per (query, key) pair of the same document forward (QK^T and PV), twice that
backward; bidirectional: L^2 pairs a document of L tokens, causal: L (L + 1) / 2. These are the useful FLOPs: a
backend that computes the whole pack's S x S scores (mask) does more work than it is credited with, one that
skips the masked blocks (flex, varlen) about what it is credited with; every backend is credited the same for
the same batch, so MFU compares them.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from ..models.losses import HiddenStates

# dense bf16 tensor-core peaks (FLOP/s) of the GPUs this project measures on, from NVIDIA's data sheets
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's bf16 peak when known (for MFU); None on the CPU, in fp32, or on an unlisted GPU."""
    if device.type != "cuda" or precision != "bf16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def meta_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` on the meta device (parameters and buffers without storage; tied weights stay tied),
    made without copying a byte of the original."""
    memo = {}
    for p in model.parameters():
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo.setdefault(id(b), torch.empty_like(b, device="meta"))
    twin = copy.deepcopy(model, memo)
    for module in twin.modules():  # an instance forward (activation checkpointing, engine.parallel) would count
        if "forward" in vars(module):  # its layer's forward twice: the model's FLOPs are the class forward's
            del module.forward
    return twin


def document_pairs(sequence_ids: torch.Tensor, causal: bool) -> float:
    """(query, key) pairs within the documents of a batch of rows (B, S), ids 1..k per document, 0 = padding."""
    ids = torch.as_tensor(sequence_ids).long()
    counts = torch.zeros(ids.shape[0], int(ids.max()) + 1, dtype=torch.float64).scatter_add_(
        1, ids.cpu(), torch.ones(ids.shape, dtype=torch.float64))[:, 1:]
    return float((counts * (counts + 1) / 2).sum() if causal else (counts ** 2).sum())


def output_tensors(out) -> list[torch.Tensor]:
    """The floating-point tensors of a model's output (a tensor, a tuple, a dataclass or a dict of them)."""
    if isinstance(out, HiddenStates):  # a head applied in the loss: its matrix product counts
        return [torch.nn.functional.linear(out.hidden, out.head_weight)]
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if dataclasses.is_dataclass(out):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    elif isinstance(out, dict):
        out = list(out.values())
    return [t for x in (out if isinstance(out, (tuple, list)) else []) for t in output_tensors(x)]


class StepFlops:
    """Forward and backward FLOPs of a micro-batch of `model` (see the module docstring); `loss_of(model, batch)`
    runs the model and its loss on a batch (meta tensors when counting)."""

    def __init__(self, model: torch.nn.Module, loss_of):
        self.model, self.loss_of = model, loss_of
        self.dense: dict[tuple, tuple[float, list]] = {}  # batch shape -> (FLOPs without attention, its calls)

    def _count(self, batch: dict) -> tuple[float, list]:
        from torch.utils.flop_counter import FlopCounterMode

        from ..models.attention import counting

        twin = meta_twin(self.model)
        calls: list = []
        with counting(calls), FlopCounterMode(display=False) as counter:
            self.loss_of(twin, {k: torch.as_tensor(v).to("meta") for k, v in batch.items()}).backward()
        return float(counter.get_total_flops()), calls

    def of(self, batch: dict) -> float:
        """The FLOPs of one forward and backward pass of `batch` (a dict of CPU tensors or arrays with
        `sequence_ids`)."""
        key = tuple((k, tuple(torch.as_tensor(v).shape)) for k, v in sorted(batch.items()))
        if key not in self.dense:
            self.dense[key] = self._count(batch)
        dense, calls = self.dense[key]
        pairs = {causal: document_pairs(batch["sequence_ids"], causal) for causal in {c for _, _, c in calls}}
        return dense + sum(3 * 4 * heads * dim * pairs[causal] for heads, dim, causal in calls)
