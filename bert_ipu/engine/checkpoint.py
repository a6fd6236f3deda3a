"""Checkpoints that resume on any topology: model and optimizer state by full parameter name, written with
torch.distributed.checkpoint (DCP) into safetensors files, and everything else in JSON.

    OUTPUT/checkpoints/step-0000300/
      shard-0000R-model-00001-of-00001.safetensors  tensors of rank R: "model.<name>" and "optim.<name>.<state>"
      state.json                                    step, counters, scheduler, optimizer hyper-parameters,
                                                    loader position, RNG states, the topology it was saved on

Every rank saves what it holds under the full model's names (a pipeline stage is the model with modules
deleted, so its names are the full model's), whole (a weight split over tensor-parallel ranks is gathered);
replicas hold equal copies and DCP writes one. Loading asks for
the names this rank holds now, so a checkpoint saved on any (replicas x stages x tensor) grid loads on any other.
Nothing is unpickled: safetensors and JSON only. A checkpoint is written into step-N.partial, fsynced, and
renamed when complete; the newest `keep` are kept, by step number. A write that fails (a full disk) removes
step-N.partial and is one RunError: the earlier checkpoints stay as they were, and --resume starts from them.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
from pathlib import Path

import warnings

import torch
import torch.distributed as dist

from ..files import describe_os_error, fsync_dir, fsync_tree
from .runtime import RunError
from .tensor import full_state_dict, gathered, is_distributed, like, local, region_generator

# DCP warns that it saves "in a single process" whenever no process group is up: that is what we mean
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

STATE = "state.json"
_STEP = re.compile(r"^step-(\d+)$")


def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints of a run folder, oldest first (by step number, not by name)."""
    folder = Path(out) / "checkpoints"
    found = [(int(m.group(1)), p) for p in folder.glob("step-*") if (m := _STEP.match(p.name))
             and (p / STATE).is_file()]
    return [p for _, p in sorted(found)]


def _write_failed(final: Path, error: BaseException) -> RunError:
    """One line for a checkpoint that could not be written (DCP wraps each rank's error in a
    CheckpointException, which is a BaseException)."""
    failures = getattr(error, "failures", None) or {}
    for failure in failures.values():  # (exception, traceback) per rank, or a wrapped exception
        error = failure[0] if isinstance(failure, tuple) else getattr(failure, "exc", failure)
        break
    why = describe_os_error(error) if isinstance(error, OSError) else f"{type(error).__name__}: {error}"
    return RunError(f"writing checkpoint {final} failed: {why}; nothing of it was kept and the earlier checkpoints "
                    "are intact: free space, then continue with --resume")


