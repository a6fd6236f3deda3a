"""Faults: a full disk, a kill at any point, a second writer. Whatever happens, the user gets one clear line (or a
killed process), and what is on disk is the previous dataset / checkpoint / export, whole and loadable, or the
new one, whole: never something half-written that later loads. A rerun gives the same bytes as an
uninterrupted run.

A full disk is faked (no tmpfs needed, no root): the write that fails writes half its bytes first, then raises
OSError(ENOSPC), as a real full disk does. A kill is real: a child process that calls os._exit at the k-th
filesystem call of the job (no cleanup, no `finally`: what SIGKILL leaves).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bert_ipu.data.instances import InstanceConfig
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
from bert_ipu.data.shards import DatasetError, DatasetWriter, PackedDataset
from bert_ipu.engine import checkpoint

import create_pretraining_data as create_cli  # data/ scripts, on sys.path via conftest
import pack_pretraining_data as pack_cli
import prepare_wikipedia as wiki_cli
from training_helpers import entry

ROOT = Path(__file__).resolve().parent.parent
WIKI_DUMP = Path(__file__).resolve().parent / "fixtures" / "wiki" / "tiny.xml"
CONFIG = InstanceConfig(max_seq_length=64)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Eight pydoc topics in BERT's format: a few hundred instances at 64 tokens, a few shards."""
    import pydoc_data.topics

    from bert_ipu.data.text import split_sentences

    path = tmp_path_factory.mktemp("faults") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(split_sentences(pydoc_data.topics.topics[n]))
                                for n in sorted(pydoc_data.topics.topics)[:8]))
    return path


def _create(corpus: Path, out: Path, seed: int = 1, overwrite: bool = False) -> dict:
    return create_pretraining_data([str(corpus)], out, InstanceConfig(max_seq_length=64, seed=seed), docs_per_shard=3,
                                   validation_fraction=0.2, overwrite=overwrite, progress=False)


