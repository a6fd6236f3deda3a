"""Pretraining loop: packed (or unpacked) BERT from the data pipeline's shards.

`main(cfg)` runs one job and returns its result (final metrics, paths). Single process, data parallel under
torchrun (DDP; gloo on CPU, nccl on GPU), pipeline parallel (`parallel.pipeline_stages`, see
bert_ipu/pipeline_parallel.py), or pipeline x data parallel. Per optimizer update:

- the global batch is `train.global_batch_size` packs, or about that many sequences (`batch_unit`), split
  into micro-batches over replicas and gradient-accumulation steps;
- all micro-batches of the update are read first, their masked tokens and present sequences are counted
  and summed over replicas (or, with `loss_balancing`, the expected counts are used: the paper's option),
  and every micro-batch's loss is its summed loss over those global counts, so
  packing, accumulation and data parallelism never change the weight of a token or a sequence (DDP
  averages gradients over replicas, so each replica's loss is scaled by the world size);
- LAMB (pytorch_optimizer) or AdamW, no weight decay on biases and LayerNorm, warm-up then polynomial
  decay, gradient clipping; with `batch_unit: packs` on packed data the betas become beta ** p (p = the
  dataset's packing factor), the paper's correction for p times more sequences per update.

A checkpoint (weights as safetensors, optimizer, scheduler, loader position, RNG state) is written
atomically every `checkpoint_every` steps and at the end, keeping the last `keep_checkpoints`; `resume`
continues from the newest one exactly. A non-finite loss stops the run with a clear error; the last good
checkpoint stays. At the end the model is exported to `OUTPUT/hf`, a folder transformers loads.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from .config import OptimizerConfig, RunConfig, to_dict
from .data.dataset import PackedLoader
from .data.instances import InstanceConfig
from .data.pipeline import create_pretraining_data, pack_pretraining_data
from .data.shards import DatasetError, PackedDataset
from .modeling import IGNORE_INDEX, PackedBertForPreTraining


class TrainingError(RuntimeError):
    """The run cannot go on (bad data, a non-finite loss, ...); the message says why and what to do."""


# --- set-up ------------------------------------------------------------------------------------------------

def init_distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world_size); joins the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise TrainingError("train.device is cuda but no CUDA device is visible; use train.device=cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    """The forward pass's precision: bf16 = torch.autocast to bfloat16 (matmuls and attention in bf16, softmax,
    LayerNorm and the losses in float32, the weights and optimizer float32); fp32 = nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def ensure_dataset(cfg: RunConfig, rank: int, say) -> Path:
    """The configured dataset; created from `data.prepare_input` (rank 0) when missing."""
    path = Path(cfg.data.dataset)
    if not (path / "manifest.json").is_file():
        if cfg.data.prepare_input is None:
            raise TrainingError(f"dataset {path} does not exist; create it with data/create_pretraining_data.py "
                                "and data/pack_pretraining_data.py, or set data.prepare_input")
        if rank == 0:
            instances = path.with_name(path.name + "_instances")
            say(f"creating pretraining instances from {cfg.data.prepare_input} -> {instances}")
            if not (instances / "manifest.json").is_file():
                create_pretraining_data([cfg.data.prepare_input], instances,
                                        InstanceConfig(max_seq_length=cfg.data.max_seq_length),
                                        validation_fraction=cfg.data.validation_fraction, overwrite=True)
            say(f"packing them ({cfg.data.algorithm}, at most {cfg.data.max_sequences_per_pack} a pack) -> {path}")
            pack_pretraining_data(instances, path, cfg.data.algorithm, cfg.data.max_sequences_per_pack,
                                  overwrite=True)
        if dist.is_initialized():
            dist.barrier()
    return path


def param_groups(named_parameters, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in named_parameters:
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(named_parameters, t: OptimizerConfig, total_steps: int, warmup_steps: int, betas: tuple):
    """LAMB or AdamW without weight decay on biases and LayerNorm; linear warm-up over `warmup_steps`, then
    polynomial decay to 0 at `total_steps`."""
    groups = param_groups(named_parameters, t.weight_decay)
    if t.optimizer == "lamb":
        from pytorch_optimizer import Lamb

        opt = Lamb(groups, lr=t.learning_rate, betas=betas, eps=t.eps, weight_decay=t.weight_decay)
    else:
        opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=betas, eps=t.eps)
    power = t.decay_power

    def schedule(step):  # step = updates done so far
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps)) ** power

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


