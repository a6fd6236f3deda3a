"""Start the processes a config needs, on this machine, when the user did not use torchrun.

PopTorch drove a pipelined model from one host process; `python run_pretraining.py --config
pretrain_large_512_packed` (4 pipeline stages) does the same here: started without torchrun, the entry point
launches the processes itself with torch.distributed's elastic launch API (what torchrun uses), says so, and
returns their exit code. Under torchrun (WORLD_SIZE set) nothing is launched, so several machines work as
before. A machine that cannot hold the processes is one clear error.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path

from ..processes import die_with_parent
from .runtime import ERROR_DIR, RunError, check_pipeline_torch


def _available_memory() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_capacity(processes: int, device: str, parameters: int | None = None) -> None:
    """One clear error when this machine cannot hold `processes` training processes."""
    import torch

    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and processes > 1 and torch.cuda.device_count() < processes:  # 1 process: the runtime says
        raise RunError(f"the config needs {processes} processes, one GPU each, but this machine has "
                       f"{torch.cuda.device_count()} GPU(s); run torchrun on several machines or lower "
                       "parallel.pipeline_stages")
    if not wants_cuda and parameters:
        # each process builds the whole model (4 bytes a parameter), then keeps its stage with gradients
        # and two optimizer states (16 bytes a parameter of the stage)
        need = processes * parameters * 4 + parameters * 16
        have = _available_memory()
        if have is not None and need > have:
            raise RunError(f"{processes} process(es) of a {parameters / 1e6:.0f} M-parameter model need about "
                           f"{need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB are free; run torchrun on several "
                           "machines, lower parallel.pipeline_stages, or choose smaller model sizes")


def launched() -> bool:
    """True inside a process that torchrun (or this module) started."""
    return "WORLD_SIZE" in os.environ


def launch_if_needed(cfg, script: str, argv: list[str] | None, parameters: int | None = None) -> int | None:
    """A config of several processes per replica (pipeline stages x tensor-parallel ranks) started with plain
    `python`: launch them here with the same arguments (`argv`, default the command line's) and return their
    exit code; None when this process should run the job itself (one process per replica, or under torchrun)."""
    processes = cfg.parallel.processes
    if launched():
        return None
    check_pipeline_torch(cfg.parallel.pipeline_stages)  # before any process starts
    check_capacity(processes, cfg.train.device, parameters)  # one process too: a model that cannot fit is one line
    if processes == 1:
        return None
    return launch(processes, script, sys.argv[1:] if argv is None else list(argv))


def launch(processes: int, script: str, argv: list[str]) -> int:
    """Run `python script argv...` in `processes` processes on this machine (elastic launch, as torchrun
    --standalone); returns 0, or the exit code of the first process that failed (it printed its error)."""
    import logging

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # each process reports its own error in one line; the launcher's log of the same failure (which process,
    # which signal it sent the others) would only repeat it in many
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)

    print(f"[run] starting {processes} processes on this machine (as torchrun --nproc-per-node {processes}); "
          "use torchrun yourself for several machines", flush=True)
    # one temporary folder for the ranks' error lines and the elastic agent's own files (left to itself, the
    # agent makes a torchelastic_* folder in /tmp per launch and never removes it), removed when the launch ends
    work = Path(tempfile.mkdtemp(prefix="bert_ipu_launch_"))
    errors = work / "errors"
    errors.mkdir()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                          logs_specs=DefaultLogsSpecs(log_dir=str(work / "agent")))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    os.environ[ERROR_DIR] = str(errors)
    try:
        elastic_launch(config, entrypoint=sys.executable)(script, *argv)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        killed = {rank: -f.exitcode for rank, f in e.failures.items() if f.exitcode < 0
                  and not (errors / str(rank)).exists() and -f.exitcode != signal.SIGTERM}  # SIGTERM: the agent's
        print_errors(errors, killed)
        return next((c for c in codes if c > 0), 1)
    except KeyboardInterrupt:  # Ctrl-C reached the processes too: each stops between updates and says where
        print_errors(errors)
        return 130
    finally:
        del os.environ[ERROR_DIR]
        shutil.rmtree(work, ignore_errors=True)
    return 0


def die_with_launcher() -> None:
    """In a process this module launched: ask Linux to send it SIGTERM when the launcher dies (a kill -9 of
    `python run_pretraining.py` left its stage processes running for ever). SIGTERM stops a training run between
    updates, after a checkpoint (engine/trainer.StopSignal). Elsewhere (torchrun, other systems) nothing."""
    if os.environ.get(ERROR_DIR):
        die_with_parent()


def print_errors(folder: Path, killed: dict[int, int] | None = None) -> None:
    """The ranks' one-line errors, as each would have printed it: rank 0's for the run and other ranks' own.
    When a rank's failure stopped rank 0 before it wrote (the launcher ends the others when one exits), the
    lowest rank's line stands in, so a failed launch always says why in one line. `killed` (rank -> signal) names
    the processes a signal ended without a word (kill -9, the out-of-memory killer): added to the first line."""
    lines = {int(p.name): p.read_text() for p in folder.iterdir() if p.name.isdigit()}
    shown = [line for _, line in sorted(lines.items()) if not line.startswith("quiet ")]
    if not shown and lines:
        shown = [lines[min(lines)].removeprefix("quiet ")]
    if killed:
        names = ", ".join(f"rank {r} was killed by {signal.Signals(n).name if n in signal.valid_signals() else n}"
                          for r, n in sorted(killed.items()))
        shown = ([f"{shown[0]} ({names}{'; out of memory?' if signal.SIGKILL in killed.values() else ''})"]
                 + shown[1:] if shown else [f"error: {names}; the run stopped: continue with --resume from its last "
                                            "checkpoint, or rerun with --overwrite if it has none"])
    for line in shown:
        print(line, file=sys.stderr, flush=True)
