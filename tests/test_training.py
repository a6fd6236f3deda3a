"""The training application: configs, a smoke run whose loss falls, exact resume, HF export, a non-finite
loss, and data parallelism equal to one process on the combined batch."""

import json

import pytest
import torch

from bert_ipu.config import CONFIG_DIR, ConfigError
from bert_ipu.tasks import load_config
from bert_ipu.engine import checkpoint
from bert_ipu.engine.runtime import RunError as TrainingError
from bert_ipu.tasks.pretraining import task as pretraining
from bert_ipu.tasks import run as main

from training_helpers import Killed, copy_run, final_weights, job, launch, tiny, torchrun


def test_every_config_loads():
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    assert "pretrain_large_512_packed" in names and "pretrain_base_128" in names and "profile_quick" in names
    assert {"squad_base_384", "squad_base_384_packed", "squad_large_384", "squad_large_384_packed"} <= set(names)
    assert {"glue_base_128", "glue_base_128_packed", "glue_large_128", "glue_large_128_packed"} <= set(names)
    assert {"causal_tiny_llama_packed", "sft_tiny_chat_packed", "sft_tiny_pairs_packed"} <= set(names)
    kinds = {"profile": "profile", "squad": "squad", "glue": "glue", "causal": "causal_lm", "sft": "causal_lm",
             "ner": "token_classification"}
    for name in names:
        cfg = load_config(name)  # its kind: picks the root
        assert cfg.name == name and cfg.kind == kinds.get(name.split("_")[0], "pretraining"), name
    large = load_config("pretrain_large_512_packed")
    assert large.train.micro_batch_size == 3 and large.model.num_hidden_layers == 24


