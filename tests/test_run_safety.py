"""A run never destroys what it did not write and never continues on other data (issue 30)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import torch

from training_helpers import entry, final_weights

COMMON = ["--config", "test_tiny", "model.max_position_embeddings=64", "data.max_seq_length=64",
          "train.max_steps=4", "train.checkpoint_every=2", "train.validate_every=2"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_folder_this_project_did_not_write(dataset, tiny_run, tmp_path):
    """--overwrite once deleted a user's config.yaml, results.json and hf/ because their names matched a run's.
    Now a folder without the run marker (or a checkpoint of ours) is refused with nothing touched, and a folder
    holding our run is still replaced."""
    user = tmp_path / "mine"
    (user / "hf").mkdir(parents=True)
    (user / "config.yaml").write_text("my: settings\n")
    (user / "results.json").write_text('{"my": "results"}')
    (user / "hf" / "model.safetensors").write_bytes(b"my weights")
    before = snapshot(user)
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={user}", "--overwrite"]) == 2
    assert snapshot(user) == before

    run = tmp_path / "ours"
    shutil.copytree(tiny_run, run)
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={run}", "train.max_steps=2",
                                 "--overwrite"]) == 0
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000002"]


def test_resume_refuses_other_data_and_accepts_the_same_data_moved(dataset, tiny_run, tmp_path):
    """--resume with data.dataset pointing at a dataset of the same layout but other content (here: its vocab.txt
    shuffled after creation, the ids now meaning other words) trained on silently before. The run records a
    fingerprint of its training rows (and vocabulary) and refuses other data in one line, the run unchanged; the
    same dataset copied elsewhere (same content, other path) resumes and ends as the uninterrupted run."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    (run / "results.json").unlink()
    shuffled = tmp_path / "shuffled"
    shutil.copytree(dataset, shuffled)
    words = (shuffled / "vocab.txt").read_text().splitlines()
    order = np.random.default_rng(0).permutation(len(words))
    (shuffled / "vocab.txt").write_text("\n".join(words[i] for i in order) + "\n")
    before = snapshot(run)
    assert entry("pretraining", [*COMMON, f"data.dataset={shuffled}", f"output_dir={run}", "--resume"]) == 2
    assert snapshot(run) == before

    # another optimizer: its moments were read as LAMB's (adamw -> lamb), or a KeyError (lamb -> adamw)
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={run}", "--resume",
                                 "train.optimizer=adamw"]) == 2
    assert snapshot(run) == before
    bare = tmp_path / "bare"  # (the checkpoint says it too, where config.yaml is gone)
    shutil.copytree(run, bare)
    (bare / "config.yaml").unlink()
    assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={bare}", "--resume",
                                 "train.optimizer=adamw"]) == 2

    moved = tmp_path / "moved"
    shutil.copytree(dataset, moved)
    assert entry("pretraining", [*COMMON, f"data.dataset={moved}", f"output_dir={run}", "--resume"]) == 0
    a, b = final_weights(run), final_weights(tiny_run)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# a constant learning rate after warmup (decay_power 0): the updates before a stop are the same whatever
# max_steps, so a run stopped early and resumed to max_steps N compares with a run of N; no checkpoint or
# validation before the stop
UNTIL_STOPPED = ["train.log_every=1", "train.checkpoint_every=100000", "train.validate_every=100000",
                 "train.decay_power=0"]