@pytest.fixture(scope="module")
def instances(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "instances"
    _create(corpus, out)
    return out


def content(dataset: Path) -> dict:
    """Every byte of a dataset, the manifest as JSON without its timings (which differ from run to run)."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("seconds", "solver_seconds")}
        return [strip(v) for v in value] if isinstance(value, list) else value
    out = {str(p.relative_to(dataset)): p.read_bytes() for p in sorted(dataset.rglob("*"))
           if p.is_file() and p.name != "manifest.json"}
    out["manifest.json"] = strip(json.loads((dataset / "manifest.json").read_text()))
    return out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    return lines[0]


# --- a full disk -----------------------------------------------------------------------------------------------

def _enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _full_disk_at(monkeypatch, where: str, at: int) -> None:
    """The `at`-th call of `where` fails as on a full disk: np.save writes half the file first."""
    calls = {"n": 0}
    if where == "np.save":
        real = np.save

        def save(path, array, *args, **kwargs):
            calls["n"] += 1
            real(path, array, *args, **kwargs)
            if calls["n"] == at:
                data = Path(path).read_bytes()
                Path(path).write_bytes(data[:len(data) // 2])
                raise _enospc(path)
        monkeypatch.setattr(np, "save", save)
    elif where == "manifest":  # the manifest's atomic write runs out of space halfway through its temporary file
        from bert_ipu import files

        real_write = files.write_atomic

        def write_atomic(path, text):
            if Path(path).name == "manifest.json":
                Path(f"{path}{files.PARTIAL}").write_text(text[:len(text) // 2])
                raise _enospc(path)
            return real_write(path, text)
        monkeypatch.setattr(files, "write_atomic", write_atomic)
    elif where == "fsync":
        real_fsync = os.fsync

        def fsync(fd):
            calls["n"] += 1
            if calls["n"] == at:  # delayed allocation: the error can surface at fsync
                raise _enospc(f"fd {fd}")
            return real_fsync(fd)
        monkeypatch.setattr(os, "fsync", fsync)


FULL_DISK = [("np.save", 1), ("np.save", 9), ("manifest", 1), ("fsync", 3)]


@pytest.mark.parametrize("job", ["create", "pack"])
@pytest.mark.parametrize("where, at", FULL_DISK)
@pytest.mark.parametrize("over_existing", [False, True], ids=["new", "overwrite"])
def test_a_full_disk_while_writing_a_dataset(corpus, instances, tmp_path, capsys, monkeypatch, job, where, at,
                                             over_existing):
    """A full disk while creating or packing (a shard half-written, the manifest half-written, or fsync failing):
    exit code 2 and one line naming the error and the file; no NAME.partial or NAME.old is left; a dataset that
    was being replaced (--overwrite) is still there, byte for byte, and verifies; none is left otherwise."""
    out = tmp_path / "out"
    if over_existing:
        if job == "create":
            _create(corpus, out, seed=2)
        else:
            pack_pretraining_data(instances, out, "lpfhp", 3, progress=False)
        before = content(out)
    _full_disk_at(monkeypatch, where, at)
    args = (["--input", str(corpus), "--output", str(out), "--docs-per-shard", "3"] if job == "create"
            else ["--input", str(instances), "--output", str(out)])
    rc = (create_cli if job == "create" else pack_cli).main(args + (["--overwrite"] if over_existing else []))
    line = _one_error_line(capsys)
    monkeypatch.undo()
    assert rc == 2 and "No space left on device" in line and "nothing was written" in line, line
    assert not (tmp_path / "out.partial").exists() and not (tmp_path / "out.old").exists()
    if over_existing:
        assert content(out) == before
        PackedDataset(out, verify=True)
    else:
        assert not out.exists()


@contextlib.contextmanager
def small_disk(path: Path, kilobytes: int):
    """A real full disk: a tmpfs of `kilobytes` mounted at `path` (root only; skipped where it cannot mount)."""
    path.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount command); the faked ENOSPC tests run")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the faked ENOSPC tests run")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_really_full_disk_keeps_the_dataset(corpus, tmp_path, capsys):
    """On a 512 KB tmpfs: the first dataset fits; replacing it (--overwrite needs room for both) runs out of space:
    exit code 2, one line, the first dataset unchanged and verified, nothing else left; packing it there runs out
    of space too, with the same outcome; a create into a 128 KB tmpfs leaves nothing."""
    with small_disk(tmp_path / "disk", 512) as disk:
        out = disk / "instances"
        assert create_cli.main(["--input", str(corpus), "--output", str(out), "--docs-per-shard", "3"]) == 0
        before = content(out)
        capsys.readouterr()
        assert create_cli.main(["--input", str(corpus), "--output", str(out), "--docs-per-shard", "3", "--seed", "2",
                                "--overwrite"]) == 2
        assert "No space left on device" in _one_error_line(capsys)
        assert content(out) == before and sorted(p.name for p in disk.iterdir()) == ["instances"]
        PackedDataset(out, verify=True)
        assert pack_cli.main(["--input", str(out), "--output", str(disk / "packed")]) == 2
        assert "No space left on device" in _one_error_line(capsys)
        assert content(out) == before and sorted(p.name for p in disk.iterdir()) == ["instances"]
    with small_disk(tmp_path / "tiny", 128) as disk:
        assert create_cli.main(["--input", str(corpus), "--output", str(disk / "instances")]) == 2
        assert "No space left on device" in _one_error_line(capsys)
        assert not any(disk.iterdir())


def _corrupt_dcp_stream(monkeypatch, step: str) -> None:
    """The files DCP writes into the checkpoint of `step` get a few bytes, then ENOSPC."""
    from torch.distributed.checkpoint import filesystem

    real = filesystem.FileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with real(self, path, mode) as stream:
            if step not in str(path):
                yield stream
                return

            class Full:
                def write(self, data):
                    stream.write(bytes(data)[:16])
                    raise _enospc(path)

                def __getattr__(self, name):
                    return getattr(stream, name)
            yield Full()
    monkeypatch.setattr(filesystem.FileSystem, "create_stream", create_stream)


def _train(dataset, out, *extra, resume=False) -> int:
    return entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                "model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=2",
                                "train.checkpoint_every=1", "train.keep_checkpoints=3", "train.validate_every=2",
                                *extra] + (["--resume"] if resume else []))


FOUR_STEPS = ["train.max_steps=4", "train.checkpoint_every=2"]


@pytest.fixture(scope="module")
def straight_run(dataset, tmp_path_factory) -> Path:
    """A 4-step run never interrupted (checkpoints at 2 and 4). Tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert _train(dataset, out, *FOUR_STEPS) == 0
    return out


@pytest.fixture(scope="module")
def straight_weights(straight_run) -> dict:
    from training_helpers import final_weights

    return final_weights(straight_run)


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_a_full_disk_while_checkpointing_keeps_the_last_checkpoint(dataset, straight_weights, tmp_path, capsys,
                                                                   monkeypatch):
    """A full disk while writing the step-4 checkpoint: exit code 2, one line; step-2 stays the newest
    checkpoint, whole, and nothing of step-4 is left; --resume continues from step 2 to the end, with the same
    weights as a run that never failed."""
    from training_helpers import final_weights

    capsys.readouterr()
    out = tmp_path / "run"
    _corrupt_dcp_stream(monkeypatch, "step-0000004")
    assert _train(dataset, out, *FOUR_STEPS) == 2
    line = _one_error_line(capsys)
    monkeypatch.undo()
    assert "writing checkpoint" in line and "No space left on device" in line and "--resume" in line, line
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    assert checkpoint.load_weights(out / "checkpoints" / "step-0000002")
    assert _train(dataset, out, *FOUR_STEPS, resume=True) == 0
    assert _same_weights(final_weights(out), straight_weights)


def test_a_full_disk_while_exporting_keeps_the_checkpoint(dataset, tmp_path, capsys, monkeypatch):
    """A full disk while writing the Hugging Face export at the end of a run: exit code 2, one line (was a
    traceback); no hf, hf.partial or hf.old is left, the final checkpoint is whole, and --resume writes the
    export."""
    import bert_ipu.models.hf_io as export

    out = tmp_path / "run"
    real = export._write_tokenizer

    def full(path, *args):
        real(path, *args)
        raise _enospc(Path(path) / "tokenizer.json")
    monkeypatch.setattr(export, "_write_tokenizer", full)
    assert _train(dataset, out) == 2
    line = _one_error_line(capsys)
    monkeypatch.undo()
    assert "writing the export" in line and "No space left on device" in line and "step-0000002" in line, line
    assert not any((out / name).exists() for name in ("hf", "hf.partial", "hf.old", "results.json"))
    assert _train(dataset, out, resume=True) == 0
    from transformers import AutoModelForPreTraining

    AutoModelForPreTraining.from_pretrained(str(out / "hf"))


def test_a_full_disk_while_preparing_wikipedia_keeps_the_complete_shards(tmp_path, capsys, monkeypatch):
    """A full disk while prepare_wikipedia writes its third shard: exit code 2, one line; the complete shards stay
    (as after an interruption) and the same command, run again, writes the bytes of an uninterrupted run."""
    clean = tmp_path / "clean"
    assert wiki_cli.main(["--dump", str(WIKI_DUMP), "--output", str(clean), "--docs-per-shard", "2", "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    calls = {"n": 0}
    real = os.fsync

    def fsync(fd):  # fsync of the 3rd shard (progress.json's writes are fsynced too: count shards only)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".txt.partial"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise _enospc("wiki-00002.txt.partial")
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    args = ["--dump", str(WIKI_DUMP), "--output", str(out), "--docs-per-shard", "2", "--quiet"]
    assert wiki_cli.main(args) == 2
    line = _one_error_line(capsys)
    monkeypatch.undo()
    assert "No space left on device" in line and "run the same command again" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["progress.json", "wiki-00000.txt", "wiki-00001.txt"]
    assert wiki_cli.main(args) == 0
    assert {p.name: p.read_bytes() for p in out.glob("wiki-*")} == {p.name: p.read_bytes() for p in clean.glob("wiki-*")}


# --- a second writer -------------------------------------------------------------------------------------------

def test_an_output_lock_is_exclusive_and_leaves_no_file(tmp_path):
    """A finished (or failed) job left NAME.lock beside its output. The lock file is removed on release, while
    still locked; a writer that locked the file just removed (it opened the name before the removal) locks the
    name's new file instead, so two writers never hold two files of one name."""
    from bert_ipu.files import OutputBusy, OutputLock

    out = tmp_path / "out"
    with OutputLock(out) as lock:
        assert lock.path == tmp_path / "out.lock" and lock.path.is_file()
        with pytest.raises(OutputBusy, match="another process is writing"):
            OutputLock(out)
    assert not any(tmp_path.iterdir())
    opened = []
    real_open = open

    def racing_open(path, *args):  # the name's file removed between this writer's open and its check
        handle = real_open(path, *args)
        if not opened:
            opened.append(path)
            Path(path).unlink()
        return handle

    import builtins
    builtins_open, builtins.open = builtins.open, racing_open
    try:
        with OutputLock(out) as lock:
            assert os.stat(lock.path).st_ino == os.fstat(lock.file.fileno()).st_ino
    finally:
        builtins.open = builtins_open
    assert opened and not any(tmp_path.iterdir())


def test_a_second_writer_of_a_dataset_is_refused(corpus, instances, tmp_path, capsys):
    """While one job writes a dataset folder (it holds NAME.lock), a second create or pack of the same folder is
    refused with one line and touches nothing; the first then finishes a whole dataset. (Two at once wrote a
    manifest with missing shards.)"""
    out = tmp_path / "out"
    with DatasetWriter(out, None, overwrite=False) as first:
        assert create_cli.main(["--input", str(corpus), "--output", str(out)]) == 2
        assert "another process is writing" in _one_error_line(capsys)
        assert pack_cli.main(["--input", str(instances), "--output", str(out), "--overwrite"]) == 2
        assert "another process is writing" in _one_error_line(capsys)
        assert first.partial.is_dir() and not out.exists()
    _create(corpus, out)  # the lock went with the first writer
    PackedDataset(out, verify=True)


def test_a_second_writer_in_another_process_is_refused(corpus, tmp_path):
    """The same across processes, with a real second process: exit code 2 and one line."""
    out = tmp_path / "wiki"
    with DatasetWriter(out, None):
        proc = subprocess.run([sys.executable, str(ROOT / "data" / "prepare_wikipedia.py"), "--dump", str(WIKI_DUMP),
                               "--output", str(out), "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "another process is writing" in proc.stderr
    assert not out.exists()


# --- a kill at any point ---------------------------------------------------------------------------------------

KILLER = r"""
import os, pathlib, shutil, sys
import numpy
job, kill_at, src, out = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])
calls = 0

def hook(owner, name):
    real = getattr(owner, name)
    def hooked(*args, **kwargs):
        global calls
        calls += 1
        if calls == kill_at:
            os._exit(137)  # SIGKILL: no cleanup, no finally
        return real(*args, **kwargs)
    setattr(owner, name, hooked)

for owner, name in [(numpy, "save"), (os, "replace"), (os, "fsync"), (shutil, "rmtree"), (shutil, "copyfile"),
                    (pathlib.Path, "mkdir"), (pathlib.Path, "write_text")]:
    hook(owner, name)
from bert_ipu.data.instances import InstanceConfig
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
if job == "create":
    create_pretraining_data([str(src)], out, InstanceConfig(max_seq_length=64, seed=1), docs_per_shard=3,
                            validation_fraction=0.2, overwrite=True, progress=False)
else:
    pack_pretraining_data(src, out, "cghp", 3, overwrite=True, progress=False)
print(calls)
"""


def _killed_run(job: str, kill_at: int, src: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", KILLER, job, str(kill_at), str(src), str(out)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("job", ["create", "pack"])
def test_a_kill_at_any_point_then_rerun_gives_the_same_bytes(corpus, instances, tmp_path, job):
    """A create or pack job replacing an older dataset (--overwrite), killed at six points spread over all its
    filesystem calls (first and last included): right after the kill, the folder holds the old dataset or the new
    one, whole (or, killed between the two renames, nothing that loads and NAME.old with the old one); the rerun
    then writes exactly the bytes of an uninterrupted run (the manifest's timings aside)."""
    src = corpus if job == "create" else instances
    reference = tmp_path / "reference"
    older = tmp_path / "older"
    if job == "create":
        _create(corpus, reference)
        _create(corpus, older, seed=2)
    else:
        pack_pretraining_data(instances, reference, "cghp", 3, progress=False)
        pack_pretraining_data(instances, older, "lpfhp", 3, progress=False)
    new, old = content(reference), content(older)
    out = tmp_path / "out"
    shutil.copytree(older, out)
    counted = _killed_run(job, 0, src, out)  # not killed: how many filesystem calls the job makes
    assert counted.returncode == 0, counted.stderr[-2000:]
    calls = int(counted.stdout.split()[-1])
    assert content(out) == new
    points = sorted({1, calls // 5, 2 * calls // 5, 3 * calls // 5, 4 * calls // 5, calls})
    for kill_at in points:
        for leftover in (out, tmp_path / "out.partial", tmp_path / "out.old"):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.copytree(older, out)
        assert _killed_run(job, kill_at, src, out).returncode == 137
        try:
            now = content(PackedDataset(out, verify=True).path)
            assert now in (old, new), kill_at
        except DatasetError:
            assert (tmp_path / "out.old" / "manifest.json").is_file(), kill_at  # between the two renames
        if job == "create":
            _create(corpus, out, overwrite=True)
        else:
            pack_pretraining_data(instances, out, "cghp", 3, overwrite=True, progress=False)
        assert content(out) == new, kill_at
        assert not (tmp_path / "out.partial").exists() and not (tmp_path / "out.old").exists()


def _process_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process from /proc, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return int(ppid), state


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        info = _process_state(int(entry))
        if info is not None and info[0] == pid:
            found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's death signal is Linux's (prctl)")
@pytest.mark.parametrize("job", ["prepare_wikipedia", "create_pretraining_data"])
def test_a_killed_data_step_leaves_no_worker_processes(tmp_path, job):
    """kill -9 of a data step running 2 worker processes: the workers (and the pool's resource tracker) end within
    seconds (they ran on for ever, waiting for work from a parent that was gone)."""
    import time

    if job == "prepare_wikipedia":  # tiny.xml's pages 300 times over: about a second of work for 2 workers
        xml = WIKI_DUMP.read_text(encoding="utf-8")
        first, last = xml.index("<page>"), xml.rindex("</page>") + len("</page>")
        (tmp_path / "dump.xml").write_text(xml[:first] + xml[first:last] * 300 + xml[last:], encoding="utf-8")
        args = ["--dump", str(tmp_path / "dump.xml"), "--quiet", "--batch-mb", "0.01"]
    else:  # the built-in corpus, a chunk of 20 documents a task: seconds of work
        args = ["--docs-per-shard", "20"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "data" / f"{job}.py"), *args, "--output", str(tmp_path / "out"),
                             "--workers", "2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    deadline = time.time() + 60
    while len(children := _children(proc.pid)) < 3:  # 2 workers and the resource tracker
        assert proc.poll() is None and time.time() < deadline, "the job ended before its workers started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while (left := [pid for pid in children if (_process_state(pid) or (0, "Z"))[1] != "Z"]) and time.time() < deadline:
        time.sleep(0.1)
    for pid in left:  # not left to the next test either
        os.kill(pid, signal.SIGKILL)
    assert not left


class Killed(BaseException):
    """A kill: nothing of ours catches it (no cleanup of the half-written files, as with SIGKILL)."""


@pytest.mark.parametrize("point", ["inside the last checkpoint", "inside the export"])
def test_training_killed_at_more_points_resumes_bitwise(dataset, straight_weights, tmp_path, monkeypatch, point):
    """A run killed while it writes its last checkpoint (step-4.partial half-written, before its rename) or while
    it writes the export resumes with --resume from its newest whole checkpoint and ends with exactly
    the weights of a run never killed (the kill right after a checkpoint is tests/test_training.py's)."""
    from training_helpers import final_weights

    extra = FOUR_STEPS
    out = tmp_path / "run"
    if point == "inside the export":
        import bert_ipu.models.hf_io as export

        real = export._write_tokenizer

        def die(path, *args):
            real(path, *args)
            raise Killed
        monkeypatch.setattr(export, "_write_tokenizer", die)
    else:
        real_fsync = checkpoint.fsync_tree

        def die(partial):  # every file of step-4 written, then killed before the fsync and the rename
            if "step-0000004" in str(partial):
                shard = next(Path(partial).glob("*.safetensors"))
                shard.write_bytes(shard.read_bytes()[:100])  # and the page cache never reached the disk
                raise Killed
            return real_fsync(partial)
        monkeypatch.setattr(checkpoint, "fsync_tree", die)
    with pytest.raises(Killed):
        _train(dataset, out, *extra)
    monkeypatch.undo()
    assert not (out / "hf").exists()
    if point == "inside the last checkpoint":  # left behind: a step-4 folder with state.json, but .partial
        assert (out / "checkpoints" / "step-0000004.partial" / "state.json").is_file()
        assert [p.name for p in checkpoint.checkpoints(out)] == ["step-0000002"]
    assert _train(dataset, out, *extra, resume=True) == 0
    assert _same_weights(final_weights(out), straight_weights)
    assert not (out / "hf.partial").exists() and not (out / "checkpoints" / "step-0000004.partial").exists()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # no row twice after the resume


def test_a_full_disk_while_logging_metrics_is_one_error(tmp_path):
    """metrics.jsonl that cannot be written is a RunError naming the file and --resume (was an OSError traceback),
    and closing the logger afterwards does not replace that error with another."""
    from bert_ipu.engine.metrics import MetricsLogger
    from bert_ipu.engine.runtime import RunError

    logger = MetricsLogger(tmp_path, main=True, total_steps=2, progress=False)
    real = logger.file

    class Full:
        name = real.name

        def write(self, text):
            real.write(text[:5])
            raise _enospc(real.name)

        def flush(self):
            raise _enospc(real.name)

        def close(self):
            real.close()
            raise _enospc(real.name)
    logger.file = Full()
    with pytest.raises(RunError, match="metrics.jsonl failed at step 1: No space left on device.*--resume"):
        logger.log(1, {"loss": 1.0})
    logger.close()


def test_a_writer_that_waited_does_not_replace_the_dataset_made_meanwhile(corpus, tmp_path):
    """Two writers of one new folder without --overwrite: the one that took the lock second, after the first
    finished, is refused (it saw no dataset before locking) instead of replacing the first one's dataset."""
    out = tmp_path / "out"
    real = DatasetWriter._check_output
    calls = {"n": 0}

    def first_finishes_meanwhile(self, overwrite):
        calls["n"] += 1
        real(self, overwrite)
        if calls["n"] == 1:  # the second writer passed its first check: the first writer now writes and finishes
            DatasetWriter._check_output = real
            try:
                _create(corpus, out)
            finally:
                DatasetWriter._check_output = first_finishes_meanwhile
    DatasetWriter._check_output = first_finishes_meanwhile
    try:
        with pytest.raises(DatasetError, match="exists; choose another output"):
            DatasetWriter(out, None)
    finally:
        DatasetWriter._check_output = real
    PackedDataset(out, verify=True)  # the first writer's dataset, whole
    assert not (tmp_path / "out.partial").exists()


class _Planted:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_planted_pickle_in_a_checkpoint_runs_nothing(dataset, straight_run, tmp_path):
    """state.pt and optimizer-4.pt pickles planted in a checkpoint (what the old --resume loaded with
    torch.load(weights_only=False)) are never unpickled: --resume reads safetensors and JSON only."""
    import pickle

    out = tmp_path / "run"
    shutil.copytree(straight_run, out)
    marker = tmp_path / "code-ran"
    for name in ("state.pt", "optimizer-4.pt", "rng.pt"):
        (out / "checkpoints" / "step-0000004" / name).write_bytes(pickle.dumps(_Planted(str(marker))))
    assert _train(dataset, out, *FOUR_STEPS, resume=True) == 0
    assert not marker.exists()


_CTRL_C_DRIVER = """
import sys, time
from pathlib import Path
from bert_ipu.data.jobs import open_engine

def task(i):
    Path(sys.argv[1], f"started-{i}").write_text("")
    time.sleep(2)
    return i

if __name__ == "__main__":
    try:
        with open_engine("local", 2) as runner:
            list(runner.map(task, range(8)))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
"""


def test_ctrl_c_stops_a_data_step_with_workers_in_one_line(tmp_path):
    """Ctrl-C reaches the whole process group: every worker printed its own KeyboardInterrupt traceback, and the
    pool's shutdown could hang (a worker killed while it sent its result). Workers ignore it and end their
    running task; the driver cancels the rest, waits for them, and says so in one line."""
    driver = tmp_path / "driver.py"
    driver.write_text(_CTRL_C_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, str(driver), str(tmp_path)], stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:  # both workers at work
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)  # (8 tasks of 2 s on 2 workers: 8 s without the cancel)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the interrupted data step did not stop")
    assert proc.returncode == 130 and err.strip() == "interrupted", err
