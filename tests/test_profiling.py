"""The profiling harness: its arithmetic on hand-computed cases, and an end-to-end run on a tiny model."""

import dataclasses
import json

import numpy as np
import pytest

from bert_ipu import cli, packing
from bert_ipu.config import ConfigError
from bert_ipu.tasks import load_config
from bert_ipu.tasks.profile import run as profiling
from bert_ipu.tasks.profile.run import Measurement, make_batches, summarize

from training_helpers import entry


def fake(name, hist, seconds, sequences, tokens, flops=1.0):
    m = Measurement(name, packing.pack(hist, name, None if name in ("none", "sort") else 3))
    m.step_seconds, m.sequences_per_step, m.tokens_per_step, m.flops_per_step = seconds, sequences, tokens, flops
    return m


def test_arithmetic_against_hand_computed_cases():
    """Histogram [0,0,0,2,0,0,0,2] at pack length 8: NONE 4 rows of 8 (EFF 24/32), CGHP pairs 4+4 and 8
    alone: 3 packs, EFF 24/24, p 4/3, theory 4/3. With NONE at 1 s a step for 4 sequences and CGHP at 1.1 s
    a step for 4 packs (16/3 sequences): realized (16/3/1.1)/(4/1) = 1.2121..., OH +10%."""
    hist = np.array([0, 0, 0, 2, 0, 0, 0, 2])
    rows = {r["algorithm"]: r for r in summarize({
        "none": fake("none", hist, [1.0, 1.0, 1.0], 4, 24),
        "cghp": fake("cghp", hist, [1.1, 1.1, 1.1], 16 / 3, 32),
    })}
    assert rows["none"]["efficiency"] == pytest.approx(24 / 64 * 2)  # 24 real tokens in 4 rows of 8
    assert rows["cghp"]["efficiency"] == pytest.approx(1.0)
    assert rows["cghp"]["packing_factor"] == pytest.approx(4 / 3)
    assert rows["cghp"]["theoretical_speedup"] == pytest.approx(4 / 3)
    assert rows["cghp"]["realized_speedup"] == pytest.approx((16 / 3 / 1.1) / 4)
    assert rows["cghp"]["overhead"] == pytest.approx(0.1)
    assert rows["cghp"]["tokens_per_second"] == pytest.approx(32 / 1.1)
    assert rows["none"]["realized_speedup"] == 1.0 and rows["none"]["overhead"] == 0.0


def test_batches_follow_the_packing():
    """Packed micro-batches have static shapes and hold the mixture's lengths; SORT's change shape."""
    hist = np.zeros(64, dtype=np.int64)
    hist[[9, 19, 29, 59]] = [50, 40, 30, 10]
    result, batches = make_batches(hist, "cghp", 3, micro_batch=4, steps=3, vocab=100, sort_batch=4, seed=0)
    assert {tuple(b["input_ids"].shape) for b in batches} == {(4, 64)}
    lengths = {int(n) for s in result.mixture.strategies for n in s if n}
    for b in batches:
        for row in b["sequence_ids"]:
            counts = np.bincount(row.numpy())[1:]
            assert set(counts[counts > 0].tolist()) <= lengths
    _, sort_batches = make_batches(hist, "sort", 3, micro_batch=4, steps=6, vocab=100, sort_batch=4, seed=0)
    assert len({tuple(b["input_ids"].shape) for b in sort_batches}) > 1


