"""Pipeline parallelism: packed BERT split into stages at encoder-layer boundaries, run by
`torch.distributed.pipelining` (GPipe or 1F1B schedules).

Every rank builds the whole model from the same seed, then keeps the modules of its stage:

    stage 0:      embeddings + its layers           in: input_ids, position_ids, token_type_ids, sequence_ids
    stage i:      its layers                        in: hidden (B, S, H), sequence_ids
    last stage:   its layers + pooler + heads       out: mlm_logits (B, M, V), nsp_logits (B, K, 2)

`sequence_ids` travels with the activations (integer tensors get no gradient), so every stage builds its
own attention mask. Parameter names stay those of the full model (the layers keep their keys "0".."N-1").

The MLM decoder is tied to the word embeddings, which live on the first stage. As in Megatron, the last
stage holds its own copy (initialised identically, since every rank builds the same model) and after each
backward the two copies' gradients are summed between the first and last stage, so both take the same
optimizer step and stay equal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .modeling import IGNORE_INDEX, PackedBertForPreTraining, attention_for

TIED_FIRST = "embeddings.word_embeddings.weight"
TIED_LAST = "cls.predictions.decoder.weight"


def split_layers(num_layers: int, stages: int, layers_per_stage: list[int] | None = None) -> list[list[int]]:
    """Layer indices per stage: as given, or as even as possible (earlier stages take the remainder)."""
    if layers_per_stage is None:
        base, extra = divmod(num_layers, stages)
        layers_per_stage = [base + (i < extra) for i in range(stages)]
    if len(layers_per_stage) != stages or sum(layers_per_stage) != num_layers or min(layers_per_stage) < 0:
        raise ValueError(f"layers_per_stage {layers_per_stage} must give {stages} stages summing to {num_layers}")
    out, at = [], 0
    for n in layers_per_stage:
        out.append(list(range(at, at + n)))
        at += n
    return out


class StageModule(nn.Module):
    """One pipeline stage of a PackedBertForPreTraining (shares its modules)."""

    def __init__(self, model: PackedBertForPreTraining, layers: list[int], first: bool, last: bool, mlm_slots: int):
        super().__init__()
        self.first, self.last, self.mlm_slots = first, last, mlm_slots
        self.max_sequences_per_pack = model.max_sequences_per_pack
        self.attention_backend = model.bert.attention_backend
        if first:
            self.embeddings = model.bert.embeddings
        self.layer = nn.ModuleDict({str(i): model.bert.encoder.layer[str(i)] for i in layers})
        if last:
            self.pooler = model.bert.pooler
            self.cls = model.cls

    def forward(self, *inputs):
        if self.first:
            input_ids, position_ids, token_type_ids, sequence_ids = inputs
            hidden = self.embeddings(input_ids, position_ids, token_type_ids)
        else:
            hidden, sequence_ids = inputs
        attention = attention_for(sequence_ids, self.attention_backend, hidden.dtype)
        for layer in self.layer.values():
            hidden = layer(hidden, attention)
        if not self.last:
            return hidden, sequence_ids
        mlm = self.cls.predictions(hidden[:, : self.mlm_slots])
        nsp = self.cls.seq_relationship(self.pooler(hidden[:, -self.max_sequences_per_pack:]))
        return mlm, nsp

    def full_name(self, name: str) -> str:
        """This stage's parameter name -> the full model's (checkpoint) name."""
        head, _, rest = name.partition(".")
        return {"embeddings": "bert.embeddings.", "layer": "bert.encoder.layer.", "pooler": "bert.pooler.",
                "cls": "cls."}[head] + rest


def pack_targets(batch: dict) -> torch.Tensor:
    """The last stage's labels as one tensor the schedule can split into micro-batches: (B, M + 2K)."""
    return torch.cat([batch["masked_lm_labels"], batch["next_sentence_labels"],
                      batch["next_sentence_weights"].round().long()], dim=1)


class PipelineLoss:
    """loss_fn of the schedule: summed MLM and NSP losses of a micro-batch over the update's global counts
    (set before each step), and running sums for the metrics."""

    def __init__(self, mlm_slots: int, k: int):
        self.mlm_slots, self.k = mlm_slots, k
        self.normalizers = (1.0, 1.0)
        self.calls: list[torch.Tensor] = []  # metrics sums of each call in the current step

    def __call__(self, output, target):
        mlm_logits, nsp_logits = output
        labels = target[:, : self.mlm_slots]
        nsp_labels = target[:, self.mlm_slots: self.mlm_slots + self.k]
        weights = target[:, self.mlm_slots + self.k:].to(torch.float32)
        mlm_sum = nn.functional.cross_entropy(mlm_logits.flatten(0, 1).float(), labels.flatten(),
                                              ignore_index=IGNORE_INDEX, reduction="sum")
        nsp_each = nn.functional.cross_entropy(nsp_logits.flatten(0, 1).float(), nsp_labels.flatten(), reduction="none")
        nsp_sum = (nsp_each * weights.flatten()).sum()
        with torch.no_grad():
            mask = labels != IGNORE_INDEX
            self.calls.append(torch.stack([
                mlm_sum.detach().double(), mask.sum().double(),
                ((mlm_logits.argmax(-1) == labels) & mask).sum().double(), nsp_sum.detach().double(),
                weights.sum().double(), ((nsp_logits.argmax(-1) == nsp_labels).float() * weights).sum().double(),
                torch.zeros((), dtype=torch.float64)]))
        return mlm_sum / self.normalizers[0] + nsp_sum / self.normalizers[1]


