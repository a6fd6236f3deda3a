"""The one training loop every task runs: `run(task, cfg) -> result`.

    result = run(PretrainingTask(cfg), cfg, resume=False, overwrite=False)   # starts the runtime, trains

Per update: read this replica's micro-batches of the update (UpdateLoader), count what the loss divides by
(the task's counts, summed over replicas: masked tokens, sequences, features, ...), run forward and backward
with the task's loss on the engine (LocalParallel / DDP, or PipelineParallel), stop on a non-finite loss,
clip, step the optimizer and the schedule, then log, evaluate and checkpoint at their cadence. At the end the
task exports the model. The loop knows nothing about BERT: the task says what the model, data, loss,
evaluation and export are (bert_ipu/tasks/). A task that does not train (`task.trains` False: fine-tuning
tasks asked to evaluate a checkpoint only) is evaluated once instead (`evaluate_only`), in a run folder of its
own all the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import signal
import threading
import time
from pathlib import Path

import torch
import yaml

from ..data.loader import Level, LevelLoader, UpdateLoader, source_pack_costs
from ..files import OutputBusy, OutputLock, write_atomic, write_json
from ..models import attention
from ..models.hf_io import ExportError, quiet_off_terminal
from . import checkpoint
from .flops import StepFlops, output_tensors, peak_flops
from .metrics import MetricsLogger
from .optim import build_optimizer, fitted_micro_batch_size, packing_betas, packs_per_update, schedule_length
from .parallel import (LocalParallel, PipelineParallel, check_compile, check_layers, check_sequence_parallel,
                       global_counts, layer_stack, split_layers, tensor_plan, to_device, update_balance)
from .runtime import Interrupted, Runtime, RunError
from .tensor import local, replicas_agree
from .trackers import RECORD as TRACKER_RECORD
from .trackers import check_installed

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "tensorboard", "hf", "results.json",
             "predictions*.json", TRACKER_RECORD, "wandb", "mlflow.db")
MARKER = ".bert_ipu_run"
"""written into every run folder when the run starts: --overwrite removes a folder's RUN_FILES only where it finds
this marker (or a checkpoint this project wrote, for runs older than the marker), never a user's files that
merely share their names"""


def ours(out: Path) -> bool:
    """Whether the folder `out` holds a run of this project (by what a run writes, not by file names)."""
    if (out / MARKER).is_file():
        try:
            return json.loads((out / MARKER).read_text()).get("written_by") == "bert_ipu"
        except (OSError, ValueError, AttributeError):
            return False
    # a run older than the marker: a checkpoint whose state holds what this project's states hold (damaged values
    # or not: a damaged checkpoint of ours gets its own message; a user's `{}` is not one)
    return any(checkpoint.written_here(found) for found in checkpoint.checkpoints(out))


def overlapping_input(out: Path, config: dict) -> str | None:
    """The config's input (model.init_checkpoint, data.dataset) that is the run folder `out`, lies in it or holds
    it, as "key path"; None if none does. A run there would mix its files with its input, --overwrite would
    delete the input, and rebuilding the dataset would delete the run."""
    inputs = {"model.init_checkpoint": (config.get("model") or {}).get("init_checkpoint"),
              "data.dataset": (config.get("data") or {}).get("dataset")}
    mine = out.resolve()
    for key, path in inputs.items():
        if isinstance(path, str) and path:
            theirs = Path(path).resolve()
            if theirs == mine or mine in theirs.parents or theirs in mine.parents:
                return f"{key} {path}"
    return None


def recorded(out: Path, section: str, key: str):
    """What the run in `out` recorded in its config.yaml as section.key (None: not recorded or unreadable)."""
    try:
        part = yaml.safe_load((out / "config.yaml").read_text()).get(section) or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return part.get(key) if isinstance(part, dict) else None


def recorded_data(out: Path) -> str | None:
    """The data fingerprint the run in `out` recorded in its config.yaml (None: not recorded or unreadable)."""
    return recorded(out, "data_layout", "data_sha256")


def _unreadable(newest: Path) -> str | None:
    """read_state's one-line refusal of a run's newest checkpoint, or None where it reads."""
    try:
        checkpoint.read_state(newest)
    except RunError as e:
        return str(e)
    return None


def _saved_optimizer(out: Path) -> str | None:
    """train.optimizer of the run in `out`: as its newest checkpoint recorded it, else its config.yaml (None:
    neither says; read_state has checked the checkpoint)."""
    saved = checkpoint.read_state(checkpoint.checkpoints(out)[-1]).get("optimizer")
    return saved if isinstance(saved, str) else recorded(out, "train", "optimizer")


def run_lock(out: Path) -> OutputLock:
    """An exclusive lock on a run folder (OUTPUT/.lock) held while a run writes it: a second run on the same
    folder is refused instead of mixing checkpoints. Released at exit, also when the process dies."""
    try:
        return OutputLock(out, lock_file=out / ".lock")
    except OutputBusy:
        raise RunError(f"another run is writing {out}; wait for it to finish or choose another output_dir") from None


def prepare_run_dir(out: Path, resume: bool, overwrite: bool, rt: Runtime, config: dict,
                    evaluation: bool = False) -> OutputLock | None:
    """Never mix two runs in one folder: a second run while one writes it is refused (run_lock); resuming needs
    a checkpoint; a folder that holds another run is an error unless `overwrite` (which removes that run's
    files, and only those). Rank 0 decides, all ranks raise the same error. Returns rank 0's lock."""
    error, lock = None, None
    found = sorted({p.name for pattern in RUN_FILES for p in out.glob(pattern)}) if rt.main and out.is_dir() else []
    # (a run resumed where it was started is left alone: refusing it would strand a run an older version began)
    overlap = overlapping_input(out, config) if rt.main and not resume else None
    if overlap:
        error = (f"output_dir {out} overlaps {overlap} (one is, or holds, the other): the run's files would mix "
                 "with its input, and --overwrite or a rebuilt dataset would delete one with the other; choose an "
                 "output_dir apart from it")
    elif found and not ours(out):  # refused before the lock: not even a lock file is left there
        error = (f"output_dir {out} holds files this project did not write ({', '.join(found)}; no {MARKER} "
                 "marker), so nothing there is replaced or deleted; choose another output_dir")
    elif rt.main and out.is_dir():
        try:
            lock = run_lock(out)
        except RunError as e:
            error = str(e)
        except OSError as e:
            error = f"cannot lock the run folder {out} ({e.strerror}); choose another output_dir"
    if rt.main and error is None:
        if out.exists() and not out.is_dir():
            error = f"output_dir {out} is a file; choose a folder"
        elif resume and not checkpoint.checkpoints(out):
            error = f"--resume: no checkpoint in {out / 'checkpoints'}; start without --resume"
        elif resume and (damaged := _unreadable(checkpoint.checkpoints(out)[-1])):
            error = damaged  # (before the marker and config.yaml are written)
        elif evaluation and checkpoint.checkpoints(out):
            error = (f"output_dir {out} holds a training run (checkpoints): an evaluation never replaces one, "
                     "--overwrite or not; choose another output_dir (e.g. output_dir=..._eval)")
        elif not resume and found and not overwrite:
            error = (f"output_dir {out} already holds a run ({', '.join(found)}); "
                     + ("replace an evaluation with --overwrite" if evaluation else
                        "continue it with --resume, replace it with --overwrite")
                     + ", or choose another output_dir")
        elif resume and (saved := _saved_optimizer(out)) not in (None, config["train"].get("optimizer")):
            error = (f"--resume: {out} trained with train.optimizer={saved}, not {config['train'].get('optimizer')} "
                     "(its moments would be read as the other's); resume with the optimizer it was saved with, or "
                     "start a new run")
        elif resume and recorded_data(out) not in (None, config["data_layout"].get("data_sha256")):
            error = (f"--resume: {out} trained on other data than this config reads (data sha256 "
                     f"{recorded_data(out)[:12]}..., now {str(config['data_layout'].get('data_sha256'))[:12]}...: "
                     "another dataset, or its files changed); point the config at the run's data, or start a new "
                     "run in another output_dir")
        else:
            try:
                if not resume:
                    for name in found:
                        target = out / name
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                out.mkdir(parents=True, exist_ok=True)
                lock = lock or run_lock(out)
                write_json(out / MARKER, {"written_by": "bert_ipu", "kind": config.get("kind")})
                write_atomic(out / "config.yaml", yaml.safe_dump(config, sort_keys=False))
            except OSError as e:
                error = f"cannot write the run folder {out}: {e.strerror}; choose another output_dir"
            except RunError as e:
                error = str(e)
    error = rt.broadcast_error(error)
    if error:
        if lock:
            lock.release()
        raise RunError(error)
    return lock


