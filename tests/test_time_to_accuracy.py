"""The pure logic of benchmarks/time_to_accuracy.py: the target rule, updates-to-target from a validation
curve, ratios with their spread over seeds, the packed micro-batch choice. No training, no timing."""

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "time_to_accuracy.py"
_spec = importlib.util.spec_from_file_location("time_to_accuracy", _PATH)
tta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tta)


def test_target_is_the_stated_fraction_of_the_pilots_gain():
    """target = start + fraction x (pilot final - start); no target without a gain or with a bad fraction."""
    assert tta.choose_target(0.10, 0.20, 0.8) == pytest.approx(0.18)
    assert tta.choose_target(0.10, 0.20, 1.0) == pytest.approx(0.20)
    with pytest.raises(ValueError):
        tta.choose_target(0.20, 0.20, 0.8)
    with pytest.raises(ValueError):
        tta.choose_target(0.20, 0.15, 0.8)
    with pytest.raises(ValueError):
        tta.choose_target(0.10, 0.20, 0.0)


def test_steps_to_target_interpolates_at_the_first_crossing():
    """The first crossing counts (a later dip does not move it), linearly interpolated between the last
    point below and the first point at or above; a target never reached gives None."""
    curve = [(0, 0.10), (10, 0.12), (20, 0.16), (30, 0.14), (40, 0.17)]
    assert tta.steps_to_target(curve, 0.14) == pytest.approx(15.0)
    assert tta.steps_to_target(curve, 0.16) == pytest.approx(20.0)
    assert tta.steps_to_target(curve, 0.165) == pytest.approx(30 + 0.025 / 0.03 * 10)
    assert tta.steps_to_target(curve, 0.10) == 0.0
    assert tta.steps_to_target(curve, 0.18) is None
    assert tta.steps_to_target([], 0.1) is None


def test_paired_ratios_and_spread():
    """Per-seed ratios of paired values, their mean and sample sd, the ratio of means; a seed whose run did
    not reach the target (None) is left out of both sides and counted."""
    r = tta.paired_ratios([30.0, 40.0, None], [20.0, 20.0, 10.0])
    assert r["ratios"] == pytest.approx([1.5, 2.0])
    assert r["mean"] == pytest.approx(1.75)
    assert r["sd"] == pytest.approx(math.sqrt(0.125))
    assert (r["min"], r["max"]) == (1.5, 2.0)
    assert r["left_out"] == 1
    assert r["ratio_of_means"] == pytest.approx(35.0 / 20.0)
    one = tta.paired_ratios([3.0], [2.0])
    assert one["sd"] == 0.0 and one["mean"] == 1.5
    none = tta.paired_ratios([None], [2.0])
    assert none["n"] == 0 and math.isnan(none["mean"]) and none["left_out"] == 1


def test_within_seed_spread():
    """Means closer than the larger range over seeds are 'within the spread'; farther apart are not."""
    assert tta.within_seed_spread([0.10, 0.12, 0.11], [0.115, 0.118, 0.116])
    assert not tta.within_seed_spread([0.10, 0.101, 0.102], [0.12, 0.121, 0.122])
    assert not tta.within_seed_spread([0.10], [0.11])


def test_packed_micro_batch_keeps_sequences_per_update_close():
    """The chosen micro-batch rounds G / p packs to whole micro-batches holding within 3% of G sequences
    (on average); it is the largest such candidate."""
    for G, p in ((32, 1.6), (32, 1.696), (40, 1.696), (16, 1.55), (256, 1.6)):
        m = tta.packed_micro_batch(G, p)
        packs = max(m, round(G / p / m) * m)
        assert abs(packs * p - G) <= 0.03 * G or m == 1
        for bigger in (c for c in (8, 4, 2, 1) if c > m):
            packs_b = max(bigger, round(G / p / bigger) * bigger)
            assert abs(packs_b * p - G) > 0.03 * G
    assert tta.packed_micro_batch(32, 1.6) == 4  # 20 packs x 1.6 = 32 exactly; 8 would give 16 packs


