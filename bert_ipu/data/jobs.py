"""What the data-preparation jobs share: an engine that maps a function over pieces of work with the results
back in input order and a bounded read-ahead, the driver's progress line, and the library versions a manifest
records.

    with open_engine("local", workers=4) as engine:
        for result in engine.map(work, items, in_flight=8, initializer=init, initargs=(vocab,)):
            ...   # in input order; at most 8 items in memory; init(vocab) once per worker process before its first item
            ...

Two engines, one mechanism: the three data steps call `engine.map` and only the executor differs.

- `local` (the default): `workers` spawned processes of this machine (`ProcessPoolExecutor`); one worker runs
  in this process. A worker that dies raises `BrokenProcessPool` instead of leaving the job waiting for a result
  that never comes (as `multiprocessing.Pool` does).
- `dask`: a Dask distributed cluster: the scheduler at `address` (HOST:PORT: `dask scheduler` there and
  `dask worker HOST:PORT` on each machine, all with this project importable and the input and output folders
  on a shared file system), or, without an address, a local cluster of `workers` processes started and closed
  here. A worker that dies is replaced and its tasks run again elsewhere (the scheduler's `allowed-failures`,
  3 by default); results are the same bytes because every piece is a pure function of its input.

Dask is imported only when the `dask` engine is used: the library imports without it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import signal
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from ..processes import die_with_parent

ENGINES = ("local", "dask")
CONNECT_TIMEOUT = 10.0  # seconds to reach a scheduler at --address before giving up


class EngineError(RuntimeError):
    """The engine cannot run the job (no scheduler at the address, the cluster went away): one line, naming
    the address and the fix."""


def worker_pool(workers: int, initializer=None, initargs=()) -> ProcessPoolExecutor:
    """`workers` spawned processes (spawn: no inherited locks or threads of the parent) that end with this one (a
    kill -9 of a data step left them running)."""
    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs))


def _start_worker(parent: int, initializer, initargs) -> None:
    die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the driver stops the work (and says so in one line); a worker that
    # took it too printed its own KeyboardInterrupt traceback, and the pool's shutdown could then hang
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (blocked since its start: `_submit`; now ignored)
    if initializer is not None:
        initializer(*initargs)


def _submit(pool, fn, item):
    """`pool.submit(fn, item)` with Ctrl-C blocked in this thread meanwhile: a worker process it starts inherits
    the blocked signal, so a Ctrl-C while the worker still imports (before `_start_worker` ignores it) does not
    print its traceback; here the signal waits, and is taken once unblocked (not lost)."""
    if threading.current_thread() is not threading.main_thread():
        return pool.submit(fn, item)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(fn, item)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ordered_map(pool, fn, items, in_flight: int):
    """Like `pool.map`, in input order, but reading at most `in_flight` items ahead of the consumer (`map`
    submits every item at once, holding the whole input in memory). `pool`: anything with `submit(fn, item)`
    returning a future with `result()`."""
    pending = deque()
    for item in items:
        pending.append(_submit(pool, fn, item))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _task(fn, initializer, initargs):
    return fn if initializer is None else _Initialised(fn, initializer, initargs, uuid.uuid4().hex)


class LocalEngine:
    """`workers` processes of this machine; with one, the work runs in this process (no pickling)."""

    name = "local"

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = worker_pool(workers) if workers > 1 else None

    def map(self, fn, items, in_flight: int | None = None, initializer=None, initargs=()):
        """fn over items, results in input order; `initializer(*initargs)` first, once in each process."""
        task = _task(fn, initializer, initargs)
        if self.pool is None:
            return map(task, items)
        return ordered_map(self.pool, task, items, in_flight or 2 * self.workers)

    def close(self) -> None:
        """Stop the workers once their running tasks end (queued ones are cancelled). Not sooner: a worker stopped
        while it sends its result leaves the pool's reader waiting for the rest, and the exit hung. Again: nothing."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


# Per worker process: the token of the last initializer run there (a worker outlives one map's tasks, so each
# map's initializer runs once per process, on its first task there).
_READY = {"token": None}
_READY_LOCK = threading.Lock()


