"""Shared helpers of the training tests: a tiny run config, final weights, the command line in-process and in
fresh processes (torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bert_ipu import cli
from bert_ipu.engine import checkpoint
from bert_ipu.tasks import load_config, registry

ROOT = Path(__file__).resolve().parent.parent


def tiny(dataset, out, *overrides, name="test_tiny", kind=None):
    return load_config(name, [f"data.dataset={dataset}", f"output_dir={out}", "model.max_position_embeddings=64",
                              "data.max_seq_length=64", *overrides], kind=kind)


def entry(kind: str, argv: list[str]) -> int:
    """The entry point of `kind` (run_pretraining.py, ...) called in this process: its exit code."""
    return cli.main(argv, kind, str(ROOT / registry()[kind].script))


def final_weights(out: Path) -> dict:
    return checkpoint.load_weights(checkpoint.checkpoints(out)[-1])


def run_cli(*args, nproc: int | None = None, port: int = 29600, script="run_pretraining.py", check=True):
    """A command-line run in fresh processes: under torchrun with `nproc` processes, else plain python."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                                         "--master-port", str(port)]
    proc = subprocess.run([sys.executable, *launcher, str(ROOT / script), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def torchrun(nproc, port, *args):
    return run_cli(*args, nproc=nproc, port=port).stdout
