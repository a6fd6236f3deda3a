"""Tensor parallelism (Megatron-style) on PyTorch's distributed tensors: a plan of module paths, applied from
outside the unchanged model, as torchtitan does.

    plan = TensorPlan(colwise=("bert.encoder.layer.*.attention.self.query", ...), rowwise=(...),
                      vocab_embedding="bert.embeddings.word_embeddings", vocab_output="cls.predictions.decoder")
    parallelize(model, tp_mesh, plan, seed)      # in place; every parameter becomes a DTensor

What each module becomes (`torch.distributed.tensor.parallel`):
- `colwise` (query/key/value, the first MLP projection): ColwiseParallel, weight split along its outputs; the
  attention between them runs on this rank's heads, as plain tensors;
- `rowwise` (attention output, second MLP projection): RowwiseParallel, weight split along its inputs, output
  all-reduced: one all-reduce per block forward and one backward, Megatron's f and g;
- `vocab_embedding`: the word embeddings split along the vocabulary (RowwiseParallel of an Embedding: a token
  outside this rank's rows looks up zeros, the output is all-reduced);
- `vocab_output`: the (tied) output layer split along the vocabulary; its logits stay sharded (a DTensor,
  Shard(-1)) and the cross-entropy over them runs under `loss_parallel()` (Megatron's parallel cross-entropy:
  a max and a sum all-reduced, never the full logits). A vocabulary that does not divide by the
  tensor-parallel size is split unevenly (DTensor pads internally), so nothing is padded and no padding
  row can ever be predicted;
- everything else (embeddings of positions and types, LayerNorms, pooler, NSP/QA/classification heads):
  replicated, a DTensor with placement Replicate whose inputs and outputs are plain tensors; each rank
  computes the same values and the same gradients, no communication.

Every parameter is a DTensor, so an optimizer or a norm sees each parameter whole: `torch.linalg.vector_norm`
of a sharded parameter is its full norm (LAMB's trust ratio, engine/optim.py), `clip_grad_norm_` clips by the
global norm. Tied weights stay tied (the embedding and the decoder share one sharded parameter).

Dropout, as Megatron: in the replicated regions every tensor-parallel rank draws the same mask (they share the
seed and consume the generator alike, so replicated activations stay equal); inside the modules named in
`rng_region` (the attention cores, where each rank holds other heads) a rank draws from a generator of its own,
one for the whole (stage of the) model, advancing from layer to layer, seeded `seed + 2718 + tp_rank`
(Megatron's model-parallel seed; the engine adds 100 x the pipeline stage to `seed`), so heads on different
ranks and different layers get independent masks. `region_generator(model)` is that generator, whose state
the checkpoints keep.
"""

from __future__ import annotations

import fnmatch
from contextlib import nullcontext

import torch
from torch import nn

from ..models.losses import whole as full  # the whole tensor on this rank: an all-gather for a shard
from ..models.plans import TensorPlan


def is_distributed(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (the tensor itself when it is not distributed)."""
    return t.to_local() if is_distributed(t) else t


def like(value: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor) distributed as `template` is: this rank keeps its slice, no communication."""
    if not is_distributed(template):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value, template.device_mesh, template.placements, src_data_rank=None)


def loss_context(tensor_parallel: int):
    """The context in which a loss over vocabulary-sharded logits, and its backward, run."""
    if tensor_parallel == 1:
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _matching(model: nn.Module, pattern: str) -> list[str]:
    return [name for name, _ in model.named_modules() if name and fnmatch.fnmatchcase(name, pattern)]


