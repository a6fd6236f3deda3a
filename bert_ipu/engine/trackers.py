"""Where a run's metrics go besides metrics.jsonl: `train.report_to`, like Hugging Face's
`TrainingArguments.report_to`, names the trackers (tensorboard, wandb, mlflow). Only rank 0 reports.

    train.report_to=[tensorboard,mlflow]      # default [tensorboard]; [] or [none]: metrics.jsonl only

Each tracker is imported only when a run asks for it, and one that is not installed is refused before the run
starts (`check_installed`, one line naming the `pip install`). A tracker gets the run's resolved config (what
OUTPUT/config.yaml holds) as its params/config when it starts, every metrics row's numbers at the row's step,
and is closed (finished, failed or killed) when the run ends. The tools' own environment variables decide where
they write: WANDB_MODE, WANDB_PROJECT, WANDB_DIR, WANDB_NAME, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME or
MLFLOW_EXPERIMENT_ID, MLFLOW_RUN_ID. Where they are unset, W&B writes under OUTPUT/wandb and MLflow into the
SQLite store OUTPUT/mlflow.db (MLflow's own default backend, which it would put in the working directory).

A run records its trackers' runs in OUTPUT/trackers.json, so that `--resume` continues them: the same W&B run
id (resume="allow") and the same MLflow run. Rows past the checkpoint that the interrupted attempt had already
sent are not sent again (W&B refuses a step it has passed, MLflow would keep both values): those steps keep the
values the tracker got first, while metrics.jsonl and TensorBoard (purge_step) hold the resumed run's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from ..files import write_json
from .runtime import RunError

RECORD = "trackers.json"
"""OUTPUT/trackers.json: the trackers' run ids, for --resume"""
INSTALL = {"tensorboard": ("tensorboard", ("tensorboard",)), "wandb": ("wandb", ("wandb",)),
           "mlflow": ("mlflow-skinny", ("mlflow",))}
"""name -> (what to pip install, the modules it needs); the versions the tests run: requirements-benchmarks.txt"""
MLFLOW_SQL = ("sqlalchemy", "alembic")
"""what MLflow's SQLite store (the default here, without MLFLOW_TRACKING_URI) needs besides mlflow-skinny"""
STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


def _missing(modules) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]  # found, not imported


def check_installed(names) -> None:
    """Each tracker of `names` can be imported here (found, not imported: the check costs nothing), else a
    RunError naming what to install. Called before anything is written or launched."""
    for name in names:
        package, modules = INSTALL[name]
        if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
            package, modules = f"{package} {' '.join(MLFLOW_SQL)}", (*modules, *MLFLOW_SQL)  # the SQLite store
        if _missing(modules):
            raise RunError(f"train.report_to: {name} is not installed here (no module {_missing(modules)[0]}); "
                           f"pip install {package} (the versions this project tests are in "
                           f"requirements-benchmarks.txt), or leave {name} out of train.report_to")


