"""The shared training engine and the run hygiene a user relies on: the dataset manifest as the single source
of truth, one run per folder, exports that transformers uses as they are, progress off a terminal, one line
per error, self-launched pipelines, and checkpoints that resume on another topology. Each test here failed
before the engine existed (application-layer issue, bugs 1-8)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import yaml

from bert_ipu.config import ConfigError
from bert_ipu.tasks import load_config
from bert_ipu.data.loader import ArraySource, UpdateLoader
from bert_ipu.engine import checkpoint
from bert_ipu.engine.runtime import RunError
from bert_ipu.tasks import run as main

from training_helpers import Killed, copy_run, entry, final_weights, job, launch, run_cli, tiny

FAST = ["train.max_steps=2", "train.validate_every=2", "train.checkpoint_every=2", "train.log_every=1"]
TOPOLOGY = ["model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=4",
            "train.checkpoint_every=2", "train.validate_every=2", "train.keep_checkpoints=3", "train.log_every=1"]
SQUAD = ["train.max_steps=4", "train.log_every=1", "train.checkpoint_every=2", "train.global_batch_size=8"]
SQUAD_DDP = ["--config", "squad_tiny_packed", *SQUAD, "train.micro_batch_size=2", "model.hidden_dropout_prob=0",
             "model.attention_probs_dropout_prob=0"]

# GLUE packed (p about 7.5): an update of batch_unit sequences is 1 pack on 1 process, 1 a replica on 2
GLUE_DDP = ["--config", "glue_tiny_packed", "train.max_steps=4", "train.num_train_epochs=null",
            "train.checkpoint_every=2", "train.keep_checkpoints=3", "data.predict_split=null"]


def missing_init(dataset, tmp_path) -> list[str]:
    return ["--config", "test_tiny", f"data.dataset={dataset}", "model.max_position_embeddings=64",
            "data.max_seq_length=64", f"model.init_checkpoint={tmp_path / 'nope'}"]


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory):
    """Every run of this module at 2 processes, in one launch (tests/engine_worker.py): the topology runs saved
    or resumed on 2 pipeline stages, SQuAD on 2 DDP ranks, then the two runs that must fail with one line (last:
    a failed step ends nothing, but nothing after it needs to train). The 1-stage run that the launch resumes
    on 2 stages runs here first, in this process."""
    root = tmp_path_factory.mktemp("two_processes")
    common = ["--config", "test_tiny", f"data.dataset={dataset}", *TOPOLOGY]
    assert entry("pretraining", [*common, f"output_dir={root / 'saved_on_1'}", "parallel.pipeline_stages=1"]) == 0
    return root, launch(2, [
        job("saved_on_2", *common, f"output_dir={root / 'saved_on_2'}", "parallel.pipeline_stages=2"),
        copy_run(root / "saved_on_1", root / "resumed_on_2", "checkpoints/step-0000004"),
        job("resumed_on_2", *common, f"output_dir={root / 'resumed_on_2'}", "parallel.pipeline_stages=2", "--resume"),
        job("squad", *SQUAD_DDP, f"output_dir={root / 'squad'}", script="run_squad.py"),
        job("glue", *GLUE_DDP, f"output_dir={root / 'glue'}", script="run_glue.py"),
        job("missing_init", *missing_init(dataset, root), f"output_dir={root / 'run2'}"),
        # a step-4 checkpoint saved on 1 stage (a copy of saved_on_1), resumed on 2 stages into another model
        copy_run(root / "saved_on_1", root / "another_model"),
        job("another_model", *common, f"output_dir={root / 'another_model'}", "parallel.pipeline_stages=2",
            "model.num_hidden_layers=4", "--resume"),
    ], root)


def rel_diff(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-3)).item() for k in a)


# --- 1: the manifest is the single source of truth ------------------------------------------------------------

@pytest.mark.parametrize("override, named", [
    (["data.algorithm=spfhp", "data.max_sequences_per_pack=2"], "data.algorithm=spfhp but it was packed with cghp"),
    (["data.max_sequences_per_pack=2"], "data.max_sequences_per_pack=2 but it was packed with depth limit 3"),
    (["data.max_seq_length=128", "model.max_position_embeddings=128"], "data.max_seq_length=128 but its packs are 64"),
])
def test_config_that_disagrees_with_its_dataset_is_an_error(dataset, tmp_path, override, named):
    """A config whose data settings differ from the existing dataset's is an error naming both values and the
    fix, before anything is written (the run folder is not created)."""
    out = tmp_path / "run"
    with pytest.raises(RunError, match=named) as e:
        main(tiny(dataset, out, *FAST, *override), progress=False)
    assert "Train on it with data.max_seq_length=64, data.algorithm=cghp, data.max_sequences_per_pack=3" in str(e.value)
    assert not out.exists()


def test_run_records_the_layout_it_trained_on(dataset, tmp_path):
    """config.yaml holds the dataset's layout (pack length, slots actually used, algorithm, depth limit)."""
    out = tmp_path / "run"
    main(tiny(dataset, out, *FAST), progress=False)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert saved["data_layout"]["pack_len"] == 64
    assert saved["data_layout"]["max_sequences_per_pack"] == manifest["layout"]["max_sequences_per_pack"]
    assert saved["data_layout"]["mlm_slots"] == manifest["layout"]["mlm_slots"]
    assert saved["data_layout"]["algorithm"] == "cghp" and saved["data_layout"]["depth_limit"] == 3


