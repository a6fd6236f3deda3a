"""The one command line (bert_ipu/cli.py) that every entry point is: --print-config, KEY=VALUE anywhere, any
kind through `python -m bert_ipu`, a kind's own flags; and the datasets and checkpoints of the code before the
reorganisation (tests/fixtures/legacy, written by commit a72fa96) still read and resume."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from bert_ipu import cli
from bert_ipu.config import CONFIG_DIR, ConfigError
from bert_ipu.data.shards import PackedDataset
from bert_ipu.tasks import load_config

from training_helpers import ROOT, entry, final_weights

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_print_config_shows_the_resolved_config_that_loads_back(name, tmp_path, capsys):
    """--print-config prints every field after overlays and overrides, as YAML that, saved and loaded, is the
    same config; nothing runs and nothing is written."""
    extra = ["data.task=sst2", "data.data_dir=x"] if name.startswith("glue_") and "tiny" not in name else []
    argv = ["--config", name, "train.seed=7", *extra, "--print-config"] if not name.startswith("profile") else \
        ["--config", name, "profile.seed=7", "--print-config"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    (tmp_path / "printed.yaml").write_text(printed)
    again = load_config(str(tmp_path / "printed.yaml"))
    expected = load_config(name, argv[2:-1])
    assert dataclasses.asdict(again) | {"name": name} == dataclasses.asdict(expected)
    section = "profile" if name.startswith("profile") else "train"
    assert yaml.safe_load(printed)[section]["seed"] == 7


def test_overrides_may_come_anywhere_also_after_resume():
    """KEY=VALUE after --resume (argparse alone rejected it) or between flags is an override like any other."""
    cfg, args, _ = cli.config(["--config", "test_tiny", "--resume", "train.max_steps=3", "output_dir=x"],
                              "pretraining")
    assert args.resume and cfg.train.max_steps == 3 and cfg.output_dir == "x"
    cfg, _, _ = cli.config(["--config", "profile_quick", "--algorithms", "cghp", "profile.steps=2", "--ranks", "2"],
                           "profile")
    assert cfg.profile.algorithms == ["cghp"] and cfg.profile.steps == 2 and cfg.profile.ranks == 2


def test_a_word_that_is_no_override_is_refused():
    """`run_pretraining.py --config test_tiny garbage` went on as if the word were not there (exit 0)."""
    with pytest.raises(ConfigError, match="argument 'garbage' is not a KEY=VALUE override"):
        cli.config(["--config", "test_tiny", "garbage"], "pretraining")
    assert entry("pretraining", ["--config", "test_tiny", "garbage", "--print-config"]) == 2


def test_python_m_bert_ipu_runs_any_kind_and_refuses_another_kinds_flags():
    """Without a kind (python -m bert_ipu) the config's own kind decides; a flag of another kind (--algorithms
    on a pretraining config, --eval-only where a task cannot evaluate only) is a ConfigError, not ignored."""
    assert type(cli.config(["--config", "squad_tiny_packed"])[0]).__name__ == "SquadRunConfig"
    assert cli.config(["--config", "profile_quick", "--algorithms", "cghp"])[0].profile.algorithms == ["cghp"]
    with pytest.raises(ConfigError, match="--algorithms is a flag of another kind"):
        cli.config(["--config", "test_tiny", "--algorithms", "cghp"])
    with pytest.raises(ConfigError, match="cannot evaluate only"):
        cli.config(["--config", "test_tiny", "--eval-only"])
    with pytest.raises(ConfigError, match="a profile config does not: drop the flag"):  # (accepted, did nothing)
        cli.config(["--config", "profile_quick", "--overwrite"])
    evaluate = cli.config(["--config", "squad_tiny_packed", "--eval-only"])[0]
    assert evaluate.data.train_file is None and evaluate.data.predict_file


def test_module_entry_point_prints_help_and_config():
    """`python -m bert_ipu` is a working command (a fresh interpreter): --help names the flags; a wrong kind for an
    entry point names the right one; exit codes 0 and 2."""
    run = lambda *a: subprocess.run([sys.executable, *a], capture_output=True, text=True, cwd=ROOT)  # noqa: E731
    helped = run("-m", "bert_ipu", "--help")
    assert helped.returncode == 0 and "--print-config" in helped.stdout and "--eval-only" in helped.stdout
    own = run("-m", "bert_ipu", "--config", "ner_tiny_packed", "--help")  # (the general text, every kind's flags)
    assert own.returncode == 0 and "token classification" in own.stdout and "--algorithms" not in own.stdout
    assert own.stdout.startswith("usage: python -m bert_ipu ")
    shown = run("-m", "bert_ipu", "--config", "glue_tiny_packed", "--print-config")
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["kind"] == "glue"
    wrong = run("run_squad.py", "--config", "test_tiny")
    assert wrong.returncode == 2 and wrong.stderr.strip() == ("error: config 'test_tiny' is of kind pretraining: "
                                                              "run it with run_pretraining.py")


def test_a_checkpoint_resumed_on_another_world_leaves_the_tensor_ranks_generators_as_seeded(tmp_path, monkeypatch):
    """The attention cores' generator (tensor parallelism) comes back from the checkpoint only on as many
    processes as saved it: on a larger grid every rank past the saved ones got rank 0's, so two tensor-parallel
    ranks drew the same attention-dropout masks for the rest of the run. There it is left as the rank seeded it."""
    from bert_ipu.engine import checkpoint
    from bert_ipu.engine.optim import build_optimizer, packing_betas
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    class Region:   # a tensor-parallel rank's generator, as tensor.region_generator returns it
        def __init__(self, seed):
            self.state = (torch.Generator().manual_seed(seed).get_state(), None)

    dataset = tmp_path / "dataset"
    shutil.copytree(LEGACY / "dataset", dataset)
    cfg = load_config("test_tiny", [f"data.dataset={dataset}", "model.max_position_embeddings=64",
                                    "data.max_seq_length=64"])
    task = PretrainingTask(cfg)
    task.prepare(Runtime.start("cpu"))
    model = task.build_model()
    opt, _ = build_optimizer(model, cfg.train, 4, 1, packing_betas(cfg.train, task.packed, task.packing_factor))
    state = checkpoint.load(LEGACY / "run" / "checkpoints" / "step-0000002", model, opt)
    saved_region = Region(1)
    monkeypatch.setattr(checkpoint, "region_generator", lambda module: saved_region)
    checkpoint.save(tmp_path / "ckpt" / "step-0000002", model, opt, state, keep=2, main=True)
    for world, restored in ((1, True), (None, True), (2, False)):
        region = Region(2)
        monkeypatch.setattr(checkpoint, "region_generator", lambda module: region)
        checkpoint.load(tmp_path / "ckpt" / "step-0000002", model, opt, world=world)
        assert torch.equal(region.state[0], saved_region.state[0]) == restored, world
    # a LAMB group that never had gradients saved no update count (an older tensor-parallel Llama's no-decay
    # group, which its norms joined since): it resumes at the other groups' count, not at its first update
    path = tmp_path / "ckpt" / "step-0000002" / "state.json"
    saved = json.loads(path.read_text())
    del saved["optimizer_groups"][1]["step"]
    path.write_text(json.dumps(saved))
    opt, _ = build_optimizer(model, cfg.train, 4, 1, packing_betas(cfg.train, task.packed, task.packing_factor))
    checkpoint.load(tmp_path / "ckpt" / "step-0000002", model, opt)
    assert [g["step"] for g in opt.param_groups] == [2, 2]


def test_a_dataset_and_a_checkpoint_of_the_previous_layout_read_and_resume(tmp_path):
    """The legacy dataset verifies; the legacy run (stopped after its step-2 checkpoint of 4 updates by the old
    code) resumes with this code and ends with exactly the weights of the same run resumed from that checkpoint
    as this code writes it (the legacy state read, then saved in the current layout): so the old layout reads to
    the very state the current one holds, and nothing else of the old run is lost. Both continuations run here:
    no figure computed on another machine is compared bitwise (float sums follow the CPU's vector width and the
    thread count; the fixture's first 2 updates ran elsewhere, and a straight run here drifts from them by a full
    LAMB step in near-zero gradients, whose sign rounding decides). It exports a model transformers loads."""
    from bert_ipu.engine import checkpoint
    from bert_ipu.engine.optim import build_optimizer, packing_betas
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.tasks import load_config
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    dataset = tmp_path / "dataset"
    shutil.copytree(LEGACY / "dataset", dataset)
    PackedDataset(dataset, verify=True)
    overrides = [f"data.dataset={dataset}", "model.max_position_embeddings=64", "data.max_seq_length=64",
                 "train.max_steps=4", "train.checkpoint_every=2", "train.validate_every=2", "train.log_every=1"]
    common = ["--config", "test_tiny", *overrides]
    resumed, converted = tmp_path / "resumed", tmp_path / "converted"
    shutil.copytree(LEGACY / "run", resumed)
    shutil.copytree(LEGACY / "run", converted, ignore=shutil.ignore_patterns("checkpoints"))
    legacy = LEGACY / "run" / "checkpoints" / "step-0000002"
    cfg = load_config("test_tiny", overrides)
    task = PretrainingTask(cfg)
    task.prepare(Runtime.start("cpu"))
    model = task.build_model()
    opt, _ = build_optimizer(model, cfg.train, 4, cfg.train.warmup_steps,
                             packing_betas(cfg.train, task.packed, task.packing_factor))
    state = checkpoint.load(legacy, model, opt)
    raw = checkpoint.load_weights(legacy)
    assert all(torch.equal(raw[k], v) for k, v in model.state_dict().items())  # read exactly
    assert state["step"] == 2 and len(opt.state) == len(list(model.parameters()))  # the optimizer's state too
    assert all(s["exp_avg"].abs().sum() > 0 for s in opt.state.values())
    checkpoint.save(converted / "checkpoints" / "step-0000002", model, opt, state, keep=2, main=True)
    assert entry("pretraining", [*common, f"output_dir={resumed}", "--resume"]) == 0
    assert entry("pretraining", [*common, f"output_dir={converted}", "--resume"]) == 0
    a, b = final_weights(resumed), final_weights(converted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(raw[k], a[k]) for k in raw)  # it trained on
    from transformers import BertForPreTraining

    BertForPreTraining.from_pretrained(str(resumed / "hf"))


def test_auto_resume_starts_a_new_run_and_continues_one_with_a_checkpoint(dataset, tmp_path):
    """--auto-resume (what make wikipedia's phases run with: a rerun failed at phase 1, "already holds a run"):
    a folder without a checkpoint starts, one with a checkpoint resumes (a finished run only exports again);
    beside --resume or --overwrite it is argparse's error."""
    from training_helpers import entry

    out = tmp_path / "run"
    common = ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
              "model.max_position_embeddings=64", "data.max_seq_length=64", "train.checkpoint_every=2"]
    assert entry("pretraining", [*common, "train.max_steps=2", "--auto-resume"]) == 0
    assert entry("pretraining", [*common, "train.max_steps=2"]) == 2  # (without it: already holds a run)
    assert entry("pretraining", [*common, "train.max_steps=4", "--auto-resume"]) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert steps == [1, 2, 3, 4]
    shutil.rmtree(out / "checkpoints")  # a run of ours killed before its first checkpoint: started over
    assert entry("pretraining", [*common, "train.max_steps=2", "--auto-resume"]) == 0
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    with pytest.raises(SystemExit):
        entry("pretraining", [*common, "--auto-resume", "--resume"])


