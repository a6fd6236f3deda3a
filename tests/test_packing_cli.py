"""The packing report command: output formats and bad input (one-line error, exit code 2)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bert_ipu.packing.__main__ import main

KEYS = ["algorithm", "max_sequences_per_pack", "packs", "sequences", "tokens", "padding_tokens", "efficiency",
        "packing_factor", "speedup_upper_bound", "lower_bound_packs", "strategies", "max_depth_used", "seconds",
        "time_limit_reached"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_json_rows_have_exactly_the_documented_keys(tmp_path, capsys):
    hist = write(tmp_path, "h.json", json.dumps([0, 3, 5, 0, 2, 7, 1, 4]))
    assert main(["--histogram", hist, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["algorithm"] for r in rows] == ["none", "sort", "greedy", "greedy", "spfhp", "spfhp",
                                              "lpfhp", "lpfhp", "nnlshp", "cghp", "cghp"]
    for r in rows:
        assert list(r) == KEYS
        assert r["sequences"] == 22 and r["tokens"] == 2 * 3 + 3 * 5 + 5 * 2 + 6 * 7 + 7 + 8 * 4
        assert r["padding_tokens"] == (r["packs"] * 8 - r["tokens"] if r["algorithm"] != "sort" else r["padding_tokens"])
        assert r["efficiency"] == pytest.approx(r["tokens"] / (r["tokens"] + r["padding_tokens"]))
        assert r["packing_factor"] == pytest.approx(22 / r["packs"])


def test_table_and_plot_from_lengths(tmp_path, capsys):
    lengths = np.random.default_rng(0).integers(1, 65, size=500)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    plot = tmp_path / "out.png"
    assert main(["--lengths", str(path), "--max-len", "64", "--algorithm", "lpfhp", "cghp",
                 "--max-sequences-per-pack", "3", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "500 sequences" in out and "cghp" in out and "lpfhp" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lengths.npy", "out.png"], "no temporary file left"


def test_lengths_text_file(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "3\n5\n\n8\n1\n")
    assert main(["--lengths", path, "--algorithm", "cghp", "--json", "--max-sequences-per-pack", "max"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["sequences"] == 4 and row["tokens"] == 17 and row["packs"] == 3  # max_len 8


@pytest.mark.parametrize("content, message", [
    ("[1, -2, 3]", "must be >= 0"),
    ("[1, 2.5, 3]", "whole numbers"),
    ('[1, "x", 3]', "not a number"),
    ("[]", "empty"),
    ("[0, 0, 0]", "nothing to pack"),
    ("{\"a\": 1}", "expected a JSON list"),
    ("[1, 2,", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was a RecursionError traceback
])
def test_bad_histograms(tmp_path, capsys, content, message):
    assert main(["--histogram", write(tmp_path, "h.json", content)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


@pytest.mark.parametrize("lengths, extra, message", [
    ("3\n0\n2\n", [], "must be >= 1"),
    ("3\n9\n2\n", ["--max-len", "8"], "above the maximum 8"),
    ("3\nabc\n", [], "'abc' is not a length"),
    ("3\n2.5\n", [], "whole numbers"),
])
def test_bad_lengths(tmp_path, capsys, lengths, extra, message):
    assert main(["--lengths", write(tmp_path, "l.txt", lengths), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_bad_options(tmp_path, capsys):
    hist = write(tmp_path, "h.json", "[1, 2, 3]")
    assert main(["--histogram", hist, "--algorithm", "magic"]) == 2
    assert "unknown algorithm 'magic'" in capsys.readouterr().err
    assert main(["--histogram", hist, "--algorithm", "nnlshp", "--max-sequences-per-pack", "max"]) == 2
    assert "up to 3" in capsys.readouterr().err
    assert main(["--histogram", str(tmp_path / "missing.json")]) == 2
    assert "cannot read histogram file" in capsys.readouterr().err
    assert main([]) == 2
    assert "exactly one of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--histogram", hist, "--max-sequences-per-pack", "0"])
    assert e.value.code == 2
    assert "below 1" in capsys.readouterr().err
    assert main(["--histogram", hist, "--plot", str(tmp_path / "no" / "dir.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("value, message", [
    ("auto", "'auto' is not supported here"),
    ("2.5", "'2.5' is not valid"),
    ("abc", "'abc' is not valid"),
    ("-1", "-1 is below 1"),
])
def test_bad_depths_name_the_value_and_the_valid_forms(tmp_path, capsys, value, message):
    """The depth limit goes through bert_ipu.packing.parse_depth: N or max here ("auto" needs a dataset)."""
    hist = write(tmp_path, "h.json", "[1, 2, 3]")
    with pytest.raises(SystemExit) as e:
        main(["--histogram", hist, "--max-sequences-per-pack", value])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in last and "give a whole number >= 1 or 'max'" in last


def test_command_line_exit_code_and_no_traceback(tmp_path):
    """As a user runs it: exit code 2, one line on stderr, no traceback."""
    bad = write(tmp_path, "h.json", "[1, -1]")
    proc = subprocess.run([sys.executable, "-m", "bert_ipu.packing", "--histogram", bad],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_pack_length_of_100000_with_the_default_algorithms(tmp_path, capsys):
    """A pack length of 100,000 with the default algorithms finishes (NNLSHP, whose dense matrix would need
    terabytes there, is left out of the default set); asked for by name it is a one-line error."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(600), 1.5, 2000).astype(int) + 1, 1, 100_000)
    lengths[0] = 100_000
    path = tmp_path / "l.npy"
    np.save(path, lengths)
    assert main(["--lengths", str(path), "--time-limit", "30", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["algorithm"] for r in rows} >= {"none", "spfhp", "lpfhp", "cghp"}
    assert "nnlshp" not in {r["algorithm"] for r in rows}
    cghp = [r for r in rows if r["algorithm"] == "cghp"]
    assert cghp and all(r["packs"] >= r["lower_bound_packs"] > 0 for r in cghp)
    assert main(["--lengths", str(path), "--algorithm", "nnlshp", "--max-sequences-per-pack", "3"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert len(err) == 1 and "nnlshp at pack length 100000" in err[0]


def test_greedy_honours_the_time_limit_on_millions_of_sequences(tmp_path, capsys):
    """GREEDY shuffles a chunk at a time and looks at the clock between chunks: on 16.8M sequences a 0.05 s
    limit stops it well within 2 s (one shuffle of them all took 6 s here, 24 s past the limit at 32M), and
    the packing it returns still holds every sequence once."""
    import time

    hist = write(tmp_path, "h.json", json.dumps([32_768] * 512))
    start = time.perf_counter()
    assert main(["--histogram", hist, "--algorithm", "greedy", "--max-sequences-per-pack", "3",
                 "--time-limit", "0.05", "--json"]) == 0
    assert time.perf_counter() - start < 2.0
    row = json.loads(capsys.readouterr().out)
    assert row["time_limit_reached"] and row["sequences"] == 32_768 * 512
    assert row["max_depth_used"] <= 3 and row["packs"] >= row["lower_bound_packs"]


def test_greedy_in_chunks_is_next_fit_over_one_shuffle(monkeypatch):
    """Drawn in chunks, GREEDY's packs are still valid (every sequence once, within the pack length and depth),
    and a histogram within one chunk gets exactly the packing of next fit over one shuffle of it."""
    from bert_ipu.packing import baselines, pack
    from bert_ipu.packing.histogram import expand_histogram

    hist = np.array([0, 3, 5, 0, 2, 7, 1, 4] * 40)
    lengths = np.random.default_rng(7).permutation(expand_histogram(hist).astype(np.int16))
    packs, current = [], []
    for length in lengths.tolist():  # next fit, written out
        if sum(current) + length > len(hist) or len(current) == 3:
            packs.append(current)
            current = []
        current.append(length)
    packs.append(current)
    whole = pack(hist, "greedy", 3, seed=7).mixture
    assert whole.n_packs == len(packs)
    assert np.array_equal(whole.coverage(len(hist)), hist)
    monkeypatch.setattr(baselines, "GREEDY_CHUNK", 7)
    chunked = pack(hist, "greedy", 3, seed=7).mixture
    assert np.array_equal(chunked.coverage(len(hist)), hist)
    assert chunked.depth <= 3 and (chunked.pack_lengths() <= len(hist)).all()


def test_nnlshp_skips_a_solve_that_would_overrun_the_time_limit(wikipedia_512, tmp_path, capsys):
    """NNLSHP's NNLS solve cannot be interrupted (14 s at pack length 512, depth 3): with a 1 s limit it is
    skipped by its estimate, every sequence gets a pack of its own and the row says the limit was reached."""
    import time

    from bert_ipu.packing.nnlshp import solve_seconds

    assert solve_seconds(512, 3) > 5
    hist = write(tmp_path, "h.json", json.dumps(wikipedia_512.tolist()))
    start = time.perf_counter()
    assert main(["--histogram", hist, "--algorithm", "nnlshp", "--max-sequences-per-pack", "3",
                 "--time-limit", "1", "--json"]) == 0
    assert time.perf_counter() - start < 3.0
    row = json.loads(capsys.readouterr().out)
    assert row["time_limit_reached"] and row["packs"] == row["sequences"]


def test_ranks_beyond_what_the_balance_report_measures_are_refused_up_front(tmp_path, capsys):
    """--ranks 1,000,000 (its updates of 8M packs did not finish in hours) and more than 1,024 packs a rank are
    one-line errors before any algorithm runs; above 25 ranks fewer of the first 100 updates are measured."""
    from bert_ipu.packing.__main__ import MAX_RANKS, balance_updates

    hist = write(tmp_path, "h.json", json.dumps([0, 0, 0, 4000]))
    for extra, named in ((["--ranks", "1000000"], f"at most {MAX_RANKS} ranks"),
                         (["--ranks", "2", "--packs-per-update", "4096"], "more than 1024 packs a rank")):
        assert main(["--histogram", hist, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and named in err[0], err
    assert main(["--histogram", hist, "--algorithm", "lpfhp", "--max-sequences-per-pack", "max", "--ranks", "32",
                 "--packs-per-update", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["updates"] == balance_updates(32) == 64


def test_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    """--max-len with --histogram (the histogram's length is the pack length) and --packs-per-update without
    --ranks were silently ignored: one-line errors now, exit 2."""
    hist = write(tmp_path, "h.json", json.dumps([0, 2, 1, 3, 0, 0, 0, 1]))
    for extra, named in ((["--max-len", "4"], "--max-len applies to --lengths"),
                         (["--packs-per-update", "4"], "give --ranks N too")):
        assert main(["--histogram", hist, "--algorithm", "lpfhp", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err


def test_balance_report_on_millions_of_sequences_builds_only_the_packs_it_measures(tmp_path, capsys):
    """--ranks measures the first updates of packs in loader order; a pack's lengths are its strategy's, so
    the report no longer assigns all 30.7M sequences first (that took 10 s here) and gives the same numbers
    as the assignment does."""
    import time

    from bert_ipu.packing import assign_ragged, pack
    from bert_ipu.packing.__main__ import balance_of
    from bert_ipu.packing.balance import update_balance
    from bert_ipu.packing.histogram import expand_histogram

    hist = write(tmp_path, "h.json", json.dumps([60_000] * 512))
    start = time.perf_counter()
    assert main(["--histogram", hist, "--algorithm", "lpfhp", "--max-sequences-per-pack", "max", "--ranks", "8",
                 "--json"]) == 0
    assert time.perf_counter() - start < 5.0  # about 1 s, 2 s on a loaded machine
    assert json.loads(capsys.readouterr().out)["updates"] == 100
    small = np.array([0, 3, 5, 0, 2, 7, 1, 4] * 30)
    result = pack(small, "cghp", 3)
    lengths = np.random.default_rng(3).permutation(expand_histogram(small))
    offsets, indices = assign_ragged(lengths, result.mixture, len(small), seed=3)
    assert balance_of(result, 4, 8, 3) == update_balance(lengths[indices], offsets, 4, 8, len(small))


@pytest.mark.skipif(not Path("/dev/urandom").exists(), reason="needs /dev/urandom")
@pytest.mark.parametrize("flag, named", [("--lengths", "not a text file of lengths"),
                                         ("--histogram", "not a JSON text file")])
def test_an_endless_binary_input_is_refused_at_once(flag, named):
    """--lengths /dev/urandom read forever: the first 64 KiB of a file are looked at before the rest is read,
    and a NUL byte or bad UTF-8 there is a one-line error (exit code 2)."""
    proc = subprocess.run([sys.executable, "-m", "bert_ipu.packing", flag, "/dev/urandom"], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and named in err[0], proc.stderr


def test_text_beyond_the_size_cap_is_refused(tmp_path, capsys, monkeypatch):
    """A text file of lengths is read up to MAX_TEXT_BYTES (an endless pipe of digits stops there) and refused
    past it, naming the .npy alternative."""
    from bert_ipu.packing import histogram

    monkeypatch.setattr(histogram, "MAX_TEXT_BYTES", 1000)
    assert main(["--lengths", write(tmp_path, "l.txt", "5\n" * 501)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than" in err[0] and ".npy" in err[0]
    assert main(["--lengths", write(tmp_path, "l.txt", "5\n" * 499), "--algorithm", "none"]) == 0


@pytest.mark.parametrize("lengths, extra", [
    ("100000000000\n", []),                                         # the longest sequence sets the pack length
    ("100000000000\n", ["--max-len", "auto"]),
    ("5\n", ["--max-len", "10000000000"]),
    ("5\n", ["--multi-size", "8", "10000000000"]),
])
def test_a_pack_length_too_long_to_allocate_is_refused_in_one_line(tmp_path, capsys, lengths, extra):
    """A histogram holds a count per length: a pack length of 1e10 or 1e11 tokens was a MemoryError traceback
    (75-745 GiB); it is refused before anything is allocated, naming the limit."""
    from bert_ipu.packing.histogram import MAX_PACK_LENGTH

    assert main(["--lengths", write(tmp_path, "l.txt", lengths), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and f"{MAX_PACK_LENGTH:,}" in err[0] and "GiB" in err[0]


def test_uint64_lengths_past_int64_are_named_as_they_are(tmp_path, capsys):
    """A .npy of uint64 lengths of 2**64 - 1 read as length -1 (cast to int64 before the check); now the real
    value is named, in one line."""
    path = tmp_path / "u.npy"
    np.save(path, np.array([3, 2**64 - 1], dtype=np.uint64))
    assert main(["--lengths", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"sequence 1 has length {2**64 - 1:,}, far above any pack length" in err[0]


def test_plot_never_replaces_a_file_this_project_did_not_write(tmp_path, capsys):
    """--plot on a dataset's manifest.json replaced it with a PNG: a file that is not a PNG is refused before
    anything runs and left as it was, and so is a PNG this project did not write (any PNG was replaced: a user's
    figure too); a missing folder is named; a plot of an earlier run (marked by `save_png`) is replaced, through a
    temporary name that does not stay behind."""
    hist = write(tmp_path, "h.json", "[1, 2, 3]")
    manifest = write(tmp_path, "manifest.json", '{"format": "packed"}\n')
    for target, named in ((manifest, "not an output of this kind"),
                          (str(tmp_path / "no" / "p.png"), f"the folder {tmp_path / 'no'} does not exist")):
        assert main(["--histogram", hist, "--plot", target]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and named in err[0], err
    assert Path(manifest).read_text() == '{"format": "packed"}\n'
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n a user's figure")
    assert main(["--histogram", hist, "--algorithm", "lpfhp", "--plot", str(png)]) == 2
    assert "not an output of this kind" in capsys.readouterr().err and png.read_bytes().endswith(b"figure")
    png.unlink()
    assert main(["--histogram", hist, "--algorithm", "lpfhp", "--plot", str(png)]) == 0
    first = png.read_bytes()
    assert main(["--histogram", hist, "--algorithm", "lpfhp", "spfhp", "--plot", str(png)]) == 0  # ours: replaced
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.json", "manifest.json", "p.png"]


def test_sort_is_counted_per_length_and_matches_sorted_batches():
    """SORT's computed tokens (each batch of the longest-first order padded to its first sequence) are counted
    per length, so 4e18 sequences no longer need expanding (a ValueError traceback); the same as batching
    every sequence, on random histograms and batch sizes."""
    from bert_ipu.packing import pack
    from bert_ipu.packing.histogram import expand_histogram

    rng = np.random.default_rng(0)
    for _ in range(300):
        hist = rng.integers(0, 6, int(rng.integers(1, 40)))
        hist[int(rng.integers(len(hist)))] += 1
        batch = int(rng.integers(1, 50))
        lengths = expand_histogram(hist)[::-1]
        expected = sum(int(lengths[i]) * len(lengths[i:i + batch]) for i in range(0, len(lengths), batch))
        assert pack(hist, "sort", batch_size=batch).computed_tokens == expected
    assert pack(np.array([4 * 10**18]), "sort").computed_tokens == 4 * 10**18


def test_huge_counts_are_packed_or_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """4e18 sequences: the default algorithms run (GREEDY, which shuffles every sequence, is left out unless
    named); --ranks and --multi-size, which hold every pack or sequence in memory, are one-line errors (they were
    tracebacks), as is an algorithm that runs out of memory (naming other packers, not itself)."""
    import bert_ipu.packing.__main__ as cli

    hist = write(tmp_path, "h.json", "[4e18]")
    assert main(["--histogram", hist, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "greedy" not in {r["algorithm"] for r in rows} and {"sort", "lpfhp", "cghp"} <= {r["algorithm"] for r in rows}
    for extra in (["--ranks", "2"], ["--multi-size", "8", "16"]):
        assert main(["--histogram", hist, "--algorithm", "lpfhp", *extra]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("running")]
        assert len(err) == 1 and "memory" in err[0] and err[0].startswith("error:"), err

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(cli, "pack", no_memory)
    assert main(["--histogram", hist, "--algorithm", "cghp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "do not fit in memory" in err and "cghp)" not in err and "lpfhp" in err


def test_heuristics_past_the_deadline_pack_the_rest_at_once(monkeypatch):
    """Past the time limit SPFHP and LPFHP put every length not yet reached into packs of its own, as many a
    pack as fit: now in one vectorised step (a Python step per length took 3 s past a 0.001 s limit on a
    million lengths), with the same packs as placing the rest length by length."""
    from bert_ipu.packing import heuristics, pack

    result = pack(np.ones(1_000_000, dtype=np.int64), "lpfhp", 3, time_limit=0.001)
    assert result.time_limit_reached and result.seconds < 1.0 and result.packs == 1_000_000
    hist = np.array([0, 3, 5, 0, 2, 7, 1, 4, 0, 9])
    for run in (heuristics.run_spfhp, heuristics.run_lpfhp):
        for reached in range(5):  # the clock runs out after `reached` lengths
            calls = iter(range(100))
            monkeypatch.setattr(heuristics, "_late", lambda deadline: next(calls) >= reached)
            mixture, late = run(hist, 3, deadline=0.0)
            assert late and np.array_equal(mixture.coverage(len(hist)), hist)
            present = np.nonzero(hist)[0][::-1] + 1
            by_hand = [[int(l)] * min(10 // l, 3, hist[l - 1]) for l in present[reached:]]
            fresh = heuristics._fresh_packs(hist, present[reached:], 3)
            assert fresh.n_packs == sum(-(-hist[l - 1] // len(p)) for l, p in zip(present[reached:], by_hand))


def test_an_integer_histogram_array_is_validated_without_a_python_step_per_length():
    """Every packer validates the histogram it is handed: an int array of 4M counts took 1.3-3 s a row, checked
    length by length; a valid one is now checked with array operations, and a bad one still names its count."""
    import time

    from bert_ipu.packing.histogram import PackingInputError, validate_histogram

    start = time.perf_counter()
    assert validate_histogram(np.ones(4_000_000, dtype=np.int64)).dtype == np.int64
    assert time.perf_counter() - start < 0.3  # about 0.02 s; length by length 1.3-3 s
    for bad, named in ((np.array([1, -1]), "length 2 is -1"), (np.array([0, 0]), "nothing to pack"),
                       (np.array([0, 0, 0, 2**61]), "64-bit"), (np.array([2**62], dtype=np.uint64), "below")):
        with pytest.raises(PackingInputError, match=named):
            validate_histogram(bad)


def test_a_refusal_found_after_some_rows_prints_no_row(tmp_path, capsys):
    """`--algorithm lpfhp nnlshp --max-sequences-per-pack max --json` printed LPFHP's row, then refused NNLSHP's
    depth; `--ranks 2` printed NONE's and SORT's rows, then found a packing shorter than one update: a partial
    report on stdout (a file, redirected). NNLSHP's depth is refused before anything runs, and JSON rows are
    printed once every row has run; a multi-size row lists every pack length, those of no pack too."""
    import json

    from bert_ipu.packing.__main__ import main

    path = tmp_path / "h.json"
    path.write_text(json.dumps([0, 0, 0, 4, 0, 0, 6, 2]))
    cases = (["--algorithm", "lpfhp", "nnlshp", "--max-sequences-per-pack", "max"], ["--ranks", "2"])
    for extra in cases:
        assert main(["--histogram", str(path), "--json", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert main(["--histogram", str(path), "--algorithm", "lpfhp", "--multi-size", "8", "64", "--json"]) == 0
    multi = [json.loads(x) for x in capsys.readouterr().out.splitlines()][-1]
    assert multi["packs"] == {"8": 10, "64": 0}


def test_the_apis_arguments_are_checked():
    """From an audit of the library's API: a SORT batch of 2.5 sequences gave computed_tokens 13.0; seed -1,
    max_len None or 8.0, a PackingResult for its mixture, string pack lengths for assign_multi_size, a list or a
    depth of 0 for lower_bound, a level count, device count or token budget of 0, unsorted candidate lengths
    were tracebacks or silent; a length past max_len made histogram_of return a longer histogram."""
    import numpy as np

    from bert_ipu.packing import PackingInputError, assign, assign_multi_size, histogram_of, lower_bound, pack
    from bert_ipu.packing.levels import StepModel, choose_levels

    h = np.array([0, 0, 3, 2, 1, 0, 0, 2])
    result = pack(h, "lpfhp", 3)
    lengths = np.repeat(np.arange(1, 9), h)
    assert np.array_equal(assign(lengths, result, 8), assign(lengths, result.mixture, 8))  # the result will do
    assert lower_bound([0, 0, 3, 2, 1, 0, 0, 2], "max") == lower_bound(h) == 5  # 38 tokens at 8
    model = StepModel(2, 64, 4, 4, 128)
    bad = {"batch_size": lambda: pack(h, "sort", batch_size=2.5), "seed": lambda: pack(h, "greedy", seed=-1),
           "max_len": lambda: assign(lengths, result.mixture, 8.0), "mixture is a str": lambda: assign(lengths, "x", 8),
           "keys": lambda: assign_multi_size(lengths, {"8": result.mixture}),
           "longer than max_len": lambda: histogram_of(np.array([5, 2]), 3),
           "max_sequences_per_pack": lambda: lower_bound(h, 0), "devices": lambda: StepModel(2, 64, 4, 4, 128, devices=0),
           "tokens_per_update": lambda: choose_levels(h, model, 0),
           "max_levels": lambda: choose_levels(h, model, 100, max_levels=0),
           "ascending": lambda: choose_levels(h, model, 100, candidate_lengths=[8, 4])}
    for says, call in bad.items():
        with pytest.raises(PackingInputError, match=says):
            call()


def test_a_byte_order_mark_is_not_text_and_a_plot_is_readable_by_others(tmp_path, capsys):
    """A histogram or lengths file starting with a UTF-8 byte-order mark was refused ('\\ufeff3' is not a length);
    the --plot PNG was written 0600 (a temporary file's mode), not as the umask says."""
    import json
    import os
    import stat

    from bert_ipu.packing.__main__ import main

    (tmp_path / "h.json").write_text("\ufeff" + json.dumps([0, 3, 1, 2]), encoding="utf-8")
    (tmp_path / "l.txt").write_text("\ufeff3\n2\n4\n", encoding="utf-8")
    old = os.umask(0o022)
    try:
        assert main(["--histogram", str(tmp_path / "h.json"), "--algorithm", "lpfhp", "--plot",
                     str(tmp_path / "p.png")]) == 0
        assert main(["--lengths", str(tmp_path / "l.txt"), "--max-len", "8", "--algorithm", "lpfhp"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.png").stat().st_mode) == 0o644
    assert "error" not in capsys.readouterr().err