def test_existing_folder_that_is_not_a_dataset_is_never_touched(tmp_path):
    """data.dataset pointing at a user's folder without a manifest is an error, and the folder is unchanged
    (the old code deleted it to create a dataset there)."""
    folder = tmp_path / "mine"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "notes.txt").write_text("x")
    cfg = load_config("test_tiny", [f"data.dataset={folder}", "data.prepare_input=builtin",
                                    f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(RunError, match="exists but is not a dataset"):
        main(cfg, progress=False)
    assert (folder / "notes.txt").read_text() == "x" and (folder / "checkpoints").is_dir()


def test_config_kind_picks_the_entry_point():
    """A config's kind (inherited) picks its task; the wrong entry point is an error naming the right one."""
    assert load_config("squad_tiny_packed").kind == "squad"
    assert load_config("test_tiny").kind == "pretraining"
    with pytest.raises(ConfigError, match="run it with run_squad.py"):
        load_config("squad_tiny", kind="pretraining")
    with pytest.raises(ConfigError, match="run it with run_pretraining.py"):
        load_config("test_tiny", kind="squad")
    assert load_config("test_tiny").output_dir == "runs/test_tiny"  # name defaults to the file, output to runs/NAME


# --- 3: one run per folder -----------------------------------------------------------------------------------

def test_rerun_into_a_run_folder_needs_resume_or_overwrite(dataset, tmp_path):
    """Rerunning into an output_dir that holds a run is an error that changes nothing; --overwrite replaces it
    (checkpoints, metrics and all); the checkpoints kept are the newest by step number."""
    out = tmp_path / "run"
    main(tiny(dataset, out, "train.max_steps=4", "train.checkpoint_every=1", "train.keep_checkpoints=2"),
         progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    with pytest.raises(RunError, match="already holds a run .*--resume.*--overwrite"):
        main(tiny(dataset, out, *FAST), progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()} == before
    main(tiny(dataset, out, *FAST), overwrite=True, progress=False)
    assert [p.name for p in checkpoint.checkpoints(out)] == ["step-0000002"]
    rows = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2]
    # rotation by step number, not by name
    for name in ("step-9", "step-10"):
        shutil.copytree(out / "checkpoints" / "step-0000002", out / "checkpoints" / name)
    assert [p.name for p in checkpoint.checkpoints(out)] == ["step-0000002", "step-9", "step-10"]


def test_resume_does_not_repeat_metrics_rows(dataset, tmp_path):
    """A run resumed from its step-2 checkpoint after reaching step 4 logs every step once."""
    out = tmp_path / "run"
    main(tiny(dataset, out, "train.max_steps=4", "train.checkpoint_every=2", "train.log_every=1",
              "train.keep_checkpoints=3"), progress=False)
    shutil.rmtree(out / "checkpoints" / "step-0000004")
    main(tiny(dataset, out, "train.max_steps=4", "train.checkpoint_every=2", "train.log_every=1"), resume=True,
         progress=False)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) == [1, 2, 3, 4]


# --- 4: exports that transformers uses as they are ----------------------------------------------------------

def test_pretraining_export_has_tokenizer_and_card(dataset, tmp_path):
    """AutoTokenizer loads the export with the dataset's vocabulary, fill-mask returns real tokens, and the
    model card says what was trained."""
    from transformers import AutoTokenizer, pipeline

    out = tmp_path / "run"
    main(tiny(dataset, out, *FAST), progress=False)
    vocab = (dataset / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tok = AutoTokenizer.from_pretrained(out / "hf")
    assert len(tok) == len(vocab)
    assert tok.convert_ids_to_tokens(tok("the")["input_ids"])[1] == "the"
    results = pipeline("fill-mask", model=str(out / "hf"))("the [MASK] is here.")
    assert results and all(r["token_str"].strip() for r in results)
    card = (out / "hf" / "README.md").read_text()
    assert "fill-mask" in card and "cghp" in card and "2" in card


# --- 5 and 6: progress off a terminal, one line per error -------------------------------------------------------

def test_progress_lines_off_a_terminal(dataset, tmp_path, capsys):
    """Without a terminal every log_every update prints a progress line to stdout (a batch job's log)."""
    main(tiny(dataset, tmp_path / "run", "train.max_steps=4", "train.log_every=2", "train.validate_every=4"),
         progress=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[run] step ") and "/4:" in x]
    assert [x.split(":")[0] for x in lines] == ["[run] step 2/4", "[run] step 4/4"]


def test_missing_init_checkpoint_is_one_line(dataset, runs, tmp_path, capsys):
    """A missing init_checkpoint is one error line and exit code 2, also under torchrun with 2 ranks (rank 0
    speaks for the run): the command line in this process, and in the module's launch of 2 processes."""
    code = entry("pretraining", [*missing_init(dataset, tmp_path), f"output_dir={tmp_path / 'runNone'}"])
    stderr = capsys.readouterr().err
    ran = runs[1]["missing_init"]
    for codes, stderr, nproc in (([code], stderr, None), (ran["codes"], ran["stderr"], 2)):
        errors = [x for x in stderr.splitlines() if x.startswith("error")]
        assert all(c != 0 for c in codes) and len(errors) == 1, stderr[-2000:]
        assert "is not a Hugging Face model folder" in errors[0]
        # no traceback through our code (torchrun itself still reports that a worker exited with code 2)
        assert 'bert_ipu/' not in stderr and (nproc or "Traceback" not in stderr)
    assert code == 2 and ran["codes"] == [2, 2]


# --- 7: a pipeline config started without torchrun launches its processes ------------------------------------

def test_pipeline_config_launches_its_processes(dataset, tmp_path, capsys):
    """`python run_pretraining.py` on a 2-stage config starts the 2 processes itself and trains; a device
    the machine does not have is one clear line."""
    out = tmp_path / "run"
    proc = run_cli("--config", "test_tiny", f"data.dataset={dataset}", "model.max_position_embeddings=64",
                   "data.max_seq_length=64", f"output_dir={out}", "parallel.pipeline_stages=2", *FAST)
    assert "starting 2 processes" in proc.stdout  # started with plain python: the entry point launched them
    assert "2 pipeline stages (1f1b)" in proc.stdout
    assert sum(x.startswith("final:") for x in proc.stdout.splitlines()) == 1
    assert checkpoint.read_state(checkpoint.checkpoints(out)[-1])["stages"] == 2
    if not torch.cuda.is_available():  # refused before anything is launched: the command line in this process
        code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", "parallel.pipeline_stages=2", "train.device=cuda",
                                     f"output_dir={tmp_path / 'gpu'}"])
        stderr = capsys.readouterr().err
        assert code == 2 and stderr.strip().count("\n") == 0 and "GPU" in stderr


def test_pipeline_on_an_older_torch_is_refused_before_launching(dataset, tmp_path, capsys, monkeypatch):
    """Under torch 2.11 (the CUDA image's) the pipeline schedule hangs: a 2-stage run there is one line and exit 2
    before any process starts or anything is written; one stage runs as before."""
    from bert_ipu.engine import runtime

    monkeypatch.setattr(runtime.torch, "__version__", "2.11.0+cu130")
    out = tmp_path / "old"
    code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", "parallel.pipeline_stages=2",
                                 f"output_dir={out}"])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.strip().count("\n") == 0 and "torch 2.13 or newer" in stderr
    assert "2.11.0+cu130" in stderr and not out.exists()
    runtime.check_pipeline_torch(1)  # one stage: no refusal
    with pytest.raises(RunError, match="pipeline_stages=2"):
        runtime.check_pipeline_torch(2)


