"""How one update's forward and backward run: on this process (and data parallel with DDP), or as a pipeline
stage (torch.distributed.pipelining), possibly data parallel over pipeline replicas; either split over
tensor-parallel ranks too (`tensor_parallel` > 1: engine/tensor.py, the task's `tensor_plan`).

Both take the same task: `task.loss(output, targets, normalizers) -> (loss, sums)` is the one loss function,
called by the local step and by the pipeline schedule alike, and both return the update's named sums
(`StepSums`), summed over the micro-batches and the data-parallel replicas.

A pipeline stage is the task's model with the modules it does not own deleted (set to None, layers removed
from their ModuleDict), following the task's `PipelinePlan`; the model's forward passes through what it
lacks, and parameter names stay the full model's.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from ..models import attention
from ..models.hf_io import quiet_off_terminal
from ..models.plans import PipelinePlan, TensorPlan
from . import tensor
from .runtime import Runtime, RunError, check_pipeline_torch

StepSums = dict  # name -> float: the sums a task reports for a step (loss sums, counts, tokens, ...)


def split_layers(num_layers: int, stages: int, layers_per_stage: list[int] | None = None) -> list[list[int]]:
    """Layer indices per stage: as given, or as even as possible (earlier stages take the remainder)."""
    if layers_per_stage is None:
        base, extra = divmod(num_layers, stages)
        layers_per_stage = [base + (i < extra) for i in range(stages)]
    if len(layers_per_stage) != stages or sum(layers_per_stage) != num_layers or min(layers_per_stage) < 0:
        raise RunError(f"parallel.layers_per_stage {layers_per_stage} must give {stages} stages summing to the "
                       f"model's {num_layers} layers; set parallel.layers_per_stage=null (as even as possible) or "
                       f"a list of {stages} counts summing to {num_layers}")
    out, at = [], 0
    for n in layers_per_stage:
        out.append(list(range(at, at + n)))
        at += n
    return out


def _set(model: nn.Module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, value)


def make_stage(model: nn.Module, plan: PipelinePlan, stage: int, stages: int, layers: list[int]) -> nn.Module:
    """`model` with every module that stage `stage` does not own deleted (in place; returned)."""
    if stage > 0:
        for path in plan.first:
            _set(model, path, None)
    if stage < stages - 1:
        for path in plan.last:
            _set(model, path, None)
    container = model.get_submodule(plan.layers)
    for key in list(container.keys()):
        if int(key) not in layers:
            del container[key]
    return model


def global_counts(task, engine, micro: list[dict]) -> StepSums:
    """The task's data counts of these micro-batches (what its loss divides by), summed over the data-parallel
    replicas: one stacked tensor, one copy to the host, one all-reduce."""
    counts = task.counts(micro)
    names = list(counts)
    return dict(zip(names, engine.dp_sum(stack_sums(counts, names)).tolist()))


def update_balance(engine, micro: list[dict], sequence_parallel: bool) -> dict[str, float]:
    """How evenly the update's work fell on the data-parallel replicas (bert_ipu.packing.balance's measures, after
    Hierarchical Balance Packing): `abr`, the attention balance ratio (1 - mean / max over replicas of the sum of
    squared sequence lengths), `dbr`, the data balance ratio (the same of real tokens), `padding_ratio` (padding
    tokens / computed tokens), and `cr`, the share of the update's tokens that went through sequence-parallel
    all-to-alls. From this replica's micro-batches (their `sequence_ids`), gathered over the replicas."""
    from ..packing.balance import balance_ratio

    attention = tokens = computed = 0.0
    for b in micro:
        ids = b["sequence_ids"].long()
        counts = torch.zeros(ids.shape[0], int(ids.max()) + 1, dtype=torch.float64).scatter_add_(
            1, ids.cpu(), torch.ones(ids.shape, dtype=torch.float64))[:, 1:]
        attention += float((counts ** 2).sum())
        tokens += float(counts.sum())
        computed += ids.numel()
    per_replica = engine.dp_gather(torch.tensor([attention, tokens, computed], dtype=torch.float64)).numpy()
    total_tokens, total_computed = per_replica[:, 1].sum(), per_replica[:, 2].sum()
    return {"abr": balance_ratio(per_replica[:, 0]), "dbr": balance_ratio(per_replica[:, 1]),
            "padding_ratio": float(1 - total_tokens / max(total_computed, 1.0)),
            "cr": 1.0 if sequence_parallel else 0.0}


