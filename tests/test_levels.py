"""Packs of several lengths in one run (Hierarchical Balance Packing's levels): the loader gives every update
packs of one level, visits every pack of every level once an epoch in a seeded or curriculum order and resumes
anywhere; the causal LM task trains on them with each level's micro-batch, sequence parallelism and activation
checkpointing, equal to one process and bitwise on resume."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch

from bert_ipu.config import ConfigError
from bert_ipu.data.loader import ArraySource, Level, LevelLoader
from bert_ipu.engine import checkpoint
from bert_ipu.tasks import load_config

from training_helpers import Killed, entry, final_weights, run_cli


def source(packs: int, length: int, first: int) -> ArraySource:
    """Packs whose first token says which pack it is (first, first + 1, ...)."""
    ids = np.zeros((packs, length), dtype=np.int64)
    ids[:, 0] = np.arange(first, first + packs)
    ids[:, 1:length // 2] = 1
    return ArraySource({"input_ids": ids, "sequence_ids": (ids > 0).astype(np.int64)})


def levels(sequence=(1, 1, 1)) -> list[Level]:
    return [Level(64, source(10, 64, 1000), 4, sequence[0]), Level(128, source(7, 128, 2000), 2, sequence[1]),
            Level(256, source(5, 256, 3000), 1, sequence[2])]


def run(loader: LevelLoader, updates: int) -> list[tuple[int, list[int]]]:
    """(level, the packs of this rank's micro-batches) of each update."""
    out = []
    for _ in range(updates):
        micro = loader.next_update()
        out.append((loader.level, sorted(int(x) for b in micro for x in b["input_ids"][:, 0] if x > 0)))
    return out


@pytest.mark.parametrize("order", ["random", "curriculum"])
def test_every_update_holds_one_level_and_an_epoch_every_pack_once(order):
    """Over one epoch (every level's updates once, the last of each filled with empty rows) each pack of each
    level is read exactly once, every update is of one level, curriculum takes the short packs first, random is
    the same for a seed and another for another seed; two replicas together read what one reads, and a level
    split over 2 sequence-parallel ranks gives both ranks the same packs."""
    one = LevelLoader(levels(), [8, 4, 2], rank=0, world=1, seed=3, order=order, drop_last=False)
    epoch = run(one, one.updates_per_epoch)
    assert one.updates_per_epoch == 2 + 2 + 3
    for level, first, packs in ((0, 1000, 10), (1, 2000, 7), (2, 3000, 5)):
        read = sorted(p for lv, ps in epoch for p in ps if lv == level)
        assert read == list(range(first, first + packs))
        assert all(p // 1000 == level + 1 for lv, ps in epoch if lv == level for p in ps)
    if order == "curriculum":
        assert [lv for lv, _ in epoch] == [0, 0, 1, 1, 2, 2, 2]
    else:
        again = LevelLoader(levels(), [8, 4, 2], 0, 1, seed=3, order=order, drop_last=False)
        other = LevelLoader(levels(), [8, 4, 2], 0, 1, seed=4, order=order, drop_last=False)
        assert run(again, 7) == epoch and [lv for lv, _ in run(other, 7)] != [lv for lv, _ in epoch]
    pair = [LevelLoader(levels((1, 1, 2)), [8, 4, 2], rank, 2, seed=3, order=order, drop_last=False)
            for rank in (0, 1)]
    first, second = (run(x, 7) for x in pair)
    for (lv, a), (lv2, b), (lv1, whole) in zip(first, second, epoch):
        assert lv == lv2 == lv1
        assert (a == b == whole) if lv == 2 else sorted(a + b) == whole  # level 2: sequence-parallel ranks


def test_the_loader_resumes_at_any_update():
    """state_dict after any update of the first epoch, loaded by a new loader: the next updates are the same
    (into the next epoch); a state of other levels or another order is refused."""
    straight = run(LevelLoader(levels(), [8, 4, 2], 0, 1, seed=5, drop_last=False), 12)
    for stop in range(1, 11):
        loader = LevelLoader(levels(), [8, 4, 2], 0, 1, seed=5, drop_last=False)
        run(loader, stop)
        resumed = LevelLoader(levels(), [8, 4, 2], 0, 1, seed=5, drop_last=False)
        resumed.load_state_dict(loader.state_dict())
        assert run(resumed, 12 - stop) == straight[stop:]
    with pytest.raises(ValueError, match="other levels"):
        LevelLoader(levels()[:2], [8, 4], 0, 1, seed=5).load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="other levels"):
        LevelLoader(levels(), [8, 4, 2], 0, 1, seed=5, order="curriculum").load_state_dict(loader.state_dict())


SFT = ["--config", "sft_tiny_chat_packed", "data.pack_lengths=[128, 256]", "model.num_attention_heads=4",
       "model.num_key_value_heads=2", "train.max_steps=6", "train.log_every=1", "train.checkpoint_every=3",
       "train.validate_every=3"]
# micro-batch 2 at 128: the update's packs (about 12 at p ~ 2.7) round to whole micro-batches alike on 1 and 2
# replicas, so both runs take the same updates
LEVELS = "train.levels=[{micro_batch_size: 2}, {checkpointed_layers: 1}]"


def test_levels_train_resume_bitwise_and_equal_one_process_under_sequence_parallelism(tmp_path, monkeypatch):
    """SFT on packs of 128 and 256 (the multi-size packer's mixture), 6 updates in random order: the run with the
    first layer checkpointed at 256 ends with exactly the weights of the run without (recomputation changes no
    number); killed after its step-3 checkpoint and resumed mid-level, bitwise the uninterrupted run's; and with
    the 256 level split over 2 sequence-parallel ranks (2 processes; the 128 level data parallel) the weights of
    one process (1e-5, float32 sums in another order)."""
    straight, plain, stopped, split = (tmp_path / n for n in ("straight", "plain", "stopped", "split"))
    assert entry("causal_lm", [*SFT, LEVELS, f"output_dir={straight}"]) == 0
    assert entry("causal_lm", [*SFT, "train.levels=[{micro_batch_size: 2}, null]", f"output_dir={plain}"]) == 0
    reference = final_weights(straight)
    assert all(torch.equal(reference[k], v) for k, v in final_weights(plain).items())

    real = checkpoint.save

    def kill_after_first(*args, **kwargs):
        real(*args, **kwargs)
        raise Killed
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(Killed):
        entry("causal_lm", [*SFT, LEVELS, f"output_dir={stopped}"])
    monkeypatch.undo()
    assert entry("causal_lm", [*SFT, LEVELS, f"output_dir={stopped}", "--resume"]) == 0
    assert all(torch.equal(reference[k], v) for k, v in final_weights(stopped).items())

    run_cli(*SFT, "train.levels=[{micro_batch_size: 2}, {sequence_parallel: 2, checkpointed_layers: 1}]",
            f"output_dir={split}", nproc=2, script="run_causal_lm.py")
    assert all(torch.allclose(reference[k], v, rtol=0, atol=1e-5) for k, v in final_weights(split).items())
    shutil.rmtree(tmp_path)


def test_bad_level_settings_are_refused():
    """A longest pack length that cannot hold the longest sequence, lengths that are not different whole numbers,
    another packer, an unknown key or a negative count in train.levels, a level's sequence-parallel size that does
    not divide the processes, several lengths with tensor parallelism: each one line naming it."""
    from bert_ipu.engine.runtime import RunError, Runtime
    from bert_ipu.engine.trainer import make_loader

    bad = {"data.pack_lengths=[64, 128]": "must hold data.max_seq_length (256)",
           "data.pack_lengths=[128, 128, 256]": "a list of different whole numbers",
           "data.pack_lengths=fast": "a list of different whole numbers",
           "train.levels=[{micro: 2}]": "unknown key 'micro'",
           "train.levels=[{checkpointed_layers: -1}]": "a whole number >= 0",
           "train.levels=[null, {micro_batch_size: 1}]": "this run packs into one length: drop train.levels"}
    for override, named in bad.items():
        with pytest.raises(ConfigError, match=re.escape(named)):
            load_config("sft_tiny_chat_packed", [override])
    with pytest.raises(ConfigError, match="train.levels has 3 entries for 2 pack lengths"):  # (a third was dropped)
        load_config("sft_tiny_chat_packed", ["data.pack_lengths=[128, 256]", "train.levels=[null, null, {}]"])
    with pytest.raises(ConfigError, match="use data.algorithm=cghp"):
        load_config("sft_tiny_chat_packed", ["data.pack_lengths=[128, 256]", "data.algorithm=lpfhp"])
    cfg = load_config("sft_tiny_chat_packed", ["data.pack_lengths=[128, 256]"])

    class Task:
        drop_last = False
    two = [Level(128, source(8, 128, 1), 2, 1), Level(256, source(8, 256, 1), 2, 3)]
    with pytest.raises(RunError, match="level 1 .* over 3 sequence-parallel ranks, which do not divide the 2"):
        make_loader(Task(), cfg.train, Runtime(torch.device("cpu"), rank=0, world=2), two)
    with pytest.raises(RunError, match="not with parallel.tensor_parallel"):
        make_loader(Task(), cfg.train, Runtime(torch.device("cpu"), rank=0, world=2, tensor=2), two)