# --- 8: checkpoints resume on another topology -------------------------------------------------------------------

@pytest.mark.parametrize("saved_on, resumed_on", [(2, 1), (1, 2)])
def test_checkpoint_resumes_on_another_topology(dataset, runs, tmp_path, saved_on, resumed_on):
    """A run saved at step 2 on `saved_on` pipeline stages and resumed on `resumed_on` continues as the
    uninterrupted run on `saved_on` stages: weights after step 4 within 1e-4 relative (float32 summation
    order differs between topologies, amplified by LAMB on near-zero gradients, as in the pipeline test), and
    the loader continues at the same update (the step-3 loss agrees to 1e-5). The 2-stage runs are the
    module's launch; the 1-stage runs are in this process."""
    root, ran = runs
    straight = root / f"saved_on_{saved_on}"
    if saved_on == 2:
        ran.ok("saved_on_2")
        resumed = tmp_path / "resumed"
        shutil.copytree(straight, resumed)
        shutil.rmtree(resumed / "checkpoints" / "step-0000004")
        assert entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", *TOPOLOGY,
                                     f"output_dir={resumed}", "parallel.pipeline_stages=1", "--resume"]) == 0
    else:
        resumed = root / "resumed_on_2"
        ran.ok("resumed_on_2")
    assert rel_diff(final_weights(straight), final_weights(resumed)) < 1e-4
    a = {json.loads(x)["step"]: json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()}
    b = {json.loads(x)["step"]: json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()}
    assert sorted(b) == [1, 2, 3, 4]
    assert abs(a[3]["loss"] - b[3]["loss"]) <= 1e-5 * a[3]["loss"]
    assert a[3]["tokens_per_second"] > 0 and b[3]["tokens_per_second"] > 0
    if saved_on == 2:  # resuming into another model is one error line on every topology, not a collective hang
        proc = ran["another_model"]  # a step-4 checkpoint saved on 1 stage, resumed on 2 into 4 layers
        errors = [x for x in proc["stderr"].splitlines() if x.startswith("error")]
        assert all(c != 0 for c in proc["codes"]) and len(errors) == 1 and "does not fit this model" in errors[0], \
            proc["stderr"][-2000:]


