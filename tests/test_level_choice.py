"""Choosing the pack lengths of a run from a model of the step time (bert_ipu.packing.levels, after Hierarchical
Balance Packing): each level's sequence-parallel size and checkpointing, the all-to-all volume Ulysses moves,
every sequence packed once in every set it tries, and on a long-tailed histogram a set of several lengths the
model times faster than everything in packs of the longest length; data.pack_lengths=auto in the causal task."""

from __future__ import annotations

import numpy as np
import pytest

from bert_ipu.packing.levels import StepModel, candidates, choose_levels, evaluate, format_choice

SHAPE = dict(layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128)


def long_tail(max_len: int = 1024, seed: int = 0) -> np.ndarray:
    """Many short documents and a few that fill the longest pack (a 128K corpus in miniature)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(40), 0.8, size=3000).astype(int), 8, max_len)
    lengths = np.concatenate([lengths, np.full(12, max_len), rng.integers(max_len // 2, max_len, 20)])
    return np.bincount(lengths - 1, minlength=max_len)


def test_a_level_takes_the_fewest_ranks_that_hold_it_then_checkpoints():
    """The smallest sequence-parallel size dividing the devices and the length whose share fits the memory;
    past the largest, that size with every layer checkpointed; without a memory limit, one device."""
    m = StepModel(**SHAPE, devices=8, memory_tokens=256)
    assert [m.setting(n) for n in (128, 256, 512, 1024, 2048, 4096)] == [(1, 0), (1, 0), (2, 0), (4, 0), (8, 0),
                                                                          (8, 4)]
    assert m.setting(1000) == (4, 0)            # 8 does not divide 1000: 4 (250 tokens each) fits
    assert m.setting(1100) == (4, 4)            # 1100 / 4 = 275 does not fit and 8 does not divide 1100
    assert StepModel(**SHAPE, devices=8).setting(4096) == (1, 0)


def test_the_exchange_is_ulysses_all_to_all_volume_and_compute_splits_over_the_ranks():
    """Per layer and rank: queries, outputs, keys and values of the rank's n / S tokens, forward and backward,
    (S - 1) / S of them leaving the rank, in bf16 (the figure benchmarks/sequence_parallel.py measures per
    layer before the (S - 1) / S); none on one rank. The compute of S ranks is a 1 / S share."""
    m = StepModel(**SHAPE, devices=8, bytes_per_second=1.0, flops_per_second=1e9)
    kv_hidden = 64 * 2 // 4
    for n, s in ((1024, 2), (1024, 8), (4096, 4)):
        per_layer = 2 * 2 * (n / s) * (64 + kv_hidden) * 2
        assert m.exchange_seconds(n, s) == pytest.approx(4 * per_layer * (s - 1) / s)
    assert m.exchange_seconds(1024, 1) == 0
    free = StepModel(**SHAPE, devices=8, bytes_per_second=float("inf"), flops_per_second=1e9)
    one = free.pack_seconds(1024, 1024.0 ** 2, 1, 0)
    assert free.pack_seconds(1024, 1024.0 ** 2, 4, 0) == pytest.approx(one / 4)
    assert free.pack_seconds(1024, 1024.0 ** 2, 1, 4) == pytest.approx(one * 4 / 3)
    # attention grows with the squares: one 1024 document costs more than 16 of 64 in the same pack; under a
    # mask (every pair of the pack computed) they cost the same
    assert free.pack_seconds(1024, 1024.0 ** 2, 1, 0) > free.pack_seconds(1024, 16 * 64.0 ** 2, 1, 0)
    masked = StepModel(**SHAPE, devices=8, bytes_per_second=float("inf"), flops_per_second=1e9,
                       document_attention=False)
    assert masked.pack_seconds(1024, 1024.0 ** 2, 1, 0) == masked.pack_seconds(1024, 16 * 64.0 ** 2, 1, 0)


def test_every_set_packs_every_sequence_and_the_choice_beats_one_length():
    """On a long-tailed histogram over 8 devices with room for 256 tokens each: every set tried ends at the
    longest length and computes at least the real tokens (all packed), the rows come fastest first, the
    chosen set has several lengths, splits only its long packs, and the model times it faster than the
    naive packing (all in packs of 1024 over 4 ranks, loader order) and than 1024 alone dealt balanced."""
    hist = long_tail()
    model = StepModel(**SHAPE, devices=8, flops_per_second=1e9, bytes_per_second=1e8, memory_tokens=256)
    assert candidates(hist) == [64, 128, 256, 512, 1024]
    choice = choose_levels(hist, model, tokens_per_update=8 * 1024, max_levels=3)
    real = int((np.arange(1, 1025) * hist).sum())
    assert len(choice.rows) == 1 + 4 + 6
    for row in choice.rows + [choice.naive]:
        assert row.lengths[-1] == 1024 and row.computed_tokens >= real
        assert row.computed_tokens == sum(p * n for p, n in zip(row.packs, row.lengths))
    assert [r.seconds for r in choice.rows] == sorted(r.seconds for r in choice.rows)
    assert len(choice.lengths) > 1 and choice.settings[0][0] < 4 and choice.speedup > 1
    single = next(r for r in choice.rows if r.lengths == (1024,))
    assert choice.best.seconds < single.seconds and single.settings == ((4, 0),)
    assert choice.naive.communication > choice.best.communication
    table = format_choice(choice, 3)
    assert len(table.splitlines()) == 1 + 3 + 1 and "naive" in table.splitlines()[-1]


def test_balanced_dealing_evens_the_replicas():
    """The same packs, dealt by balance.balanced_order instead of the loader's order: a lower attention balance
    ratio over the epoch's updates."""
    hist = long_tail()
    model = StepModel(**SHAPE, devices=8, flops_per_second=1e9, bytes_per_second=1e8)
    dealt = evaluate(hist, [256, 1024], model, 16 * 1024, balanced=True)
    loader = evaluate(hist, [256, 1024], model, 16 * 1024, balanced=False)
    assert dealt.packs == loader.packs and dealt.abr < loader.abr and dealt.seconds <= loader.seconds