def run(task, cfg, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Start this process's runtime (device, process group, grid) and run `task` as `cfg` says: train it, or
    evaluate it only when it does not train. Returns the result (also in OUTPUT/results.json)."""
    par = cfg.parallel
    rt = Runtime.start(cfg.train.device, par.pipeline_stages, par.tensor_parallel, par.sequence_parallel)
    if task.trains:
        return train(task, cfg, rt, resume=resume, overwrite=overwrite, progress=progress)
    return evaluate_only(task, cfg, rt, overwrite=overwrite)


def run_config(cfg, task, levels: list[Level] = ()) -> dict:
    """What OUTPUT/config.yaml records: the config and the data layout the run trained on, with `data_sha256`,
    the fingerprint of the training rows of `levels` (--resume refuses other data)."""
    import dataclasses

    layout = task.layout_record()
    if levels:
        layout["data_sha256"] = data_fingerprint(levels)
    return dataclasses.asdict(cfg) | {"data_layout": layout}


def data_fingerprint(levels: list[Level]) -> str:
    """One sha256 over the levels' pack lengths and their sources' fingerprints."""
    return hashlib.sha256(" ".join(f"{lv.pack_length}:{lv.source.fingerprint()}" for lv in levels).encode()).hexdigest()


def check_backend(cfg, rt: Runtime, training: bool) -> None:
    """The attention backend can run here (one line, before anything is written)."""
    name = cfg.model.attention_backend
    try:
        attention.check_device(name, rt.device, training)
    except ValueError as e:
        raise RunError(f"model.attention_backend={name}: {e}") from None
    if attention.backend(name).half_only and cfg.train.precision != "bf16":
        raise RunError(f"model.attention_backend={name} computes in bfloat16 only (flash attention), and "
                       f"train.precision is {cfg.train.precision}; set train.precision=bf16 or use another backend")


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker", "Broken pipe",
             "NCCL communicator was aborted", "ProcessGroupNCCL", "Socket Timeout")
"""what gloo and NCCL say when the process at the other end of a collective is gone (they raise RuntimeError)"""


def peer_failed(e: BaseException, rt: Runtime) -> bool:
    """A collective of a run of several processes failed because another process died (killed, out of memory, a
    crash of its own it reports itself), not because of this process."""
    import torch.distributed as dist

    return rt.world > 1 and (isinstance(e, dist.DistError) or any(s in str(e) for s in PEER_LOST))


SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings")
"""the model section's sizes that an init checkpoint's config.json replaces"""


def architecture(config) -> str:
    """A model's architecture in a few words (its `transformers` config)."""
    sizes = ", ".join(f"{k} {getattr(config, k)}" for k in SIZES if getattr(config, k, None) is not None)
    return f"{config.model_type} ({sizes}, vocab_size {config.vocab_size})"


def say_init_architecture(cfg, model, rt: Runtime) -> str | None:
    """A model read from model.init_checkpoint has the checkpoint's architecture, whatever the config's model sizes
    say: say so at start-up, naming the sizes that differ; returns the architecture (for errors), None without one."""
    init = getattr(cfg.model, "init_checkpoint", None)
    if not init:
        return None
    described = architecture(model.config)
    differ = [f"{k} {getattr(cfg.model, k)} -> {getattr(model.config, k)}" for k in SIZES
              if hasattr(cfg.model, k) and getattr(model.config, k, None) not in (None, getattr(cfg.model, k))]
    rt.say(f"model from model.init_checkpoint {init}: {described}"
           + (f"; it replaces the config's model sizes ({', '.join(differ)})" if differ else ""))
    return described


def evaluate_only(task, cfg, rt: Runtime, overwrite: bool = False) -> dict:
    """Evaluate the task's model (its init checkpoint) once: no training, no checkpoints; the run folder holds
    config.yaml, the task's predictions and results.json."""
    if not cfg.model.init_checkpoint:
        raise RunError("an evaluation-only run scores model.init_checkpoint, and none is set (a model built from "
                       "scratch would be scored); set model.init_checkpoint=FOLDER of a fine-tuned model")
    check_backend(cfg, rt, training=False)
    task.prepare(rt)
    torch.manual_seed(cfg.train.seed)
    with quiet_off_terminal():  # an init checkpoint's "Loading weights" bar is noise in a log file
        model = task.build_model().to(rt.device).eval()
    fresh = getattr(model, "newly_initialised", [])
    if fresh:  # (a pretrained BERT has no task head: its scores would be a random head's)
        raise RunError(f"model.init_checkpoint {cfg.model.init_checkpoint} lacks weights this model needs "
                       f"({', '.join(fresh[:3])}{', ...' if len(fresh) > 3 else ''}: they would start random, and "
                       "the scores with them); evaluate the hf/ export of a run that trained this task")
    say_init_architecture(cfg, model, rt)
    lock = prepare_run_dir(Path(cfg.output_dir), False, overwrite, rt, run_config(cfg, task), evaluation=True)
    try:
        engine = LocalParallel(model, task, rt, cfg.train.precision, seed=cfg.train.seed)
        metrics = task.evaluate(engine, rt, 0)
        result = {"output_dir": cfg.output_dir, "metrics": metrics} | task.result_extra()
        if rt.main:
            write_json(Path(cfg.output_dir) / "results.json", result)
    finally:
        if lock:
            lock.release()
    rt.barrier()
    return result


def train(task, cfg, rt: Runtime, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    t = cfg.train
    out = Path(cfg.output_dir)
    # everything that can refuse the config comes first (data, update size, schedule, model): a refused run
    # writes nothing, and --overwrite deletes nothing, not even an init checkpoint inside the old run
    check_backend(cfg, rt, training=True)
    check_installed(t.report_to)
    task.prepare(rt)
    levels = task.train_levels()
    check_compile(t.compile, rt, levels)
    loader, P, levels = make_loader(task, t, rt, levels)
    accumulation = loader.accumulation
    total, warmup = schedule_length(t, loader.updates_per_epoch)
    stages = rt.stages
    if stages > 1 and cfg.parallel.schedule == "1f1b" and accumulation < stages:
        raise RunError(f"1F1B over {stages} stages needs at least {stages} micro-batches per update, got "
                       f"{accumulation}; raise train.global_batch_size or lower train.micro_batch_size")
    torch.manual_seed(t.seed)
    with quiet_off_terminal():  # an init checkpoint's "Loading weights" bar is noise in a log file
        model = task.build_model().to(rt.device).train()
    init = say_init_architecture(cfg, model, rt)
    try:  # a model that cannot be split, or whose heads the backend's kernel cannot take, is refused here
        try:
            attention.check_head_dim(cfg.model.attention_backend, attention.model_head_dim(model.config), rt.device)
        except ValueError as e:
            raise RunError(f"model.attention_backend={cfg.model.attention_backend}: {e}") from None
        attention.check_dropout(cfg.model.attention_backend, attention.model_attention_dropout(model.config))
        if stages > 1:
            split_layers(len(layer_stack(model)), stages, cfg.parallel.layers_per_stage)
        if rt.tensor > 1:
            tensor_plan(task, model, rt.tensor)
        for level in levels:
            if level.sequence_parallel > 1:
                check_sequence_parallel(task, model, rt, level.pack_length, level.sequence_parallel)
            check_layers(model, level.checkpointed_layers)
    except RunError as e:
        if init:  # the sizes in the error are the checkpoint's, not the config's
            raise RunError(f"{e} (the model is model.init_checkpoint's: {init})") from None
        raise
    masks_seed = dropout_seed(t.seed, rt, levels)
    if masks_seed != t.seed:   # (the model is built: every stage built it from t.seed alike)
        torch.manual_seed(masks_seed)
    config = run_config(cfg, task, levels)
    lock = prepare_run_dir(out, resume, overwrite, rt, config)
    try:
        return _train(task, cfg, rt, out, resume, progress, loader, model, P, total, warmup, levels, config)
    finally:
        if lock:
            lock.release()


class StopSignal:
    """SIGTERM (a scheduler's) and Ctrl-C (SIGINT) noted while training: the handlers only set a flag, and the
    loop stops between updates (after a checkpoint for SIGTERM). A KeyboardInterrupt raised wherever the signal
    lands could be lost (raised inside a __del__ it is only printed, and training went on); a flag is not. A
    second Ctrl-C interrupts at once (a step that hangs). Ranks agree: the flags are summed over all processes
    once an update, so all stop at one step."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.noted = {s: False for s in self.SIGNALS}
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._note)

    def _note(self, signum, frame):
        if signum == signal.SIGINT and self.noted[signum]:
            raise KeyboardInterrupt
        self.noted[signum] = True

    def requested(self, rt: Runtime) -> int:
        """The signal to stop for (all ranks alike; SIGTERM first, it checkpoints), or 0 to go on."""
        flags = torch.tensor([float(self.noted[s]) for s in self.SIGNALS])
        if rt.world > 1:
            flags = rt.all_sum(flags)
        return next((int(s) for s, f in zip(self.SIGNALS, flags.tolist()) if f > 0), 0)

    def restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}


class LevelClock:
    """The seconds of each update, for the tokens/s of each level (packs of several lengths): the host no longer
    waits for an update, so its wall time would be the time to queue the work. On CUDA two events around the
    update, read when the host synchronises anyway (`take`, at a log row); on the CPU, where the step runs as it is
    queued, wall time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []  # (pack length, tokens, start, end)

    def start(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, begin, pack_length: int, tokens: float) -> None:
        end = self.start()
        self.marks.append((pack_length, tokens, begin, end))

    def take(self) -> dict[int, list[float]]:
        """pack length -> [tokens, seconds] of the updates since the last take (the device's work is done)."""
        out: dict[int, list[float]] = {}
        for length, tokens, begin, end in self.marks:
            if self.cuda:
                end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3 if self.cuda else end - begin
            at = out.setdefault(length, [0.0, 0.0])
            at[0], at[1] = at[0] + tokens, at[1] + seconds
        self.marks.clear()
        return out


def step_flops(task, engine, rt: Runtime, levels: list[Level]) -> StepFlops | None:
    """The model FLOPs of the task's micro-batches (bert_ipu.engine.flops), where one process holds the whole model
    and whole rows (None under pipeline, tensor or sequence parallelism)."""
    if rt.stages > 1 or rt.tensor > 1 or max([rt.sequence, *(lv.sequence_parallel for lv in levels)]) > 1:
        return None

    def loss_of(model, batch):  # any scalar of the outputs: the losses add no matrix products
        out = model(*[batch[f] for f in task.input_fields])
        return sum(t.float().sum() for t in output_tensors(out))
    return StepFlops(engine.module, loss_of)


def rates(flops: float, device_seconds: float, peak: float | None) -> dict:
    """A log row's model TFLOP/s per device and MFU (over the device's bf16 peak, where known)."""
    if not flops:
        return {}
    per_device = flops / device_seconds
    return {"tflops_per_second": per_device / 1e12} | ({"mfu": per_device / peak} if peak else {})


class NonFinite:
    """The non-finite check of every update, kept on the device: whether the update's loss sums and gradient norm
    are finite is noted there (no copy to the host, which would wait for the step), and `first()` reads it back
    where the host synchronises anyway (a log row, an evaluation, a checkpoint, the end). The run then stops as it
    always did: naming the first update whose loss (or gradient norm) was not finite, writing no checkpoint of the
    weights after it, the last good checkpoint the newest. The updates between that one and the check run on (at
    most train.log_every of them) and are thrown away with the run."""

    def __init__(self):
        self.step = None      # first bad update (-1: none yet), on the device
        self.norm_bad = None  # whether it was the gradient norm (the loss was finite)
        self.sums = None      # that update's loss sums
        self.counts: dict[int, dict] = {}  # host counts of the updates since the last check, by update

    def note(self, step: int, sums: torch.Tensor, norm: torch.Tensor | None, counts: dict) -> None:
        loss_ok = torch.isfinite(sums).all()
        norm_ok = torch.isfinite(torch.as_tensor(norm, device=sums.device)).all() if norm is not None else loss_ok
        if self.step is None:
            self.step = torch.full((), -1, dtype=torch.int64, device=sums.device)
            self.norm_bad = torch.zeros((), dtype=torch.bool, device=sums.device)
            self.sums = torch.zeros_like(sums)
        new = (self.step < 0) & ~(loss_ok & norm_ok)
        self.step = torch.where(new, step, self.step)
        self.norm_bad = torch.where(new, loss_ok, self.norm_bad)
        self.sums = torch.where(new, sums, self.sums)
        self.counts[step] = counts

    def first(self) -> tuple[int, bool, torch.Tensor] | None:
        """(the first update that was not finite, whether its gradient norm was the cause, its loss sums), or None
        (one copy to the host)."""
        if self.step is None:
            return None
        step = int(self.step)
        if step < 0:
            self.counts.clear()
            return None
        return step, bool(self.norm_bad), self.sums.cpu()


def _packs_per_update(loader_state: dict) -> list:
    """The packs per update of a loader's state: one (UpdateLoader), or one a level (LevelLoader)."""
    return [x.get("packs_per_update") for x in loader_state.get("levels", [loader_state])]


def dropout_seed(seed: int, rt: Runtime, levels=()) -> int:
    """The seed of this process's dropout masks (the shared generator, once the model is built): its own for each
    pipeline stage and each sequence-parallel rank of a row, the same for the tensor-parallel ranks of a group
    (their replicated regions must agree) and for the replicas (as DDP's are). Seeded alike, two stages drew the
    same masks in the layers they start with, and a row's shares the same pattern. With `levels` of which one
    splits its rows (its own sequence parallelism over the data-parallel processes), every process has its own.
    The first stage's first rank keeps `seed`, and its generator is not re-seeded (a single process's masks are as
    they were)."""
    if any(level.sequence_parallel > 1 for level in levels):
        return seed + 7919 * (rt.rank // rt.tensor)
    return seed + 7919 * (rt.stage * rt.sequence + rt.sp_rank)


def fitted_micro_batch(t, level: Level, replicas: int) -> Level:
    """`level` with its micro-batch fitted to an update of train.batch_unit=sequences (`fitted_micro_batch_size`)."""
    micro = fitted_micro_batch_size(t, level.packing_factor, replicas, level.micro_batch_size)
    return level if micro == level.micro_batch_size else dataclasses.replace(level, micro_batch_size=micro)


def make_loader(task, t, rt: Runtime, levels: list[Level]):
    """(the run's loader, packs per update, the levels with their micro-batches fitted to the update): an
    UpdateLoader over one level's packs, or a LevelLoader over several (every update of one level, each level
    over world / its sequence-parallel size replicas)."""
    if len(levels) > 1 and (rt.tensor > 1 or rt.stages > 1 or rt.sequence > 1 or t.batch_unit != "sequences"):
        raise RunError("packs of several lengths train with train.batch_unit=sequences on data-parallel processes "
                       "(each level's sequence parallelism in train.levels), not with parallel.tensor_parallel, "
                       "parallel.pipeline_stages or parallel.sequence_parallel > 1")
    for i, level in enumerate(levels):
        if rt.world % level.sequence_parallel:
            raise RunError(f"level {i} (packs of {level.pack_length}) splits its rows over {level.sequence_parallel} "
                           f"sequence-parallel ranks, which do not divide the {rt.world} processes; choose a size "
                           "that divides them")
    replicas = [rt.dp_world if len(levels) == 1 else rt.world // lv.sequence_parallel for lv in levels]
    levels = [fitted_micro_batch(t, lv, n) for lv, n in zip(levels, replicas)]
    Ps = [packs_per_update(t, lv.packing_factor, n, lv.micro_batch_size) for lv, n in zip(levels, replicas)]
    costs = []
    for level in levels:
        try:
            costs.append(source_pack_costs(level.source) if t.balance == "attention" else None)
        except ValueError as e:
            raise RunError(f"train.balance=attention: {e}; use train.balance=none") from None
        if costs[-1] is not None and not level.source.stores_lengths:
            rt.say("train.balance=attention: the dataset stores no sequence lengths (written before them), so the "
                   "pack costs were computed from its sequence_ids; repack it to read them at O(packs)")
    try:
        if len(levels) == 1:
            loader = UpdateLoader(levels[0].source, Ps[0], levels[0].micro_batch_size, rt.dp_rank, rt.dp_world,
                                  t.seed, drop_last=task.drop_last, pack_costs=costs[0])
        else:
            loader = LevelLoader(levels, Ps, rt.rank, rt.world, t.seed, t.level_order, drop_last=task.drop_last,
                                 pack_costs=costs if t.balance == "attention" else None)
    except ValueError as e:
        raise RunError(f"{e}; use more data or a smaller train.global_batch_size / train.micro_batch_size") from None
    return loader, (Ps[0] if len(levels) == 1 else Ps), levels


def restore(newest: Path, engine, opt, sched, loader, rt: Runtime, t) -> dict:
    """Load the checkpoint `newest` into the model, optimizer, scheduler and loader; returns its JSON state
    (checked against what a checkpoint holds: checkpoint.check_state)."""
    state = checkpoint.load(newest, engine.module, opt, rt.rank, shared_rank=rt.rank - rt.tp_rank, world=rt.world)
    masks_seed = dropout_seed(t.seed, rt, getattr(loader, "levels", ()))
    if state.get("world") != rt.world and masks_seed != t.seed:
        # (on another grid every rank got rank 0's generator: the stages and a row's shares drew the same masks
        # again; the update's number keeps them off the masks of the run's start)
        torch.manual_seed(masks_seed + int(state["step"]))
    sched.load_state_dict(state["scheduler"])
    saved_lr = state.get("learning_rate", t.learning_rate)
    if saved_lr != t.learning_rate:  # the user asks for a new peak learning rate: the schedule keeps its place
        sched.base_lrs = [t.learning_rate] * len(opt.param_groups)
        for group, factor in zip(opt.param_groups, [f(sched.last_epoch) for f in sched.lr_lambdas]):
            group["lr"] = t.learning_rate * factor
        rt.say(f"train.learning_rate {saved_lr} -> {t.learning_rate} from step {state['step']} on")
    try:
        loader.load_state_dict(state["loader"])
    except ValueError as e:  # the config's update size or seed differs from the run's, or the state is damaged
        saved = state.get("replicas")
        moved = _packs_per_update(state["loader"]) != _packs_per_update(loader.state_dict())
        why = "" if t.batch_unit != "sequences" or saved == rt.dp_world or not moved else (
            f" (with train.batch_unit=sequences an update is whole micro-batches of every replica, so its packs "
            f"change with the replicas: the checkpoint's run had {saved}, this one has {rt.dp_world}; resume on "
            f"{saved} replica(s); train.batch_unit=packs keeps an update's packs on any number)")
        raise RunError(f"checkpoint {newest}: {e}{why}") from None
    return state


def _train(task, cfg, rt: Runtime, out: Path, resume: bool, progress: bool, loader, model, P, total: int,
           warmup: int, levels: list[Level], config: dict) -> dict:
    t, p, stages, accumulation = cfg.train, task.packing_factor, rt.stages, loader.accumulation
    parameters = sum(q.numel() for q in model.parameters())
    engine = (PipelineParallel(model, task, rt, accumulation, cfg.parallel.schedule, cfg.parallel.layers_per_stage,
                               seed=t.seed)
              if stages > 1 else LocalParallel(model, task, rt, t.precision, seed=t.seed,
                                              sequence_sizes=[lv.sequence_parallel for lv in levels],
                                              compile_mode=t.compile))
    betas = packing_betas(t, task.packed, p)
    opt, sched = build_optimizer(engine.module, t, total, warmup, betas, sharded=rt.tensor > 1)

    step, seen, last = 0, 0.0, {}
    # the logging window's sums since its last row: saved with a checkpoint, so that a resumed run's rows hold the
    # same updates as the uninterrupted run's (its throughput figures count only the updates timed since resuming)
    window: dict = {}
    balance: dict = {}  # the window's sums of each update's balance measures (update_balance)
    window_step = 0
    if resume:
        newest = checkpoint.checkpoints(out)[-1]
        try:
            state = restore(newest, engine, opt, sched, loader, rt, t)
        except RunError:
            raise
        except Exception as e:  # a damaged file of the checkpoint's: its contents are input, never trusted
            older = checkpoint.checkpoints(out)[:-1]
            detail = str(e).splitlines()[0][:200] if str(e) else "no detail"
            raise RunError(f"checkpoint {newest} is damaged ({type(e).__name__}: {detail}); "
                           + (f"move it away to resume from {older[-1]}" if older
                              else "start a new run with --overwrite")) from None
        step, seen = state["step"], state["sequences_seen"]
        last = state.get("metrics", {})  # what a finished run reported, if it is resumed at its end
        carried = state.get("window", {})
        window, balance = dict(carried.get("sums", {})), dict(carried.get("balance", {}))
        window_step = carried.get("start", step)
        rt.say(f"resumed from {newest} at step {step} (saved on {state['replicas']} replica(s) x {state['stages']} "
               f"stage(s) x {state.get('sequence', 1)} sequence-parallel x {state.get('tensor', 1)} tensor-parallel, "
               "now "
               f"{rt.dp_world} x {stages} x {rt.sequence} x {rt.tensor})")
    per_update = (f"{P} packs/update = {levels[0].micro_batch_size} x {rt.dp_world} replica(s) x {accumulation} "
                  f"accumulation (about {P * p:.0f} sequences)"
                  if len(levels) == 1 else "levels " + "; ".join(
                      f"{lv.pack_length}: {n} packs/update, micro-batch {lv.micro_batch_size}, sequence parallel "
                      f"{lv.sequence_parallel}, {lv.checkpointed_layers} checkpointed layers"
                      for lv, n in zip(levels, P)) + f" ({t.level_order} order)")
    rt.say(f"{cfg.name}: {parameters / 1e6:.1f} M parameters, {task.describe()}, {per_update}"
           + (f", {stages} pipeline stages ({cfg.parallel.schedule})" if stages > 1 else "")
           + (f", sequence parallel over {rt.sequence} (Ulysses)" if rt.sequence > 1 else "")
           + (f", tensor parallel over {rt.tensor}" if rt.tensor > 1 else "")
           + f", {total} updates, betas {tuple(round(b, 6) for b in betas)}, {rt.device}")

    def stop_non_finite(what: str, at_step: int) -> None:
        found = checkpoint.checkpoints(out)
        raise RunError(f"step {at_step}: {what}; stopping. The last good checkpoint is "
                       f"{found[-1] if found else 'none (none was written yet)'}; resume from it with --resume and a "
                       "lower train.learning_rate (a resumed run takes the new one), or check the data")

    names = task.stat_names
    health = NonFinite()
    pending = None  # the loss sums of the updates since the last sync, on the device

    def sync() -> None:
        """Read the device's sums into the window (one copy to the host) and stop if an update was not finite."""
        nonlocal pending, window
        bad = health.first()
        if bad is not None:
            at, norm_bad, sums = bad
            if norm_bad:
                stop_non_finite("the gradient norm is not finite", at)
            loss = task.summarize(dict(zip(names, sums.tolist())) | health.counts[at])["loss"]
            stop_non_finite(f"the loss is {loss}", at)
        if pending is not None:
            window = window | {k: window.get(k, 0.0) + v for k, v in zip(names, pending.tolist())}
            pending = None

    def save(at_step: int) -> Path:
        sync()
        # never write a checkpoint of weights an update made non-finite: the last good one must stay the newest
        bad = float(not all(bool(torch.isfinite(local(q)).all()) for q in engine.module.parameters()))
        if rt.all_sum(torch.tensor([bad])).item() > 0:  # every rank (stage) checks its own part
            stop_non_finite("the weights are not finite after the update", at_step)
        if rt.tensor > 1:  # a checkpoint keeps one rank's copy of a replicated weight: all copies must be equal
            apart = float(not replicas_agree(engine.module, rt.mesh()["tp"]))
            if rt.all_sum(torch.tensor([apart])).item() > 0:
                raise RunError(f"step {at_step}: the replicated weights differ between tensor-parallel ranks (a bug: "
                               "please report it with the config); the last checkpoint is intact")
        state = {"step": at_step, "sequences_seen": seen, "scheduler": sched.state_dict(),
                 "loader": loader.state_dict(), "world": rt.world, "replicas": rt.dp_world, "stages": stages,
                 "tensor": rt.tensor, "sequence": rt.sequence,
                 "config": cfg.name, "learning_rate": t.learning_rate, "optimizer": t.optimizer, "metrics": last,
                 "window": {"sums": window, "balance": balance, "start": window_step}}
        return checkpoint.save(out / "checkpoints" / f"step-{at_step:07d}", engine.module, opt, state,
                               t.keep_checkpoints, rt.main)

    def due(every, at):
        return at == total or (every is not None and at % every == 0)

    evaluation = Level(0, None, t.micro_batch_size, rt.sequence)  # how evaluation runs between levels
    logger = MetricsLogger(out, rt.main, total, step, progress, desc=task.name, report_to=t.report_to, config=config,
                           name=cfg.name)
    clock = LevelClock(rt.device) if len(levels) > 1 else None  # each level's tokens/s
    first_step = step
    flops = step_flops(task, engine, rt, levels)  # the model FLOPs of each update, counted on the host (MFU)
    peak = peak_flops(rt.device, t.precision)
    # this process's share of the window: sequences, tokens, model FLOPs, since when
    timed = {"sequences": 0.0, "tokens": 0.0, "flops": 0.0, "since": time.perf_counter()}
    stop = StopSignal()
    outcome = "failed"  # what the trackers record if the loop ends by an error
    try:
        while step < total:
            started = time.perf_counter()
            mark = clock.start() if clock else None
            host = loader.next_update()  # CPU tensors: counted and measured here, then copied without waiting
            level = levels[loader.level] if len(levels) > 1 else levels[0]
            engine.use_level(level)
            spread = update_balance(engine, host, level.sequence_parallel > 1 or rt.sequence > 1)
            balance = {k: balance.get(k, 0.0) + v for k, v in spread.items()}
            counts = global_counts(task, engine, host)
            micro = [to_device(b, rt.device) for b in host]
            sums = engine.train_step(micro, task.normalizers(counts))
            norm = engine.clip(t.clip_grad_norm) if t.clip_grad_norm else None
            health.note(step + 1, sums, norm, counts)
            lr = opt.param_groups[0]["lr"]   # this update's (logged: read after sched.step it was the next one's)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if clock:
                clock.stop(mark, level.pack_length, counts["tokens"])
            step += 1
            pending = sums if pending is None else pending + sums
            window = window | {k: window.get(k, 0.0) + v for k, v in counts.items()}  # (keeping the sums read)
            seen += counts["sequences"]
            if flops is not None:
                timed["flops"] += sum(flops.of(b) for b in host)  # this replica's (every replica does as much)
            timed["sequences"] += counts["sequences"]
            timed["tokens"] += counts["tokens"]
            if step == first_step + 1 and t.compile != "none":  # said once; the throughput leaves this update out
                sync()
                what = "the layers" if t.compile == "layers" else "the step"
                rt.say(f"train.compile={t.compile}: the first update, which compiled {what}, took "
                       f"{time.perf_counter() - started:.1f} s")
                timed = {"sequences": 0.0, "tokens": 0.0, "flops": 0.0, "since": time.perf_counter()}
                if clock:
                    clock.take()
            row = {}   # this step's row: its window's training figures, its validation, or both
            if due(t.log_every, step):
                sync()  # the device's work of the window is done: its seconds are wall time
                seconds = time.perf_counter() - timed["since"]
                updates = step - window_step
                # no rates for a window of no timed update (the first, compiling update was its only one)
                speed = {"sequences_per_second": timed["sequences"] / seconds,
                         "tokens_per_second": timed["tokens"] / seconds} if timed["sequences"] else {}
                per_level = clock.take() if clock else {}
                row = last = task.summarize(window) | {"sequences_seen": seen, "lr": lr} | speed \
                    | {k: v / updates for k, v in balance.items()} \
                    | {f"tokens_per_second_{n}": tok / sec for n, (tok, sec) in sorted(per_level.items())} \
                    | (rates(timed["flops"], seconds, peak) if speed else {})
                window, balance, window_step = {}, {}, step
                timed = {"sequences": 0.0, "tokens": 0.0, "flops": 0.0, "since": time.perf_counter()}
            paused = time.perf_counter()   # validation and checkpoints are left out of the throughput
            if task.has_evaluation and due(t.validate_every, step):
                sync()
                model.eval()
                engine.use_level(evaluation)  # the validation rows: one length, the run's own layout
                validated = task.evaluate(engine, rt, step) | {"sequences_seen": seen}
                model.train()
                # (a row of validation alone: it repeated the last training row's loss, lr and rates at its step)
                row, last = row | validated, last | validated
                evaluated = {k: v for k, v in row.items() if k in task.headline}   # (the training loss too, if logged)
                if evaluated:
                    rt.say(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluated.items()))
            if row:
                shown = (*task.progress_keys, "abr") if rt.dp_world > 1 else task.progress_keys
                logger.log(step, row, {k: row[k] for k in shown if k in row})
            if due(t.checkpoint_every, step):
                save(step)
            timed["since"] += time.perf_counter() - paused
            logger.advance()
            signum = stop.requested(rt)
            if signum == signal.SIGTERM:  # a scheduler's: checkpoint this update, then stop
                if not due(t.checkpoint_every, step):
                    save(step)
                raise Interrupted(f"stopped at step {step} by SIGTERM; checkpoint "
                                  f"{out / 'checkpoints' / f'step-{step:07d}'}; continue with --resume", signum)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
        outcome = "finished"
    except Interrupted:
        outcome = "killed"
        raise
    except RuntimeError as e:
        if isinstance(e, RunError) or not peer_failed(e, rt):
            raise
        found = checkpoint.checkpoints(out)
        raise RunError(f"stopped at step {step}: another process of the run failed or was killed (a collective "
                       f"lost its peer); last checkpoint {found[-1] if found else 'none'}; "
                       + ("continue with --resume" if found else "rerun with --overwrite"), local=False) from None
    except KeyboardInterrupt:
        outcome = "killed"
        found = checkpoint.checkpoints(out)
        raise Interrupted(f"stopped at step {step} by Ctrl-C; last checkpoint {found[-1] if found else 'none'}; "
                          "continue with --resume" if found else f"stopped at step {step} by Ctrl-C before the "
                          "first checkpoint; rerun with --overwrite", signal.SIGINT) from None
    finally:
        stop.restore()
        logger.close(outcome)
    result = {"step": step, "output_dir": str(out), "metrics": last, "packs_per_update": P,
              "accumulation": accumulation, "packing_factor": p, "sequences_seen": seen} | task.result_extra()
    full = engine.full_model()  # a collective in pipeline mode
    error = None
    if rt.main:
        export = out / "hf"
        found = checkpoint.checkpoints(out)
        try:
            task.export(full, export, {"steps": step, "sequences_seen": seen, "metrics": last})
            result["export"] = str(export)
            write_json(out / "results.json", result)
        except (ExportError, OSError) as e:  # a full disk at the very end: the checkpoint is what counts
            why = str(e) if isinstance(e, ExportError) else f"writing {out / 'results.json'} failed: {e.strerror}"
            error = f"{why} (checkpoint {found[-1] if found else 'none'} is intact: --resume exports it)"
        else:
            rt.say(f"done: {step} updates; checkpoint {found[-1] if found else 'none'}; Hugging Face export {export}")
    error = rt.broadcast_error(error)  # every rank stops with it, none waits at the barrier
    if error:
        raise RunError(error)
    rt.barrier()
    return result