# --- the loader: updates independent of the topology ------------------------------------------------------------

def test_update_loader_splits_updates_the_same_for_any_replica_count():
    """The packs of an update are the same whether 1, 2 or 4 replicas read it; the last partial update is
    filled with empty rows (no labels) when drop_last is off, so every pack is seen once an epoch."""
    import numpy as np

    rows = {"input_ids": np.arange(10)[:, None].repeat(3, 1), "start_positions": np.arange(10)[:, None]}
    src = ArraySource(rows, label_fields=("start_positions",))
    seen = {}
    for world in (1, 2, 4):
        updates = []
        for _ in range(3):
            parts = []
            for r in range(world):
                loader = UpdateLoader(src, 4, 4 // world, r, world, seed=3, drop_last=False)
                loader.load_state_dict(loader.state_dict() | {"update_in_epoch": len(updates)})
                parts += [b["input_ids"][:, 0].tolist() for b in loader.next_update()]
            updates.append(sorted(x for p in parts for x in p))
        seen[world] = updates
    assert seen[1] == seen[2] == seen[4]
    flat = [x for u in seen[1] for x in u]
    assert sorted(x for x in flat if x) == list(range(1, 10)) and flat.count(0) == 3  # 2 empty rows + pack 0


# --- SQuAD on the shared engine ------------------------------------------------------------------------------------

def test_squad_kill_and_resume_is_bitwise_identical(tmp_path, monkeypatch):
    """SQuAD fine-tuning gains checkpoints and exact resume: a run killed after its step-2 checkpoint and
    resumed ends with exactly the weights of a run never stopped (dropout on: the RNG state is restored)."""
    from bert_ipu.tasks import run as squad

    def cfg(out):
        return load_config("squad_tiny_packed", [*SQUAD, "data.predict_file=null", f"output_dir={out}"])
    squad(cfg(tmp_path / "straight"), progress=False)
    real = checkpoint.save

    def kill_after_first(*args, **kwargs):
        real(*args, **kwargs)
        raise Killed
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(Killed):
        squad(cfg(tmp_path / "stopped"), progress=False)
    monkeypatch.undo()
    squad(cfg(tmp_path / "stopped"), resume=True, progress=False)
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(tmp_path / "stopped" / "hf")) == 30522  # the export has its tokenizer