def stopped_by(sig, dataset, out: Path, steps: int):
    """A fresh `run_pretraining.py` process of `steps` updates, sent `sig` once 3 metrics rows are written (past warmup):
    (exit code, stderr lines). It runs on one thread, as the in-process runs it is compared with bitwise
    (one_thread): one summation order, whatever the machine's load."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from training_helpers import ROOT

    proc = subprocess.Popen([sys.executable, str(ROOT / "run_pretraining.py"), *COMMON, f"data.dataset={dataset}",
                             f"output_dir={out}", f"train.max_steps={steps}", *UNTIL_STOPPED],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            # a job started in the background (a CI shell's `&`) inherits SIGINT ignored, and so
                            # would Python: Ctrl-C's default here, as in a terminal
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def test_sigterm_checkpoints_and_stops_in_one_line_and_resumes_bitwise(dataset, tmp_path):
    """A scheduler's SIGTERM: the run finishes its update, checkpoints it, says where it stopped in one line
    (exit 143 = 128 + SIGTERM), and --resume ends with bitwise the weights of a run never stopped."""
    import signal

    from bert_ipu.engine import checkpoint

    out = tmp_path / "stopped"
    code, lines = stopped_by(signal.SIGTERM, dataset, out, 100000)
    assert code == 143 and len(lines) == 1 and "by SIGTERM" in lines[0] and "--resume" in lines[0], lines
    saved = checkpoint.checkpoints(out)
    assert len(saved) == 1 and str(saved[0]) in lines[0]
    step = int(saved[0].name.split("-")[1])
    assert step >= 1
    end = UNTIL_STOPPED
    steps = f"train.max_steps={step + 2}"
    straight = tmp_path / "straight"
    with one_thread():
        assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={out}", steps, *end,
                                     "--resume"]) == 0
        assert entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={straight}", steps, *end]) == 0
    a, b = final_weights(out), final_weights(straight)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def test_ctrl_c_is_one_line_naming_how_to_continue(dataset, tmp_path):
    """Ctrl-C (SIGINT) printed a 30-line KeyboardInterrupt traceback; now one line, exit 130."""
    import signal

    code, lines = stopped_by(signal.SIGINT, dataset, tmp_path / "run", 100000)
    assert code == 130 and len(lines) == 1 and "by Ctrl-C" in lines[0], lines


def test_an_export_off_a_terminal_writes_no_progress_bars(tmp_path, capsys):
    """transformers' "Writing model shards" bars appeared in logs off a terminal (here stderr is captured: not a
    terminal); the export writes none, and leaves the bars of an interactive session as they were."""
    from transformers import BertConfig
    from transformers.utils import logging as hf_logging

    from bert_ipu.models.bert import PackedBertForPreTraining
    from bert_ipu.models.hf_io import export_model

    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(25)]]) + "\n")
    assert hf_logging.is_progress_bar_enabled()
    export_model(PackedBertForPreTraining(config), tmp_path / "hf", vocab, card={"task": "test"})
    assert "Writing model shards" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_a_killed_launcher_leaves_no_stage_processes(dataset, tmp_path):
    """kill -9 of `python run_pretraining.py` running a 2-stage pipeline (it launches the 2 stage processes
    itself) left both stages running for ever. They now get SIGTERM when their launcher dies, and end."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from training_helpers import ROOT

    out = tmp_path / "orphans"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run_pretraining.py"), *COMMON, f"data.dataset={dataset}",
                             f"output_dir={out}", "parallel.pipeline_stages=2", "train.max_steps=100000",
                             *UNTIL_STOPPED], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})  # a killed
    # launcher cannot remove its temporary folder: leave it in the test's

    def stages() -> list[int]:  # the processes whose command line names this run's folder, but the launcher
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if str(out).encode() in cmdline and int(pid) != proc.pid:
                found.append(int(pid))
        return found

    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    assert len(stages()) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60
    while stages() and time.time() < deadline:
        time.sleep(0.2)
    left = stages()
    for pid in left:  # do not leave them to the next test either
        os.kill(pid, signal.SIGKILL)
    assert not left


def test_a_killed_stage_ends_the_run_in_one_line(dataset, tmp_path):
    """kill -9 of one stage process of a 2-stage pipeline: the other stage's next collective fails, which ended
    the run with a 30-line gloo traceback ("Connection closed by peer"). Now one line: where the run stopped, its
    last checkpoint, how to continue, and which rank a signal killed; no process is left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from training_helpers import ROOT

    out = tmp_path / "stage"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run_pretraining.py"), *COMMON, f"data.dataset={dataset}",
                             f"output_dir={out}", "parallel.pipeline_stages=2", "train.max_steps=100000",
                             *UNTIL_STOPPED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def stage(rank: int) -> int | None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if str(out).encode() in cmdline and f"RANK={rank}".encode() in environ:
                return int(pid)
        return None

    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.kill(stage(1), signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "another process of the run failed or was killed" in lines[0] and "rank 1 was killed by SIGKILL" in lines[0]
    assert stage(0) is None and stage(1) is None


def test_loading_an_init_checkpoint_off_a_terminal_draws_no_progress_bar(dataset, tiny_run, tmp_path, capsys):
    """transformers 5 draws a "Loading weights" bar for from_pretrained: in the log of `make wikipedia`'s phase 2
    (its init checkpoint is phase 1's export) it was bar glyphs and carriage returns. Off a terminal (stderr is
    captured here) the run draws none, and its start-up line names the checkpoint's architecture."""
    from training_helpers import entry as run_entry

    code = run_entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={tmp_path / 'run'}",
                                     f"model.init_checkpoint={tiny_run / 'hf'}", "train.max_steps=1"])
    captured = capsys.readouterr()
    assert code == 0 and "Loading weights" not in captured.err, captured.err[-2000:]
    assert f"model from model.init_checkpoint {tiny_run / 'hf'}: bert" in captured.out


