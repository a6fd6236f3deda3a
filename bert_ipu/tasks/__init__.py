"""Tasks: what differs between packed trainings, one folder each, on the one engine (bert_ipu/engine/).

    cfg = load_config("squad_tiny_packed", ["train.num_train_epochs=1"])   # the kind comes from the config
    result = run(cfg)                                                      # the task of its kind

A task is a folder here whose `__init__.py` defines `SPEC` (a `base.TaskSpec`: kind, root config, entry
point, how to run); `registry()` finds every folder, so a new task is a new folder plus its configs, never an
edit elsewhere. `base.Task` is the protocol the engine trains; common.py holds what the fine-tuning tasks
share.
"""

from __future__ import annotations

import functools

from .base import Task, TaskSpec

__all__ = ["Task", "TaskSpec", "load_config", "registry", "run", "spec"]


@functools.cache
def registry() -> dict[str, TaskSpec]:
    """{kind: TaskSpec} of every task folder (a subpackage with a SPEC)."""
    import importlib
    import pkgutil

    found = {}
    for module in pkgutil.iter_modules(__path__):
        if module.ispkg:
            spec_ = getattr(importlib.import_module(f"{__name__}.{module.name}"), "SPEC", None)
            if isinstance(spec_, TaskSpec):
                found[spec_.kind] = spec_
    return dict(sorted(found.items()))


def spec(kind: str) -> TaskSpec:
    from ..config import ConfigError

    kinds = registry()
    if kind not in kinds:
        raise ConfigError(f"kind {kind!r}: choose one of {', '.join(kinds)}")
    return kinds[kind]


def load_config(name: str, overrides=(), kind: str | None = None):
    """The config NAME (configs/NAME.yaml or a path) with `section.key=value` overrides, as the root dataclass
    of its kind; `kind`, when given, is the kind the caller runs (another kind is an error naming its entry
    point)."""
    from .. import config

    return config.load_config(name, overrides, registry(), expected=kind)


def run(cfg, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Run a loaded config: the job of its kind's task; returns its result."""
    return spec(cfg.kind).run(cfg, resume=resume, overwrite=overwrite, progress=progress)
