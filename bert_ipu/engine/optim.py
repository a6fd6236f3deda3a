"""Optimizer, schedule and the size of an update: what pretraining and fine-tuning share.

    P = packs_per_update(train, packing_factor, replicas)          # packs of one update, all replicas
    opt, sched = build_optimizer(model, train, total_steps, warmup_steps, betas)
"""

from __future__ import annotations

import math

import torch

from .runtime import RunError


NORMS = tuple(c for c in (torch.nn.LayerNorm, torch.nn.GroupNorm, getattr(torch.nn, "RMSNorm", None),
                           torch.nn.modules.batchnorm._NormBase) if c is not None)


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and normalisation weights (BERT's recipe), chosen by module type, so any
    model's norms (LayerNorm, RMSNorm, ...) qualify whatever their names: torch's norms and any module whose class
    name ends in Norm (transformers' own: LlamaRMSNorm subclasses nn.Module, and Llama runs decayed its norms)."""
    norm_params = {id(p) for m in module.modules() if isinstance(m, NORMS) or type(m).__name__.endswith("Norm")
                   for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        (no_decay if name.endswith("bias") or id(p) in norm_params else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class ShardedLamb(torch.optim.Optimizer):
    """pytorch_optimizer's LAMB for parameters split over tensor-parallel ranks (DTensors), on the multi-tensor
    (foreach) path: the same update with its defaults (decoupled weight decay, gradient averaging, first moment
    bias-corrected, weight norm clamped at 10, trust ratio 1 when a norm is 0), but every norm taken over the
    whole parameter, not this rank's shard: the squared norms of the split parameters are summed over their ranks
    in one all-reduce a step. pytorch_optimizer's LAMB cannot run on DTensors (it clamps a partial norm in place);
    on plain tensors this class computes what it computes (tests/test_tensor_parallel.py). No host
    synchronisation: the trust ratios stay on the device."""

    clamp = 10.0

    def __init__(self, params, lr: float, betas: tuple, eps: float, weight_decay: float):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self._split: dict[tuple, torch.Tensor] = {}  # which parameters are split (a device mask, made once)

    def _whole_norms(self, index: int, params: list, values: list) -> torch.Tensor:
        """(2, n): the L2 norms of the parameters and of `values` (laid out as the parameters), each over the whole
        parameter."""
        from .tensor import is_distributed, local

        norms = torch.stack([torch.stack(torch._foreach_norm([local(p) for p in params])),
                             torch.stack(torch._foreach_norm(values))])
        split = [is_distributed(p) and any(pl.is_shard() for pl in p.placements) for p in params]
        if not any(split):
            return norms
        key = (index, tuple(id(p) for p in params))  # the parameters with a gradient this step
        if key not in self._split:
            self._split[key] = torch.tensor(split, device=norms.device)
        mask = self._split[key]
        import torch.distributed as dist

        squares = norms.square() * mask
        dist.all_reduce(squares, group=next(p for p, s in zip(params, split) if s).device_mesh.get_group())
        return torch.where(mask, squares.sqrt(), norms)

    @torch.no_grad()
    def step(self, closure=None):
        from .tensor import local

        # one count of updates for every group, as pytorch_optimizer's LAMB keeps on a fresh run (a group's own
        # count started at 1 when its parameters first had gradients: a checkpoint's norms moved into a group that
        # had none, Llama's no-decay group before its RMSNorms joined it, got a first step's bias correction after
        # N updates; checkpoint.load gives such a group the others' count, for either optimizer)
        step = max(group.get("step", 0) for group in self.param_groups) + 1
        for index, group in enumerate(self.param_groups):
            group["step"] = step
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            (beta1, beta2), lr, eps, decay = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            step_size = lr / (1.0 - beta1 ** group["step"])
            for p in params:
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            weights = [local(p) for p in params]
            grads = [local(p.grad) for p in params]
            exp_avgs = [local(self.state[p]["exp_avg"]) for p in params]
            exp_avg_sqs = [local(self.state[p]["exp_avg_sq"]) for p in params]
            torch._foreach_mul_(exp_avgs, beta1)
            torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
            if decay:
                torch._foreach_mul_(weights, 1.0 - decay * lr)
            updates = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(updates, eps)
            torch._foreach_reciprocal_(updates)
            torch._foreach_mul_(updates, exp_avgs)
            weight_norms, update_norms = self._whole_norms(index, params, updates)
            weight_norms = weight_norms.clamp(max=self.clamp)
            ratios = torch.where((weight_norms != 0) & (update_norms != 0), weight_norms / (update_norms + eps),
                                 torch.ones_like(weight_norms)).unbind()
            for p, ratio in zip(params, ratios):
                self.state[p]["trust_ratio"] = ratio
            torch._foreach_mul_(updates, ratios)
            torch._foreach_add_(weights, updates, alpha=-step_size)


def build_optimizer(module: torch.nn.Module, t, total_steps: int, warmup_steps: int, betas: tuple,
                    sharded: bool = False):
    """LAMB (pytorch_optimizer's, on its multi-tensor path; ShardedLamb when the parameters are split over
    tensor-parallel ranks) or AdamW (fused into one kernel per step on CUDA, multi-tensor elsewhere), without
    weight decay on biases and LayerNorm; linear warm-up over `warmup_steps`, then polynomial decay
    (`t.decay_power`) to 0 at `total_steps`. None of them synchronises the host within a step."""
    groups = param_groups(module, t.weight_decay)
    if t.optimizer == "lamb" and sharded:
        opt = ShardedLamb(groups, lr=t.learning_rate, betas=betas, eps=t.eps, weight_decay=t.weight_decay)
    elif t.optimizer == "lamb":
        from pytorch_optimizer import Lamb

        # foreach: a few multi-tensor kernels a step; its per-tensor path tests each norm on the host (a sync per
        # parameter)
        opt = Lamb(groups, lr=t.learning_rate, betas=betas, eps=t.eps, weight_decay=t.weight_decay, foreach=True)
    else:
        cuda = next(module.parameters()).device.type == "cuda"
        opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=betas, eps=t.eps, fused=cuda or None)
    power = t.decay_power

    def schedule(step):  # step = updates done so far
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps)) ** power

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def fitted_micro_batch_size(t, packing_factor: float, replicas: int, micro_batch_size: int | None = None) -> int:
    """With train.batch_unit=sequences an update holds about global_batch_size sequences, 1/p as many packs. When
    that is less than one micro-batch on every replica (GLUE packed at p = 13: 2.5 packs against micro-batches
    of 8 would train on about 100 examples an update instead of 32), the micro-batch shrinks to the packs a
    replica's share needs (at least 1). `micro_batch_size`: default the train section's."""
    micro_batch_size = t.micro_batch_size if micro_batch_size is None else micro_batch_size
    share = t.global_batch_size / packing_factor / replicas
    if t.batch_unit != "sequences" or share >= micro_batch_size:
        return micro_batch_size
    return max(1, round(share))


def packs_per_update(t, packing_factor: float, replicas: int, micro_batch_size: int | None = None) -> int:
    """Packs of one update over all replicas: `global_batch_size` packs, or (batch_unit: sequences) about
    that many sequences, i.e. 1/p as many packs rounded to whole micro-batches of every replica (of
    `micro_batch_size` packs; default the train section's)."""
    micro_batch_size = t.micro_batch_size if micro_batch_size is None else micro_batch_size
    per_step = micro_batch_size * replicas
    if t.batch_unit == "packs":
        packs = t.global_batch_size
    else:
        packs = max(per_step, round(t.global_batch_size / packing_factor / per_step) * per_step)
    if packs % per_step:
        raise RunError(f"the update holds {packs} packs, not a multiple of micro_batch_size x replicas = "
                       f"{per_step}; change train.global_batch_size or the micro-batch size")
    return packs


def packing_betas(t, packed: bool, packing_factor: float) -> tuple:
    """The paper's correction: with batch_unit packs an update holds p times more sequences, so beta ** p."""
    if packed and t.batch_unit == "packs" and t.packing_beta_correction:
        return tuple(b ** packing_factor for b in t.betas)
    return tuple(t.betas)


def schedule_length(t, updates_per_epoch: int) -> tuple[int, int]:
    """(total updates, warm-up updates) from max_steps or num_train_epochs, warmup_steps or the proportion."""
    total = t.max_steps if t.max_steps is not None else max(1, math.ceil(t.num_train_epochs * updates_per_epoch))
    warmup = t.warmup_steps if t.warmup_steps is not None else int(total * t.warmup_proportion)
    return total, warmup