def stack_sums(sums: dict[str, torch.Tensor], names) -> torch.Tensor:
    """Named sums as one float64 CPU vector in `names` order: stacked where they live, copied once."""
    return device_sums(sums, names).cpu()


def device_sums(sums: dict[str, torch.Tensor], names) -> torch.Tensor:
    """Named sums as one float64 vector in `names` order, on the device where they were computed (no copy to the
    host: a step's sums stay there until a log line needs them)."""
    values = [tensor.full(torch.as_tensor(sums[n]).detach()) for n in names]
    device = next((v.device for v in values if v.device.type != "cpu"), torch.device("cpu"))
    return torch.stack([v.to(device, torch.float64) for v in values])


def to_device(batch: dict, device: torch.device) -> dict:
    """A micro-batch of CPU tensors on `device`: on CUDA through pinned memory with non-blocking copies (the host
    queues the copy and goes on; the copy stream-orders before the step's kernels)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def check_compile(mode: str, rt: Runtime, levels=()) -> None:
    """train.compile can run here (a RunError, one line naming the fix, before anything is written): cudagraphs
    needs CUDA; the compiled step covers one process or data parallelism (DDP), not pipeline stages, tensor or
    sequence parallelism yet."""
    if mode == "none":
        return
    if mode == "cudagraphs" and rt.device.type != "cuda":
        raise RunError(f"train.compile=cudagraphs replays CUDA graphs and this run is on {rt.device.type}; use "
                       "train.compile=compile (or none)")
    split = [what for what, n in (("pipeline stages", rt.stages), ("tensor parallelism", rt.tensor),
                                  ("sequence parallelism", max([rt.sequence, *(lv.sequence_parallel for lv in levels)])))
             if n > 1]
    if split:
        raise RunError(f"train.compile={mode} compiles the step of one process or of data-parallel replicas, not "
                       f"with {' or '.join(split)}; set train.compile=none")


def tensor_plan(task, model: nn.Module, size: int) -> TensorPlan:
    """The task's tensor-parallel plan for `model`; a RunError when it has none or it cannot split `size` ways."""
    plan = task.tensor_plan(model)
    if plan is None:
        raise RunError(f"the {task.name} task has no tensor-parallel plan for {type(model).__name__}; set "
                       "parallel.tensor_parallel=1")
    try:
        tensor.check(model, plan, size)
    except ValueError as e:
        raise RunError(str(e)) from None
    return plan


def check_sequence_parallel(task, model: nn.Module, rt: Runtime, pack_len: int, size: int | None = None) -> None:
    """A RunError (one line, naming the fix) when `model` cannot run with its rows' tokens split over
    `rt.sequence` ranks: the task has no sequence-parallel layout, the attention heads (and key/value heads) do
    not divide by tensor x sequence ranks (each rank attends with whole heads), or the pack length does not divide
    by the sequence ranks (each holds an equal, contiguous share of a row; documents may straddle the shares)."""
    S, T = rt.sequence if size is None else size, rt.tensor
    if not task.sequence_fields:
        raise RunError(f"the {task.name} task has no sequence-parallel layout; set parallel.sequence_parallel=1")
    if rt.stages > 1:
        raise RunError("parallel.sequence_parallel with pipeline stages: no task has both a pipeline plan and a "
                       "sequence-parallel layout; set one of them to 1")
    for what in ("num_attention_heads", "num_key_value_heads"):
        count = getattr(model.config, what, None)
        if count is not None and count % (S * T):
            raise RunError(f"the model's {what} ({count}) does not divide by parallel.sequence_parallel ({S})"
                           + (f" x parallel.tensor_parallel ({T})" if T > 1 else "")
                           + ": after the all-to-all each rank attends with whole heads; choose sizes that divide it")
    if pack_len % S:
        raise RunError(f"the pack length {pack_len} does not divide by parallel.sequence_parallel ({S}): each rank "
                       "holds an equal share of every row; choose a pack length (data.max_seq_length) that divides")