def test_auto_pack_lengths_in_the_causal_task(tmp_path):
    """data.pack_lengths=auto: the task packs the training sequences into the lengths the model chose for its
    processes and memory (the very packs the model timed), and each level trains with the chosen sequence-parallel size and checkpointing;
    train.levels beside auto is refused in one line."""
    import torch

    from bert_ipu.config import ConfigError
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.tasks import load_config
    from bert_ipu.tasks.causal_lm.task import CausalLMTask

    cfg = load_config("sft_tiny_chat_packed", ["data.pack_lengths=auto", "data.level_memory_tokens=128",
                                               "model.num_attention_heads=4", "model.num_key_value_heads=2",
                                               f"output_dir={tmp_path}"])
    task = CausalLMTask(cfg, progress=False)
    task.prepare(Runtime(torch.device("cpu"), rank=0, world=2))
    chosen = sorted(task.by_length)
    best = task.level_choice.best
    assert chosen[-1] == 256 and set(task.auto_settings) == set(chosen)
    # the rows are the packing the model timed (the packer given the model's costs), not another mixture
    assert [task.by_length[n].packs for n in chosen] == [p for p in best.packs if p]
    levels = task.train_levels()
    assert [lv.pack_length for lv in levels] == chosen
    for lv in levels:
        assert (lv.sequence_parallel, lv.checkpointed_layers) == ((1, 0) if lv.pack_length <= 128 else (2, 0))
    with pytest.raises(ConfigError, match="train.levels with data.pack_lengths=auto"):
        load_config("sft_tiny_chat_packed", ["data.pack_lengths=auto", "train.levels=[null, null]"])