# --- checkpoints -------------------------------------------------------------------------------------------

def checkpoints(out: Path) -> list[Path]:
    folder = out / "checkpoints"
    return sorted(p for p in folder.glob("step-*") if (p / "state.pt").is_file() and not p.name.endswith(".partial"))


def save_checkpoint(out: Path, step: int, engine, opt, sched, loader, keep: int, sequences_seen: float = 0) -> Path:
    """Weights (the whole model, safetensors), and optimizer + scheduler state of every optimizer: one file
    per pipeline stage (data-parallel replicas share theirs). Written to step-N.partial, then renamed."""
    from safetensors.torch import save_model

    rank = dist.get_rank() if dist.is_initialized() else 0
    final = out / "checkpoints" / f"step-{step:07d}"
    partial = final.with_name(final.name + ".partial")
    model = engine.full_model()  # collective in pipeline mode: every rank calls it
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    engine.barrier()
    if engine.writes_optimizer:
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
                   partial / f"optimizer-{engine.stage or 0}.pt")
    engine.barrier()
    if rank == 0:
        save_model(model, str(partial / "model.safetensors"))
        state = {"step": step, "sequences_seen": sequences_seen, "loader": loader.state_dict(),
                 "torch_rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save(state, partial / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        for old in checkpoints(out)[:-keep]:
            shutil.rmtree(old)
    engine.barrier()
    return final


def load_checkpoint(path: Path, engine, opt, sched, loader) -> tuple[int, float]:
    from safetensors.torch import load_model

    load_model(engine.model, str(path / "model.safetensors"))
    optim = torch.load(path / f"optimizer-{engine.stage or 0}.pt", weights_only=False)
    opt.load_state_dict(optim["optimizer"])
    sched.load_state_dict(optim["scheduler"])
    state = torch.load(path / "state.pt", weights_only=False)
    loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"], state.get("sequences_seen", 0)


# --- the loop ----------------------------------------------------------------------------------------------

def forever(loader):
    while True:
        yield from loader


def all_sum(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        values = values.clone()
        dist.all_reduce(values)
    return values


def batch_stats(out, batch) -> torch.Tensor:
    """Sums over a micro-batch: mlm loss, mlm count, mlm correct, nsp loss, nsp count, nsp correct, tokens."""
    with torch.no_grad():
        labels = batch["masked_lm_labels"]
        mlm_correct = ((out.mlm_logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
        w = batch["next_sentence_weights"]
        nsp_correct = ((out.nsp_logits.argmax(-1) == batch["next_sentence_labels"]).float() * w).sum()
        tokens = (batch["sequence_ids"] > 0).sum()
        return torch.stack([out.mlm_loss_sum.detach().double(), out.mlm_count.double(), mlm_correct.double(),
                            out.nsp_loss_sum.detach().double(), out.nsp_count.double(), nsp_correct.double(),
                            tokens.double()])


def summarize(stats: torch.Tensor) -> dict:
    mlm_loss, mlm_n, mlm_ok, nsp_loss, nsp_n, nsp_ok, tokens = stats.tolist()
    return {"loss": mlm_loss / max(mlm_n, 1) + nsp_loss / max(nsp_n, 1), "mlm_loss": mlm_loss / max(mlm_n, 1),
            "nsp_loss": nsp_loss / max(nsp_n, 1), "mlm_accuracy": mlm_ok / max(mlm_n, 1),
            "nsp_accuracy": nsp_ok / max(nsp_n, 1), "sequences": nsp_n, "tokens": tokens}


class LocalEngine:
    """The whole model on this process; data parallel with DDP when there are several processes."""

    stage = None
    eval_micro_batches = 1  # micro-batches evaluated together

    @property
    def writes_optimizer(self) -> bool:  # replicas hold equal optimizer states: rank 0 saves one
        return not dist.is_initialized() or dist.get_rank() == 0

    def dp_sum(self, values: torch.Tensor) -> torch.Tensor:
        return all_sum(values) if self.world > 1 else values

    def __init__(self, model: PackedBertForPreTraining, world: int, precision: str = "fp32"):
        self.model, self.world, self.precision = model, world, precision
        self.device = next(model.parameters()).device
        self.ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    def named_parameters(self):
        return self.model.named_parameters()

    def train_step(self, micro: list[dict], normalizers: tuple[float, float]) -> torch.Tensor:
        stats = torch.zeros(7, dtype=torch.float64)
        for i, batch in enumerate(micro):
            sync = self.ddp.no_sync() if self.world > 1 and i < len(micro) - 1 else nullcontext()
            with sync:
                with autocast(self.device, self.precision):
                    o = self.ddp(**batch, mlm_normalizer=normalizers[0], nsp_normalizer=normalizers[1])
                (o.loss * self.world).backward()  # DDP averages gradients over replicas; we want their sum
            stats += batch_stats(o, batch).cpu()
        return self.dp_sum(stats)

    def evaluate(self, batches: list[dict]) -> torch.Tensor:
        stats = torch.zeros(7, dtype=torch.float64)
        with torch.no_grad():
            for batch in batches:
                with autocast(self.device, self.precision):
                    out = self.model(**batch)
                stats += batch_stats(out, batch).cpu()
        return self.dp_sum(stats)

    def clip(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def full_model(self) -> PackedBertForPreTraining:
        return self.model

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()


class PipelineEngine(LocalEngine):
    """This process's pipeline stage (bert_ipu.pipeline_parallel), data parallel over replicas of the pipeline
    when there are more processes than stages; the micro-batches of an update are the schedule's."""

    def __init__(self, model: PackedBertForPreTraining, cfg: RunConfig, mlm_slots: int, micro_batches: int, device):
        from .pipeline_parallel import Pipeline

        self.model, self.world = model, 1
        self.pipe = Pipeline(model, cfg.parallel.pipeline_stages, mlm_slots, micro_batches, cfg.parallel.schedule,
                             cfg.parallel.layers_per_stage, device)
        self.stage = self.pipe.rank
        self.eval_micro_batches = micro_batches  # the schedule always runs all of its micro-batches

    @property
    def writes_optimizer(self) -> bool:  # replica 0 saves one optimizer file per stage
        return self.pipe.replica == 0

    def dp_sum(self, values):
        return self.pipe.dp_sum(values)

    def named_parameters(self):
        return self.pipe.module.named_parameters()

    def train_step(self, micro, normalizers):
        self.pipe.step({k: torch.cat([b[k] for b in micro]) for k in micro[0]}, normalizers)
        return self.pipe.stats()

    def evaluate(self, batches):
        n = self.eval_micro_batches
        stats = torch.zeros(7, dtype=torch.float64)
        for lo in range(0, len(batches) - n + 1, n):
            self.pipe.evaluate({k: torch.cat([b[k] for b in batches[lo:lo + n]]) for k in batches[0]})
            stats += self.pipe.stats()
        return stats

    def clip(self, max_norm):
        self.pipe.clip_grad_norm_(max_norm)

    def full_model(self):
        """Every stage's parameters copied into rank 0's whole model (a collective)."""
        state = self.pipe.gather_state_dict()
        if state is not None:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected or set(missing) - {"cls.predictions.decoder.bias", "cls.predictions.bias",
                                             "cls.predictions.decoder.weight"}:
                raise TrainingError(f"pipeline stages did not cover the model: missing {missing}")
        return self.model


def validate(engine, data: PackedDataset, cfg: RunConfig, rank: int, world: int, device) -> dict:
    """MLM and NSP loss and accuracy on (up to `validation_batches` micro-batches of) the held-out split."""
    group = engine.eval_micro_batches
    # a small held-out split still validates: the micro-batch shrinks to what every rank can fill
    micro = max(1, min(cfg.train.micro_batch_size, data.packs("validation") // (world * group)))
    loader = PackedLoader(data, "validation", micro, shuffle=False, rank=rank, world_size=world)
    batches = []
    for batch in loader:
        if len(batches) >= max(cfg.train.validation_batches, group):
            break
        batches.append({k: v.to(device) for k, v in batch.items()})
    engine.model.eval()
    stats = engine.evaluate(batches)
    engine.model.train()
    return {f"val_{k}": v for k, v in summarize(stats).items()}


def main(cfg: RunConfig, resume: bool = False, progress: bool = True) -> dict:
    from tqdm import tqdm

    device = pick_device(cfg.train.device)
    rank, processes = init_distributed(device)
    stages = cfg.parallel.pipeline_stages
    if processes % stages:
        raise TrainingError(f"parallel.pipeline_stages={stages} needs a multiple of {stages} processes (stages x "
                            f"data-parallel replicas); got {processes}")
    # data-parallel rank and size: the stages of one pipeline replica read the same micro-batches
    rank_dp, world = divmod(rank, stages)[0], processes // stages
    say = (lambda msg: print(f"[run] {msg}", flush=True)) if rank == 0 else (lambda msg: None)
    out = Path(cfg.output_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    path = ensure_dataset(cfg, rank, say)
    try:
        data = PackedDataset(path)
    except DatasetError as e:
        raise TrainingError(str(e)) from None
    if "validation" not in data.splits or data.packs("validation") < world:
        raise TrainingError(f"{path} has no validation split (or fewer packs than replicas); recreate it with a "
                            "larger --validation-fraction")
    if data.packs("train") < cfg.train.micro_batch_size * world:
        raise TrainingError(f"{path} holds {data.packs('train')} training packs: not one micro-batch of "
                            f"{cfg.train.micro_batch_size} for each of {world} replica(s)")
    layout, manifest = data.layout, data.manifest
    packed = layout.max_sequences_per_pack > 1
    p = manifest["packing"]["train"]["packing_factor"] if "packing" in manifest else 1.0

    t = cfg.train
    per_step = t.micro_batch_size * world
    if t.batch_unit == "packs":
        packs_per_update = t.global_batch_size
    else:  # about global_batch_size sequences: 1/p as many packs, rounded to whole micro-batches
        packs_per_update = max(per_step, round(t.global_batch_size / p / per_step) * per_step)
    if packs_per_update % per_step:
        raise TrainingError(f"the update holds {packs_per_update} packs, not a multiple of micro_batch_size x "
                            f"replicas = {per_step}; change train.global_batch_size or train.micro_batch_size")
    accumulation = packs_per_update // per_step
    if stages > 1 and cfg.parallel.schedule == "1f1b" and accumulation < stages:
        raise TrainingError(f"1F1B over {stages} stages needs at least {stages} micro-batches per update, got "
                            f"{accumulation}; raise train.global_batch_size or lower train.micro_batch_size")

    expected = None
    if t.loss_balancing:  # expected counts per update, from the whole training split
        labels = [shard["masked_lm_labels"] for shard in data.shards("train")]
        masked_per_pack = sum(int((x != IGNORE_INDEX).sum()) for x in labels) / data.packs("train")
        expected = (packs_per_update * masked_per_pack, packs_per_update * p)

    torch.manual_seed(t.seed)
    bert_config = cfg.model.bert_config(manifest["vocab"]["size"], layout.pack_len)
    if cfg.model.init_checkpoint:
        model = PackedBertForPreTraining.from_pretrained(cfg.model.init_checkpoint,
                                                         max_sequences_per_pack=layout.max_sequences_per_pack,
                                                         attention_backend=cfg.model.attention_backend)
        bert_config = model.config
    else:
        model = PackedBertForPreTraining(bert_config, layout.max_sequences_per_pack, cfg.model.attention_backend)
    model.to(device).train()
    engine = (PipelineEngine(model, cfg, layout.mlm_slots, accumulation, device) if stages > 1
              else LocalEngine(model, world, t.precision))
    betas = t.betas
    if packed and t.batch_unit == "packs" and t.packing_beta_correction:
        betas = tuple(b ** p for b in betas)  # p times more sequences per update: the paper's correction
    opt, sched = make_optimizer(engine.named_parameters(), t, t.max_steps, t.warmup_steps, betas)
    loader = PackedLoader(data, "train", t.micro_batch_size, seed=t.seed, rank=rank_dp, world_size=world)

    step, sequences_seen = 0, 0.0
    if resume:
        found = checkpoints(out)
        if not found:
            raise TrainingError(f"--resume: no checkpoint in {out / 'checkpoints'}; start without --resume")
        step, sequences_seen = load_checkpoint(found[-1], engine, opt, sched, loader)
        say(f"resumed from {found[-1]} at step {step}")
    say(f"{cfg.name}: {model.num_parameters() / 1e6:.1f} M parameters, {'packed' if packed else 'unpacked'} data "
        f"{path} (S={layout.pack_len}, p={p:.3f}), {packs_per_update} packs/update = {t.micro_batch_size} x "
        f"{world} replica(s) x {accumulation} accumulation"
        + (f", {stages} pipeline stages ({cfg.parallel.schedule})" if stages > 1 else "")
        + f", betas {tuple(round(b, 6) for b in betas)}, {device}")

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tensorboard"))
    metrics_file = open(out / "metrics.jsonl", "a") if rank == 0 else None
    batches = forever(loader)
    bar = tqdm(total=t.max_steps, initial=step, desc="pretraining", disable=rank != 0 or not progress or None)
    last = {}
    window = torch.zeros(7, dtype=torch.float64)
    window_time, window_start = 0.0, time.perf_counter()
    try:
        while step < t.max_steps:
            micro = [{k: v.to(device) for k, v in next(batches).items()} for _ in range(accumulation)]
            counts = torch.stack([torch.stack([(b["masked_lm_labels"] != IGNORE_INDEX).sum(),
                                               b["next_sentence_weights"].sum().long()]) for b in micro]).sum(0)
            if expected is None:  # summed over data-parallel replicas (the stages of a pipeline share a batch)
                mlm_total, nsp_total = engine.dp_sum(counts.to(torch.float64)).tolist()
            else:
                mlm_total, nsp_total = expected
            stats = engine.train_step(micro, (max(mlm_total, 1.0), max(nsp_total, 1.0)))
            summary = summarize(stats)
            if not math.isfinite(summary["loss"]):
                ckpt = checkpoints(out)
                raise TrainingError(f"step {step + 1}: the loss is {summary['loss']}; stopping. The last good "
                                    f"checkpoint is {ckpt[-1] if ckpt else 'none (none was written yet)'}; lower "
                                    "train.learning_rate or check the data, then resume with --resume")
            if t.clip_grad_norm:
                engine.clip(t.clip_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            sequences_seen += stats[4].item()
            window += stats
            if step % t.log_every == 0 or step == t.max_steps:
                seconds = time.perf_counter() - window_start
                last = summarize(window) | {"step": step, "sequences_seen": sequences_seen,
                                            "lr": sched.get_last_lr()[0],
                                            "sequences_per_second": window[4].item() / seconds,
                                            "tokens_per_second": window[6].item() / seconds}
                window.zero_()
                window_start = time.perf_counter()
                if rank == 0:
                    bar.set_postfix(loss=f"{last['loss']:.3f}", mlm_acc=f"{last['mlm_accuracy']:.3f}",
                                    nsp_acc=f"{last['nsp_accuracy']:.3f}",
                                    seq_s=f"{last['sequences_per_second']:.1f}",
                                    tok_s=f"{last['tokens_per_second']:.0f}")
            if step % t.validate_every == 0 or step == t.max_steps:
                last = last | validate(engine, data, cfg, rank_dp, world, device) | {"step": step,
                                                                                  "sequences_seen": sequences_seen}
                if rank == 0:
                    say(f"step {step}: loss {last.get('loss', float('nan')):.4f}, validation MLM accuracy "
                        f"{last['val_mlm_accuracy']:.4f}, NSP accuracy {last['val_nsp_accuracy']:.4f}")
            if rank == 0 and (step % t.log_every == 0 or step % t.validate_every == 0 or step == t.max_steps):
                metrics_file.write(json.dumps({k: v for k, v in last.items()}) + "\n")
                metrics_file.flush()
                for k, v in last.items():
                    if k != "step":
                        writer.add_scalar(k, v, step)
            if step % t.checkpoint_every == 0 or step == t.max_steps:
                save_checkpoint(out, step, engine, opt, sched, loader, t.keep_checkpoints, sequences_seen)
            bar.update(1)
    finally:
        bar.close()
        if metrics_file:
            metrics_file.close()
        if writer:
            writer.close()
    result = {"step": step, "output_dir": str(out), "metrics": last, "dataset": str(path), "packing_factor": p,
              "packs_per_update": packs_per_update, "accumulation": accumulation}
    full = engine.full_model()
    if rank == 0:
        full.save_pretrained(out / "hf")
        result["export"] = str(out / "hf")
        say(f"done: {step} steps; checkpoint {checkpoints(out)[-1]}; Hugging Face export {out / 'hf'}")
    if dist.is_initialized():
        dist.barrier()
    return result
