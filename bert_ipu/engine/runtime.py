"""What every run needs before it trains: the device, the process grid, the precision, and the error type.

    rt = Runtime.start("auto", pipeline_stages=1, tensor_parallel=1)   # joins torchrun's process group
    rt.say("...")                                   # rank 0 speaks for the run
    with rt.autocast("bf16"): ...

Knows nothing about BERT or any task.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class RunError(RuntimeError):
    """The run cannot go on (bad data, a config that disagrees with its dataset, a non-finite loss, ...); the
    message says why and what to do. Entry points print it as one line and exit with code 2.

    Most checks run (or are broadcast) on every rank alike, and rank 0 reports them for the run; `local=True`
    marks a failure of this rank alone, which the rank reports itself."""

    exit_code = 2

    def __init__(self, message: str, local: bool = False):
        super().__init__(message)
        self.local = local


PIPELINE_TORCH = "2.13"  # torch.distributed.pipelining as tested here; under 2.11 a 1F1B stage waited forever


def check_pipeline_torch(stages: int) -> None:
    """Refuse pipeline stages on a torch older than the one they were proven on: under torch 2.11 (a CUDA image's
    torch) the 1F1B schedule left the first stage waiting for a message the last never sent, a silent hang
    (measured on the CPU with gloo: every pipeline test of the suite)."""
    if stages > 1 and torch.torch_version.TorchVersion(torch.__version__) < PIPELINE_TORCH:
        raise RunError(f"parallel.pipeline_stages={stages} needs torch {PIPELINE_TORCH} or newer (under torch 2.11 "
                       f"its schedule hangs), but this is torch {torch.__version__}; install torch==2.13.0 or set "
                       "parallel.pipeline_stages=1")


class Interrupted(RunError):
    """The run was stopped by a signal (Ctrl-C: SIGINT, a scheduler's SIGTERM); the message says where it stopped
    and how to continue. Exit code 128 + the signal's number, as a shell reports a process it stopped."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def pick_device(name: str) -> torch.device:
    """auto (cuda when visible), cpu, cuda or cuda:N; this process's GPU under torchrun (LOCAL_RANK)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RunError(f"device {name} was asked for but no CUDA device is visible; use train.device=cpu")
        if name == "cuda":
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    try:
        return torch.device(name)
    except RuntimeError:
        raise RunError(f"device {name!r} is not a device torch knows; use auto, cpu or cuda") from None


def autocast(device: torch.device, precision: str):
    """The forward pass's precision: bf16 = torch.autocast to bfloat16 (matmuls and attention in bf16, softmax,
    LayerNorm and the losses in float32, the weights and optimizer float32); fp32 = nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


