"""Balanced dealing in training (`train.balance: attention`): pack costs read from the data, the packs of an
update dealt to data-parallel ranks and micro-batches by attention cost, the same packs per update, runs
deterministic and resumable bit for bit."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket

import numpy as np
import pytest
import torch

from bert_ipu.config import ConfigError
from bert_ipu.data.layout import sequence_lengths_per_id
from bert_ipu.data.loader import ArraySource, ShardSource, UpdateLoader, sequence_lengths, source_pack_costs
from bert_ipu.data.shards import DatasetError, PackedDataset
from bert_ipu.engine import checkpoint
from bert_ipu.engine.runtime import finish
from bert_ipu.packing.balance import balance_ratio, pack_costs
from bert_ipu.tasks import run as main

from training_helpers import Killed, final_weights, tiny

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
    dense = sequence_lengths_per_id(ids, 20)  # more ids than 16: the bincount path, the same counts
    assert np.array_equal(dense[:, :3], sequence_lengths_per_id(ids, 3)) and not dense[:, 3:].any()
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


def _costs_from_sequence_ids(source) -> np.ndarray:
    """The costs as computed before datasets stored their sequence lengths: from every pack's sequence_ids."""
    return pack_costs(*sequence_lengths(source.sequence_ids(0, source.packs)), linear_weight=1.0)


def test_stored_costs_equal_costs_from_the_sequence_ids(dataset, tmp_path):
    """The pipeline writes every pack's sequence lengths (packed and unpacked datasets, every split), and the
    costs read from them equal, exactly, those computed from the packs' sequence_ids, pack by pack (read 7
    packs at a time, across shards of 13 packs)."""
    from bert_ipu.data.pipeline import pack_pretraining_data

    small_shards = tmp_path / "small_shards"
    pack_pretraining_data(dataset.parent / "instances", small_shards, "cghp", 3, packs_per_shard=13, progress=False)
    for path in (dataset, dataset.parent / "instances", small_shards):
        data = PackedDataset(path, verify=True)
        assert data.has_derived("sequence_lengths") and data.manifest["derived_fields"] == ["sequence_lengths"]
        for split in data.splits:
            source = ShardSource(data, split)
            stored = source_pack_costs(source, chunk=7)
            assert source._lengths is not None  # read from the stored field, not the sequence ids
            computed = _costs_from_sequence_ids(source)
            assert len(stored) == source.packs and np.array_equal(stored, computed)
    assert len(PackedDataset(small_shards).shard_sizes("train")) > 3
    assert (PackedDataset(dataset).shard("train", 0, ["sequence_lengths"])["sequence_lengths"][:, 1] > 0).any()

    # a range reads only the shards it spans: visiting every shard for every chunk made reading all costs
    # quadratic in the shards (37 s for 32M packs; review finding)
    source = ShardSource(PackedDataset(small_shards), "train")
    source.sequence_lengths(0, 1)
    touched = []

    class Counting(list):
        def __getitem__(self, i):
            touched.append(i)
            return list.__getitem__(self, i)

    source._lengths = Counting(source._lengths)
    flat, offsets = source.sequence_lengths(20, 30)  # packs 20..29: shards 1 and 2 of 13 packs each
    assert sorted(set(touched)) == [1, 2] and len(offsets) == 11