def test_end_to_end_tiny(tmp_path, capsys):
    hist = tmp_path / "h.json"
    counts = [0] * 64
    for length, n in ((10, 300), (20, 200), (30, 100), (60, 40)):
        counts[length - 1] = n
    hist.write_text(json.dumps(counts))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: tiny\nmodel: {{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
                   f"intermediate_size: 64, max_position_embeddings: 64}}\nprofile: {{histogram: {hist}, steps: 2, "
                   f"rounds: 2, micro_batch_size: 2}}\n")
    out, png, traces = tmp_path / "rows.jsonl", tmp_path / "plot.png", tmp_path / "traces"
    assert entry("profile", ["--config", str(cfg), "--algorithms", "sort", "lpfhp", "cghp", "profile.seed=1",
                               "--json", str(out),
                               "--plot", str(png), "--trace-dir", str(traces), "--scaling", str(tmp_path / "e.png"),
                               "--scaling-batches", "6"]) == 0
    text = capsys.readouterr().out
    for column in ("EFF", "theory", "realized", "OH", "seq/s", "GFLOP/step", "shapes", "un-padded seq/s/device"):
        assert column in text
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["algorithm"] for r in rows] == ["none", "sort", "lpfhp", "cghp"]
    assert all(r["flops_per_step"] > 0 and r["sequences_per_second"] > 0 and r["compile_seconds"] is None
               for r in rows)
    assert png.read_bytes()[:4] == b"\x89PNG" and (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    assert (traces / "cghp.trace.json").is_file() and "aten::" in (traces / "cghp_ops.txt").read_text()
    assert entry("profile", ["--config", str(tmp_path / "missing.yaml")]) == 2


def _tiny_profile(tmp_path):
    """A profile config of a 1-layer BERT on a two-length histogram at 32: seconds on the CPU."""
    hist = tmp_path / "h.json"
    counts = [0] * 32
    counts[9], counts[19] = 50, 30
    hist.write_text(json.dumps(counts))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: tiny\nmodel: {{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
                   f"intermediate_size: 64, max_position_embeddings: 64}}\nprofile: {{histogram: {hist}, steps: 1, "
                   f"rounds: 2, micro_batch_size: 2}}\n")
    return cfg


def test_backends_hf_baseline_and_bf16(tmp_path, capsys, monkeypatch):
    """--backends measures every algorithm per attention backend and names the fastest (a backend that cannot
    train here is skipped with its reason, not a crash); --hf-baseline adds transformers' BertForPreTraining on NONE's rows, which
    counts more FLOPs (its MLM head runs on every position); profile.precision=bf16 runs under autocast."""
    from bert_ipu.tasks.profile import run as profile_run

    studied = []   # (the Section E study runs in the profile's precision too: it ran in float32)
    real = profile_run.scaling_study
    monkeypatch.setattr(profile_run, "scaling_study", lambda model, *a, **k: (studied.append(model), real(model, *a,
                                                                                                           **k))[1])
    cfg = _tiny_profile(tmp_path)
    out, traces = tmp_path / "rows.jsonl", tmp_path / "traces"
    assert entry("profile", ["--config", str(cfg), "--algorithms", "cghp", "--backends", "mask", "reference", "flex",
                               "varlen", "--hf-baseline", "profile.precision=bf16", "--json", str(out),
                             "--trace-dir", str(traces), "--scaling", str(tmp_path / "e.png"),
                             "--scaling-batches", "2"]) == 0
    assert [getattr(m, "precision", None) for m in studied] == ["bf16"]
    # a trace per backend (each backend's replaced the one's before): the custom op in mask's, not reference's
    assert "bert_ipu::packed_attention_mask" in (traces / "mask_cghp.trace.json").read_text()
    assert "bert_ipu::packed_attention_mask" not in (traces / "reference_cghp.trace.json").read_text()
    text = capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ref = {r["algorithm"]: r for r in rows if r["backend"] == "reference"}
    assert set(ref) == {"none", "cghp", "hf"}
    assert ref["hf"]["flops_per_step"] > ref["none"]["flops_per_step"]
    assert {r["algorithm"] for r in rows if r["backend"] == "mask"} == {"none", "cghp", "hf"}
    assert "OH over HF" in text and "bf16" in text and "fastest backend for cghp:" in text
    assert any(r["backend"] == "flex" for r in rows) or "backend flex: skipped" in text
    assert not any(r["backend"] == "varlen" for r in rows)  # flash attention: CUDA only, skipped here
    assert all(r["mfu"] is None for r in rows)  # no known peak on a CPU


def test_compile_step_modes_and_engine_rows_in_one_run(tmp_path, capsys):
    """One run of every flag that compiles (each compilation costs seconds on the CPU; three runs took 95 s of the
    suite, one takes 60):

    - --compile: each algorithm's row also has the time torch.compile took over its batches' shapes;
    - --step-modes eager compile: every backend's steps also run under torch.compile (static shapes), as rows of
      backend `mask+compile` with their own speed-ups over NONE; SORT (a shape per batch) is timed eager only, the
      HF baseline compiled too; cudagraphs is skipped with its reason off CUDA. The compiled step trains: its
      FLOPs are those of the eager step (counted on the eager model);
    - --engine: beside the AdamW rows, the training application's step (the engine's LocalParallel with each step
      mode as train.compile, LAMB multi-tensor, clipping, the schedule, pinned copies) on the packed algorithms'
      batches, as rows `mask+engine` and `mask+engine+compile`: the same batches, so the same FLOPs; not on SORT's
      (a shape per batch: not what the application trains on)."""
    cfg = _tiny_profile(tmp_path)
    out = tmp_path / "rows.jsonl"
    assert entry("profile", ["--config", str(cfg), "--algorithms", "sort", "cghp", "--hf-baseline", "--compile",
                             "--engine", "--step-modes", "eager", "compile", "cudagraphs", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {(r["backend"], r["algorithm"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {("mask", "none"), ("mask", "sort"), ("mask", "cghp"), ("mask", "hf"),
                         ("mask+compile", "none"), ("mask+compile", "cghp"), ("mask+compile", "hf"),
                         ("mask+engine", "none"), ("mask+engine", "cghp"),
                         ("mask+engine+compile", "none"), ("mask+engine+compile", "cghp")}
    assert all(rows["mask", a]["compile_seconds"] > 0 for a in ("none", "sort", "cghp", "hf"))
    for algorithm in ("none", "cghp", "hf"):
        eager, compiled = rows["mask", algorithm], rows["mask+compile", algorithm]
        assert compiled["flops_per_step"] == eager["flops_per_step"] and compiled["sequences_per_second"] > 0
    assert rows["mask+compile", "none"]["realized_speedup"] == 1.0
    assert "cudagraphs: skipped" in text
    for algorithm in ("none", "cghp"):
        assert rows["mask+engine", algorithm]["flops_per_step"] == rows["mask", algorithm]["flops_per_step"]
        assert rows["mask+engine+compile", algorithm]["sequences_per_second"] > 0


def test_bad_step_modes_are_refused():
    with pytest.raises(ConfigError, match="profile.step_modes"):
        load_config("profile_quick", ["profile.step_modes=[eager, jit]"])


def test_balance_of_a_hand_worked_mixture():
    """Packs [64] (attention 4096) and [32, 32] (2048), equally likely, pack length 64, 2 ranks x 2 packs:
    every pack is full (DBR 0, padding 0). Balanced, an update of 2 + 2 splits evenly (ABR 0); 3 costly + 1
    cannot (8192 against 6144: ABR 1/8), nor can 1 + 3 (6144 against 4096: ABR 1/6), each with probability
    1/4: mean ABR 1/32 + 1/24 = 7/96. In loader order a 2 + 2 update (probability 3/8) also puts both costly
    packs on one rank with probability 1/3 (8192 against 4096: ABR 1/4): mean 7/96 + 1/32 = 10/96. Sampled
    over 2,000 updates: within 4 standard errors (0.008)."""
    from bert_ipu.packing.mixture import Mixture
    from bert_ipu.tasks.profile.run import balance_of

    got = balance_of(Mixture.from_lists([[64], [32, 32]], [5, 5]), 64, 2, 2, 2000, seed=0)
    assert got["updates"] == 2000 and got["dbr_loader"] == got["dbr_balanced"] == got["padding_ratio"] == 0
    assert got["abr_balanced"] == pytest.approx(7 / 96, abs=0.008)
    assert got["abr_loader"] == pytest.approx(10 / 96, abs=0.008)
    one = balance_of(Mixture.from_lists([[32]], [3]), 64, 4, 1, 10, seed=0)  # NONE-like: one half-full row each
    assert one["padding_ratio"] == 0.5 and one["abr_loader"] == one["abr_balanced"] == 0


def test_expected_max_of_draws():
    """E[max of n draws] from {1, 2, 3, 4}: n=1 -> 2.5; n=2 -> sum x ((i/4)^2 - ((i-1)/4)^2) = 50/16."""
    from bert_ipu.tasks.profile.run import expected_max

    x = np.array([4.0, 1.0, 3.0, 2.0])
    assert expected_max(x, 1) == pytest.approx(2.5)
    assert expected_max(x, 2) == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7) / 16)
    assert expected_max(x, 1000) == pytest.approx(4.0)
    assert expected_max(np.full(5, 2.0), 7) == pytest.approx(2.0)


TINY_MODEL = ("model: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, "
              "max_position_embeddings: 64}\n")


def tiny_histogram(tmp_path):
    hist = tmp_path / "h.json"
    counts = [0] * 32
    counts[9], counts[19] = 50, 30
    hist.write_text(json.dumps(counts))
    return hist


def test_profile_runs_from_yaml_alone(tmp_path):
    """Every command-line option is a profile field: a YAML file runs the profile through profiling.run, writes
    the rows and, beside them, the effective config, which loads back to the same config."""
    hist, out, traces = tiny_histogram(tmp_path), tmp_path / "rows.jsonl", tmp_path / "traces"
    path = tmp_path / "p.yaml"
    path.write_text(f"name: tiny\n{TINY_MODEL}profile: {{histogram: {hist}, json: {out}, backends: [reference], "
                    f"algorithms: [none, cghp], steps: 1, rounds: 2, micro_batch_size: 2, device: cpu, "
                    f"trace_dir: {traces}, ranks: 2}}\n")
    cfg = load_config(str(path), kind="profile")
    said = []
    result = profiling.run(cfg, say=said.append)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["algorithm"], r["backend"]) for r in rows] == [("none", "reference"), ("cghp", "reference")]
    # profile.ranks: the balance of each packing's updates over 2 ranks, in the rows and a table of its own
    assert all(0 <= r["abr_balanced"] <= r["abr_loader"] and 0 <= r["padding_ratio"] < 1 for r in rows)
    assert rows[0]["padding_ratio"] > rows[1]["padding_ratio"]  # NONE pads each sequence to the pack length
    assert any(m.startswith("balance over 2 ranks") for m in said)
    assert rows == json.loads(json.dumps(result["rows"])) and result["scaling"] is None
    assert (traces / "cghp.trace.json").is_file()
    for written in (tmp_path / "rows.jsonl.config.yaml", traces / "config.yaml"):
        again = load_config(str(written), kind="profile")
        assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


def test_flags_and_yaml_fields_give_the_same_config(tmp_path):
    """Each flag of run_profiling.py is an override of its profile field: flags on a bare file and the same
    values written as fields give equal configs; flags win over KEY=VALUE pairs, unset flags leave the file's."""
    hist = tiny_histogram(tmp_path)
    bare = tmp_path / "bare.yaml"
    bare.write_text(f"name: tiny\n{TINY_MODEL}profile: {{histogram: {hist}, scaling_batches: 7}}\n")
    out, traces, png, scaling = (str(tmp_path / n) for n in ("a b.jsonl", "traces", "p.png", "true"))
    by_flags = cli.config([
        "--config", str(bare), "--algorithms", "sort", "cghp", "profile.steps=2", "--max-sequences-per-pack", "2",
        "--json", out, "--trace-dir", traces, "--plot", png, "--scaling", scaling, "--compile",
        "--backends", "mask", "reference", "--hf-baseline", "--ranks", "4", "profile.algorithms=[greedy]"], "profile")[0]
    fields = tmp_path / "fields.yaml"
    fields.write_text(f"name: tiny\n{TINY_MODEL}profile: {{histogram: {hist}, algorithms: [sort, cghp], steps: 2, "
                      f"max_sequences_per_pack: 2, json: '{out}', trace_dir: '{traces}', plot: '{png}', "
                      f"scaling: '{scaling}', scaling_batches: 7, compile: true, backends: [mask, reference], "
                      f"hf_baseline: true, ranks: 4}}\n")
    by_yaml = load_config(str(fields), kind="profile")
    assert dataclasses.asdict(by_flags) == dataclasses.asdict(by_yaml)
    assert by_yaml.profile.scaling == scaling and by_yaml.profile.backends == ["mask", "reference"]
    plain = cli.config(["--config", str(bare)], "profile")[0]
    assert dataclasses.asdict(plain) == dataclasses.asdict(load_config(str(bare), kind="profile"))
    assert (plain.profile.backends, plain.profile.compile, plain.profile.json) == (None, False, None)


def test_bad_profile_input_is_a_clear_error(tmp_path, capsys):
    """Bad fields are ConfigErrors, a bad histogram a PackingInputError, a profile that can measure no backend
    a ProfilingError: all ValueErrors, which the command line reports with exit code 2."""
    hist = tiny_histogram(tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text(f"name: tiny\n{TINY_MODEL}profile: {{histogram: {hist}, steps: 1, rounds: 2, "
                    f"micro_batch_size: 2, device: cpu}}\n")
    for override in ("profile.backends=[bogus]", "profile.backends=mask", "profile.scaling_batches=1",
                     "profile.algorithms=[nope]", "profile.compile=maybe", "profile.max_sequences_per_pack=0",
                     "profile.ranks=0", "profile.balance_updates=0", "profile.ranks=100000"):  # (ran for minutes)
        with pytest.raises(ConfigError):
            load_config(str(path), [override], kind="profile")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, -2]")
    with pytest.raises(packing.PackingInputError):
        profiling.run(load_config(str(path), [f"profile.histogram={bad}"], kind="profile"),
                      say=lambda m: None)
    # FlexAttention has no backward on the CPU: nothing is left to measure
    with pytest.raises(profiling.ProfilingError):
        profiling.run(load_config(str(path), ["profile.backends=[flex]"], kind="profile"), say=lambda m: None)
    capsys.readouterr()
    assert entry("profile", ["--config", str(path), "--backends", "flex"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert entry("profile", ["--config", str(path), "--scaling-batches", "1"]) == 2
    # a pack length of 1e5 (a histogram that long): the attention scores need TBs; refused before any allocation
    long = tmp_path / "long.json"
    long.write_text(json.dumps([0] * 99_999 + [1]))
    capsys.readouterr()
    assert entry("profile", ["--config", str(path), f"profile.histogram={long}"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "pack length of 100,000" in lines[0] and "GiB are free" in lines[0], lines
    # a micro-batch of 100,000 packs: its activations and MLM logits (134 GB) died in the allocator, a traceback;
    # a depth above the pack length gave torch's "Expected input batch_size (128) to match target batch_size"
    for override, says in (("profile.micro_batch_size=100000", "GiB are free"),
                           ("profile.max_sequences_per_pack=100000", "more than the pack length")):
        assert entry("profile", ["--config", str(path), override]) == 2
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(lines) == 1 and says in lines[0], lines
    # SORT's micro-batch is consecutive sequences: more than the histogram holds was numpy's "high <= 0"
    few = tmp_path / "few.json"
    few.write_text(json.dumps([0] * 7 + [3]))
    assert entry("profile", ["--config", str(path), f"profile.histogram={few}", "profile.micro_batch_size=4",
                             "--algorithms", "sort"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "SORT takes 4 consecutive sequences a micro-batch and the histogram holds 3" \
        in lines[0], lines


@pytest.mark.parametrize("flag, name, content, named", [
    ("--json", "no/such/rows.jsonl", None, "does not exist"),
    ("--plot", "no/such/plot.png", None, "does not exist"),
    ("--scaling", "no/such/e.png", None, "does not exist"),
    ("--json", "manifest.json", '{"format": "packed", "shards": []}\n', "not an output of this kind"),
    ("--plot", "notes.txt", "my notes\n", "not an output of this kind"),
    ("--scaling", ".", None, "is a folder"),
    ("--plot", "figure.png", b"\x89PNG\r\n\x1a\n a user's figure", "not an output of this kind"),  # not marked ours
    ("--json", "same.out", None, "profile.json and profile.plot are both"),  # --plot same.out too (it replaced it)
])
def test_profile_outputs_are_checked_before_anything_is_measured(tmp_path, capsys, flag, name, content, named):
    """An output in a folder that does not exist was a FileNotFoundError traceback after the whole profile, and
    --json on a dataset's manifest.json replaced it: now each is one line (exit code 2) naming the path, before
    the model is built, and the file that was there is left as it was."""
    hist = tiny_histogram(tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text(f"name: tiny\n{TINY_MODEL}profile: {{histogram: {hist}, steps: 1, rounds: 2, "
                    f"micro_batch_size: 2, device: cpu}}\n")
    target = tmp_path / name
    if content is not None:
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    same = ["--plot", str(target)] if name == "same.out" else []
    assert entry("profile", ["--config", str(path), flag, str(target), *same]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0] and "Traceback" not in captured.err
    assert "[profile]" not in captured.out  # nothing was measured
    if content is not None:
        assert target.read_bytes() == (content if isinstance(content, bytes) else content.encode())
    assert not list(tmp_path.rglob("*.partial"))