def layer_stack(model: nn.Module) -> nn.ModuleDict:
    """The model's layers: its ModuleDict keyed "0".."N-1" (every model of bert_ipu/models keeps them so)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleDict) and list(module.keys()) == [str(i) for i in range(len(module))]:
            return module
    raise RunError(f"{type(model).__name__} has no stack of layers keyed 0..N-1 to checkpoint")


def check_layers(model: nn.Module, checkpointed: int) -> None:
    """Activation checkpointing of `checkpointed` layers fits the model (a RunError naming the count)."""
    if checkpointed and checkpointed > len(layer_stack(model)):
        raise RunError(f"train.levels asks to checkpoint {checkpointed} layers; the model has "
                       f"{len(layer_stack(model))}")


def checkpoint_layers(model: nn.Module, checkpointed: int) -> None:
    """Activation checkpointing of the first `checkpointed` layers (the others keep their activations): each
    recomputes its forward in the backward pass (torch.utils.checkpoint, non-reentrant), applied from outside
    the model by giving the layer an instance `forward`; 0 restores every layer's own."""
    import types

    from torch.utils.checkpoint import checkpoint

    def checkpointed_forward(self, *args, **kwargs):
        # a plain method, not a partial of `checkpoint`: torch.compile traces into it (checkpoint itself is marked
        # as not to be traced), so a layer compiled alone (train.compile=layers) stays compiled when checkpointed
        return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)

    for i, layer in enumerate(layer_stack(model).values()):
        if i < checkpointed and "forward" not in vars(layer):
            layer.forward = types.MethodType(checkpointed_forward, layer)
        elif i >= checkpointed and "forward" in vars(layer):
            del layer.forward


def compile_layers(model: nn.Module) -> None:
    """train.compile=layers: every layer of the model's stack (`layer_stack`) compiled on its own with static
    shapes, forward and backward (`nn.Module.compile`). The layers are alike, so dynamo compiles the first and the
    others reuse its code (their weights are inputs, not constants): a fraction of the whole step's compile time
    (BERT-large: one layer's compile instead of 24 inlined), while the embeddings, heads and loss stay eager.
    torchtitan compiles its transformer blocks the same way."""
    for layer in layer_stack(model).values():
        layer.compile(dynamic=False)


def split_tensors(model: nn.Module, task, rt: Runtime, seed: int) -> None:
    """Split `model` (a whole model or a pipeline stage) over this process's tensor-parallel ranks, following the
    task's plan for it (in place). The attention cores' dropout seed differs per stage too (Megatron's +100), and
    per sequence-parallel rank (its heads are a row's other share: the same seed drew the same masks on each)."""
    tensor.parallelize(model, rt.mesh()["tp"], tensor_plan(task, model, rt.tensor),
                       seed + 100 * rt.stage + 7919 * rt.sp_rank)


