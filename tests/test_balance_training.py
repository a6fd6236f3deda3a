"""Balanced dealing in training (`train.balance: attention`): pack costs read from the data, the packs of an
update dealt to data-parallel ranks and micro-batches by attention cost, the same packs per update, runs
deterministic and resumable bit for bit."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
import torch

from bert_ipu.config import ConfigError
from bert_ipu.data.loader import ArraySource, ShardSource, UpdateLoader, sequence_lengths, source_pack_costs
from bert_ipu.data.shards import PackedDataset
from bert_ipu.engine import checkpoint
from bert_ipu.packing.balance import balance_ratio, pack_costs
from bert_ipu.tasks.pretraining import main

from training_helpers import final_weights, tiny

# 16 packs an update: 2 ranks x 2 micro-batches x 4 packs (with 4 packs a rank, most of them of one
# 64-token sequence, a single short pack is an imbalance no dealing can remove)
STEPS = 3
DDP = [f"train.max_steps={STEPS}", "train.global_batch_size=16", "train.micro_batch_size=4",
       f"train.validate_every={STEPS}", f"train.checkpoint_every={STEPS}", "train.log_every=1",
       "train.validation_batches=1"]


def test_pack_costs_are_read_from_the_sequence_ids():
    """A pack's cost is the sum of its sequences' squared lengths plus its tokens, from the sequence ids
    (0 = padding, ids need not be sorted); rows without sequence ids, or a bad switch value, are refused."""
    ids = np.array([[1, 1, 1, 2, 2, 0, 0, 0],
                    [2, 1, 2, 1, 2, 1, 2, 1],
                    [1, 1, 1, 1, 1, 1, 1, 1],
                    [1, 2, 3, 0, 0, 0, 0, 0]])
    flat, offsets = sequence_lengths(ids)
    assert flat.tolist() == [3, 2, 4, 4, 8, 1, 1, 1] and offsets.tolist() == [0, 2, 4, 5, 8]
    costs = source_pack_costs(ArraySource({"sequence_ids": ids}), chunk=3)  # chunks cut across rows
    assert costs.tolist() == [9 + 4 + 5, 16 + 16 + 8, 64 + 8, 3 + 3]
    with pytest.raises(ValueError, match="no sequence_ids"):
        source_pack_costs(ArraySource({"input_ids": ids}))
    with pytest.raises(ConfigError, match="train.balance 'random': choose none or attention"):
        tiny("unused", "unused", "train.balance=random")


def test_shard_costs_match_the_packs_the_loader_reads(dataset):
    """Costs read from the shards' sequence_ids alone equal those of the packs the loader hands out."""
    source = ShardSource(PackedDataset(dataset), "train")
    costs = source_pack_costs(source, chunk=7)
    loader = UpdateLoader(source, 8, 4, seed=5)
    rows = loader.update_rows().ravel()
    got = np.concatenate([[(sequence_lengths(r[None])[0] ** 2).sum() + (r > 0).sum() for r in b["sequence_ids"].numpy()]
                          for b in loader.next_update()])
    assert len(costs) == source.packs and np.array_equal(costs[rows], got)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank: int, world: int, port: int, dataset: str, out: str) -> None:
    """One data-parallel rank (spawned): train with train.balance=attention, recording per update the packs
    this rank was dealt and their attention cost (sum of squared sequence lengths of what it read)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    real = UpdateLoader.next_update
    log = []

    def record(self):
        rows = self.update_rows()
        micro = real(self)
        cost = sum(float((sequence_lengths(b["sequence_ids"].numpy())[0] ** 2).sum()) for b in micro)
        log.append({"rows": rows.ravel().tolist(), "attention": cost})
        return micro
    UpdateLoader.next_update = record
    main(tiny(dataset, f"{out}/run", *DDP, "train.balance=attention"), progress=False)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(log, f)


def test_two_ddp_ranks_get_more_equal_attention_with_the_same_packs(dataset, tmp_path):
    """Two gloo data-parallel ranks training with train.balance=attention read packs whose attention costs
    are more equal than the plain loader deals them (mean ABR over the updates at most half; the plain
    order is what UpdateLoader without costs gives each rank, the only thing that decides it), every update
    holds the same packs as without balancing (so the same sequences), and each rank's packs are exactly
    those an in-process loader deals from (seed, data): the dealing is deterministic. (One DDP run, not two:
    the test stays near 15 s on an idle 2-core machine.)"""
    torch.multiprocessing.spawn(_ddp_rank, args=(2, _free_port(), str(dataset), str(tmp_path)), nprocs=2)
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    source = ShardSource(PackedDataset(dataset), "train")
    costs = source_pack_costs(source)
    attention = pack_costs(*sequence_lengths(source.sequence_ids(0, source.packs)))
    seed = tiny(dataset, tmp_path).train.seed
    plain = [UpdateLoader(source, 16, 4, r, 2, seed=seed) for r in (0, 1)]
    fair = [UpdateLoader(source, 16, 4, r, 2, seed=seed, pack_costs=costs) for r in (0, 1)]
    abr_plain, abr_run = [], []
    for u in range(STEPS):
        rows = [loader.update_rows().ravel().tolist() for loader in plain]
        for r in (0, 1):
            assert fair[r].update_rows().ravel().tolist() == logs[r][u]["rows"]
            fair[r].update_in_epoch += 1
            plain[r].update_in_epoch += 1
        assert sorted(rows[0] + rows[1]) == sorted(logs[0][u]["rows"] + logs[1][u]["rows"])
        abr_plain.append(balance_ratio([attention[rows[0]].sum(), attention[rows[1]].sum()]))
        abr_run.append(balance_ratio([logs[0][u]["attention"], logs[1][u]["attention"]]))
    assert np.mean(abr_run) <= 0.5 * np.mean(abr_plain), (abr_run, abr_plain)
    assert (tmp_path / "run" / "hf").is_dir()


def test_balanced_run_resumes_bitwise(dataset, tmp_path, monkeypatch):
    """With train.balance=attention a run stopped after its step-1 checkpoint and resumed ends with exactly
    the weights of a run never stopped (one process: the update's packs are dealt to its micro-batches)."""
    extra = ["train.max_steps=2", "train.checkpoint_every=1", "train.validate_every=2", "train.micro_batch_size=2",
             "train.balance=attention"]
    main(tiny(dataset, tmp_path / "straight", *extra), progress=False)
    real = checkpoint.save

    def kill_after_first(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(KeyboardInterrupt):
        main(tiny(dataset, tmp_path / "stopped", *extra), progress=False)
    monkeypatch.undo()
    main(tiny(dataset, tmp_path / "stopped", *extra), resume=True, progress=False)
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