def _rng_to_text(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def _rng_from_text(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def _param_names(module: torch.nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every name it has in `module` (a tied weight has two)."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _optimizer_tensors(module, opt) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """The optimizer's per-parameter state keyed "optim.<name>.<key>" under every name of the parameter,
    and the non-tensor entries (kept in JSON)."""
    names = _param_names(module)
    tensors, other = {}, {}
    for p, state in opt.state.items():
        for name in names.get(id(p), []):
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optim.{name}.{key}"] = value
                else:
                    other[f"{name}.{key}"] = value
    return tensors, other


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors stores no tensor twice: a tied weight's second name (and its optimizer state) gets a copy,
    so that every name loads on its own on any topology (a pipeline's last stage holds the decoder alone)."""
    seen, out = set(), {}
    for k, v in tensors.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        out[k] = v.contiguous() if key not in seen else v.clone()
        seen.add(key)
    return out


def save(path: Path, module: torch.nn.Module, opt, state: dict, keep: int, main: bool, group=None) -> Path:
    """Save this rank's model part and optimizer state, and (main rank) `state` as JSON; a collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.api import CheckpointException

    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    error = None
    if main:
        shutil.rmtree(partial, ignore_errors=True)
        try:
            partial.mkdir(parents=True)
        except OSError as e:
            error = str(_write_failed(final, e))
    if dist.is_initialized():
        box = [error]
        dist.broadcast_object_list(box, src=0)  # also the barrier before anyone writes
        error = box[0]
    if error:
        raise RunError(error)
    # whole tensors: a weight split over tensor-parallel ranks is gathered (every rank of the split then holds an
    # equal copy, written once), so the files are the same on every topology
    tensors = {f"model.{k}": v for k, v in full_state_dict(module).items()}
    optim, other = _optimizer_tensors(module, opt)
    tensors |= {k: gathered(v) for k, v in optim.items()}
    try:  # DCP agrees on the outcome across ranks: every rank raises when one fails
        dcp.save(_unshared(tensors),
                 storage_writer=HuggingFaceStorageWriter(str(partial), save_distributed=True),
                 no_dist=not dist.is_initialized())
    except (OSError, CheckpointException) as e:
        if main:
            shutil.rmtree(partial, ignore_errors=True)
        raise _write_failed(final, e) from None
    rng = {"cpu": _rng_to_text(torch.get_rng_state()),
           "cuda": _rng_to_text(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None}
    region = region_generator(module)  # tensor parallelism: this rank's attention-dropout generator
    if region is not None:
        cpu, cuda = region.state
        rng["tensor_region"] = {"cpu": _rng_to_text(cpu), "cuda": None if cuda is None else _rng_to_text(cuda)}
    rngs = [None] * dist.get_world_size() if dist.is_initialized() else [rng]
    others = [None] * len(rngs)
    if dist.is_initialized():
        dist.all_gather_object(rngs, rng)
        dist.all_gather_object(others, other)
    else:
        others = [other]
    if main:
        merged = {}
        for part in others:
            merged |= part
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.state_dict()["param_groups"]]
        rngs = [r if isinstance(r, dict) else {"cpu": r, "cuda": None} for r in rngs]
        doc = state | {"optimizer_groups": groups, "optimizer_other": merged, "rng": rngs}
        try:
            (partial / STATE).write_text(json.dumps(doc, indent=1))
            fsync_tree(partial)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            fsync_dir(final.parent)
        except OSError as e:
            shutil.rmtree(partial, ignore_errors=True)
            error = str(_write_failed(final, e))
        else:
            for old in checkpoints(final.parent.parent)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)  # rotation; a checkpoint left over harms nothing
    if dist.is_initialized():
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise RunError(error)
    return final


STATE_FIELDS = {"step": int, "sequences_seen": (int, float), "scheduler": dict, "loader": dict, "replicas": int,
                "stages": int}
"""what every checkpoint's JSON state holds, by type (read_state checks it before anything uses it)"""


def written_here(path: Path) -> bool:
    """Whether the checkpoint folder `path` was written by this project: its state is a JSON object with every
    field of STATE_FIELDS (whatever their values: read_state judges those)."""
    try:
        state = json.loads((Path(path) / STATE).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(state, dict) and set(STATE_FIELDS) <= set(state)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _count(value) -> bool:
    return isinstance(value, int) and _number(value)


def _bad_progress(state: dict) -> str | None:
    """What is wrong with the counters a resumed run continues from (read_state has checked their types): the
    sequences seen, the scheduler's step and rates, the optimizer's groups (their learning rates and steps), the
    loader's place in its epoch; None where nothing is. Each was a traceback some updates later, or a run that
    went on from a wrong place."""
    sched, loader = state["scheduler"], state["loader"]
    groups = state.get("optimizer_groups")
    if not _number(state["sequences_seen"]):
        return f"sequences_seen {state['sequences_seen']!r}"
    if not _count(sched.get("last_epoch", 0)):
        return f"scheduler last_epoch {sched.get('last_epoch')!r}"
    if not all(isinstance(sched.get(k, []), list) and all(map(_number, sched.get(k, []))) for k in ("base_lrs",
                                                                                                    "_last_lr")):
        return f"scheduler rates {sched.get('base_lrs')!r} / {sched.get('_last_lr')!r}"
    if groups is not None and not (isinstance(groups, list) and groups and all(
            isinstance(g, dict) and all(_number(g[k]) for k in ("lr", "initial_lr", "step") if k in g)
            for g in groups)):
        return f"optimizer_groups {str(groups)[:80]}"
    if not _count(loader.get("update_in_epoch", 0)):
        return f"loader update_in_epoch {loader['update_in_epoch']!r}"
    return None


def read_state(path: Path) -> dict:
    try:
        state = json.loads((Path(path) / STATE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path} is not a checkpoint of this project ({e}); resume from another or start anew") from None
    bad = ("not a JSON object" if not isinstance(state, dict) else
           next((f"{key!r} is {state.get(key)!r}" for key, kind in STATE_FIELDS.items()
                 if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)
                 or (kind is int and state.get(key) < 0)), None))
    if bad:
        raise RunError(f"checkpoint {path} is damaged ({STATE}: {bad}); move it away to resume from an older one, "
                       "or start a new run with --overwrite")
    loader = state["loader"]
    if not all(isinstance(loader.get(k), int) and not isinstance(loader.get(k), bool) and loader[k] >= 0
               for k in ("epoch", "seed") if k in loader) or "epoch" not in loader:
        raise RunError(f"checkpoint {path} is damaged ({STATE}: loader {loader!r}); move it away to resume from "
                       "an older one, or start a new run with --overwrite")
    bad = _bad_progress(state)
    if bad:
        raise RunError(f"checkpoint {path} is damaged ({STATE}: {bad}); move it away to resume from an older one, "
                       "or start a new run with --overwrite")
    window = state.get("window", {})  # the logging window's sums (absent in checkpoints before it was kept)
    number = (int, float)
    if not (isinstance(window, dict) and all(isinstance(window.get(k, {}), dict) and all(
            isinstance(v, number) and not isinstance(v, bool) for v in window.get(k, {}).values())
            for k in ("sums", "balance")) and isinstance(window.get("start", 0), int)
            and 0 <= window.get("start", 0) <= state["step"]):
        raise RunError(f"checkpoint {path} is damaged ({STATE}: window {window!r}); move it away to resume from "
                       "an older one, or start a new run with --overwrite")
    return state


def load(path: Path, module: torch.nn.Module, opt, rank: int = 0, shared_rank: int | None = None,
         world: int | None = None) -> dict:
    """Load this rank's model part and optimizer state (by name) from a checkpoint saved on any topology;
    returns the JSON state (step, counters, scheduler, loader). Sets the RNG state: the shared generator's from
    `shared_rank` (default `rank`; under tensor parallelism the group's first rank, so that all ranks of a
    group draw the same replicated-region masks whatever rank saved it), the attention cores' own generator
    from `rank`, when the checkpoint was saved on as many processes as this run's `world` (else the shared one
    from rank 0, and the cores' left as this rank seeded it: given rank 0's, two tensor-parallel ranks of a
    larger grid drew the same masks for the rest of the run)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    path = Path(path)
    state = read_state(path)
    reader = HuggingFaceStorageReader(str(path))
    saved = reader.read_metadata().state_dict_metadata
    current = {f"model.{k}": v for k, v in module.state_dict().items()}
    # a split weight is read whole into a plain tensor, then this rank keeps its slice (below)
    model_sd = {k: torch.empty(v.shape, dtype=v.dtype) if is_distributed(v) else v for k, v in current.items()}
    missing = [k for k in model_sd if k not in saved]
    wrong = [k for k in model_sd if k in saved and tuple(saved[k].size) != tuple(model_sd[k].shape)]
    problem = None
    if missing or wrong:
        problem = (f"{path} does not fit this model ({len(missing)} weights missing, e.g. "
                   f"{(missing or wrong)[0][6:]}{'' if missing else ' has another shape'}): it was saved from "
                   "another model; resume with the config it was saved with")
    if dist.is_initialized():  # a pipeline stage may find the mismatch alone: every rank stops with the same error
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
        problem = next((p for p in problems if p), None)
    if problem:
        raise RunError(problem)
    # optimizer: one template per state tensor of every parameter this rank holds, under a name it was saved by
    names = _param_names(module)
    groups = state["optimizer_groups"]
    if len(groups) != len(opt.param_groups):  # (which optimizer: the trainer checks train.optimizer first)
        raise RunError(f"{path} was saved by an optimizer of {len(groups)} parameter groups, this run's has "
                       f"{len(opt.param_groups)}: resume with the config it was saved with, or start a new run")
    templates, where = {}, {}
    for gi, group in enumerate(opt.param_groups):
        for p in group["params"]:
            for name in names[id(p)]:
                keys = [k for k in saved if k.startswith(f"optim.{name}.")]
                if keys:
                    for k in keys:
                        meta = saved[k]
                        templates[k] = torch.empty(meta.size, dtype=meta.properties.dtype)
                    where[id(p)] = (name, keys)
                    break
    try:
        dcp.load(model_sd | templates, storage_reader=HuggingFaceStorageReader(str(path)),
                 no_dist=not dist.is_initialized())
    except Exception as e:  # DCP reports every rank's failure with tracebacks: one line is what the user needs
        raise RunError(f"{path} could not be loaded into this model ({str(e).strip().splitlines()[-1]}); resume "
                       "with the config it was saved with") from None
    with torch.no_grad():
        for k, v in current.items():
            if is_distributed(v):
                local(v).copy_(local(like(model_sd[k].to(local(v).device), v)))
    params = {id(p): p for g in opt.param_groups for p in g["params"]}
    opt.state.clear()
    other = state.get("optimizer_other", {})
    for p_id, (name, keys) in where.items():
        p = params[p_id]
        entry = {k[len(f"optim.{name}."):]: _state_like(templates[k].to(local(p).device), p) for k in keys}
        entry |= {k[len(name) + 1:]: v for k, v in other.items() if k.startswith(f"{name}.")}
        opt.state[p] = entry
    for group, saved_group in zip(opt.param_groups, groups):
        # the optimizer's own progress comes back; its settings (betas, eps, weight decay) stay the config's
        group.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved_group.items()
                      if k not in ("betas", "eps", "weight_decay")})
    counted = [g["step"] for g in groups if isinstance(g.get("step"), (int, float))]
    for group, saved_group in zip(opt.param_groups, groups):   # (LAMB counts updates a group: one that never had
        if counted and "step" not in saved_group:               # gradients saved none; Llama's norms joined it,
            group["step"] = max(counted)                         # and resume at the run's update, not its first)
    rngs = [r if isinstance(r, dict) else {"cpu": r, "cuda": None} for r in state.get("rng") or []]
    if rngs:
        same = len(rngs) == state.get("world", 1) and (world is None or world == len(rngs))

        def saved(r):
            return rngs[r] if same and r < len(rngs) else rngs[0]

        shared = saved(rank if shared_rank is None else shared_rank)
        torch.set_rng_state(_rng_from_text(shared["cpu"]))
        if shared.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state(_rng_from_text(shared["cuda"]))
        region, own = region_generator(module), saved(rank).get("tensor_region") if same else None
        if region is not None and own is not None:
            region.state = (_rng_from_text(own["cpu"]), None if own["cuda"] is None else _rng_from_text(own["cuda"]))
    return state


def _state_like(value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """An optimizer state read whole, split as its parameter is when it has the parameter's shape (moments)."""
    return like(value, p) if is_distributed(p) and tuple(value.shape) == tuple(p.shape) else value


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint as one state dict (full names), whatever topology saved it."""
    from safetensors.torch import load_file

    out = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        out |= {k[6:]: v for k, v in load_file(str(file)).items() if k.startswith("model.")}
    return out