def test_squad_two_ddp_ranks_equal_one_process(runs, tmp_path):
    """SQuAD with 2 data-parallel ranks (2 packs each per micro-batch) ends with the weights of 1 process on
    the same 8-pack updates, and both evaluate to the same EM/F1. Every weight agrees to 1e-5 absolute
    (measured 2.9e-6): only float32 summation order differs. Not relative: the span head's bias has a true
    gradient of exactly 0 (a softmax over positions ignores a constant), so AdamW, which divides each gradient
    by its running RMS, moves it by rounding noise alone, and it stays near 0 (relative differences there
    are meaningless; all others agree to 2e-4 relative)."""
    assert entry("squad", [*SQUAD_DDP, "train.micro_batch_size=4", f"output_dir={tmp_path / 'one'}"]) == 0
    root, ran = runs
    assert "8 packs/update = 2 x 2 replica(s) x 2 accumulation" in ran.ok("squad")["stdout"]
    a, b = final_weights(tmp_path / "one"), final_weights(root / "squad")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    one, two = (json.loads((folder / "results.json").read_text()) for folder in (tmp_path / "one", root / "squad"))
    assert one["packs_per_update"] == two["packs_per_update"] == 8
    assert abs(one["f1"] - two["f1"]) < 1e-6


def test_a_run_of_sequences_per_update_resumes_on_its_replicas_and_says_so_elsewhere(runs, tmp_path, capsys):
    """With train.batch_unit=sequences an update is whole micro-batches of every replica, so its packs change with
    the replicas (GLUE packed: 2 packs an update on 2 replicas, 1 on 1 process): a resume on another number of
    replicas is refused in one line naming the replicas and the fix (it blamed the batch size and seed, which the
    user had not changed)."""
    root, ran = runs
    assert ran.ok("glue")["codes"] == [0, 0]
    folder = tmp_path / "glue"
    shutil.copytree(root / "glue", folder)
    shutil.rmtree(folder / "checkpoints" / "step-0000004")
    argv = [*GLUE_DDP, f"output_dir={folder}", "--resume"]
    capsys.readouterr()
    assert entry("glue", argv) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "the checkpoint's run had 2, this one has 1; resume on 2 replica(s)" in error
    assert not (folder / "checkpoints" / "step-0000004").exists()   # (nothing trained)


# --- run safety (from the bad-input issue, where the engine owns it) ------------------------------------------------

def test_an_update_that_makes_the_weights_non_finite_writes_no_checkpoint(dataset, tmp_path, monkeypatch):
    """A finite loss whose update makes a weight NaN stops the run before its checkpoint: the checkpoint it
    names is the last good one, and no checkpoint of NaN weights exists."""
    from bert_ipu.engine import trainer

    real = trainer.build_optimizer
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        opt, sched = real(*args, **kwargs)
        step = opt.step

        def step_then_poison(*a, **k):
            result = step(*a, **k)
            calls["n"] += 1
            if calls["n"] == 6:  # the update of step 6, which is a checkpoint step
                opt.param_groups[0]["params"][0].data.fill_(float("nan"))
            return result
        opt.step = step_then_poison
        return opt, sched
    monkeypatch.setattr(trainer, "build_optimizer", poisoned)
    out = tmp_path / "run"
    with pytest.raises(RunError, match=r"step 6: the weights are not finite .*last good checkpoint is .*step-0000003"):
        main(tiny(dataset, out, "train.max_steps=9"), progress=False)
    assert [p.name for p in checkpoint.checkpoints(out)] == ["step-0000003"]
    assert all(torch.isfinite(v).all() for v in final_weights(out).values())


def test_resume_takes_a_new_learning_rate(dataset, tmp_path):
    """Resumed with a lower train.learning_rate, the run continues the schedule from its step with the new peak
    (the old code brought the saved learning rate back with the scheduler state)."""
    out = tmp_path / "run"
    args = ["train.max_steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=3", "train.log_every=1"]
    main(tiny(dataset, out, *args), progress=False)
    lr = {json.loads(x)["step"]: json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()}
    shutil.rmtree(out / "checkpoints" / "step-0000004")
    main(tiny(dataset, out, *args, "train.learning_rate=0.01"), resume=True, progress=False)
    again = {json.loads(x)["step"]: json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()}
    assert again[2] == lr[2] and again[3] == pytest.approx(lr[3] * 0.01 / 0.02)