def _old_format_copy(dataset, out):
    """A copy of the dataset as written before the derived fields: no sequence_lengths.npy, no manifest entry."""
    shutil.copytree(dataset, out)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["derived_fields"]
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            del shard["derived_sha256"]
            os.remove(out / shard["name"] / "sequence_lengths.npy")
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_dataset_without_stored_lengths_still_gives_the_costs(dataset, tmp_path, capsys):
    """A dataset written before the stored sequence lengths loads, verifies, and gives the same costs from its
    sequence_ids (the fallback), so the same balanced dealing; inspect says whether the lengths are stored, and
    a balanced run on it trains, saying why its start took longer."""
    import inspect_packed_data as inspect_cli

    old = _old_format_copy(dataset, tmp_path / "old")
    data = PackedDataset(old, verify=True)
    assert not data.has_derived("sequence_lengths")
    source = ShardSource(data, "train")
    assert not source.stores_lengths and ShardSource(PackedDataset(dataset), "train").stores_lengths
    costs = source_pack_costs(source)
    assert source._lengths is None
    new = source_pack_costs(ShardSource(PackedDataset(dataset), "train"))
    assert np.array_equal(costs, new)
    assert inspect_cli.main([str(old)]) == 0 and "sequence lengths: not stored" in capsys.readouterr().out
    assert inspect_cli.main([str(dataset)]) == 0 and "sequence lengths: stored" in capsys.readouterr().out
    a, b = (UpdateLoader(s, 16, 4, 0, 2, seed=1, pack_costs=c)
            for s, c in ((source, costs), (ShardSource(PackedDataset(dataset), "train"), new)))
    assert a.update_rows().tolist() == b.update_rows().tolist()
    main(tiny(old, tmp_path / "run", "train.max_steps=1", "train.validate_every=1", "train.balance=attention"),
         progress=False)
    assert "stores no sequence lengths (written before them)" in capsys.readouterr().out


def test_stored_lengths_that_disagree_with_the_sequence_ids_are_refused(dataset, tmp_path, capsys):
    """Stored sequence lengths whose checksum matches but which disagree with the pack's sequence_ids (a
    writer's bug) are refused where datasets are verified, naming the shard, row and fix; changed bytes are a
    checksum mismatch; a missing file is refused on opening."""
    import inspect_packed_data as inspect_cli

    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    path = bad / shard["name"] / "sequence_lengths.npy"
    lengths = np.load(path)
    lengths[5] = lengths[5][::-1]  # the same tokens, the sequences' lengths in the wrong order
    assert not np.array_equal(lengths, np.load(path))
    np.save(path, lengths)
    with pytest.raises(DatasetError, match="checksum mismatch in train/shard-00000"):
        PackedDataset(bad, verify=True)
    shard["derived_sha256"]["sequence_lengths"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=r"train/shard-00000 row 5: stored sequence_lengths .* disagree with "
                                           r"its sequence_ids .*recreate the dataset with data/pack_pretraining"):
        PackedDataset(bad, verify=True)
    assert inspect_cli.main([str(bad)]) == 2 and "disagree with its sequence_ids" in capsys.readouterr().err
    os.remove(path)
    with pytest.raises(DatasetError, match="sequence_lengths.npy is missing"):
        PackedDataset(bad)


def test_writer_refuses_sequence_ids_beyond_the_layout(tmp_path):
    """A shard whose sequence ids exceed the layout's K (its NSP slots) cannot be written: its lengths (and
    NSP labels) would have no column."""
    from bert_ipu.data.layout import FIELDS, PackLayout
    from bert_ipu.data.shards import STORAGE, DatasetWriter

    layout = PackLayout(8, 2, 2)
    arrays = {f: np.zeros((1, 8 if f.endswith("_ids") else 2), dtype=STORAGE[f]) for f in FIELDS}
    arrays["sequence_ids"][0, :3] = [1, 2, 3]
    with pytest.raises(ValueError, match=r"outside 0\.\.2"), DatasetWriter(tmp_path / "ds", layout) as writer:
        writer.write_shard("train", arrays)
    assert not (tmp_path / "ds").exists() and not (tmp_path / "ds.partial").exists()


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
    # leave as the entry points do (engine/runtime.finish): gloo's threads can abort the interpreter's teardown,
    # and spawn would report a rank that finished its work as failed (seen once in a full fresh-clone run)
    finish(0)


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
        raise Killed
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(Killed):
        main(tiny(dataset, tmp_path / "stopped", *extra), progress=False)
    monkeypatch.undo()
    main(tiny(dataset, tmp_path / "stopped", *extra), resume=True, progress=False)
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