def sum_gradients(params, group) -> None:
    """What DDP does, for any parameters: each gradient (this rank's shard of it) summed over `group`."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(tensor.local(p.grad), group=group)


class LocalParallel:
    """The whole model on this process (or split over tensor-parallel ranks, or over sequence-parallel ranks'
    tokens); data parallel over replicas. The ranks that hold the same weights (the replicas, and the
    sequence-parallel ranks of each) sum their gradients: DDP, or (tensor parallel) the gradient shards summed
    over that group.

    Sequence parallelism (`rt.sequence` > 1): every rank of a replica reads the same micro-batches; each keeps its
    contiguous 1/S of every row in the task's `sequence_fields` and runs the model under
    `models.attention.sequence_parallel` (Ulysses all-to-alls around attention). The counts a loss divides by come
    from the whole rows (the trainer counts before the split); the loss sums are summed over all the ranks."""

    eval_group = 1  # micro-batches evaluated together

    def __init__(self, model: nn.Module, task, rt: Runtime, precision: str = "fp32", seed: int = 0,
                 sequence_sizes=(), compile_mode: str = "none"):
        """`sequence_sizes`: the sequence-parallel sizes of the run's levels (packs of several lengths, each
        split over its own number of ranks, tensor and pipeline parallelism off); their groups are made here,
        by every process, and `use_level` picks one. `compile_mode` (train.compile): none; compile (forward, the
        task's loss and their backward under torch.compile with static shapes); layers (each layer of the stack
        compiled alone: `compile_layers`); cudagraphs (the whole step, replayed as CUDA graphs: torch.compile's
        reduce-overhead). Checked by `check_compile`."""
        self.model, self.task, self.rt, self.precision = model, task, rt, precision
        self.tensor = rt.tensor
        if self.tensor > 1:
            split_tensors(model, task, rt, seed)
        self.weight_group = rt.weight_group() if rt.dp_world * rt.sequence > 1 else None
        self.use_ddp = self.weight_group is not None and self.tensor == 1
        self.ddp = (nn.parallel.DistributedDataParallel(model, process_group=self.weight_group) if self.use_ddp
                    else model)
        self.writes_model = True
        # sequence size -> (its sequence-parallel group, its replicas' group, this rank's place in the first)
        self.layouts = {rt.sequence: (rt.mesh()["sp"].get_group() if rt.sequence > 1 else None,
                                      rt.mesh()["dp"].get_group() if rt.dp_world > 1 else None, rt.sp_rank)}
        for size in sorted(set(sequence_sizes) - {rt.sequence}):  # levels: tensor = stages = sequence = 1
            blocks = {k: dist.new_group(list(range(k, k + size))) for k in range(0, rt.world, size)}
            strided = {j: dist.new_group(list(range(j, rt.world, size))) for j in range(size)}
            replicas = strided[rt.rank % size] if rt.world > size else None
            self.layouts[size] = (blocks[rt.rank - rt.rank % size], replicas, rt.rank % size)
        self.sequence = rt.sequence
        self.sp_group, self.count_group, self.sp_rank = self.layouts[self.sequence]
        self.checkpointed = 0
        self.compile_mode = compile_mode
        self._step = self._loss_sums
        if compile_mode == "layers":
            compile_layers(model)
        elif compile_mode != "none":
            self._step = torch.compile(self._loss_sums, dynamic=False,
                                       mode="reduce-overhead" if compile_mode == "cudagraphs" else None)

    def use_level(self, level) -> None:
        """Run the next update as `level` (bert_ipu.data.loader.Level) says: its sequence-parallel split and its
        activation checkpointing."""
        if level.sequence_parallel != self.sequence:
            self.sequence = level.sequence_parallel
            self.sp_group, self.count_group, self.sp_rank = self.layouts[self.sequence]
        if level.checkpointed_layers != self.checkpointed:
            checkpoint_layers(self.model, level.checkpointed_layers)
            self.checkpointed = level.checkpointed_layers

    @property
    def module(self) -> nn.Module:
        """What this rank holds (for the optimizer and the checkpoint)."""
        return self.model

    def dp_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel replicas of what every rank of a replica computes alike (the counts of its
        micro-batches: a sum over tensor- or sequence-parallel ranks would count each value T or S times)."""
        return values if self.count_group is None else self.rt.all_sum(values, group=self.count_group)

    def dp_gather(self, values: torch.Tensor) -> torch.Tensor:
        """(replicas, ...): every data-parallel replica's `values` (what its ranks compute alike)."""
        return values[None] if self.count_group is None else self.rt.all_gather(values, group=self.count_group)

    def _sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over every rank that computed a share of the update's losses (replicas, sequence ranks)."""
        return values if self.weight_group is None else self.rt.all_sum(values, group=self.weight_group)

    def _local(self, batch: dict) -> dict:
        """This rank's share of a micro-batch: under sequence parallelism its 1/S of every row's tokens."""
        if self.sp_group is None:
            return batch
        S, r = self.sequence, self.sp_rank
        out = dict(batch)
        for name in self.task.sequence_fields:
            n = batch[name].shape[1] // S
            out[name] = batch[name][:, r * n:(r + 1) * n]
        return out

    def _forward(self, model, batch):
        with self.rt.autocast(self.precision):
            return model(*[batch[f] for f in self.task.input_fields])

    def _loss(self, model, batch: dict, normalizers: dict):
        """(loss, sums) of one micro-batch on this rank's share of it (call it, and the backward of the loss,
        inside `tensor.loss_context`)."""
        batch = self._local(batch)
        with attention.sequence_parallel(self.sp_group):
            out = self._forward(model, batch)
            return self.task.loss(out, {k: batch[k] for k in self.task.target_fields}, normalizers)

    def _loss_sums(self, batch: dict, normalizers: dict):
        """(loss, its named sums as one float64 vector) of one micro-batch: what train.compile compiles."""
        loss, sums = self._loss(self.ddp, batch, normalizers)
        return loss, device_sums(sums, self.task.stat_names)

    def _device_normalizers(self, normalizers: dict) -> dict:
        """The loss's divisors as float32 scalars on the device, moved in one non-blocking copy: a compiled step
        takes them as inputs (a Python float would be baked into the graph), and no copy waits for the device."""
        if not normalizers:
            return {}
        values = torch.tensor([float(v) for v in normalizers.values()], dtype=torch.float32)
        if self.rt.device.type == "cuda":
            values = values.pin_memory().to(self.rt.device, non_blocking=True)
        return dict(zip(normalizers, values.unbind()))

    def train_step(self, micro: list[dict], normalizers: dict) -> torch.Tensor:
        """Forward and backward of the update's micro-batches (gradients summed over the replicas); returns the
        task's `stat_names` sums as one float64 vector on the device, summed over the ranks: nothing is copied to
        the host (the trainer reads the sums when a log line needs them)."""
        normalizers = self._device_normalizers(normalizers)
        if self.compile_mode == "cudagraphs":
            # the backward graph's outputs are the gradients, overwritten at its next replay: autograd must add them
            # into gradients of their own, never keep the output itself as a parameter's .grad (it does when .grad
            # is None; then the next micro-batch's replay overwrote it: "accessing tensor output of CUDAGraphs that
            # has been overwritten", seen on an H200 with two micro-batches an update)
            for p in self.model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        total = None
        for i, batch in enumerate(micro):
            sync = self.ddp.no_sync() if self.use_ddp and i < len(micro) - 1 else nullcontext()
            with sync, tensor.loss_context(self.tensor):
                if self.compile_mode == "cudagraphs":  # the graphs' outputs of the last replay may be reused
                    torch.compiler.cudagraph_mark_step_begin()
                loss, sums = self._step(batch, normalizers)
                # DDP averages gradients over its group; we want their sum
                (loss * self.weight_group.size() if self.use_ddp else loss).backward()
            # a new tensor, never the step's own output: a replayed graph overwrites that at its next replay
            total = sums.clone() if total is None else total + sums
        if self.tensor > 1:
            tensor.align_gradients(self.model.parameters())
        if self.weight_group is not None and not self.use_ddp:
            sum_gradients(self.model.parameters(), self.weight_group)
        return self._sum(total)

    @torch.no_grad()
    def evaluate(self, batches: list[dict], normalizers: dict) -> StepSums:
        names = self.task.stat_names
        total = torch.zeros(len(names), dtype=torch.float64)
        # eager, as under train.compile=compile: compiled layers would compile again for evaluation (and for every
        # new evaluation shape, all the layers sharing dynamo's recompile limit), inside a timed window
        eager = torch.compiler.set_stance("force_eager") if self.compile_mode == "layers" else nullcontext()
        with eager:
            for batch in batches:
                with tensor.loss_context(self.tensor):
                    total += stack_sums(self._loss(self.model, batch, normalizers)[1], names)
        return dict(zip(names, self._sum(total).tolist()))

    def clip(self, max_norm: float) -> torch.Tensor:
        """Clip by the global gradient norm (of whole parameters, also when they are split); returns the norm
        before clipping, on the device (not read back: the trainer checks it is finite with the loss)."""
        return tensor.full(nn.utils.clip_grad_norm_(self.model.parameters(), max_norm, foreach=True))

    def full_model(self) -> nn.Module | None:
        """The model with whole weights. Under tensor parallelism a collective: the split weights are gathered
        on every rank and a whole model is built on rank 0 (None elsewhere), without touching the shared
        random generator (the ranks must keep drawing the same dropout masks)."""
        if self.tensor == 1:
            return self.model
        state = tensor.full_state_dict(self.model)
        if not self.rt.main:
            return None
        with torch.random.fork_rng(devices=[self.rt.device] if self.rt.device.type == "cuda" else []), \
                quiet_off_terminal():
            whole = self.task.build_model()
        whole.load_state_dict(state, strict=True)
        return whole.to(self.rt.device).train(self.model.training)