class _Initialised:
    """`fn`, after `initializer(*initargs)` has run once in this process for this job (`token`)."""

    def __init__(self, fn, initializer, initargs, token: str):
        self.fn, self.initializer, self.initargs, self.token = fn, initializer, initargs, token
        self.__name__ = fn.__name__  # what Dask names its tasks after (fn-<hash>, on its dashboard and in its logs)

    def __call__(self, item):
        with _READY_LOCK:
            if _READY["token"] != self.token:
                self.initializer(*self.initargs)
                _READY["token"] = self.token
        return self.fn(item)


class DaskEngine:
    """A `distributed.Client` on the scheduler at `address`, or on a local cluster of `workers` processes
    (one thread each) that this engine starts and closes."""

    name = "dask"

    def __init__(self, workers: int, address: str | None):
        import logging

        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise EngineError("--engine dask needs the dask and distributed packages: pip install -r "
                              "requirements.txt (or use --engine local)") from None
        self.address, self.cluster = address, None
        if address is None:
            # ":0": the scheduler's HTTP server (always started) on a free port, not 8787 that another cluster of
            # this machine may hold (Dask would warn and move anyway)
            try:
                self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                            dashboard_address=":0", silence_logs=logging.ERROR)
            except Exception as e:  # Dask raises RuntimeError, OSError, TimeoutError for a cluster that cannot start
                raise EngineError(f"could not start a local Dask cluster of {workers} worker(s) ({type(e).__name__}: "
                                  f"{_first_line(e)}); use --engine local, or --address of a running cluster") from None
            self.client = Client(self.cluster, set_as_default=False)
            self.where = f"the local Dask cluster of {workers} worker(s)"
        else:
            self.client = _connect(Client, address)
            self.where = f"the Dask scheduler at {address}"
            try:  # tasks would wait forever on a scheduler without workers
                self.client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
            except TimeoutError:
                self.client.close()
                raise EngineError(f"the Dask scheduler at {address} has no workers (none within {CONNECT_TIMEOUT:.0f} "
                                  f"s): start them there (`dask worker {address}` on each machine)") from None
        self.workers = max(1, sum(self.client.nthreads().values()))

    def map(self, fn, items, in_flight: int | None = None, initializer=None, initargs=()):
        """fn over items on the cluster, results in input order; `initializer(*initargs)` first, once in each
        worker process."""
        task = _task(fn, initializer, initargs)
        in_flight = in_flight or 2 * self.workers
        pending = deque()
        try:
            for item in items:
                pending.append(self.client.submit(task, item, pure=False))
                if len(pending) >= in_flight:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            if pending:
                self.client.cancel(list(pending))

    def _result(self, future):
        from distributed import KilledWorker

        try:
            return future.result()
        except KilledWorker as e:
            raise EngineError(f"a piece of work was lost with its worker on every try on {self.where} ({e.task}; "
                              "out of memory?): give the workers more memory, or smaller pieces (--batch-mb, "
                              "--docs-per-shard, --packs-per-shard)") from None
        except Exception as e:
            if future.status == "error":  # the task itself raised: the job's own error, unchanged
                raise
            raise EngineError(f"lost {self.where} ({type(e).__name__}: {_first_line(e)}); check the cluster and "
                              "run the same command again") from None

    def close(self) -> None:
        if self.client is None:  # (closed already: `stops`)
            return
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.client = self.cluster = None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "no message"


def _connect(Client, address: str):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"--address {address}: expected HOST:PORT of a Dask scheduler (e.g. 10.0.0.1:8786)")
    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise EngineError(f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT:.0f} s "
                          f"({type(e).__name__}): start one there (`dask scheduler`, then `dask worker {address}` "
                          "on each machine) or leave out --address to start a local cluster") from None


