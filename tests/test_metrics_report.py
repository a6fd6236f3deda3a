"""train.report_to (issue 31): a run's metrics also go to the trackers people already use (TensorBoard, W&B,
MLflow), read back here from what each tracker stored: W&B's offline run file, MLflow's SQLite store in the
run folder. The trackers are optional packages (requirements-benchmarks.txt): their tests skip without them,
while the refusals and the config checks run everywhere."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bert_ipu.config import ConfigError
from bert_ipu.engine.runtime import RunError
from bert_ipu.engine.trackers import check_installed
from bert_ipu.tasks import run as main

from training_helpers import ROOT, entry, tiny

SIX = ["train.max_steps=6", "train.log_every=1", "train.validate_every=3", "train.checkpoint_every=3"]
TRACKER_ENV = ("WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_API_KEY",
               "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")


@pytest.fixture
def offline(monkeypatch):
    """The trackers' environment of a machine that never set them, W&B offline (nothing leaves the machine)."""
    for name in TRACKER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def rows(out: Path) -> dict[int, dict]:
    """metrics.jsonl as {step: its numbers}."""
    table = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        table[step] = {k: v for k, v in row.items() if isinstance(v, (int, float))}
    return table


def mlflow_history(uri: str, run_id: str) -> dict[int, dict]:
    """{step: {key: value}} of the MLflow run in the store `uri`; a key logged twice at a step fails."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    table = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            assert key not in table.setdefault(m.step, {}), f"{key} logged twice at step {m.step}"
            table[m.step][key] = m.value
    return table


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (.wandb): a 7-byte header (':W&B', magic, version), then LevelDB-log
    chunks in 32 KiB blocks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last), each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, payload, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left for a chunk header: the block is padded
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding up to the end of the block
            pos += block - pos % block
            continue
        payload += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
    return records


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)  # W&B writes a history key as key or as nested_key


def wandb_run(folder: Path) -> tuple[str, dict, dict, int | None]:
    """(run id, {step: {key: value}}, config, exit code) of one offline W&B run folder."""
    records = wandb_records(next(folder.glob("run-*.wandb")))
    history, config, exit_code, run_id = {}, {}, None, None
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {_key(i): json.loads(i.value_json) for i in r.history.item}
            history[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            run_id = r.run.run_id
            config |= {_key(i): json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "config":
            config |= {_key(i): json.loads(i.value_json) for i in r.config.update}
        elif kind == "exit":
            exit_code = r.exit.exit_code
    return run_id, history, config, exit_code


def test_metrics_reach_mlflow_and_wandb_as_metrics_jsonl_holds_them(dataset, tmp_path, offline):
    """Every number of every metrics.jsonl row is in MLflow and W&B at the row's step with the same value (both
    store float64: equal, not close), the resolved config is the MLflow run's params and the W&B run's config,
    both runs are closed as finished, and TensorBoard (asked for too) still writes its events."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("wandb")
    from mlflow import MlflowClient

    out = tmp_path / "run"
    cfg = tiny(dataset, out, *SIX, "train.report_to=[tensorboard,mlflow,wandb]")
    main(cfg, progress=False)
    jsonl = rows(out)
    assert sorted(jsonl) == [1, 2, 3, 4, 5, 6] and "loss" in jsonl[1] and "mlm_accuracy" in jsonl[3]
    record = json.loads((out / "trackers.json").read_text())

    default_store = f"sqlite:///{(out / 'mlflow.db').resolve()}"  # MLFLOW_TRACKING_URI unset: in the run folder
    assert record["mlflow"]["tracking_uri"] == default_store
    assert mlflow_history(default_store, record["mlflow"]["run_id"]) == jsonl
    client = MlflowClient(tracking_uri=default_store)
    run = client.get_run(record["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == cfg.name
    assert run.data.params["train.learning_rate"] == json.dumps(cfg.train.learning_rate)
    assert run.data.params["train.report_to"] == json.dumps(["tensorboard", "mlflow", "wandb"])
    assert run.data.params["data_layout.data_sha256"] == yaml_config(out)["data_layout"]["data_sha256"]

    [folder] = (out / "wandb").glob("offline-run-*")
    run_id, history, config, exit_code = wandb_run(folder)
    assert run_id == record["wandb"]["id"] and exit_code == 0
    assert history == jsonl
    assert config["train"]["learning_rate"] == cfg.train.learning_rate and config["name"] == cfg.name
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def yaml_config(out: Path) -> dict:
    import yaml

    return yaml.safe_load((out / "config.yaml").read_text())


def test_resume_continues_the_same_tracker_runs_without_a_step_twice(dataset, tmp_path, offline, monkeypatch):
    """A run killed after step 5 (checkpoint at 3) and resumed: MLflow continues the same run (in the store and
    experiment that MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME name) and W&B the same id (a second offline
    folder), no step reaches a tracker twice, steps 4-5 keep the values the trackers got first
    (the resumed attempt does not send them again), step 6 comes from the resumed attempt, and metrics.jsonl
    holds every step once. trackers.json is set back to what a SIGKILL leaves (the steps sent, recorded at the
    close, unknown): metrics.jsonl's last step before the resume tells them."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("wandb")
    from mlflow import MlflowClient

    from bert_ipu.engine import metrics

    class Killed(BaseException):
        pass

    out = tmp_path / "run"
    store = f"sqlite:///{tmp_path / 'tracking.db'}"  # a store of the user's, and an experiment of theirs
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "packed-bert-tests")
    argv = ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}", "model.max_position_embeddings=64",
            "data.max_seq_length=64", *SIX, "train.report_to=[mlflow,wandb]"]
    real, advanced = metrics.MetricsLogger.advance, []

    def advance(self):  # called once an update, after its row is logged and its checkpoint written
        advanced.append(1)
        if len(advanced) == 5:
            raise Killed
        real(self)
    monkeypatch.setattr(metrics.MetricsLogger, "advance", advance)
    with pytest.raises(Killed):
        entry("pretraining", argv)
    monkeypatch.setattr(metrics.MetricsLogger, "advance", real)
    first = rows(out)
    first_record = json.loads((out / "trackers.json").read_text())
    assert sorted(first) == [1, 2, 3, 4, 5]
    assert first_record["mlflow"]["reported"] == first_record["wandb"]["reported"] == 5
    for entry_ in first_record.values():
        entry_["reported"] = 0  # as written when the trackers started: a SIGKILL records nothing more
    (out / "trackers.json").write_text(json.dumps(first_record))

    assert entry("pretraining", [*argv, "--resume"]) == 0
    record = json.loads((out / "trackers.json").read_text())
    assert record["mlflow"]["run_id"] == first_record["mlflow"]["run_id"]
    assert record["wandb"]["id"] == first_record["wandb"]["id"]
    assert record["mlflow"]["reported"] == record["wandb"]["reported"] == 6
    final = rows(out)
    assert sorted(final) == [1, 2, 3, 4, 5, 6]
    sent = {**{s: first[s] for s in (1, 2, 3, 4, 5)}, 6: final[6]}  # what reached the trackers, each once

    assert mlflow_history(store, record["mlflow"]["run_id"]) == sent
    run = MlflowClient(tracking_uri=store).get_run(record["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and record["mlflow"]["tracking_uri"] == store
    assert MlflowClient(tracking_uri=store).get_experiment(run.info.experiment_id).name == "packed-bert-tests"
    assert not (out / "mlflow.db").exists()
    attempts = sorted((out / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2
    (id1, history1, _, exit1), (id2, history2, _, exit2) = (wandb_run(f) for f in attempts)
    assert id1 == id2 == record["wandb"]["id"] and exit1 != 0 and exit2 == 0
    assert history1 == {s: first[s] for s in (1, 2, 3, 4, 5)} and history2 == {6: final[6]}
    # the resume is bitwise: the steps the trackers kept from the first attempt trained to the same loss
    assert [final[s]["loss"] for s in (4, 5)] == [first[s]["loss"] for s in (4, 5)]


@pytest.mark.parametrize("tracker, module, install", [("wandb", "wandb", "pip install wandb"),
                                                      ("mlflow", "mlflow", "pip install mlflow-skinny"),
                                                      ("mlflow", "sqlalchemy", "pip install mlflow-skinny sqlalchemy")])
def test_a_tracker_that_is_not_installed_is_refused_before_the_run(dataset, tmp_path, monkeypatch, capsys,
                                                                   tracker, module, install):
    """Asking for a tracker whose package is missing (simulated: its module None in sys.modules, which imports
    refuse) is one error line naming the pip install, exit code 2, and nothing is written (no run folder).
    MLflow's default store (SQLite in the run folder) needs SQLAlchemy too; a tracking server does not. The
    SQLAlchemy case needs MLflow itself installed (`make test` installs it): without it, MLflow is what is
    missing, which the case before covers."""
    if module == "sqlalchemy":
        pytest.importorskip("mlflow")
    for name in TRACKER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "run"
    code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                 f"train.report_to=[tensorboard,{tracker}]"])
    errors = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(errors) == 1 and install in errors[0] and f"no module {module}" in errors[0], errors
    assert not out.exists()
    with pytest.raises(RunError, match=install):  # the engine checks too (a run started from Python)
        main(tiny(dataset, out, f"train.report_to=[{tracker}]"), progress=False)
    assert not out.exists()
    if module == "sqlalchemy":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
        check_installed(["mlflow"])  # a server keeps the store: mlflow-skinny alone is enough


@pytest.mark.parametrize("value, names", [("[]", []), ("[none]", []), ("none", []), ("wandb", ["wandb"]),
                                          ("[MLflow, tensorboard, mlflow]", ["mlflow", "tensorboard"])])
def test_report_to_values(value, names):
    """train.report_to takes a list (or one name); none or [] is no tracker; names are case-blind, kept once."""
    from bert_ipu.tasks import load_config

    assert load_config("test_tiny", [f"train.report_to={value}"]).train.report_to == names
    assert load_config("test_tiny").train.report_to == ["tensorboard"]  # the default: today's behaviour


@pytest.mark.parametrize("value, says", [("[wandbb]", "unknown tracker 'wandbb'; choose from tensorboard, wandb, "
                                                      "mlflow (or none)"),
                                         ("[none, wandb]", "give it alone"),
                                         ("[1]", "give a list of tracker names")])
def test_a_bad_tracker_name_is_one_line(dataset, tmp_path, capsys, value, says):
    """An unknown tracker, none beside another, or a non-name is a config error: one line, exit code 2."""
    out = tmp_path / "run"
    code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                 f"train.report_to={value}"])
    errors = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(errors) == 1 and says in errors[0], errors
    assert not out.exists()
    with pytest.raises(ConfigError, match="train.report_to"):
        tiny(dataset, out, f"train.report_to={value}")


def test_no_tracker_writes_metrics_jsonl_only_and_imports_none(dataset, tmp_path):
    """train.report_to=[] (in a fresh process): metrics.jsonl and nothing else reports (no tensorboard folder,
    no trackers.json), and neither wandb nor mlflow (nor tensorboard's writer) was imported."""
    out = tmp_path / "run"
    code = ("import sys; from bert_ipu.cli import main; code = main(sys.argv[1:], 'pretraining'); "
            "print('LOADED', sorted(m for m in ('wandb', 'mlflow', 'torch.utils.tensorboard') if m in sys.modules)); "
            "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, "--config", "test_tiny",
                           f"data.dataset={dataset}", f"output_dir={out}", "model.max_position_embeddings=64",
                           "data.max_seq_length=64", "train.max_steps=2", "train.validate_every=2",
                           "train.report_to=[]"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout
    assert sorted(rows(out)) == [1, 2]
    assert not (out / "tensorboard").exists() and not (out / "trackers.json").exists()


def test_overwrite_removes_the_trackers_files(dataset, tmp_path, offline):
    """--overwrite replaces a run with its trackers' files in the run folder (trackers.json, wandb/): the new run
    starts a new tracker run."""
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    cfg = tiny(dataset, out, "train.max_steps=1", "train.validate_every=1", "train.report_to=[wandb]")
    main(cfg, progress=False)
    before = json.loads((out / "trackers.json").read_text())["wandb"]["id"]
    main(cfg, progress=False, overwrite=True)
    after = json.loads((out / "trackers.json").read_text())["wandb"]["id"]
    assert before != after
    [folder] = (out / "wandb").glob("offline-run-*")
    assert wandb_run(folder)[0] == after


def test_a_tracker_that_cannot_start_stops_the_run_before_step_one(dataset, tmp_path, monkeypatch, capsys):
    """A tracker that fails to start (here TensorBoard's writer; W&B without a login, an MLflow server that does
    not answer) is one error line naming it and the way on, exit code 2, before any update: no checkpoint."""
    from bert_ipu.engine import trackers

    def refuse(self, out, start_step):
        raise PermissionError(13, "Permission denied", str(out / "tensorboard"))
    monkeypatch.setattr(trackers.TensorBoard, "__init__", refuse)
    out = tmp_path / "run"
    code = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                 "model.max_position_embeddings=64", "data.max_seq_length=64"])
    errors = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(errors) == 1, errors
    assert "tensorboard could not start (PermissionError" in errors[0] and "nothing was trained" in errors[0]
    assert not (out / "checkpoints").exists()


def test_a_tracker_that_fails_later_is_left_out_and_training_goes_on(dataset, tmp_path, monkeypatch, capsys):
    """A tracker call that fails mid-run is one warning line; that tracker gets no more rows, while training and
    metrics.jsonl go on to the end."""
    from bert_ipu.engine import trackers

    real, calls = trackers.TensorBoard.log, []

    def flaky(self, step, scalars):
        calls.append(step)
        if step == 2:
            raise ConnectionError("the server went away")
        real(self, step, scalars)
    monkeypatch.setattr(trackers.TensorBoard, "log", flaky)
    out = tmp_path / "run"
    main(tiny(dataset, out, "train.max_steps=4", "train.validate_every=4"), progress=False)
    warnings = [x for x in capsys.readouterr().err.splitlines() if "report_to" in x]
    assert len(warnings) == 1 and "tensorboard failed at step 2 (ConnectionError" in warnings[0], warnings
    assert calls == [1, 2] and sorted(rows(out)) == [1, 2, 3, 4]
