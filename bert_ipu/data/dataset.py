"""The loader the trainer reads packed (or unpacked) shards with.

    data = PackedDataset("data/packed_128")
    loader = PackedLoader(data, "train", micro_batch_size=8, seed=0, rank=0, world_size=1)
    for batch in loader:            # dict of (B, S) / (B, M) / (B, K) tensors, static shapes
        ...
    state = loader.state_dict()     # resume later from the exact next pack

Each epoch visits the packs in an order shuffled from (seed, epoch); data-parallel rank r of n takes every
n-th pack of that order (the same number on every rank), then cuts micro-batches (the last partial one is
dropped so that shapes stay static).
"""

from __future__ import annotations

import numpy as np
import torch

from .layout import FIELDS
from .shards import PackedDataset, gather, widen


class PackedLoader:
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