@contextmanager
def open_engine(engine: str = "local", workers: int = 1, address: str | None = None):
    """The engine a step runs on (see the module docstring); closed (its local cluster stopped) on exit."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if workers < 1:
        raise EngineError("--workers must be >= 1")
    if address is not None and engine != "dask":
        raise EngineError(f"--address {address} names a Dask scheduler: add --engine dask (or leave out --address)")
    runner = LocalEngine(workers) if engine == "local" else DaskEngine(workers, address)
    try:
        yield runner
    finally:
        runner.close()


@contextmanager
def stops(runner):
    """Close `runner` when the block ends, before the contexts entered ahead of this one exit (a DatasetWriter
    removing its partial folder on Ctrl-C or an error: a worker still writing a shard made it again after)."""
    try:
        yield runner
    finally:
        runner.close()


def add_engine_arguments(parser) -> None:
    """--engine and --address, as every data step's command line takes them."""
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: --workers processes here (default); dask: a Dask cluster, the one at --address or "
                             "a local one of --workers processes started and stopped by this command (the output is "
                             "the same bytes either way)")
    parser.add_argument("--address", metavar="HOST:PORT", help="with --engine dask: the scheduler of an existing "
                        "cluster (its workers must import this project and see the input and output folders)")


class Progress:
    """The driver's progress: pieces done (of the total when it is known), MB done of the total and MB/s. A
    tqdm bar on a terminal; elsewhere (a log file) a line on stderr every `every` seconds and at the end."""

    def __init__(self, enabled: bool, label: str, total_bytes: int | None = None, total_pieces: int | None = None,
                 unit: str = "B", every: float = 30.0):
        self.enabled, self.label, self.every, self.unit = enabled, label, every, unit
        self.total_bytes, self.total_pieces = total_bytes, total_pieces
        self.bytes = self.pieces = 0
        self.extra = ""
        self.bar = None
        self.start = self.last = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, unit=unit, unit_scale=True, desc=label, file=sys.stderr)

    def update(self, pieces: int = 0, done_bytes: int | None = None, add_bytes: int = 0, extra: str = "") -> None:
        """`pieces` more pieces done; the bytes done so far (`done_bytes`) or more of them (`add_bytes`)."""
        if not self.enabled:
            return
        before = self.bytes
        self.pieces += pieces
        self.bytes = done_bytes if done_bytes is not None else self.bytes + add_bytes
        self.extra = extra or self.extra
        if self.bar is not None:
            self.bar.update(self.bytes - before)
            self.bar.set_postfix_str(f"{self._pieces()}{', ' + self.extra if self.extra else ''}", refresh=False)
        elif time.perf_counter() - self.last >= self.every:
            self.last = time.perf_counter()
            self.line()

    def _pieces(self) -> str:
        of = f" of {self.total_pieces:,}" if self.total_pieces is not None else ""
        return f"{self.pieces:,}{of} piece{'' if (self.total_pieces or self.pieces) == 1 else 's'}"

    def line(self) -> None:
        seconds = time.perf_counter() - self.start
        share = f" ({self.bytes / self.total_bytes:.1%})" if self.total_bytes else ""
        if self.unit == "B":
            of = f" of {self.total_bytes / 1e6:,.1f}" if self.total_bytes else ""
            amount = f"{self.bytes / 1e6:,.1f}{of} MB{share}, {self.bytes / 1e6 / max(seconds, 1e-9):,.2f} MB/s"
        else:
            of = f" of {self.total_bytes:,}" if self.total_bytes else ""
            amount = f"{self.bytes:,}{of} {self.unit}{share}, {self.bytes / max(seconds, 1e-9):,.1f} {self.unit}/s"
        print(f"{self.label}: {self._pieces()}, {amount}{', ' + self.extra if self.extra else ''}, {seconds:.0f} s",
              file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(exc_type is None)
        return False

    def close(self, ok: bool = True) -> None:
        """The last line on success; on an error nothing is left (the error is the one line)."""
        if self.bar is not None:
            self.bar.leave = ok
            self.bar.close()
        elif self.enabled and ok:
            self.line()


def library_versions(*names: str) -> dict:
    """{"python": ..., name: installed version, ...}: what a manifest records of the code that wrote it."""
    from importlib.metadata import version

    return {"python": platform.python_version()} | {name: version(name) for name in names}