def test_bad_configs_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key\(s\) train.max_step; valid keys: .*max_steps"):
        load_config("test_tiny", ["train.max_step=3"])
    with pytest.raises(ConfigError, match="choose lamb or adamw"):
        load_config("test_tiny", ["train.optimizer=sgd"])
    with pytest.raises(ConfigError, match="no config 'nope'"):
        load_config("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    with pytest.raises(TrainingError, match="does not exist"):
        main(load_config("test_tiny", [f"data.dataset={tmp_path / 'missing'}", f"output_dir={tmp_path / 'o'}"]))


def test_smoke_loss_falls_and_exports(dataset, tmp_path):
    """A few steps: the training loss falls, validation runs, metrics are logged, the export loads in
    transformers with the final weights."""
    out = tmp_path / "run"
    result = main(tiny(dataset, out, "train.max_steps=20", "train.optimizer=adamw", "train.learning_rate=0.01"),
                  progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if "loss" in x]
    assert losses[-1] < losses[0] - 0.5, losses
    assert "val_mlm_accuracy" in lines[-1] and result["step"] == 20
    from transformers import BertForPreTraining

    hf = BertForPreTraining.from_pretrained(out / "hf")
    weights = final_weights(out)
    for name, tensor in weights.items():
        assert torch.equal(hf.state_dict()[name], tensor), name
    assert list((out / "tensorboard").iterdir())
    # a new run initialised from the export starts from exactly those weights
    again = tmp_path / "again"
    main(tiny(dataset, again, f"model.init_checkpoint={out / 'hf'}", "train.max_steps=1", "train.learning_rate=0"),
         progress=False)
    for name, tensor in final_weights(again).items():
        assert torch.equal(tensor, weights[name]), name


def test_a_checkpoint_or_validation_between_log_rows_leaves_the_logged_loss_as_it_is(dataset, tmp_path):
    """The loss sums read from the device for a checkpoint or a validation between two log rows stay in that
    row's window: the update after the read kept the window's counts only, so the row divided what was left of
    the sums by all of its counts (a helper's run: loss 5.49 instead of 10.97 with a checkpoint at step 2 of a
    4-step row, 2.74 with a validation at step 3)."""
    rows = {}
    for name, every in (("plain", (4, 4)), ("checkpoint", (2, 4)), ("validation", (4, 3))):
        out = tmp_path / name
        main(tiny(dataset, out, "train.max_steps=4", "train.log_every=4", f"train.checkpoint_every={every[0]}",
                  f"train.validate_every={every[1]}"), progress=False)
        rows[name] = [x for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in x]
    assert [r["step"] for r in rows["plain"]] == [4]
    for name in ("checkpoint", "validation"):
        assert [r["step"] for r in rows[name]] == [4]
        for key in ("loss", "mlm_accuracy", "nsp_accuracy"):
            assert rows[name][0][key] == pytest.approx(rows["plain"][0][key], rel=1e-6), (name, key)


def test_bf16_autocast_trains_close_to_fp32(dataset, tmp_path):
    """train.precision=bf16: the forward runs under bf16 autocast, the weights stay float32, and the losses
    follow the fp32 run's to within bf16 rounding (2% of the loss over 4 updates); pipeline stages refuse it
    with a clear error."""
    losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        main(tiny(dataset, out, f"train.precision={precision}", "train.max_steps=4", "train.validate_every=4"),
             progress=False)
        losses[precision] = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert all(v.dtype == torch.float32 for v in final_weights(out).values())
    assert len(losses["fp32"]) == len(losses["bf16"]) >= 4
    assert losses["fp32"] != losses["bf16"]  # autocast really changed the arithmetic
    for a, b in zip(losses["fp32"], losses["bf16"]):
        assert abs(a - b) <= 0.02 * a
    with pytest.raises(ConfigError, match="bf16 is not supported with pipeline"):
        tiny(dataset, tmp_path / "p", "train.precision=bf16", "parallel.pipeline_stages=2")


def test_kill_and_resume_is_bitwise_identical(dataset, tmp_path, monkeypatch):
    """A run stopped after its step-3 checkpoint and resumed ends with exactly the weights of a run that was
    never stopped (CPU, one process; dropout on, so the RNG state must be restored too)."""
    extra = ["train.max_steps=6", "model.hidden_dropout_prob=0.1", "model.attention_probs_dropout_prob=0.1"]
    straight = tmp_path / "straight"
    main(tiny(dataset, straight, *extra), progress=False)
    stopped = tmp_path / "stopped"
    real = checkpoint.save

    def kill_after_first(*args, **kwargs):
        path = real(*args, **kwargs)
        raise Killed  # as if the process died right after the checkpoint
    monkeypatch.setattr(checkpoint, "save", kill_after_first)
    with pytest.raises(Killed):
        main(tiny(dataset, stopped, *extra), progress=False)
    monkeypatch.undo()
    result = main(tiny(dataset, stopped, *extra), resume=True, progress=False)
    assert result["step"] == 6
    a, b = final_weights(straight), final_weights(stopped)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    with pytest.raises(TrainingError, match="no checkpoint"):
        main(tiny(dataset, tmp_path / "fresh", *extra), resume=True, progress=False)


def test_loss_balancing_divides_by_expected_counts(dataset, tmp_path, monkeypatch):
    """With loss_balancing the normalizers are the expected counts of an update (dataset averages), the same
    for every update; without it they are the update's real counts."""
    seen = []
    real = pretraining.PretrainingTask.loss

    def spy(self, out, targets, normalizers):
        seen.append((float(normalizers["mlm"]), float(normalizers["nsp"])))  # a training step's are tensors
        return real(self, out, targets, normalizers)
    monkeypatch.setattr(pretraining.PretrainingTask, "loss", spy)
    main(tiny(dataset, tmp_path / "balanced", "train.loss_balancing=true", "train.max_steps=3"), progress=False)
    balanced = [s for s in seen if s[0] is not None]
    # one value (a training step's float32 divisor rounds the evaluation's float64 one)
    assert len({(round(m, 3), round(n, 3)) for m, n in balanced}) == 1 and not float(balanced[0][0]).is_integer()
    seen.clear()
    main(tiny(dataset, tmp_path / "real", "train.max_steps=3"), progress=False)
    real_counts = [s for s in seen if s[0] is not None]
    assert all(float(m).is_integer() and float(n).is_integer() for m, n in real_counts)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(dataset, tmp_path, monkeypatch):
    out = tmp_path / "nan"
    real = pretraining.PretrainingTask.loss
    calls = {"n": 0}

    def poisoned(self, output, targets, normalizers):
        calls["n"] += 1
        loss, sums = real(self, output, targets, normalizers)
        if calls["n"] == 9:  # first micro-batch of the 5th update (2 micro-batches an update)
            sums["mlm_loss_sum"] = sums["mlm_loss_sum"] * float("nan")
        return loss, sums
    monkeypatch.setattr(pretraining.PretrainingTask, "loss", poisoned)
    with pytest.raises(TrainingError, match=r"step 5: the loss is nan; stopping. The last good checkpoint is .*step-0000003"):
        main(tiny(dataset, out, "train.validate_every=100"), progress=False)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000003"]


PIPELINE = ["model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=4",
            "train.checkpoint_every=2", "train.validate_every=2"]


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory):
    """Every run of this module at 2 processes, in one launch (tests/engine_worker.py): 2 DDP ranks, then 2
    pipeline stages under each schedule and a copy of the 1F1B run resumed from its step-2 checkpoint."""
    root = tmp_path_factory.mktemp("two_processes")
    common = ["--config", "test_tiny", f"data.dataset={dataset}", *PIPELINE]
    return root, launch(2, [
        job("ddp", "--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={root / 'ddp'}",
            "model.max_position_embeddings=64", "data.max_seq_length=64", "train.micro_batch_size=4",
            "train.global_batch_size=8", "train.max_steps=4"),
        job("ddp_val", *common, f"output_dir={root / 'ddp_val'}"),  # tiny_run's config on 2 replicas
        *[job(schedule, *common, f"output_dir={root / schedule}", "parallel.pipeline_stages=2",
              f"parallel.schedule={schedule}") for schedule in ("1f1b", "gpipe")],
        copy_run(root / "1f1b", root / "resumed", "checkpoints/step-0000004"),
        job("resumed", *common, f"output_dir={root / 'resumed'}", "parallel.pipeline_stages=2", "--resume"),
    ], root)