class Pipeline:
    """This rank's stage, its schedule, and the collectives of pipeline x data parallelism.

    The processes form a (data-parallel replicas x stages) grid: global rank = replica * stages + stage, so
    the stages of one replica are consecutive ranks. Activations move within a replica (its pipeline
    group); gradients of a stage are summed over the replicas (its data-parallel group), like DDP does.
    """

    def __init__(self, model: PackedBertForPreTraining, stages: int, mlm_slots: int, micro_batches: int,
                 schedule: str = "1f1b", layers_per_stage: list[int] | None = None, device=None):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        world = dist.get_world_size()
        if world % stages:
            raise ValueError(f"{world} processes do not split into pipelines of {stages} stages")
        self.stages, self.replicas = stages, world // stages
        self.replica, self.rank = divmod(dist.get_rank(), stages)  # self.rank: the stage index
        # every process takes part in creating every group
        pipelines = [dist.new_group([r * stages + i for i in range(stages)]) for r in range(self.replicas)]
        replicas = [dist.new_group([r * stages + i for r in range(self.replicas)]) for i in range(stages)]
        tied = [dist.new_group([r * stages, r * stages + stages - 1]) for r in range(self.replicas)]
        self.pp_group, self.dp_group, self.tied_group = pipelines[self.replica], replicas[self.rank], tied[self.replica]
        self.first_rank = self.replica * stages  # global ranks of this replica's first and last stage
        self.last_rank = self.first_rank + stages - 1
        layers = split_layers(model.config.num_hidden_layers, stages, layers_per_stage)
        self.first, self.last = self.rank == 0, self.rank == stages - 1
        self.module = StageModule(model, layers[self.rank], self.first, self.last, mlm_slots)
        self.loss = PipelineLoss(mlm_slots, model.max_sequences_per_pack)
        device = device or torch.device("cpu")
        stage = PipelineStage(self.module, self.rank, stages, device, group=self.pp_group)
        kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
        # our loss is already a sum over global counts: the schedule must not divide by the micro-batches
        self.schedule = kind(stage, n_microbatches=micro_batches, loss_fn=self.loss, scale_grads=False)
        self.micro_batches = micro_batches

    def dp_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel replicas of this stage."""
        if self.replicas > 1:
            values = values.clone()
            dist.all_reduce(values, group=self.dp_group)
        return values

    def parameters(self):
        return self.module.parameters()

    def step(self, batch: dict, normalizers: tuple[float, float]) -> None:
        """Forward and backward of one update's micro-batches (batch holds all of them along dim 0)."""
        self.loss.normalizers = normalizers
        self._run(self.schedule.step, batch)
        self._sum_tied_gradients()
        if self.replicas > 1:  # what DDP would do: sum each gradient over the replicas
            for p in self.module.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=self.dp_group)

    def evaluate(self, batch: dict) -> None:
        """Forward only (with the loss, for the metrics) of micro_batches micro-batches."""
        with torch.no_grad():
            self._run(self.schedule.eval, batch)

    def _run(self, call, batch: dict) -> None:
        """The schedule's step or eval, with what each stage feeds in: inputs on the first, labels on the last."""
        if self.first:
            call(batch["input_ids"], batch["position_ids"], batch["token_type_ids"], batch["sequence_ids"])
        elif self.last:
            call(target=pack_targets(batch), losses=[])
        else:
            call()

    def _sum_tied_gradients(self):
        if self.first or self.last:
            name = TIED_FIRST if self.first else TIED_LAST
            weight = dict(self.module.named_parameters())[name]
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            dist.all_reduce(weight.grad, group=self.tied_group)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Global gradient norm over all stages, the tied weight counted once (on the first stage)."""
        squares = torch.zeros((), dtype=torch.float64)
        for name, p in self.module.named_parameters():
            if p.grad is not None and not (self.last and name == TIED_LAST and not self.first):
                squares += p.grad.double().pow(2).sum()
        dist.all_reduce(squares, group=self.pp_group)  # gradients are equal across replicas by now
        norm = squares.sqrt().item()
        scale = max_norm / (norm + 1e-6)
        if scale < 1:
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm

    def stats(self) -> torch.Tensor:
        """The metrics sums of the last step (last stage of every replica, summed), on every rank.

        On its first step the schedule infers shapes by running the stage once on uninitialised buffers,
        loss included; that call comes before the real micro-batches, so only the last ones count."""
        stats = torch.zeros(7, dtype=torch.float64)
        if self.last:
            stats = torch.stack(self.loss.calls[-self.micro_batches:]).sum(0)
        self.loss.calls.clear()
        dist.broadcast(stats, src=self.last_rank, group=self.pp_group)
        return self.dp_sum(stats)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This stage's parameters under their full-model names."""
        return {self.module.full_name(n): p.detach().clone() for n, p in self.module.named_parameters()}

    def gather_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full model's parameters on each replica's first stage (None elsewhere)."""
        parts = [None] * self.stages
        dist.gather_object(self.state_dict(), parts if self.first else None, dst=self.first_rank,
                           group=self.pp_group)
        if not self.first:
            return None
        merged = {}
        for part in parts:
            merged.update(part)
        return merged