def _flat(config: dict, prefix: str = ""):
    """(dotted key, value) pairs of a nested config: train.learning_rate, data_layout.pack_length, ..."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


class TensorBoard:
    """OUTPUT/tensorboard; after a resume the events past the checkpoint are purged (TensorBoard's purge_step),
    so the resumed run's values replace them."""

    def __init__(self, out: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self, status: str) -> None:
        self.writer.close()


class WandB:
    """A W&B run (wandb.init): the config as its config, each row with wandb.log(step=). Its id goes into
    OUTPUT/trackers.json; a resume passes it back with resume="allow". WANDB_MODE=offline writes the run under
    OUTPUT/wandb (WANDB_DIR elsewhere) for `wandb sync`; each attempt of a resumed run is a folder of its own
    there, with the same id."""

    def __init__(self, out: Path, config: dict, name: str, previous: dict | None):
        import wandb

        kwargs = {"config": config}
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(out)
        if not os.environ.get("WANDB_NAME"):
            kwargs["name"] = name
        if previous:
            kwargs |= {"id": previous["id"], "resume": "allow"}
        self.run = wandb.init(**kwargs)
        self.record = {"id": self.run.id}

    def log(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)


class MLflow:
    """An MLflow run through MlflowClient (no global active run, no autologging): the config as params (dotted
    keys), each row with log_batch at its step, set_terminated at the end. The store is MLFLOW_TRACKING_URI, or
    the SQLite file OUTPUT/mlflow.db; the experiment MLFLOW_EXPERIMENT_NAME (created if new), else
    MLFLOW_EXPERIMENT_ID, else MLflow's default one. A resume continues the recorded run when the store is the
    same one (MLFLOW_RUN_ID, else a new run, otherwise). Params cannot change in MLflow: a resumed run logs the
    ones that are new, and a changed value (say train.learning_rate) as the tag `resumed_at_step_N/KEY`."""

    def __init__(self, out: Path, config: dict, name: str, previous: dict | None, start_step: int):
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out / 'mlflow.db').resolve()}"
        self.client = client = MlflowClient(tracking_uri=uri)
        run_id = previous["run_id"] if previous and previous.get("tracking_uri") == uri else None
        run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
        if run_id:
            run = client.get_run(run_id)
            client.update_run(run_id, status="RUNNING")
        else:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME")
            if experiment:
                found = client.get_experiment_by_name(experiment)
                experiment_id = found.experiment_id if found else client.create_experiment(experiment)
            else:
                experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID") or DEFAULT_EXPERIMENT_ID
            run = client.create_run(experiment_id, run_name=name)
        self.run_id = run.info.run_id
        logged = run.data.params
        params, tags = [], []
        for key, value in _flat(config):
            value = (value if isinstance(value, str) else json.dumps(value, default=str))[:MAX_PARAM_VAL_LENGTH]
            if key not in logged:
                params.append(Param(key, value))
            elif logged[key] != value:
                tags.append(RunTag(f"resumed_at_step_{start_step}/{key}", value))
        for i in range(0, max(len(params), len(tags)), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH],
                             tags=tags[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        self.record = {"run_id": self.run_id, "tracking_uri": uri, "experiment_id": run.info.experiment_id}

    def log(self, step: int, scalars: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in scalars.items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, STATUS[status])


class Trackers:
    """The trackers of one run (rank 0's): started together, each row to each, closed together. `sent_before`:
    on a resume, the last step that metrics.jsonl held before it dropped the rows past the checkpoint, which the
    interrupted attempt had sent too (OUTPUT/trackers.json's `reported` covers attempts before that)."""

    def __init__(self, names, out: Path, config: dict | None, name: str, start_step: int, sent_before: int):
        self.out, self.started = Path(out), {}
        record_path = self.out / RECORD
        try:
            record = json.loads(record_path.read_text()) if start_step and record_path.is_file() else {}
        except (OSError, ValueError):
            record = {}
        record = record if isinstance(record, dict) else {}
        self.record, self.skip = record, {}
        config = config or {}
        try:
            for tracker in names:
                previous = record.get(tracker) if start_step else None
                previous = previous if isinstance(previous, dict) else None
                if tracker == "tensorboard":
                    self.started[tracker] = TensorBoard(self.out, start_step)
                    continue
                self.started[tracker] = (WandB(self.out, config, name, previous) if tracker == "wandb"
                                         else MLflow(self.out, config, name, previous, start_step))
                entry = self.started[tracker].record
                continued = previous is not None and all(previous.get(k) == v for k, v in entry.items())
                # a continued tracker run already holds the interrupted attempt's rows: do not send them again
                self.skip[tracker] = max(previous.get("reported", 0), sent_before) if continued else 0
                record[tracker] = entry | {"reported": self.skip[tracker]}
        except Exception as e:  # not logged in, a server that does not answer, a store it cannot open
            self.close("failed")
            detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise RunError(f"train.report_to: {tracker} could not start ({type(e).__name__}: {detail}); nothing was "
                           "trained: fix that (see docs/training.md, Experiment trackers) and run again (--overwrite, "
                           f"or --resume when resuming), or leave {tracker} out of train.report_to") from None
        self._save()

    def _save(self) -> None:
        if set(self.started) - {"tensorboard"}:
            write_json(self.out / RECORD, self.record)

    def log(self, step: int, scalars: dict) -> None:
        """`scalars` at `step` to every tracker; one whose call fails is reported once (one line on stderr) and
        left out from then on: metrics.jsonl, already written, is the run's record, and training goes on."""
        for name, tracker in list(self.started.items()):
            if step <= self.skip.get(name, 0):
                continue
            try:
                tracker.log(step, scalars)
            except Exception as e:
                print(f"[run] train.report_to: {name} failed at step {step} ({type(e).__name__}: "
                      f"{str(e).strip()[:200]}); no more rows go to it (metrics.jsonl has them all)", file=sys.stderr,
                      flush=True)
                self.started.pop(name)
                continue
            if name in self.record:
                self.record[name]["reported"] = max(self.record[name].get("reported", 0), step)

    def close(self, status: str = "finished") -> None:
        """Close every tracker (`status`: finished, failed or killed) and record what each was sent."""
        for tracker in self.started.values():
            try:
                tracker.close(status)
            except Exception:  # a tracker that cannot close must not hide the run's own error or result
                pass
        try:
            self._save()
        except OSError:
            pass
        self.started = {}