def test_data_parallel_equals_one_process(dataset, runs, tmp_path):
    """2 DDP ranks (gloo, 4 packs each) end with the weights of 1 process on the combined 8 packs; the
    only difference is float32 summation order across ranks (tolerance 1e-5 relative)."""
    one = tmp_path / "one"
    main(tiny(dataset, one, "train.micro_batch_size=8", "train.global_batch_size=8", "train.max_steps=4"), progress=False)
    root, ran = runs
    two = root / "ddp"
    assert "8 packs/update = 4 x 2 replica(s) x 1 accumulation" in ran.ok("ddp")["stdout"]
    a, b = final_weights(one), final_weights(two)
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 1e-5, name


def val_rows(run) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k.startswith("val_")}
            for x in (run / "metrics.jsonl").read_text().splitlines() if "val_loss" in x]


@pytest.mark.parametrize("other", ["ddp_val", "1f1b"])
def test_validation_is_the_same_on_any_topology(tiny_run, runs, other):
    """The same training on 1 process, 2 data-parallel replicas and 2 pipeline stages validates the same packs
    (the first validation_batches x micro_batch_size = 8, each once: evaluation_rows): the same sequences and
    tokens counted exactly, accuracies exactly (a count of argmax hits: the weights differ by float32 summation
    order only, about 1e-6 here, far from flipping a prediction of this tiny model), losses to 1e-5 relative.
    Before, 2 replicas each evaluated validation_batches micro-batches of their own: twice the sequences."""
    root, ran = runs
    ran.ok(other)
    one, two = val_rows(tiny_run), val_rows(root / other)
    assert len(one) == len(two) == 2
    for x, y in zip(one, two):
        assert x["val_sequences"] == y["val_sequences"] == 8 and x["val_tokens"] == y["val_tokens"]
        assert x["val_mlm_accuracy"] == y["val_mlm_accuracy"] and x["val_nsp_accuracy"] == y["val_nsp_accuracy"]
        for key in ("val_loss", "val_mlm_loss", "val_nsp_loss"):
            assert abs(x[key] - y[key]) <= 1e-5 * abs(x[key]), (key, x[key], y[key])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_pipeline_equals_one_process(tiny_run, runs, schedule):
    """BERT split into 2 pipeline stages in 2 processes (gloo; the tied MLM decoder on the last stage, its
    gradient summed with the embeddings' on the first) gives the losses (1e-5 relative) and updated weights of
    one process; and a run resumed from its step-2 checkpoint ends with bitwise the weights of the
    uninterrupted run.

    Weights after 4 LAMB steps agree to 1e-4 relative, not 1e-5: only float32 summation order differs, but
    LAMB, like Adam, divides each gradient by its running RMS, so parameters whose true gradient is almost
    zero (the attention query/key biases, to which softmax is nearly invariant) take steps of about lr whose
    size is set by rounding noise. With SGD the same comparison agrees to 1e-7 (checked by hand)."""
    one, (root, ran) = tiny_run, runs  # tiny_run: the same 4 updates on one process
    two = root / schedule
    stdout = ran.ok(schedule)["stdout"]
    assert f"2 pipeline stages ({schedule})" in stdout
    a, b = final_weights(one), final_weights(two)
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 1e-4, name
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(la, lb):
        for key in ("loss", "val_loss", "val_mlm_accuracy"):
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-5 * abs(x[key]) + 1e-7, (key, x[key], y[key])
    if schedule == "1f1b":  # resume: the launch dropped the last checkpoint of a copy and continued from step 2
        ran.ok("resumed")
        c = final_weights(root / "resumed")
        for name in b:
            assert torch.equal(b[name], c[name]), name


def test_pipeline_times_data_parallel_equals_one_process(dataset, tmp_path):
    """2 pipeline stages x 2 data-parallel replicas (4 processes: activations within a replica, gradients
    of each stage summed over replicas) give the losses (1e-5) and weights of one process on the same 16
    packs per update. Weights to 3e-4 relative (measured 1.3e-4, on the pooler bias): one more summation
    order than the pipeline alone, amplified by LAMB as explained above."""
    common = [f"data.dataset={dataset}", "model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=3",
              "train.checkpoint_every=3", "train.validate_every=3", "train.micro_batch_size=4",
              "train.global_batch_size=16"]
    one = tmp_path / "one"
    main(load_config("test_tiny", [*common, f"output_dir={one}"]), progress=False)
    grid = tmp_path / "grid"
    stdout = torchrun(4, "--config", "test_tiny", *common, f"output_dir={grid}", "parallel.pipeline_stages=2")
    assert "16 packs/update = 4 x 2 replica(s) x 2 accumulation" in stdout and "2 pipeline stages" in stdout
    a, b = final_weights(one), final_weights(grid)
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-3)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 3e-4, name
    la = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (grid / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):  # (validation is split over replicas, so its packs differ: not compared)
        for key in ("loss", "sequences", "mlm_accuracy"):
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-5 * abs(x[key]) + 1e-7, (key, x[key], y[key])
