"""Run under torchrun by the training tests (training_helpers.launch): several command lines in one launch, so a
test module pays for its processes (a torch import each, and a gloo rendezvous) once, not once a command line
(STYLE habit 23; tests/tensor_parallel_worker.py is the same pattern for one check).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/engine_worker.py PLAN.json OUT.json

PLAN.json is a list of steps that every process runs in order:

    {"name": N, "script": "run_pretraining.py", "argv": [...]}   the entry point's command line, called in this
        process (bert_ipu.cli.main, as the script does, minus the process exit): each rank's exit code, and the
        stdout and stderr of all ranks (rank order), are recorded under N
    {"name": N, "call": "module:function", "args": [...]}         a check of tests/ that takes the process group
    {"copy": SRC, "to": DST, "remove": [relative paths]}         rank 0 copies a run folder (to resume the copy)

Rank 0 rewrites OUT.json after every step, so a launch that dies keeps what ran. A step that raises (anything but
the one-line errors the command line reports itself) prints its traceback and ends the launch: the other ranks may
be waiting in a collective. Steps that are expected to fail go last in a plan, after everything that must train.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import shutil
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from bert_ipu import cli
from bert_ipu.engine.runtime import finish
from bert_ipu.tasks import registry

ROOT = Path(__file__).resolve().parent.parent
KINDS = {Path(spec.script).name: kind for kind, spec in registry().items()}


def run_step(step: dict) -> dict:
    """One command line or check in this process: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if "call" in step:
                module, function = step["call"].split(":")
                value = getattr(importlib.import_module(module), function)(*step.get("args", []))
                code = 0
            else:
                script = step["script"]
                code, value = cli.main(step["argv"], KINDS[Path(script).name], str(ROOT / script)), None
        except BaseException:
            traceback.print_exc()
            code, value = None, None
    return {"code": code, "value": value, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main(plan_path: str, out_path: str) -> None:
    dist.init_process_group("gloo")  # before the first step, so even a step refused at once can report
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for step in json.loads(Path(plan_path).read_text()):
        if "copy" in step:
            if rank == 0:
                shutil.copytree(step["copy"], step["to"])
                for name in step.get("remove", []):
                    target = Path(step["to"]) / name
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
            dist.barrier()
            continue
        mine = run_step(step)
        every = [None] * world
        dist.all_gather_object(every, mine)
        results[step["name"]] = {"codes": [r["code"] for r in every], "value": every[0]["value"],
                                 "stdout": "".join(r["stdout"] for r in every),
                                 "stderr": "".join(r["stderr"] for r in every)}
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
        if any(r["code"] is None for r in every):
            print(f"step {step['name']!r} raised; the launch stops here:\n" + results[step["name"]]["stderr"],
                  file=sys.stderr, flush=True)
            finish(1)
    dist.barrier()
    finish(0)  # without gloo's teardown, as the entry points (engine/runtime.finish)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