class _RankGenerator:
    """Forward hooks that let modules draw random numbers from this rank's own generator state (CPU, and the
    model's CUDA device when it has one), leaving the shared generator as it was. `state` is
    (CPU state, CUDA state or None): what a checkpoint keeps."""

    def __init__(self, seed: int, device: torch.device):
        self.device = device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            self.state = self._get()
        self.saved = None

    def _get(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set(self, state) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def enter(self, module, args) -> None:
        self.saved = self._get()
        self._set(self.state)

    def leave(self, module, args, output) -> None:
        self.state = self._get()
        self._set(self.saved)


def check(model: nn.Module, plan: TensorPlan, size: int) -> None:
    """ValueError (one line, naming the fix) when `model` cannot be split `size` ways by `plan`: every rank
    holds whole attention heads, and an even share of every split width (the MLP's hidden units: a column-
    parallel layer's outputs and a row-parallel layer's inputs). The vocabulary may split unevenly."""
    for what in plan.head_counts:
        count = getattr(model.config, what, None)
        if count is not None and count % size:
            raise ValueError(f"the model's {what} ({count}) does not divide by parallel.tensor_parallel ({size}): "
                             "every rank holds whole attention heads; choose a tensor-parallel size that divides it")
    for patterns, side in ((plan.colwise, "out_features"), (plan.rowwise, "in_features")):
        for name in (n for pattern in patterns for n in _matching(model, pattern)):
            width = getattr(model.get_submodule(name), side)
            if width % size:
                raise ValueError(f"{name} has {width} {side.replace('_', ' ')}, which do not divide by "
                                 f"parallel.tensor_parallel ({size}): every rank holds an equal share of a split "
                                 "layer; choose a tensor-parallel size that divides it (or a model width that "
                                 "divides by it, e.g. model.intermediate_size)")


def parallelize(model: nn.Module, mesh, plan: TensorPlan, seed: int) -> nn.Module:
    """Split `model` over the one-dimensional `mesh` following `plan` (in place; returned). Every process of the
    mesh must hold the same weights before (they do: same seed, same checkpoint)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    check(model, plan, mesh.size())
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)

    styles = {}
    for patterns, style in ((plan.colwise, ColwiseParallel), (plan.rowwise, RowwiseParallel)):
        for pattern in patterns:
            for name in _matching(model, pattern):
                styles[name] = style()
    if plan.vocab_embedding and _matching(model, plan.vocab_embedding):
        styles[plan.vocab_embedding] = RowwiseParallel(input_layouts=Replicate())
    for pattern, inputs in plan.shared_input:
        layouts = (Replicate(),) + (None,) * (inputs - 1)
        for name in _matching(model, pattern):
            styles[name] = PrepareModuleInput(input_layouts=layouts, desired_input_layouts=layouts,
                                              use_local_output=False)
    if plan.vocab_output and _matching(model, plan.vocab_output):
        styles[plan.vocab_output] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, mesh, styles)

    # parallelize_module gives a split module new Parameters: every other name of a tied weight follows
    for names in aliases.values():
        if len(names) > 1:
            current = [model.get_parameter(n) for n in names]
            shared = next((p for p in current if isinstance(p, DTensor)), current[0])
            for n in names:
                parent, _, attr = n.rpartition(".")
                setattr(model.get_submodule(parent), attr, shared)

    def replicate_inputs(module, inputs, device_mesh):
        return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def local_outputs(module, outputs, device_mesh):
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs

    for _, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        if own and not any(isinstance(p, DTensor) for p in own):
            distribute_module(module, mesh, input_fn=replicate_inputs, output_fn=local_outputs)

    generator = _RankGenerator(seed + 2718 + mesh.get_local_rank(), next(model.parameters()).device)
    for pattern in plan.rng_region:
        for name in _matching(model, pattern):
            module = model.get_submodule(name)
            module.register_forward_pre_hook(generator.enter)
            module.register_forward_hook(generator.leave)
    model._tensor_parallel_generator = generator
    return model


def region_generator(model: nn.Module):
    """The generator of a split model's attention cores (None for a model that is not split)."""
    return getattr(model, "_tensor_parallel_generator", None)


def align_gradients(params) -> None:
    """Each gradient laid out as its parameter is. Autograd may leave a split parameter's gradient in another
    placement: DTensor's embedding backward gives the vocabulary-split word embeddings a Replicate gradient
    (the full V x h on every rank, computed locally from replicated inputs; tied to the decoder it is
    accumulated into the decoder's shard instead). Slicing it to the shard costs no communication, and then
    sums over replicas or tied stages, norms and the optimizer see the same layout on every rank."""
    for p in params:
        g = p.grad
        if is_distributed(g) and g.placements != p.placements:
            p.grad = g.redistribute(p.device_mesh, p.placements)


def replicas_agree(model: nn.Module, mesh) -> bool:
    """Whether every rank of `mesh` holds bitwise the same replicated weights (a collective): a checksum of each
    rank's replicated parameters, gathered. They can only drift apart through a bug (ranks drawing different
    dropout masks outside the attention cores, or a rank updating alone); a checkpoint must never hide it,
    since it saves one rank's copy."""
    import torch.distributed as dist

    values = [local(p.detach()).double() for p in model.parameters()
              if is_distributed(p) and all(q.is_replicate() for q in p.placements)]
    mine = torch.stack([torch.stack([v.sum(), v.square().sum()]) for v in values]).flatten().cpu() if values \
        else torch.zeros(1, dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(mesh.size())]
    dist.all_gather(gathered, mine, group=mesh.get_group())
    return all(torch.equal(gathered[0], g) for g in gathered)


def gathered(t: torch.Tensor) -> torch.Tensor:
    """A distributed tensor gathered whole and moved to the CPU at once (so that a whole model's weights never
    sit on the device together); any other tensor as it is."""
    return full(t).cpu() if is_distributed(t) else t


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict with every distributed tensor gathered whole, on the CPU (a collective on the
    mesh)."""
    return {k: gathered(v.detach()) for k, v in module.state_dict().items()}
