"""What a task is: the `Task` protocol the engine trains, and the `TaskSpec` a task folder registers.

A task is a folder of bert_ipu/tasks/ whose `__init__.py` defines `SPEC = TaskSpec(...)`: its config kind, its
root config dataclass, the entry point that runs it, and how to run a config of that kind. The engine
(bert_ipu/engine/) knows tasks only through the `Task` protocol below: it reads typed attributes and calls the
methods, never asks whether a task has something. docs/adding-a-task.md walks through a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import nn

from ..data.loader import Level, PackSource
from ..models.plans import PipelinePlan, TensorPlan


@runtime_checkable
class Task(Protocol):
    """What the engine trains: data, model, the loss as sums and counts, evaluation and export.

    Class attributes:
        name            the task's name (progress bar, errors)
        input_fields    the model's positional inputs, fields of a micro-batch
        target_fields   what the loss reads, fields of a micro-batch
        stat_names      the named sums `loss` reports (besides the counts of `counts`)
        sequence_fields the per-token fields that sequence parallelism splits along the row (each rank keeps
                        its contiguous 1/S of every row), or () where the task has no sequence-parallel layout
        pipeline_plan   where the model splits into pipeline stages, or None (one stage only)
        drop_last       drop an epoch's last partial update (True) or fill it with empty rows (False)
        headline        the metrics said after every evaluation (and in the final result)
        progress_keys   the metrics on the progress line
    Set by `prepare`:
        packing_factor  sequences per row of the training data (1 unpacked)
        packed          whether rows hold several sequences (the betas' packing correction)
    """

    name: str
    input_fields: tuple[str, ...]
    target_fields: tuple[str, ...]
    stat_names: tuple[str, ...]
    sequence_fields: tuple[str, ...]
    pipeline_plan: PipelinePlan | None
    drop_last: bool
    headline: tuple[str, ...]
    progress_keys: tuple[str, ...]
    packing_factor: float
    packed: bool

    @property
    def trains(self) -> bool:
        """False for an evaluation-only run (the engine evaluates `build_model()` and writes no checkpoint)."""

    @property
    def has_evaluation(self) -> bool:
        """Whether `evaluate` has anything to evaluate."""

    def prepare(self, rt) -> None:
        """Read or create the task's packed data on the runtime `rt`; a config that disagrees with the data is
        a RunError."""

    def train_source(self) -> PackSource:
        """The training rows (bert_ipu.data.loader.PackSource)."""

    def train_levels(self) -> list[Level]:
        """The training packs by pack length (bert_ipu.data.loader.Level): one level, `train_source()`, unless the
        task packs its data into several lengths (Hierarchical Balance Packing's levels)."""

    def layout_record(self) -> dict:
        """The data layout the run trains on, recorded in OUTPUT/config.yaml."""

    def describe(self) -> str:
        """One phrase on the data, for the start-up line."""

    def build_model(self) -> nn.Module:
        """The whole model (a pipeline stage is made from it by deleting modules)."""

    def tensor_plan(self, model: nn.Module) -> TensorPlan | None:
        """How tensor parallelism splits `model` (bert_ipu.models.plans), or None when it cannot."""

    def counts(self, micro: list[dict]) -> dict[str, torch.Tensor]:
        """Data-only sums of an update's micro-batches: what the loss divides by, "sequences" and "tokens"."""

    def normalizers(self, counts: dict[str, float]) -> dict[str, float]:
        """What the loss divides by, from the update's global counts (summed over micro-batches and ranks)."""

    def loss(self, output, targets: dict, normalizers: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the loss to differentiate, its named sums `stat_names`): one function for every engine."""

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        """Means for people ("loss" at least) from summed stats and counts."""

    def evaluate(self, engine, rt, step: int) -> dict[str, float]:
        """Validation metrics at `step` (a collective: every rank calls it)."""

    def export(self, model: nn.Module, folder: Path, info: dict) -> None:
        """Write the Hugging Face export of `model` (rank 0)."""

    def result_extra(self) -> dict:
        """What the task adds to results.json."""


class TaskBase:
    """What most tasks share: one level of packs (`train_source`, with the train section's micro-batch and the
    parallel section's sequence-parallel size), training (not evaluation only), and no sequence-parallel
    layout. A task overrides what differs."""

    sequence_fields: tuple[str, ...] = ()
    trains = True

    def train_levels(self) -> list[Level]:
        return [Level(self.layout_record()["pack_len"], self.train_source(), self.cfg.train.micro_batch_size,
                      self.cfg.parallel.sequence_parallel, 0, self.packing_factor)]


def no_summary(result: dict) -> str | None:
    return None


@dataclass(frozen=True)
class TaskSpec:
    """A task as the command line and the config loader know it.

    kind        the config's `kind:` (configs/*.yaml)
    config      the root config dataclass of that kind; its class attribute `script` names the entry point
                that runs it (run_X.py), for errors and model cards
    task        "module:Class" of the `Task` the engine trains (imported when a run starts), or
    job         for a kind that is not a training (the profile), job(cfg, resume, overwrite, progress) -> result
    summary     the final line printed from the result (None: nothing)
    eval_only   overrides that make a config evaluate only (`--eval-only`); None: the flag is refused
    arguments   (flag, argparse keyword arguments, "section.key") triples: extra flags of this kind's command
                line, each setting one field (the profile's --algorithms, --json, ...); flags win over the file and
                the KEY=VALUE pairs
    launches    whether a config of this kind may need several processes per replica (its `parallel`
                section), started by the entry point when it was not run under torchrun
    resumable   whether a run of this kind has a run folder to resume or overwrite (--resume, --overwrite)
    preflight   preflight(cfg): cheap checks of the inputs (the data exists, say) made by the command line before
                it launches processes or writes anything; raises ConfigError or RunError
    doc         what `--help` says of the kind (its entry point's docstring)
    """
    kind: str
    config: type
    task: str | None = None
    job: Callable[..., dict] | None = None
    summary: Callable[[dict], str | None] = no_summary
    eval_only: tuple[str, ...] | None = None
    arguments: tuple[tuple[str, dict, str], ...] = field(default_factory=tuple)
    launches: bool = True
    resumable: bool = True
    preflight: Callable[..., None] | None = None
    doc: str = ""

    @property
    def script(self) -> str:
        return self.config.script

    def task_class(self) -> type:
        import importlib

        module, _, name = self.task.partition(":")
        return getattr(importlib.import_module(module), name)

    def run(self, cfg, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
        """Run a config of this kind: its task on the engine (bert_ipu.engine.trainer.run), or its job."""
        if self.job is not None:
            return self.job(cfg, resume=resume, overwrite=overwrite, progress=progress)
        from ..engine.trainer import run

        return run(self.task_class()(cfg, progress), cfg, resume=resume, overwrite=overwrite, progress=progress)
