"""Multi-size packing (bert_ipu.packing.multisize): packs of several lengths chosen together, with a bound
from the multi-size cutting-stock LP."""

from __future__ import annotations

import numpy as np
import pytest

from bert_ipu.packing import PackingInputError, assign_multi_size
from bert_ipu.packing.multisize import pack_multi_size


def hist(seqs, max_len):
    h = np.zeros(max_len, dtype=np.int64)
    np.add.at(h, np.asarray(seqs) - 1, 1)
    return h


def check_packing(result, histogram, depth=None):
    """Every sequence lands in exactly one pack, every pack fits its length (and the depth limit), and the
    cost is the packs' cost."""
    covered = np.zeros(len(histogram), dtype=np.int64)
    for size, mix in result.mixtures.items():
        flat, offsets = mix.expand_ragged()
        totals = np.add.reduceat(flat, offsets[:-1]) if len(flat) else np.zeros(0)
        assert (totals <= size).all() and (np.diff(offsets) >= 1).all()
        if depth is not None:
            assert np.diff(offsets).max() <= depth
        np.add.at(covered, flat - 1, 1)
    assert np.array_equal(covered, histogram)


def brute_force(seqs, sizes, costs, depth):
    """The optimum over every partition of the sequences into packs (each block in its cheapest size)."""
    def block_cost(block):
        fits = [c for s, c in zip(sizes, costs) if sum(block) <= s and (depth is None or len(block) <= depth)]
        return min(fits) if fits else float("inf")

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for part in partitions(rest):
            for i in range(len(part)):
                yield part[:i] + [[first] + part[i]] + part[i + 1:]
            yield [[first]] + part
    return min(sum(block_cost(b) for b in p) for p in partitions(list(seqs)))


@pytest.mark.parametrize("seqs, sizes, depth, optimum", [
    ([10, 6], [8, 16], None, 16),                 # one 16 holds both; 16 + 8 would waste a pack
    ([10, 10, 6], [8, 16], None, 32),             # each 10 needs a 16 of its own; the 6 rides along
    ([5, 5, 5, 3, 3, 3, 2], [8, 16], None, 32),   # 26 tokens: at least 4 packs of 8 tokens' worth
    ([5, 5, 5, 3, 3, 3, 2], [8, 16], 2, 32),      # pairs at most: still 4 packs of 8 ({5, 3} x 3, {2})
    ([2, 2, 2, 2], [4, 8], 2, 8),                 # pairs at most: {2, 2} x 2 in two 4s, not one 8 of four
    ([3, 3, 3, 3], [4, 8, 12], None, 12),         # 12 tokens exactly fill one 12, or 8 + 4
])
def test_bound_is_exact_on_hand_worked_instances(seqs, sizes, depth, optimum):
    """On small instances solved by hand, the packing reaches the optimum and the bound proves it."""
    h = hist(seqs, max(sizes))
    r = pack_multi_size(h, sizes, depth)
    check_packing(r, h, depth)
    assert r.cost == r.lower_bound == optimum
    assert brute_force(seqs, sizes, sizes, depth) == optimum


@pytest.mark.parametrize("seed", range(40))
def test_bound_is_a_lower_bound_and_every_sequence_lands_once(seed):
    """Random tiny instances (up to 7 sequences, 2-3 pack lengths, random integer costs or tokens, depth
    limits): bound <= the brute-force optimum <= the packing's cost, and the packing is valid."""
    rng = np.random.default_rng(seed)
    sizes = sorted(rng.choice([4, 6, 8, 12, 16], size=int(rng.integers(2, 4)), replace=False).tolist())
    seqs = rng.integers(1, max(sizes) + 1, size=int(rng.integers(1, 8))).tolist()
    costs = None if seed % 2 else rng.integers(1, 20, size=len(sizes)).tolist()
    depth = [None, 1, 2, 3][seed % 4]
    h = hist(seqs, max(sizes))
    r = pack_multi_size(h, sizes, depth, costs=costs)
    check_packing(r, h, depth)
    best = brute_force(seqs, sizes, costs or sizes, depth)
    assert r.lp_bound <= r.lower_bound <= best + 1e-9 and best <= r.cost + 1e-9


