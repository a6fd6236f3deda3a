"""The loader every task trains with: whole updates of packs, the same for any number of processes.

    source = ShardSource(PackedDataset("runs/data/packed_128"), "train")   # or any PackSource
    loader = UpdateLoader(source, packs_per_update=32, micro_batch_size=8, dp_rank=0, dp_world=2, seed=0)
    micro = loader.next_update()    # this replica's micro-batches of the next update: list of dicts of tensors
    state = loader.state_dict()     # {"epoch", "update_in_epoch", ...}: resume at the exact next update

Each epoch visits the packs in an order shuffled from (seed, epoch) and cuts it into updates of
`packs_per_update` consecutive packs. Replica r of n takes the r-th n-th of each update and cuts it into
micro-batches. So the packs of an update, and the loader's position, depend only on (seed, packs per update),
never on how many replicas or pipeline stages share the work: a checkpoint resumes exactly on another
topology. `drop_last` drops the epoch's last partial update (pretraining, static shapes); without it the last
update is filled up with empty rows (no tokens, no labels: they add nothing to any loss or count), so every
pack is seen once per epoch (fine-tuning).

`PackedLoader` (at the end) reads plain micro-batches of one split of a dataset, for evaluation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .layout import FIELDS, IGNORE_INDEX, sequence_lengths_per_id
from .shards import PackedDataset, gather, widen


class PackSource(Protocol):
    """Rows of packed data, addressable by index."""
    packs: int
    stores_lengths: bool  # sequence lengths read at O(packs) (False: computed from every row's sequence ids)

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The rows (any order) as numpy arrays of the model's dtypes; index -1 = an empty row."""

    def sequence_lengths(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The sequences of rows [start, stop), ragged: (flat lengths, offsets), as `sequence_lengths`."""

    def fingerprint(self) -> str:
        """A sha256 naming these rows' content: equal for the same data, different for other data (a run
        records it and refuses to resume on other data)."""


def empty_rows(template: dict[str, np.ndarray], n: int, label_fields=()) -> dict[str, np.ndarray]:
    """n all-padding rows shaped like `template`'s: zeros; "no label" in the label fields (IGNORE_INDEX for
    integer labels, NaN for float labels such as regression scores)."""
    def fill(k, v):
        if k not in label_fields:
            return 0
        return np.nan if np.issubdtype(v.dtype, np.floating) else IGNORE_INDEX
    return {k: np.full((n, *v.shape[1:]), fill(k, v), dtype=v.dtype) for k, v in template.items()}


def with_empty_rows(rows: np.ndarray, fetch, label_fields) -> dict[str, np.ndarray]:
    """fetch(real rows) with the -1 entries of `rows` replaced by empty rows, in place."""
    real = rows >= 0
    if not real.any():  # shapes and dtypes from any one row (fetching no rows gives no row shape)
        return empty_rows(fetch(np.zeros(1, dtype=np.int64)), len(rows), label_fields)
    got = fetch(rows[real])
    if real.all():
        return got
    out = empty_rows(got, len(rows), label_fields)
    for k in out:
        out[k][real] = got[k]
    return out


class ShardSource:
    """A split of a dataset on disk (bert_ipu.data.shards), read through its memory maps."""

    LABELS = ("masked_lm_labels",)

    def __init__(self, dataset: PackedDataset, split: str):
        self.dataset, self.split = dataset, split
        self.shards = dataset.shards(split)  # kept mapped: training reads them again every epoch
        self.sizes = dataset.shard_sizes(split)
        self.packs = dataset.packs(split)
        self._lengths = None
        self._starts = np.concatenate([[0], np.cumsum(self.sizes)])  # first pack of each shard

    def _fetch(self, rows):
        arrays = gather(self.sizes, self.shards.__getitem__, rows)
        return {f: widen(f, arrays[f]) for f in FIELDS}

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return with_empty_rows(np.asarray(rows), self._fetch, self.LABELS)

    def sequence_ids(self, start: int, stop: int) -> np.ndarray:
        """Packs [start, stop)'s `sequence_ids` (read alone, not the other fields)."""
        return gather(self.sizes, self.shards.__getitem__, np.arange(start, stop), ("sequence_ids",))["sequence_ids"]

    def fingerprint(self) -> str:
        """From the manifest's entries of this split's shards, each with its bytes' sha256 (no shard is read),
        and the vocabulary the ids refer to, when the dataset has one."""
        h = hashlib.sha256(json.dumps([self.dataset.manifest["layout"], self.dataset.manifest["splits"][self.split]],
                                      sort_keys=True, default=str).encode())
        vocab = self.dataset.path / "vocab.txt"
        if vocab.is_file():
            h.update(vocab.read_bytes())
        return h.hexdigest()

    @property
    def stores_lengths(self) -> bool:
        """Whether the shards store the packs' sequence lengths (datasets written before that field do not)."""
        return self.dataset.has_derived("sequence_lengths")

    def sequence_lengths(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Packs [start, stop)'s sequence lengths, ragged (see `sequence_lengths`): from the shards' stored
        `sequence_lengths` field (K numbers a pack), or for a dataset written before it, from `sequence_ids`."""
        if not self.stores_lengths:
            return sequence_lengths(self.sequence_ids(start, stop))
        if self._lengths is None:  # mapped on first use: only the balanced loader reads them
            self._lengths = [self.dataset.shard(self.split, i, ("sequence_lengths",))["sequence_lengths"]
                             for i in range(len(self.sizes))]
        # a contiguous range: slices of only the shards it spans (visiting every shard on every call made
        # reading all costs chunk by chunk quadratic in the shards; docs/results/packing.md, "Balance across
        # devices")
        parts = []
        starts = self._starts
        for i in range(max(int(np.searchsorted(starts, start, side="right")) - 1, 0), len(self._lengths)):
            at = int(starts[i])
            if at >= stop:
                break
            lo, hi = max(start - at, 0), min(stop - at, len(self._lengths[i]))
            if lo < hi:
                parts.append(self._lengths[i][lo:hi])
        return ragged(np.concatenate(parts) if parts else np.zeros((0, self.dataset.layout.max_sequences_per_pack),
                                                                    dtype=np.int32))


class ArraySource:
    """Rows held in memory: a dict of (P, ...) arrays (e.g. SQuAD features packed on the fly)."""

    stores_lengths = True  # in memory: computing them from the sequence ids is as cheap as reading

    def __init__(self, rows: dict[str, np.ndarray], label_fields=()):
        self.rows, self.label_fields = rows, tuple(label_fields)
        self.packs = len(next(iter(rows.values())))

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return with_empty_rows(np.asarray(rows), lambda r: {k: v[r] for k, v in self.rows.items()},
                               self.label_fields)

    def fingerprint(self) -> str:
        """Over every array's name, dtype, shape and bytes."""
        h = hashlib.sha256()
        for name in sorted(self.rows):
            a = np.ascontiguousarray(self.rows[name])
            h.update(f"{name} {a.dtype.str} {a.shape}".encode())
            h.update(a.data)
        return h.hexdigest()

    def sequence_ids(self, start: int, stop: int) -> np.ndarray:
        if "sequence_ids" not in self.rows:
            raise ValueError("these rows have no sequence_ids: their sequences' lengths are unknown")
        return self.rows["sequence_ids"][start:stop]

    def sequence_lengths(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return sequence_lengths(self.sequence_ids(start, stop))


def evaluation_rows(packs: int, limit: int | None, micro_batch_size: int, dp_rank: int, dp_world: int,
                    group: int = 1) -> np.ndarray:
    """This replica's evaluation micro-batches, (batches, micro_batch_size) pack indices (-1 = an empty row), so
    that the replicas together evaluate the first min(packs, limit) packs of a split exactly once, whatever their
    number: replica r takes the r-th contiguous share, and empty rows (which count nothing) fill every replica
    to the same number of micro-batches, a multiple of `group` (a pipeline schedule's micro-batches). The
    validation figures of a checkpoint are then the same on 1 process, 2 pipeline stages or 2 replicas."""
    n = packs if limit is None else min(packs, limit)
    per_replica = -(-n // dp_world)
    batches = -(-per_replica // micro_batch_size)
    batches = max(group, -(-batches // group) * group)
    rows = np.full(dp_world * batches * micro_batch_size, -1, dtype=np.int64)
    rows[:n] = np.arange(n)
    return rows.reshape(dp_world, batches, micro_batch_size)[dp_rank]


def sequence_lengths(sequence_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sequences of packed rows, ragged: (flat lengths, offsets); row p's sequences (ids 1..k, in id order)
    have lengths flat[offsets[p]:offsets[p + 1]]. sequence_ids: (P, S) int, 0 = padding."""
    ids = np.asarray(sequence_ids)
    return ragged(sequence_lengths_per_id(ids, int(ids.max(initial=0))))


def ragged(per_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense per-id lengths (P, K) (0 = no such sequence) -> (flat lengths, offsets) as `sequence_lengths`."""
    present = per_id > 0
    return per_id[present], np.concatenate([[0], np.cumsum(present.sum(axis=1))])


def source_pack_costs(source, chunk: int = 4096) -> np.ndarray:
    """Every pack's attention cost (`bert_ipu.packing.balance.pack_costs` with linear_weight 1: the sum of its
    sequences' squared lengths, plus its tokens, which only break ties), from the sequence lengths the source
    holds (`source.sequence_lengths`, `chunk` packs at a time: a dataset on disk reads its shards' stored
    `sequence_lengths`, K numbers a pack, or for one written before that field, its `sequence_ids`). For
    `UpdateLoader(pack_costs=)`. The costs are integers below 2^53 within a chunk, so exact in float64: both
    sources give the same costs, bit for bit."""
    from bert_ipu.packing.balance import pack_costs

    parts = []
    for start in range(0, source.packs, chunk):
        flat, offsets = source.sequence_lengths(start, min(start + chunk, source.packs))
        parts.append(pack_costs(flat, offsets, linear_weight=1.0))
    return np.concatenate(parts) if parts else np.zeros(0)


class UpdateLoader:
    def __init__(self, source: PackSource, packs_per_update: int, micro_batch_size: int, dp_rank: int = 0,
                 dp_world: int = 1, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
                 pack_costs: np.ndarray | None = None):
        """pack_costs: optional cost of every pack of the source (`bert_ipu.packing.balance.pack_costs`): each
        update's packs are then dealt to replicas and micro-batches by `balanced_order` (the same packs per
        update, so the same sequences; only who computes which changes). None keeps the plain order."""
        if micro_batch_size < 1 or not 0 <= dp_rank < dp_world:
            raise ValueError("micro_batch_size must be >= 1 and 0 <= dp_rank < dp_world")
        if packs_per_update % (micro_batch_size * dp_world):
            raise ValueError(f"{packs_per_update} packs per update do not split into micro-batches of "
                             f"{micro_batch_size} on {dp_world} replica(s)")
        self.source, self.packs_per_update, self.micro_batch_size = source, packs_per_update, micro_batch_size
        self.dp_rank, self.dp_world, self.seed, self.shuffle, self.drop_last = dp_rank, dp_world, seed, shuffle, drop_last
        n = source.packs
        self.updates_per_epoch = n // packs_per_update if drop_last else -(-n // packs_per_update)
        if self.updates_per_epoch == 0:
            raise ValueError(f"{n} packs do not fill one update of {packs_per_update} packs")
        self.epoch, self.update_in_epoch = 0, 0
        self._order_epoch, self._order = None, None
        if pack_costs is not None and len(pack_costs) != n:
            raise ValueError(f"pack_costs has {len(pack_costs)} entries for {n} packs")
        self.pack_costs = None if pack_costs is None else np.asarray(pack_costs, dtype=np.float64)

    @property
    def accumulation(self) -> int:
        """Micro-batches per update on one replica."""
        return self.packs_per_update // (self.micro_batch_size * self.dp_world)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            n = self.source.packs
            order = np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)
            total = self.updates_per_epoch * self.packs_per_update
            self._order = np.concatenate([order, np.full(max(0, total - n), -1)])[:total]  # -1 = empty row
            self._order_epoch = self.epoch
        return self._order

    def update_rows(self) -> np.ndarray:
        """The packs (indices, -1 = empty) of the next update on this replica: (accumulation, micro)."""
        lo = self.update_in_epoch * self.packs_per_update
        rows = self._epoch_order()[lo:lo + self.packs_per_update]
        if self.pack_costs is not None:
            from bert_ipu.packing.balance import balanced_order
            costs = np.where(rows >= 0, self.pack_costs[np.maximum(rows, 0)], 0.0)  # an empty row costs nothing
            rows = rows[balanced_order(costs, self.dp_world, self.micro_batch_size)]
        share = self.packs_per_update // self.dp_world
        return rows[self.dp_rank * share:(self.dp_rank + 1) * share].reshape(-1, self.micro_batch_size)

    def next_update(self) -> list[dict[str, torch.Tensor]]:
        """This replica's micro-batches of the next update (then the position moves on)."""
        micro = [{k: torch.from_numpy(v) for k, v in self.source.gather(rows).items()}
                 for rows in self.update_rows()]
        self.update_in_epoch += 1
        if self.update_in_epoch == self.updates_per_epoch:
            self.epoch, self.update_in_epoch = self.epoch + 1, 0
        return micro

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "update_in_epoch": self.update_in_epoch, "seed": self.seed,
                "packs_per_update": self.packs_per_update}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["packs_per_update"]) != (self.seed, self.packs_per_update):
            raise ValueError(f"the checkpoint's loader read updates of {state['packs_per_update']} packs with seed "
                             f"{state['seed']}; this run has {self.packs_per_update} packs per update and seed "
                             f"{self.seed}: keep train.global_batch_size, the batch unit and train.seed to resume")
        _check_place(state["update_in_epoch"], self.updates_per_epoch)
        self.epoch, self.update_in_epoch = state["epoch"], state["update_in_epoch"]


def _check_place(update_in_epoch: int, updates_per_epoch: int) -> None:
    """A checkpoint's place in an epoch must be one of this data's (a ValueError, as a loader's other refusals)."""
    if not 0 <= update_in_epoch <= updates_per_epoch:
        raise ValueError(f"the checkpoint's loader stopped at update {update_in_epoch} of an epoch of "
                         f"{updates_per_epoch}: not a place in this data")


@dataclass(frozen=True)
class Level:
    """The packs of one length a run trains on (Hierarchical Balance Packing's level): their source, how many
    a micro-batch holds, over how many sequence-parallel ranks each row's tokens are split, how many of the
    model's first layers recompute their activations in the backward pass (activation checkpointing), and the
    packs' packing factor. A run of one pack length has one level."""
    pack_length: int
    source: PackSource
    micro_batch_size: int
    sequence_parallel: int = 1
    checkpointed_layers: int = 0
    packing_factor: float = 1.0


class LevelLoader:
    """Whole updates of packs of several lengths: every update holds packs of one level (on every rank: no rank
    waits for another level), each level read by an `UpdateLoader` of its own over its data-parallel replicas
    (world / its sequence-parallel ranks); an epoch takes every level's updates once, in an order of levels
    that is `random` (seeded by (seed, epoch)) or `curriculum` (short packs first).

        loader = LevelLoader(levels, packs_per_update=[24, 12], rank=0, world=2, seed=0, order="random")
        micro = loader.next_update()     # this rank's micro-batches; loader.level is their level's index
        state = loader.state_dict()      # resume at the exact next update

    `packs_per_update[i]` are level i's packs of one update over all its replicas. Deterministic for a seed, and
    like UpdateLoader the same updates for any number of replicas."""

    ORDERS = ("random", "curriculum")

    def __init__(self, levels: list[Level], packs_per_update: list[int], rank: int, world: int, seed: int,
                 order: str = "random", drop_last: bool = True, pack_costs: list | None = None):
        if order not in self.ORDERS:
            raise ValueError(f"level order {order!r}: choose {' or '.join(self.ORDERS)}")
        self.levels, self.seed, self.order = levels, seed, order
        self.loaders = []
        for i, (level, P) in enumerate(zip(levels, packs_per_update)):
            s = level.sequence_parallel
            self.loaders.append(UpdateLoader(level.source, P, level.micro_batch_size, rank // s, world // s,
                                             seed + 1000 * i, drop_last=drop_last,
                                             pack_costs=None if pack_costs is None else pack_costs[i]))
        self.updates_per_epoch = sum(x.updates_per_epoch for x in self.loaders)
        self.epoch, self.update_in_epoch, self.level = 0, 0, 0
        self._order_epoch, self._order = None, None

    def schedule(self, epoch: int) -> np.ndarray:
        """The level of each update of an epoch."""
        if self._order_epoch != epoch:
            per = [np.full(x.updates_per_epoch, i) for i, x in enumerate(self.loaders)]
            if self.order == "curriculum":  # short packs first: the levels by pack length
                by_length = np.argsort([lv.pack_length for lv in self.levels], kind="stable")
                self._order = np.concatenate([per[i] for i in by_length])
            else:
                self._order = np.random.default_rng([self.seed, epoch, 7]).permutation(np.concatenate(per))
            self._order_epoch = epoch
        return self._order

    @property
    def accumulation(self) -> int:
        """Micro-batches per update on one rank, at the level of the last update."""
        return self.loaders[self.level].accumulation

    def next_update(self) -> list[dict[str, torch.Tensor]]:
        self.level = int(self.schedule(self.epoch)[self.update_in_epoch])
        micro = self.loaders[self.level].next_update()
        self.update_in_epoch += 1
        if self.update_in_epoch == self.updates_per_epoch:
            self.epoch, self.update_in_epoch = self.epoch + 1, 0
        return micro

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "update_in_epoch": self.update_in_epoch, "seed": self.seed,
                "order": self.order, "levels": [x.state_dict() for x in self.loaders]}

    def load_state_dict(self, state: dict) -> None:
        if "levels" not in state or len(state["levels"]) != len(self.loaders) or state["order"] != self.order:
            raise ValueError("the checkpoint's loader read other levels (or another order of them): keep "
                             "data.pack_lengths, train.levels and train.level_order to resume")
        for loader, saved in zip(self.loaders, state["levels"]):
            loader.load_state_dict(saved)
        _check_place(state["update_in_epoch"], self.updates_per_epoch)
        self.epoch, self.update_in_epoch = state["epoch"], state["update_in_epoch"]


class PackedLoader:
    """Plain micro-batches of one split of a `PackedDataset` (evaluation reads the held-out split with it).

        loader = PackedLoader(data, "validation", micro_batch_size=8, shuffle=False, rank=0, world_size=1)
        for batch in loader: ...       # dict of (B, S) / (B, M) / (B, K) tensors, static shapes
        state = loader.state_dict()    # resume later from the exact next micro-batch

    Each epoch visits the packs in an order shuffled from (seed, epoch) (or in order); data-parallel rank r of
    n takes every n-th pack of that order (the same number on every rank), then cuts micro-batches (the last
    partial one is dropped so that shapes stay static)."""

    def __init__(self, dataset: PackedDataset, split: str, micro_batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True):
        if micro_batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError("micro_batch_size must be >= 1 and 0 <= rank < world_size")
        self.dataset, self.split = dataset, split
        self.shards = dataset.shards(split)  # kept mapped: training reads them again every epoch
        self.sizes = dataset.shard_sizes(split)
        self.micro_batch_size, self.seed, self.shuffle = micro_batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch, self.batch_in_epoch = 0, 0
        per_rank = dataset.packs(split) // world_size
        self.batches_per_epoch = per_rank // micro_batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(f"split {split!r} has {dataset.packs(split)} packs: not one micro-batch of "
                             f"{micro_batch_size} per rank for {world_size} ranks")

    def _order(self, epoch: int) -> np.ndarray:
        n = self.dataset.packs(self.split)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        mine = order[self.rank::self.world_size][: n // self.world_size]
        return mine[: self.batches_per_epoch * self.micro_batch_size].reshape(self.batches_per_epoch, -1)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self):
        """Micro-batches from the current position to the end of the epoch; then the next epoch begins."""
        batches = self._order(self.epoch)
        while self.batch_in_epoch < self.batches_per_epoch:
            rows = batches[self.batch_in_epoch]
            self.batch_in_epoch += 1
            arrays = gather(self.sizes, self.shards.__getitem__, rows)
            yield {f: torch.from_numpy(widen(f, arrays[f])) for f in FIELDS}
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "seed": self.seed,
                "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["world_size"]) != (self.seed, self.world_size):
            raise ValueError("the loader state was saved with another seed or world size")
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