def test_a_second_run_on_the_same_folder_is_refused(dataset, tmp_path):
    """While a run holds its folder, another run on it is refused with a clear error and writes nothing."""
    from bert_ipu.engine.trainer import run_lock

    out = tmp_path / "run"
    out.mkdir()
    lock = run_lock(out)
    try:
        with pytest.raises(RunError, match="another run is writing"):
            main(tiny(dataset, out, *FAST), progress=False)
        assert not (out / "config.yaml").exists()
    finally:
        lock.release()
    main(tiny(dataset, out, *FAST), progress=False)  # free again


def test_a_refused_config_writes_nothing(dataset, tmp_path):
    """A run refused after its data checks (an update size that does not split into micro-batches) leaves no
    run folder behind, so the corrected command runs without --overwrite."""
    out = tmp_path / "run"
    with pytest.raises(RunError, match="not a multiple of micro_batch_size"):
        main(tiny(dataset, out, "train.global_batch_size=7"), progress=False)
    assert not out.exists()
    main(tiny(dataset, out, *FAST), progress=False)


def test_resume_survives_a_torn_metrics_line_and_keeps_a_finished_runs_metrics(dataset, tmp_path):
    """A metrics line cut short by a crash is dropped on resume; resuming a run that already finished keeps its
    final metrics (and export) instead of reporting none."""
    out = tmp_path / "run"
    args = ["train.max_steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=3", "train.log_every=1"]
    first = main(tiny(dataset, out, *args), progress=False)
    shutil.rmtree(out / "checkpoints" / "step-0000004")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')
    main(tiny(dataset, out, *args), resume=True, progress=False)
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    again = main(tiny(dataset, out, *args), resume=True, progress=False)  # already at its last step
    assert again["metrics"]["val_mlm_accuracy"] == first["metrics"]["val_mlm_accuracy"]


def test_no_weight_decay_on_biases_and_norms_of_any_name():
    """The engine chooses the no-decay parameters by module type: BERT's LayerNorm and a norm of any name."""
    from bert_ipu.engine.optim import param_groups

    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(4, 4))
    model.add_module("ln_1", torch.nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.01)
    assert {id(p) for p in decay["params"]} == {id(model.proj.weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model.proj.bias), id(model.ln_1.weight), id(model.ln_1.bias)}