DAMAGE = {
    "state a list": lambda c: (c / "state.json").write_text("[1, 2]"),
    "state empty": lambda c: (c / "state.json").write_text("{}"),
    "step a string": lambda c: _edit(c, step="two"),
    "loader missing": lambda c: _edit(c, loader=None),
    "negative epoch": lambda c: _edit(c, loader={"epoch": -1, "update_in_epoch": 0, "seed": 0,
                                                 "packs_per_update": 8}),
    "scheduler garbage": lambda c: _edit(c, scheduler={"last_epoch": "x"}),
    "logging window garbage": lambda c: _edit(c, window={"sums": {"loss": "x"}, "balance": {}, "start": 0}),
    "logging window a list": lambda c: _edit(c, window=[1]),
    "rng not base64": lambda c: _edit(c, rng=["%%%"]),
    "scheduler step a string": lambda c: _edit_in(c, "scheduler", last_epoch="x"),
    "scheduler rate a string": lambda c: _edit_in(c, "scheduler", _last_lr=["x"]),
    "optimizer learning rate a string": lambda c: _edit_group(c, lr="x"),
    "no optimizer groups": lambda c: _edit(c, optimizer_groups=[]),
    "no optimizer groups but one": lambda c: _edit(c, optimizer_groups=[{"lr": 0.01}]),
    "loader past its epoch": lambda c: _edit_in(c, "loader", update_in_epoch=10 ** 9),
    "loader before its epoch": lambda c: _edit_in(c, "loader", update_in_epoch=-5),
    "sequences seen NaN": lambda c: _edit(c, sequences_seen=float("nan")),
    "weights truncated": lambda c: _truncate(next(c.glob("*.safetensors"))),
    "weights garbage": lambda c: next(c.glob("*.safetensors")).write_bytes(b"\x00garbage" * 100),
}


def _edit(folder: Path, **fields):
    import json

    state = json.loads((folder / "state.json").read_text())
    for key, value in fields.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    (folder / "state.json").write_text(json.dumps(state))


def _edit_in(folder: Path, key: str, **fields):
    import json

    state = json.loads((folder / "state.json").read_text())
    _edit(folder, **{key: state[key] | fields})


def _edit_group(folder: Path, **fields):
    import json

    state = json.loads((folder / "state.json").read_text())
    _edit(folder, optimizer_groups=[state["optimizer_groups"][0] | fields] + state["optimizer_groups"][1:])


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_damaged_checkpoint_is_one_line_naming_it(dataset, tiny_run, tmp_path, capsys):
    """--resume from a checkpoint whose state or weights were damaged raised KeyError/TypeError/binascii
    tracebacks from deep in the loaders: each kind is now one line naming the checkpoint and the way on (the
    older checkpoint), exit 2, and the checkpoints are left as they were."""
    import pytest

    from training_helpers import entry as run_entry

    failed = []
    for name, damage in DAMAGE.items():
        run = tmp_path / name.replace(" ", "_")
        shutil.copytree(tiny_run, run)
        (run / "results.json").unlink()
        newest = run / "checkpoints" / "step-0000004"
        damage(newest)
        before = snapshot(run / "checkpoints")
        code = run_entry("pretraining", [*COMMON, f"data.dataset={dataset}", f"output_dir={run}", "--resume"])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        if not (code == 2 and len(lines) == 1 and str(newest) in lines[0] and "Traceback" not in err
                and snapshot(run / "checkpoints") == before):
            failed.append((name, code, lines[-3:]))
    if failed:
        pytest.fail("\n".join(map(str, failed)))