def test_a_bad_command_line_is_one_line_from_every_command():
    """argparse printed its usage block before the error (two lines and more); every command's parser now
    says the error in one line, exit code 2, as every other refusal."""
    run = lambda *a: subprocess.run([sys.executable, *a], capture_output=True, text=True, cwd=ROOT)  # noqa: E731
    for argv, named in ((["-m", "bert_ipu.packing", "--histogram", "h.json", "--max-sequences-per-pack", "0"],
                         "max_sequences_per_pack 0 is below 1"),
                        (["run_pretraining.py", "--config", "test_tiny", "--resume", "--overwrite"],
                         "not allowed with argument --resume"),
                        (["data/create_pretraining_data.py"], "the following arguments are required: --output")):
        done = run(*argv)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and named in lines[0] and "see --help" in lines[0], done.stderr


def test_a_flags_path_holding_an_equals_sign_is_its_value():
    """--json /tmp/d/lr=1.jsonl was taken for a KEY=VALUE override ("argument --json: expected one argument"); an
    override is a dotted key before its "=" (and the help's example is one the kind takes: a profile has no train
    section)."""
    from bert_ipu.cli import config

    cfg = config(["--config", "profile_quick", "--json", "/tmp/d/lr=1.jsonl", "profile.steps=2"], "profile")[0]
    assert cfg.profile.json == "/tmp/d/lr=1.jsonl" and cfg.profile.steps == 2