def _pack_targets(targets: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list]:
    """The last stage's labels as one tensor the schedule can split into micro-batches (it takes one):
    every field flattened to (B, width) in float64 (exact for integer labels), and how to undo it."""
    spec, parts = [], []
    for name, t in targets.items():
        spec.append((name, t.shape[1:], t.dtype))
        parts.append(t.reshape(len(t), -1).double())
    return torch.cat(parts, dim=1), spec


def _unpack_targets(packed: torch.Tensor, spec) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, shape, dtype in spec:
        width = int(torch.tensor(shape).prod()) if len(shape) else 1
        out[name] = packed[:, at:at + width].reshape(len(packed), *shape).to(dtype)
        at += width
    return out


class _PlainTuple(nn.Module):
    """The stage's own forward, with its output as the plain tuple of tensors the schedule requires (a model
    may return a tuple subclass with named fields)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        return tuple(out) if isinstance(out, tuple) else out


class PipelineParallel:
    """This process's pipeline stage, data parallel over replicas of the pipeline when there are more processes
    than stages. The micro-batches of an update are the schedule's (1F1B or GPipe).

    The processes form a (replicas x stages x tensor) grid (Runtime): activations move within a replica
    between the same tensor-parallel rank of each stage (its pipeline group); the gradients of a stage are
    summed over the replicas (its data-parallel group), as DDP does. Under tensor parallelism the stage is
    split like a whole model (its inputs and outputs are whole tensors on every tensor-parallel rank)."""

    def __init__(self, model: nn.Module, task, rt: Runtime, micro_batches: int, schedule: str = "1f1b",
                 layers_per_stage: list[int] | None = None, seed: int = 0):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        plan = task.pipeline_plan
        if plan is None:
            raise RunError(f"the {task.name} task has no pipeline plan; set parallel.pipeline_stages=1")
        check_pipeline_torch(rt.stages)  # under torchrun, where launch_if_needed does not run
        self.task, self.rt, self.plan = task, rt, plan
        stages, replicas, self.tensor = rt.stages, rt.dp_world, rt.tensor
        self.replica, self.stage = rt.dp_rank, rt.stage
        mesh = rt.mesh()
        self.pp_group, self.dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
        # the tied weight's first and last stage, per replica and tensor-parallel rank (every process takes part
        # in creating every group)
        tied = {(r, t): dist.new_group([rt.grid_rank(r, 0, t), rt.grid_rank(r, stages - 1, t)])
                for r in range(replicas) for t in range(self.tensor)}
        self.tied_group = tied[(self.replica, rt.tp_rank)]
        self.first_rank = rt.grid_rank(self.replica, 0, rt.tp_rank)  # this replica's first and last stage
        self.last_rank = rt.grid_rank(self.replica, stages - 1, rt.tp_rank)
        self.first, self.last = self.stage == 0, self.stage == stages - 1
        self.writes_model = True
        num_layers = len(model.get_submodule(plan.layers))
        layers = split_layers(num_layers, stages, layers_per_stage)
        self.model = make_stage(model, plan, self.stage, stages, layers[self.stage])
        if self.tensor > 1:
            split_tensors(self.model, task, rt, seed)
        self.micro_batches = micro_batches
        self.eval_group = micro_batches  # the schedule always runs all of its micro-batches
        self._sums: list[torch.Tensor] = []
        self._normalizers: dict = {}
        self._spec = None
        stage = PipelineStage(_PlainTuple(self.model), self.stage, stages, rt.device, group=self.pp_group)
        kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
        # our loss is already a sum over global counts: the schedule must not divide by the micro-batches
        self.schedule = kind(stage, n_microbatches=micro_batches, loss_fn=self._loss, scale_grads=False)

    @property
    def module(self) -> nn.Module:
        return self.model

    def use_level(self, level) -> None:
        """One level only (packs of several lengths do not run on pipelines): nothing changes between updates."""

    def _loss(self, output, target):
        loss, sums = self.task.loss(output, _unpack_targets(target, self._spec), self._normalizers)
        self._sums.append(stack_sums(sums, self.task.stat_names))
        return loss

    def dp_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel replicas of this stage."""
        return self.rt.all_sum(values, group=self.dp_group) if self.rt.dp_world > 1 else values

    def dp_gather(self, values: torch.Tensor) -> torch.Tensor:
        """(replicas, ...): every data-parallel replica's `values` (this stage's copies)."""
        return self.rt.all_gather(values, group=self.dp_group) if self.rt.dp_world > 1 else values[None]

    def _run(self, call, micro: list[dict]) -> None:
        """The schedule's step or eval: inputs on the first stage, targets on the last."""
        batch = {k: torch.cat([b[k] for b in micro]) for k in micro[0]}
        with tensor.loss_context(self.tensor):  # the last stage's loss and its backward run inside the schedule
            if self.first:
                call(*[batch[f] for f in self.task.input_fields])
            elif self.last:
                target, self._spec = _pack_targets({k: batch[k] for k in self.task.target_fields})
                call(target=target, losses=[])
            else:
                call()

    def _collect_vector(self) -> torch.Tensor:
        """The named sums of the last step as one float64 vector (last stage of every replica, summed), on every
        rank.

        On its first step the schedule may run the stage on placeholder inputs, loss included, before the
        real micro-batches; only the last `micro_batches` calls count."""
        sums = torch.zeros(len(self.task.stat_names), dtype=torch.float64)
        if self.last:
            sums = torch.stack(self._sums[-self.micro_batches:]).sum(0)
        self._sums.clear()
        dist.broadcast(sums, src=self.last_rank, group=self.pp_group)
        return self.dp_sum(sums)

    def _collect(self) -> StepSums:
        """`_collect_vector` by name."""
        return dict(zip(self.task.stat_names, self._collect_vector().tolist()))

    def train_step(self, micro: list[dict], normalizers: dict) -> torch.Tensor:
        self._normalizers = normalizers
        self._run(self.schedule.step, micro)
        if self.tensor > 1:
            tensor.align_gradients(self.model.parameters())
        self._sum_tied_gradients()
        if self.rt.dp_world > 1:  # what DDP would do: sum each gradient over the replicas
            sum_gradients(self.model.parameters(), self.dp_group)
        return self._collect_vector()

    @torch.no_grad()
    def evaluate(self, batches: list[dict], normalizers: dict) -> StepSums:
        self._normalizers = normalizers
        names = self.task.stat_names
        total = dict.fromkeys(names, 0.0)
        n = self.micro_batches
        for lo in range(0, len(batches) - n + 1, n):
            self._run(self.schedule.eval, batches[lo:lo + n])
            total = {k: total[k] + v for k, v in self._collect().items()}
        return total

    def _tied(self) -> torch.nn.Parameter | None:
        if self.plan.tied is None or not (self.first or self.last):
            return None
        name = self.plan.tied[0] if self.first else self.plan.tied[1]
        return self.model.get_parameter(name)

    def _sum_tied_gradients(self) -> None:
        weight = self._tied()
        if weight is not None and self.rt.stages > 1:
            sum_gradients([weight], self.tied_group)

    def clip(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm over all stages, the tied weight counted once (on the first stage)."""
        squares = torch.zeros((), dtype=torch.float64)
        twin = self._tied() if self.last and not self.first else None
        for p in self.model.parameters():
            if p.grad is not None and p is not twin:  # a split gradient's squares summed over its ranks
                squares += tensor.full(p.grad.double().pow(2).sum())
        dist.all_reduce(squares, group=self.pp_group)  # gradients are equal across replicas by now
        norm = squares.sqrt().item()
        scale = max_norm / (norm + 1e-6)
        if scale < 1:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return torch.tensor(norm)

    def full_model(self) -> nn.Module | None:
        """Every stage's weights gathered into a whole model on rank 0 of each replica (a collective;
        None elsewhere)."""
        state = tensor.full_state_dict(self.model)
        parts = [None] * self.rt.stages
        dist.gather_object(state, parts if self.first else None, dst=self.first_rank, group=self.pp_group)
        if not self.first:
            return None
        merged = {}
        for part in parts:
            merged |= part
        with quiet_off_terminal():
            model = self.task.build_model()
        model.load_state_dict(merged, strict=True)
        return model
