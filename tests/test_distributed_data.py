"""The three data steps on a Dask cluster (`--engine dask`): the same bytes as the local pool, whatever happens
to the workers; a rerun resumes (or starts over) as the local path does; a bad --address is one line.

One local cluster of 2 worker processes (one thread each) serves the module, as `--address` would name an
existing cluster; one test lets the command start and stop its own. Compared: the sha256 of every file each
step writes, the manifests included, with only their timings taken out ("seconds", "solver_seconds": two runs
on the same engine differ there too). Nothing in a manifest records the engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402
from distributed.diagnostics.plugin import WorkerPlugin  # noqa: E402

from bert_ipu.data import jobs  # noqa: E402
from bert_ipu.data.instances import InstanceConfig  # noqa: E402
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data  # noqa: E402
from bert_ipu.data.shards import DatasetWriter  # noqa: E402
from bert_ipu.data.wikipedia import PROGRESS, prepare  # noqa: E402
from bert_ipu.data.wikipedia import writer as wiki_writer  # noqa: E402

import create_pretraining_data as create_cli  # noqa: E402  data/ scripts, on sys.path via conftest
import pack_pretraining_data as pack_cli  # noqa: E402
import prepare_wikipedia as wiki_cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = Path(__file__).resolve().parent / "fixtures" / "wiki" / "tiny.xml"
CONFIG = InstanceConfig(max_seq_length=128)
TIMINGS = {"seconds", "solver_seconds"}


def _without(value, keys):
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def digests(folder: Path, ignore=frozenset()) -> dict[str, str]:
    """sha256 of every file under `folder` by relative path; a JSON manifest's without its timings (and the
    fields in `ignore`)."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name in ("manifest.json", "wikipedia.json"):
            data = json.dumps(_without(json.loads(data), TIMINGS | set(ignore)), sort_keys=True).encode()
        out[str(path.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return out


class KillOnce(WorkerPlugin):
    """Kills its worker process (SIGKILL: no cleanup) when the worker starts executing the `after`-th task named
    `name`, once in the whole cluster: the first worker to create `marker` dies, no other, and no restarted one."""

    def __init__(self, marker: str, name: str, after: int = 2):
        self.marker, self.name, self.after = marker, name, after
        self.seen = 0

    def transition(self, key, start, finish, *args, **kwargs):
        if finish != "executing" or not str(key).startswith(self.name + "-"):
            return
        self.seen += 1
        if self.seen < self.after:
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster():
    """A local Dask cluster of 2 worker processes, 1 thread each, and a client of the test's own."""
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    yield cluster, client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The three steps on the local pool (1 worker, in process): the reference outputs, in small pieces (an
    article a piece, 50 documents a chunk, 500 packs a shard) so that a step has many tasks."""
    root = tmp_path_factory.mktemp("local")
    prepare(TINY, root / "wiki", docs_per_shard=2, progress=False, batch_bytes=1)
    create_pretraining_data(["builtin"], root / "instances", CONFIG, docs_per_shard=50, progress=False)
    pack_pretraining_data(root / "instances", root / "packed", packs_per_shard=500, progress=False)
    return root


def run_steps(out: Path, local: Path, **engine) -> None:
    """The three steps with `engine` (engine=, address= or workers=) into `out`; the packing step packs the
    reference instances, so that its manifest names the same source."""
    prepare(TINY, out / "wiki", docs_per_shard=2, progress=False, batch_bytes=1, **engine)
    create_pretraining_data(["builtin"], out / "instances", CONFIG, docs_per_shard=50, progress=False, **engine)
    pack_pretraining_data(local / "instances", out / "packed", packs_per_shard=500, progress=False, **engine)


def assert_same(out: Path, local: Path) -> None:
    for step in ("wiki", "instances", "packed"):
        got, want = digests(out / step), digests(local / step)
        assert len(want) >= 6 and got == want, step  # wiki: 4 shards, progress.json, wikipedia.json


def test_each_step_on_dask_writes_the_same_bytes_as_the_local_pool(cluster, local, tmp_path, capsys):
    """Dump -> text, text -> instances and instances -> packs on the cluster at --address: every file the same
    bytes as the local pool's (shards, vocab, progress record, manifests less their timings), through the API and
    through prepare_wikipedia's command line; and the packing command with a local cluster of its own (no
    --address) too, with its progress off a terminal: pieces of the total and MB/s."""
    run_steps(tmp_path / "at_address", local, engine="dask", address=cluster[0].scheduler_address)
    assert_same(tmp_path / "at_address", local)
    assert len(digests(local / "packed")) == 11 * 8 + 2  # many pieces: 10 train shards, 1 validation, 8 files each

    assert wiki_cli.main(["--dump", str(TINY), "--output", str(tmp_path / "cli" / "wiki"), "--docs-per-shard", "2",
                          "--batch-mb", "1e-6", "--engine", "dask", "--address",
                          cluster[0].scheduler_address]) == 0
    assert digests(tmp_path / "cli" / "wiki") == digests(local / "wiki")
    err = capsys.readouterr().err.strip().splitlines()  # --batch-mb 1e-6: an article a piece (the default: 1 piece)
    assert err[-1].startswith("tiny.xml -> text: 7 pieces, ") and "(100.0%)" in err[-1] and " MB/s" in err[-1], err

    assert pack_cli.main(["--input", str(local / "instances"), "--output", str(tmp_path / "own" / "packed"),
                          "--packs-per-shard", "500", "--engine", "dask", "--workers", "2"]) == 0
    assert digests(tmp_path / "own" / "packed") == digests(local / "packed")
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("packing: 11 of 11 pieces, ") and " MB/s" in err[-1], err


@pytest.mark.parametrize("step, task", [("wiki", "convert_batch"), ("instances", "_process_chunk"),
                                        ("packed", "_write_packed_shard")])
def test_a_worker_killed_mid_step_is_replaced_and_the_output_is_the_same(cluster, local, tmp_path, step, task):
    """A worker process killed (SIGKILL) as it starts its second task of the step: the scheduler runs that task
    (and any result the worker held) again elsewhere; the step completes with the same bytes."""
    cluster, client = cluster
    marker = tmp_path / "killed"
    client.register_plugin(KillOnce(str(marker), task), name="kill-once")
    try:
        before = set(client.run(os.getpid).values())
        engine = {"engine": "dask", "address": cluster.scheduler_address}
        out = tmp_path / step
        if step == "wiki":
            prepare(TINY, out, docs_per_shard=2, progress=False, batch_bytes=1, **engine)
        elif step == "instances":
            create_pretraining_data(["builtin"], out, CONFIG, docs_per_shard=50, progress=False, **engine)
        else:
            pack_pretraining_data(local / "instances", out, packs_per_shard=500, progress=False, **engine)
    finally:
        client.unregister_worker_plugin("kill-once")
    assert marker.exists()  # a worker was killed during the step
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it: the next test has 2 workers again
    assert len(before - set(client.run(os.getpid).values())) == 1  # exactly one process was replaced
    assert digests(out) == digests(local / step)


def test_an_interrupted_driver_resumes_skipping_finished_pieces(cluster, local, tmp_path, monkeypatch):
    """Dump -> text, driver stopped after its first shard: the rerun on the cluster sends only the articles of
    the shards not yet complete (2 of 7 are skipped) and ends with the same bytes. The dataset steps, stopped
    midway, leave no dataset and no temporary folder (as on the local pool: they start over), and the rerun writes
    the same bytes."""
    engine = {"engine": "dask", "address": cluster[0].scheduler_address}
    out = tmp_path / "wiki"
    original = wiki_writer._commit_shard

    def commit_then_stop(output, identity, shards):
        original(output, identity, shards)
        raise KeyboardInterrupt

    monkeypatch.setattr(wiki_writer, "_commit_shard", commit_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare(TINY, out, docs_per_shard=2, progress=False, batch_bytes=1, **engine)
    monkeypatch.setattr(wiki_writer, "_commit_shard", original)
    assert sorted(p.name for p in out.iterdir()) == [PROGRESS, "wiki-00000.txt"]

    sent = []
    real_map = jobs.DaskEngine.map

    def counting_map(self, fn, items, *args, **kwargs):
        def counted():
            for item in items:
                sent.append(item)
                yield item
        return real_map(self, fn, counted(), *args, **kwargs)

    monkeypatch.setattr(jobs.DaskEngine, "map", counting_map)
    manifest = prepare(TINY, out, docs_per_shard=2, progress=False, batch_bytes=1, **engine)
    monkeypatch.undo()
    indices = [index for _, batch in sent for index, _ in batch]
    assert indices == [2, 3, 4, 5, 6] and manifest["resumed_shards"] == 1
    # the manifest says how many shards were kept from the first run; every other byte is the same
    assert digests(out, ignore={"resumed_shards"}) == digests(local / "wiki", ignore={"resumed_shards"})

    calls = {"n": 0}
    real_write = DatasetWriter.write_shard

    def stop_at_the_third_shard(self, split, arrays):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_write(self, split, arrays)

    monkeypatch.setattr(DatasetWriter, "write_shard", stop_at_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        create_pretraining_data(["builtin"], tmp_path / "instances", CONFIG, docs_per_shard=50, progress=False,
                                **engine)
    monkeypatch.undo()
    assert calls["n"] == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["wiki"]
    create_pretraining_data(["builtin"], tmp_path / "instances", CONFIG, docs_per_shard=50, progress=False, **engine)
    assert digests(tmp_path / "instances") == digests(local / "instances")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_bad_address_is_one_line_and_writes_nothing(local, tmp_path, capsys, monkeypatch):
    """--address where no scheduler listens: each command exits 2 with one line on stderr naming the address and
    the fix, and writes nothing (no output, no lock, no temporary folder). Run as real processes: the line is
    all of stderr, whatever Dask logs. A scheduler without workers, --address without --engine dask, and one that
    is not HOST:PORT: one line each."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    commands = {
        "prepare_wikipedia.py": ["--dump", str(TINY), "--output", str(out)],
        "create_pretraining_data.py": ["--output", str(out)],
        "pack_pretraining_data.py": ["--input", str(local / "instances"), "--output", str(out)],
    }
    # 2 s to connect (CONNECT_TIMEOUT, 10 s by default) keeps the test short; the three run side by side
    code = "import runpy, sys; from bert_ipu.data import jobs; jobs.CONNECT_TIMEOUT = 2.0; " \
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    runs = {name: subprocess.Popen([sys.executable, "-c", code, str(ROOT / "data" / name), *args, "--engine", "dask",
                                    "--address", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=env)
            for name, args in commands.items()}
    for name, run in runs.items():
        stdout, stderr = run.communicate(timeout=120)
        assert run.returncode == 2 and stdout == "", (name, stdout, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("error: no Dask scheduler answered at " + address), \
            (name, stderr)
        assert "dask scheduler" in stderr and "leave out --address" in stderr
    assert list(tmp_path.iterdir()) == []

    assert create_cli.main(["--output", str(out), "--address", address]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --address {address} names a Dask scheduler: add --engine dask (or leave out --address)\n"
    empty = small_cluster(workers=0)  # a scheduler without workers: the step would wait for ever
    monkeypatch.setattr(jobs, "CONNECT_TIMEOUT", 1.0)
    try:
        assert create_cli.main(["--output", str(out), "--engine", "dask", "--address", empty.scheduler_address]) == 2
    finally:
        empty.close()
    assert capsys.readouterr().err == (f"error: the Dask scheduler at {empty.scheduler_address} has no workers (none "
                                       f"within 1 s): start them there (`dask worker {empty.scheduler_address}` on "
                                       "each machine)\n")
    assert pack_cli.main(["--input", str(local / "instances"), "--output", str(out), "--engine", "dask",
                          "--address", "nowhere"]) == 2
    assert capsys.readouterr().err == ("error: --address nowhere: expected HOST:PORT of a Dask scheduler "
                                       "(e.g. 10.0.0.1:8786)\n")
    assert list(tmp_path.iterdir()) == []


def small_cluster(allowed_failures: int = 3, workers: int = 1) -> LocalCluster:
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                            silence_logs=logging.ERROR)


def test_a_cluster_that_goes_away_or_kills_every_try_is_one_line(local, tmp_path, capfd, monkeypatch):
    """The scheduler stopped during a step: text -> instances (the command) is one line naming it, exit 2, and
    leaves no dataset; dump -> text keeps its complete shard for a rerun and writes no manifest (nothing left as
    done), and the rerun on another cluster gives the same bytes. A piece that kills its worker on every try
    (allowed-failures 0 here: the first death is final): one line, exit 2, no dataset."""
    doomed = small_cluster()
    address = doomed.scheduler_address
    real_write = DatasetWriter.write_shard

    def write_then_stop_the_cluster(self, split, arrays):
        doomed.close()
        return real_write(self, split, arrays)

    monkeypatch.setattr(DatasetWriter, "write_shard", write_then_stop_the_cluster)
    try:
        code = create_cli.main(["--output", str(tmp_path / "instances"), "--docs-per-shard", "50", "--engine", "dask",
                                "--address", address])
    finally:
        doomed.close()
    monkeypatch.undo()
    captured = capfd.readouterr()
    assert code == 2 and captured.err.startswith(f"error: lost the Dask scheduler at {address} ("), captured.err
    assert captured.err.count("\n") == 1 and "run the same command again" in captured.err
    assert not any(tmp_path.iterdir())

    doomed = small_cluster()
    out = tmp_path / "wiki"
    original = wiki_writer._commit_shard

    def commit_then_stop_the_cluster(output, identity, shards):
        original(output, identity, shards)
        doomed.close()

    monkeypatch.setattr(wiki_writer, "_commit_shard", commit_then_stop_the_cluster)
    try:
        with pytest.raises(jobs.EngineError, match=f"lost the Dask scheduler at {doomed.scheduler_address}"):
            prepare(TINY, out, docs_per_shard=2, progress=False, batch_bytes=1, engine="dask",
                    address=doomed.scheduler_address)
    finally:
        doomed.close()
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == [PROGRESS, "wiki-00000.txt"]
    prepare(TINY, out, docs_per_shard=2, progress=False, batch_bytes=1, engine="dask", workers=1)
    assert digests(out, ignore={"resumed_shards"}) == digests(local / "wiki", ignore={"resumed_shards"})

    fragile = small_cluster(allowed_failures=0)
    try:
        with Client(fragile, set_as_default=False) as client:
            client.register_plugin(KillOnce(str(tmp_path / "killed"), "_write_packed_shard", after=1), name="kill")
            code = pack_cli.main(["--input", str(local / "instances"), "--output", str(tmp_path / "packed"),
                                  "--engine", "dask", "--address", fragile.scheduler_address])
    finally:
        fragile.close()
    captured = capfd.readouterr()
    assert code == 2 and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("error: a piece of work was lost with its worker on every try on the Dask "
                                   f"scheduler at {fragile.scheduler_address} (_write_packed_shard-")
    assert "out of memory?" in captured.err and "--packs-per-shard" in captured.err
    assert not (tmp_path / "packed").exists() and not (tmp_path / "packed.partial").exists()


def test_the_library_and_the_local_engine_need_no_dask(local, tmp_path):
    """Dask is imported by --engine dask only: with `distributed` unimportable, the data modules import, the local
    engine runs a step, and --engine dask is one line saying what to install."""
    code = (
        "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None\n"  # import of either fails
        "import bert_ipu.data.pipeline, bert_ipu.data.wikipedia\n"
        "from bert_ipu.data.pipeline import pack_pretraining_data\n"
        f"pack_pretraining_data({str(local / 'instances')!r}, {str(tmp_path / 'packed')!r}, packs_per_shard=500, "
        "progress=False, workers=2)\n"
        "script, src, dst = sys.argv[1:]\n"
        "sys.argv = ['pack', '--input', src, '--output', dst, '--engine', 'dask']\n"
        "import runpy; runpy.run_path(script, run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / "data" / "pack_pretraining_data.py"),
                          str(local / "instances"), str(tmp_path / "other")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2 and run.stdout == "", (run.stdout, run.stderr)
    assert run.stderr == ("error: --engine dask needs the dask and distributed packages: pip install -r "
                          "requirements.txt (or use --engine local)\n")
    assert digests(tmp_path / "packed") == digests(local / "packed")  # 2 local workers: the same bytes
    assert not (tmp_path / "other").exists()