def test_no_weight_decay_on_llamas_rms_norms():
    """transformers' LlamaRMSNorm subclasses nn.Module, not torch's RMSNorm: every Llama run decayed its norms'
    gains. The packed Llama's norms are in the no-decay group, its projections and embeddings decayed."""
    from transformers import LlamaConfig

    from bert_ipu.engine.optim import param_groups
    from bert_ipu.models.llama import PackedLlamaForCausalLM

    model = PackedLlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=2, num_attention_heads=2))
    decay, no_decay = param_groups(model, 0.1)
    undecayed = {id(p) for p in no_decay["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in undecayed}
    assert names == {n for n, _ in model.named_parameters() if "norm" in n} and len(names) == 5
    assert any("embed_tokens" in n for n, p in model.named_parameters() if id(p) not in undecayed)


def test_loss_balancing_expects_the_counts_of_the_updates_the_loader_makes(dataset, tmp_path):
    """train.loss_balancing divides the sums by the counts an update is expected to hold. With batch_unit
    sequences the loader shrinks a micro-batch larger than the update's share, and with it the packs of an update:
    counts from the configured micro-batch (16) doubled them, halving every loss and gradient. Now the expected
    sequences are the loader's packs per update times the packing factor, within 20% of a real update's."""
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.engine.trainer import make_loader
    from bert_ipu.tasks.pretraining.task import PretrainingTask

    cfg = tiny(dataset, tmp_path / "x", "train.loss_balancing=true", "train.batch_unit=sequences",
               "train.micro_batch_size=16", "train.global_batch_size=8")
    task = PretrainingTask(cfg)
    rt = Runtime.start("cpu")
    task.prepare(rt)
    loader, packs, levels = make_loader(task, cfg.train, rt, task.train_levels())
    assert levels[0].micro_batch_size < 16
    assert task.expected["nsp"] == pytest.approx(packs * task.packing_factor)
    real = np.mean([float(task.counts(loader.next_update())["sequences"]) for _ in range(8)])
    assert task.expected["nsp"] == pytest.approx(real, rel=0.2)


def test_a_rows_figures_are_its_own_updates(dataset, tmp_path, monkeypatch):
    """metrics.jsonl: a validation step that logs no training row gets a row of its validation alone (it repeated
    the last training row's loss, lr and rates at its step); `lr` is the rate the row's last update ran at (it was
    the next update's: the peak at step 1 of a warm-up, 0 at the end); the rates leave validation and checkpoints
    out (here a validation made 3 s longer: the next row's update took under a second, not over 3)."""
    import time as clock

    from bert_ipu.tasks.pretraining.task import PretrainingTask

    evaluate = PretrainingTask.evaluate
    monkeypatch.setattr(PretrainingTask, "evaluate", lambda *a: (clock.sleep(3), evaluate(*a))[1])
    out = tmp_path / "run"
    main(tiny(dataset, out, "train.max_steps=6", "train.warmup_steps=2", "train.log_every=2",
              "train.validate_every=3", "train.checkpoint_every=null", "train.learning_rate=0.02"), progress=False)
    rows = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    assert sorted(rows) == [2, 3, 4, 6]
    assert set(rows[3]) == {"step", "sequences_seen"} | {k for k in rows[3] if k.startswith("val_")}
    assert "loss" not in rows[3] and "lr" not in rows[3] and "val_mlm_accuracy" in rows[3]
    # update s + 1 runs at warm-up (s + 1) / 2 for s < 2, then linear decay (6 - s) / 4: update 2 at 0.02, 4 at
    # 0.015, 6 at 0.005 (logged before: 0.015, 0.01 and 0)
    assert [rows[s]["lr"] for s in (2, 4, 6)] == pytest.approx([0.02, 0.015, 0.005])
    assert rows[4]["sequences"] / rows[4]["sequences_per_second"] < 3


def test_each_pipeline_stage_and_sequence_rank_draws_its_own_dropout_masks():
    """Seeded alike after the model is built, two pipeline stages drew the same dropout masks in the layers they
    start with, and the sequence-parallel ranks of a row the same pattern on each share. Each (stage, sequence
    rank) now has its own seed; the tensor-parallel ranks of a group and the replicas keep one (replicated regions
    must agree; DDP replicas share theirs), and the first one keeps the run's seed."""
    from bert_ipu.engine.runtime import Runtime
    from bert_ipu.engine.trainer import dropout_seed

    def seeds(world, stages=1, sequence=1, tensor=1):
        grid = {}
        for rank in range(world):
            rt = Runtime.__new__(Runtime)
            rt.rank, rt.world, rt.stages, rt.sequence, rt.tensor = rank, world, stages, sequence, tensor
            grid[rank] = (rt.stage, rt.sp_rank, rt.tp_rank, dropout_seed(5, rt))
        return grid

    pipeline = seeds(8, stages=2, tensor=2)   # 2 replicas x 2 stages x 2 tensor ranks
    assert len({s for *_, s in pipeline.values()}) == 2
    assert {stage: {s for st, _, _, s in pipeline.values() if st == stage} for stage in (0, 1)} == \
        {0: {5}, 1: {5 + 7919}}
    rows = seeds(4, sequence=2, tensor=2)
    assert {sp: {s for _, r, _, s in rows.values() if r == sp} for sp in (0, 1)} == {0: {5}, 1: {5 + 7919}}
    assert set(seeds(2).values()) == {(0, 0, 0, 5)}   # data parallel: one seed
    # packs of several lengths, one level's rows split over the 2 processes: each process its own (one pattern
    # on both shares before)
    from bert_ipu.data.loader import Level

    split = [Level(source=None, pack_length=128, micro_batch_size=2, packing_factor=2.0),
             Level(source=None, pack_length=256, micro_batch_size=1, packing_factor=3.0, sequence_parallel=2)]
    rts = []
    for rank in range(2):
        rt = Runtime.__new__(Runtime)
        rt.rank, rt.world, rt.stages, rt.sequence, rt.tensor = rank, 2, 1, 1, 1
        rts.append(rt)
    assert [dropout_seed(5, rt, split) for rt in rts] == [5, 5 + 7919]
    assert [dropout_seed(5, rt, split[:1]) for rt in rts] == [5, 5]