@dataclass
class Runtime:
    """This process's place in the run: device, global rank and world, and the (replicas x stages x sequence x
    tensor) grid.

    Global rank = ((replica * stages + stage) * sequence + sp_rank) * tensor + tp_rank: the tensor-parallel ranks
    of a stage are consecutive (as Megatron's: an all-reduce in every layer, the most communication on the
    closest links), then the sequence-parallel ranks (two all-to-alls a layer), then the stages of one pipeline
    replica (activations between stages), then the replicas (one gradient sum an update). All of a replica's
    ranks read the same micro-batches; a sequence-parallel rank computes its share of each row's tokens.
    `dp_rank` / `dp_world` index the data-parallel replicas."""
    device: torch.device
    rank: int = 0
    world: int = 1
    stages: int = 1
    tensor: int = 1
    sequence: int = 1
    _mesh: object = field(default=None, repr=False, compare=False)
    _weight_group: object = field(default=None, repr=False, compare=False)

    @classmethod
    def start(cls, device: str = "auto", pipeline_stages: int = 1, tensor_parallel: int = 1,
              sequence_parallel: int = 1) -> "Runtime":
        dev = pick_device(device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not dist.is_initialized():
            if dev.type == "cuda":  # NCCL for GPU tensors, gloo for the small CPU sums and objects
                torch.cuda.set_device(dev)
                dist.init_process_group("cpu:gloo,cuda:nccl", device_id=dev)
            else:
                dist.init_process_group("gloo")
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        per_replica = pipeline_stages * sequence_parallel * tensor_parallel
        if world % per_replica:
            raise RunError(f"parallel.pipeline_stages={pipeline_stages} x parallel.sequence_parallel={sequence_parallel}"
                           f" x parallel.tensor_parallel={tensor_parallel} needs a multiple of {per_replica} processes "
                           f"(x data-parallel replicas); got {world}")
        return cls(dev, rank, world, pipeline_stages, tensor_parallel, sequence_parallel)

    @property
    def main(self) -> bool:
        """Rank 0 speaks for the run (progress, metrics, final line) and writes what is written once."""
        return self.rank == 0

    @property
    def per_replica(self) -> int:
        """Processes of one data-parallel replica: stages x sequence x tensor."""
        return self.stages * self.sequence * self.tensor

    @property
    def dp_rank(self) -> int:
        return self.rank // self.per_replica

    @property
    def dp_world(self) -> int:
        return self.world // self.per_replica

    @property
    def stage(self) -> int:
        return self.rank // (self.tensor * self.sequence) % self.stages

    @property
    def sp_rank(self) -> int:
        return self.rank // self.tensor % self.sequence

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor

    def grid_rank(self, replica: int, stage: int, tp_rank: int, sp_rank: int | None = None) -> int:
        """The global rank at a place of the grid (`sp_rank` default: this process's)."""
        sp_rank = self.sp_rank if sp_rank is None else sp_rank
        return ((replica * self.stages + stage) * self.sequence + sp_rank) * self.tensor + tp_rank

    def mesh(self):
        """The (dp, pp, sp, tp) device mesh of the grid, built once (a collective: every process builds every
        group); `mesh()["tp"]` is this process's tensor-parallel ranks, `mesh()["sp"]` its sequence-parallel ranks,
        `mesh()["dp"].get_group()` its replicas."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.dp_world, self.stages, self.sequence, self.tensor),
                                          mesh_dim_names=("dp", "pp", "sp", "tp"))
        return self._mesh

    def weight_group(self):
        """The process group of the ranks that hold the same weights as this one (same stage and tensor-parallel
        rank): every replica's sequence-parallel ranks, whose gradients are summed. Built once, by every process
        (new_group is a collective over all ranks)."""
        if self._weight_group is None:
            import itertools

            groups = {}
            for stage, tp in itertools.product(range(self.stages), range(self.tensor)):
                ranks = [self.grid_rank(r, stage, tp, s) for r in range(self.dp_world) for s in range(self.sequence)]
                groups[stage, tp] = dist.new_group(ranks)
            self._weight_group = groups[self.stage, self.tp_rank]
        return self._weight_group

    def say(self, msg: str, tag: str = "run") -> None:
        if self.main:
            print(f"[{tag}] {msg}", flush=True)

    def autocast(self, precision: str):
        return autocast(self.device, precision)

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def all_sum(self, values: torch.Tensor, group=None) -> torch.Tensor:
        """Sum over the ranks of `group` (default: all); a copy, on the CPU for gloo."""
        if dist.is_initialized():
            values = values.clone()
            dist.all_reduce(values, group=group)
        return values

    def all_gather(self, values: torch.Tensor, group=None) -> torch.Tensor:
        """(ranks of `group`, *values.shape): every rank's `values` in rank order (default group: all)."""
        if not dist.is_initialized():
            return values[None]
        parts = [torch.empty_like(values) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, values.contiguous(), group=group)
        return torch.stack(parts)

    def broadcast_error(self, error: str | None) -> str | None:
        """A check that only one rank can make (a file rank 0 wrote): every rank learns its outcome."""
        if not dist.is_initialized():
            return error
        box = [error]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def finish(code: int) -> None:
    """End an entry point's process with `code`. A distributed process leaves without the interpreter's
    teardown (os._exit after flushing): its work is done and written (files fsynced, all ranks past the final
    barrier), and gloo's threads can abort in their destructors at exit ("terminate called without an active
    exception", seen in CI with and without destroy_process_group), turning a finished run into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        os._exit(code)
    sys.exit(code)


RANK0_REPORTS_S = 30.0
"""how long, at most, a rank under torchrun waits for rank 0 to report the error they share (report_error)"""

ERROR_DIR = "BERT_IPU_ERROR_DIR"
"""set by engine/launch.py for the processes it starts: a folder where each rank leaves its one-line error"""


def report_error(exc: BaseException) -> None:
    """One line on stderr for a RunError/ConfigError: from rank 0 for the run, from another rank only for a
    failure of its own (RunError(local=True))."""
    rank = int(os.environ.get("RANK", "0"))
    errors = os.environ.get(ERROR_DIR)
    if errors:  # launched by engine/launch.py: the launcher prints it (a failing rank can stop rank 0 first)
        line = f"error: {exc}" if rank == 0 else f"error (rank {rank}): {exc}"
        shown = rank == 0 or getattr(exc, "local", False)
        tmp = os.path.join(errors, f".{rank}.tmp")
        with open(tmp, "w") as f:
            f.write(("" if shown else "quiet ") + line)
        os.replace(tmp, os.path.join(errors, str(rank)))
    elif rank == 0:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    elif getattr(exc, "local", False):
        print(f"error (rank {rank}): {exc}", file=sys.stderr, flush=True)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        # under torchrun the first process to exit makes the agent stop the others: a rank that leaves the run's
        # error to rank 0 waits here (the agent's SIGTERM ends the wait), or rank 0 can be stopped before it says
        # why the run failed (seen in CI: three ranks, no line)
        time.sleep(RANK0_REPORTS_S)