def test_grid_keeps_a_valid_packing_and_a_valid_bound():
    """With lengths in units of 8 tokens the packing (rounded up) is still valid and the bound (rounded
    down) still below the cost of any packing found, rounded or not; exact, the bound is within 1%; and
    three pack lengths never cost more than the largest alone (it is one of the choices)."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(4.5, 1.0, 1500).astype(int) + 1, 512)
    h = hist(lengths, 512)
    exact = pack_multi_size(h, [128, 256, 512])
    coarse = pack_multi_size(h, [128, 256, 512], grid=8)
    check_packing(exact, h)
    check_packing(coarse, h)
    assert coarse.grid == 8 and coarse.lower_bound <= exact.cost and exact.lower_bound <= coarse.cost
    assert exact.gap < 0.01 and coarse.lp_bound < exact.lp_bound <= exact.lower_bound
    single = pack_multi_size(h, [512])
    assert exact.cost <= single.cost and single.lower_bound % 512 == 0


@pytest.mark.parametrize("sizes", [[3000, 5000], [5000], [2049]])
def test_automatic_grid_fits_a_sequence_as_long_as_the_largest_pack(sizes):
    """The automatic grid (ceil(largest / 2048) tokens) used to round a sequence of exactly the largest pack
    length (5,000 -> 5,001 in units of 3) past the largest pack and refuse the input, with advice ("a smaller
    grid") that the sequence-level API cannot take: it now picks a grid under which every sequence fits."""
    rng = np.random.default_rng(0)
    top = max(sizes)
    lengths = np.concatenate([rng.integers(1, top + 1, 300), [top, top - 1]])
    h = hist(lengths, top)
    result = pack_multi_size(h, sizes, max_sequences_per_pack=4)
    check_packing(result, h)
    assert top % result.grid == 0 or -(-top // result.grid) <= top // result.grid


def test_time_limit_returns_a_valid_packing_and_bound():
    """A time limit that runs out at once still returns a valid packing (best fit) and a bound below it."""
    rng = np.random.default_rng(1)
    h = hist(np.minimum(rng.lognormal(4.5, 1.0, 2000).astype(int) + 1, 512), 512)
    r = pack_multi_size(h, [128, 256, 512], time_limit=1e-6)
    check_packing(r, h)
    assert r.time_limit_reached and r.lower_bound <= r.cost


@pytest.mark.parametrize("seed", range(6))
def test_assign_multi_size_puts_every_sequence_in_one_slot_of_its_length(seed):
    """assign_multi_size: every sequence lands in exactly one pack of one pack length, in a slot of its own
    length (so every pack holds its mixture's pattern: it fits its length and the depth limit); each pack
    length gets as many sequences of each length as its mixture takes; the same seed gives the same packs,
    another seed splits equal lengths differently."""
    rng = np.random.default_rng(seed)
    # mostly short sequences, so that all three pack lengths are used and share sequence lengths
    lengths = rng.permutation(np.concatenate([rng.integers(1, 6, 300), rng.integers(6, 33, 100)]))
    r = pack_multi_size(hist(lengths, 32), [8, 16, 32], max_sequences_per_pack=3)
    assert sorted(r.mixtures) == [8, 16, 32]
    assigned = assign_multi_size(lengths, r, seed=seed)
    assert list(assigned) == sorted(r.mixtures)
    seen = []
    for size, (offsets, indices) in assigned.items():
        flat, slot_offsets = r.mixtures[size].expand_ragged()
        assert len(offsets) - 1 == r.mixtures[size].n_packs
        assert np.array_equal(np.sort(lengths[indices]), np.sort(flat)), "the mixture's lengths, each once"
        totals = np.add.reduceat(lengths[indices], offsets[:-1])
        assert (totals <= size).all() and np.diff(offsets).max() <= 3
        seen.append(indices)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(lengths)))
    again = assign_multi_size(lengths, r.mixtures, seed=seed)
    assert all(np.array_equal(assigned[s][i], again[s][i]) for s in assigned for i in (0, 1))
    other = assign_multi_size(lengths, r, seed=seed + 100)
    assert any(not np.array_equal(np.sort(assigned[s][1]), np.sort(other[s][1])) for s in assigned)


def test_assign_multi_size_refuses_other_data():
    """Mixtures computed for other data are a ValueError naming the length that does not match."""
    r = pack_multi_size(hist([5, 6, 7], 8), [4, 8])
    with pytest.raises(PackingInputError, match="sequences of length 5 but the data has 2"):
        assign_multi_size([5, 5, 6, 7], r)
    with pytest.raises(PackingInputError, match="above the maximum 8"):
        assign_multi_size([5, 6, 9], r)


@pytest.mark.parametrize("kwargs, message", [
    (dict(pack_lengths=[]), "non-empty list"),
    (dict(pack_lengths=[8, 0]), "non-empty list"),
    (dict(pack_lengths=[8, 8]), r"each length once \(8 given twice\)"),
    (dict(pack_lengths=[8, 9.5]), "non-empty list of whole numbers"),
    (dict(pack_lengths=["8"]), "non-empty list of whole numbers"),
    (dict(pack_lengths=8), "non-empty list of whole numbers"),
    (dict(pack_lengths=[4]), "longer than the largest pack length 4"),
    (dict(pack_lengths=[8, 16], costs=[1]), "one number > 0 per pack length"),
    (dict(pack_lengths=[8, 16], costs=[1, -2]), "one number > 0 per pack length"),
    (dict(pack_lengths=[8], max_sequences_per_pack=0), "max_sequences_per_pack"),
    (dict(pack_lengths=[8], time_limit=0), "time limit"),
    (dict(pack_lengths=[8], grid=0), "grid"),
    (dict(pack_lengths=[8], grid=16), "no longer fits"),
])
def test_bad_input_is_a_value_error_naming_the_problem(kwargs, message):
    with pytest.raises(PackingInputError, match=message):
        pack_multi_size(hist([5, 6], 8), **kwargs)


def test_cli_reports_a_multi_size_row_per_depth(tmp_path, capsys):
    """`--multi-size` adds one row per depth limit (table and JSON) whose packs hold every token and whose
    cost is never below its bound; bad pack lengths are one error line and exit code 2."""
    import json

    from bert_ipu.packing.__main__ import main

    path = tmp_path / "h.json"
    path.write_text(json.dumps(hist([10, 6, 5, 5, 5, 3, 3, 3, 2], 16).tolist()))
    assert main(["--histogram", str(path), "--algorithm", "lpfhp", "--multi-size", "8", "16", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    multi = [r for r in rows if r["algorithm"] == "multi-size"]
    assert [r["max_sequences_per_pack"] for r in multi] == ["max", 3]   # (as every row writes unlimited: was null)
    for r in multi:
        assert r["computed_tokens"] == sum(int(s) * n for s, n in r["packs"].items()) >= r["lower_bound_tokens"]
        assert r["efficiency"] == pytest.approx(42 / r["computed_tokens"])
    assert main(["--histogram", str(path), "--multi-size", "8", "16"]) == 0
    assert "multi-size packing into 8, 16 tokens" in capsys.readouterr().out
    for bad in (["0", "16"], ["8"]):
        assert main(["--histogram", str(path), "--multi-size", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