def test_raw_seconds_accumulates_the_updates_seconds():
    """Per-update seconds = sequences / sequences_per_second, summed over the rows with rates (the engine leaves
    validation out of them: tests/test_engine.py); a validation row without rates adds nothing."""
    rows = [{"step": 1, "sequences": 10, "sequences_per_second": 10.0},
            {"step": 2, "sequences": 10, "sequences_per_second": 5.0},
            {"step": 2, "val_mlm_accuracy": 0.1, "sequences_seen": 20},
            {"step": 3, "sequences": 10, "sequences_per_second": 2.0}]
    out = tta.raw_seconds(rows)
    assert [s for s, _ in out] == [1, 2, 3]
    assert [t for _, t in out] == pytest.approx([1.0, 3.0, 8.0])


def test_choose_batch_gives_both_layouts_one_micro_batch_shape():
    """G >= the request (at most 2x), divisible by m in {8, 4}, and round(G/p/m) x m packs hold G sequences
    within 2.5% on average; the smallest such G is taken, with the largest m that fits."""
    def fits(g, m, p):
        packs = round(g / p / m) * m
        return g % m == 0 and packs >= m and abs(packs * p - g) <= 0.025 * g

    for asked, p in ((16, 1.688), (32, 1.696), (20, 1.6), (256, 1.59)):
        G, m = tta.choose_batch(asked, p)
        assert asked <= G <= 2 * asked and m in (8, 4, 2) and fits(G, m, p)
        assert not any(fits(g, mm, p) for g in range(asked, G) for mm in (8, 4, 2))
        assert not any(fits(G, mm, p) for mm in (8, 4, 2) if mm > m)
    assert tta.choose_batch(16, 1.688) == (20, 4)  # 12 packs x 1.688 = 20.3 sequences
    assert tta.choose_batch(16, 1.604) == (16, 2)  # 10 packs x 1.604 = 16.04
    assert tta.choose_batch(32, 1.604) == (32, 4)  # 20 packs x 1.604 = 32.08


def test_loss_targets_run_downwards():
    """For a loss the target lies between start and pilot on the way down, and a curve reaches it when it
    falls to or below it; a pilot whose loss did not fall gives no target."""
    assert tta.choose_target(10.0, 7.0, 0.8, higher_is_better=False) == pytest.approx(7.6)
    with pytest.raises(ValueError):
        tta.choose_target(7.0, 7.5, 0.8, higher_is_better=False)
    curve = [(0, 10.0), (10, 8.0), (20, 7.0)]
    assert tta.steps_to_target(curve, 7.6, higher_is_better=False) == pytest.approx(14.0)
    assert tta.steps_to_target(curve, 6.0, higher_is_better=False) is None


def test_downstream_by_variant_groups_the_seeds_of_each_variant():
    """Downstream scores per model ("VARIANT_seedI") are grouped by variant, each score with its spread
    over the seeds; a variant name holding underscores stays whole, a None score is left out."""
    scores = {"unpacked_seed0": {"squad_f1": 40.0, "sst2_accuracy": 0.5},
              "unpacked_seed1": {"squad_f1": 50.0, "sst2_accuracy": None},
              "packed_seed0": {"squad_f1": 45.0, "sst2_accuracy": 0.625},
              "packs_betas_lr_seed0": {"squad_f1": 30.0, "sst2_accuracy": 0.5}}
    side = tta.downstream_by_variant(scores)
    assert list(side) == ["unpacked", "packed", "packs_betas_lr"]
    assert side["unpacked"]["squad_f1"]["mean"] == pytest.approx(45.0)
    assert (side["unpacked"]["squad_f1"]["min"], side["unpacked"]["squad_f1"]["max"]) == (40.0, 50.0)
    assert side["unpacked"]["sst2_accuracy"]["n"] == 1
    assert side["packs_betas_lr"]["squad_f1"]["n"] == 1
