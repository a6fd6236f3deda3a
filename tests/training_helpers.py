"""Shared helpers of the training tests: a tiny run config, final weights, the command line in this process (entry),
in fresh processes (run_cli, torchrun), and several command lines in one torchrun launch (launch: a test module
pays for its processes once)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bert_ipu import cli
from bert_ipu.engine import checkpoint
from bert_ipu.tasks import load_config, registry

ROOT = Path(__file__).resolve().parent.parent


def tiny(dataset, out, *overrides, name="test_tiny", kind=None):
    return load_config(name, [f"data.dataset={dataset}", f"output_dir={out}", "model.max_position_embeddings=64",
                              "data.max_seq_length=64", *overrides], kind=kind)


def entry(kind: str, argv: list[str]) -> int:
    """The entry point of `kind` (run_pretraining.py, ...) called in this process, from the repository root as
    run_cli runs it (configs name fixtures by relative paths): its exit code."""
    with contextlib.chdir(ROOT):
        return cli.main(argv, kind, str(ROOT / registry()[kind].script))


class Killed(BaseException):
    """Raised by a test where the process dies (SIGKILL: no handler of the run's sees it, unlike Ctrl-C's
    KeyboardInterrupt, which the trainer turns into a one-line stop)."""


def final_weights(out: Path) -> dict:
    return checkpoint.load_weights(checkpoint.checkpoints(out)[-1])


def run_cli(*args, nproc: int | None = None, script="run_pretraining.py", check=True):
    """A command-line run in fresh processes: under torchrun with `nproc` processes (--standalone: a free port,
    so tests can run side by side), else plain python."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    # torchrun's agent leaves a torchelastic_* folder in the temporary folder per launch: give it one we remove
    with tempfile.TemporaryDirectory(prefix="run_cli_") as temp:
        proc = subprocess.run([sys.executable, *launcher, str(ROOT / script), *args], capture_output=True,
                              text=True, env={**env, "TMPDIR": temp}, cwd=ROOT, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def torchrun(nproc, *args):
    return run_cli(*args, nproc=nproc).stdout


# --- several command lines in one launch (tests/engine_worker.py) ----------------------------------------------

def job(name: str, *argv: str, script: str = "run_pretraining.py") -> dict:
    """A step of a launch: the command line `script argv...`, recorded under `name`."""
    return {"name": name, "script": script, "argv": [str(a) for a in argv]}


def call(name: str, function: str, *args) -> dict:
    """A step of a launch: `module:function` of tests/ called on every rank (the process group is up), its value
    (rank 0's, JSON) recorded under `name`."""
    return {"name": name, "call": function, "args": list(args)}


def copy_run(src: Path, dst: Path, *remove: str) -> dict:
    """A step of a launch: copy the run folder `src` to `dst` without `remove` (say, its last checkpoint)."""
    return {"copy": str(src), "to": str(dst), "remove": list(remove)}


class Launch(dict):
    """What each step of one launch gave, by name: {"codes": exit code per rank, "stdout", "stderr" (all ranks),
    "value" (a call's result)}. A step that is missing (the launch died before it) fails the test that asks for
    it, with the launch's stderr."""

    def __init__(self, results: dict, proc: subprocess.CompletedProcess):
        super().__init__(results)
        self.proc = proc

    def __missing__(self, name):
        raise AssertionError(f"step {name!r} did not run (exit code {self.proc.returncode}):\n"
                             f"{self.proc.stderr[-3000:]}")

    def ok(self, name: str) -> dict:
        """The step `name`, which must have succeeded on every rank."""
        step = self[name]
        assert step["codes"] == [0] * len(step["codes"]), (name, step["codes"], step["stderr"][-3000:])
        return step


def launch(nproc: int, steps: list[dict], folder: Path) -> Launch:
    """Run `steps` in order in one torchrun launch of `nproc` processes (tests/engine_worker.py)."""
    plan, out = folder / "plan.json", folder / "results.json"
    plan.write_text(json.dumps(steps))
    proc = run_cli(str(plan), str(out), nproc=nproc, script="tests/engine_worker.py", check=False)
    return Launch(json.loads(out.read_text()) if out.exists() else {}, proc)
