"""What the data-preparation jobs share: a pool of worker processes whose results come back in input order
with a bounded read-ahead, and the library versions a manifest records.

    with worker_pool(4, initializer=init, initargs=(vocab,)) as pool:
        for result in ordered_map(pool, work, items, in_flight=8):   # in order; at most 8 items in memory
            ...

A worker that dies (killed, out of memory) raises `BrokenProcessPool` from `ordered_map` instead of leaving
the job waiting for a result that never comes (as `multiprocessing.Pool` does).
"""

from __future__ import annotations

import multiprocessing as mp
import platform
from collections import deque
from concurrent.futures import ProcessPoolExecutor


def worker_pool(workers: int, initializer=None, initargs=()) -> ProcessPoolExecutor:
    """`workers` spawned processes (spawn: no inherited locks or threads of the parent)."""
    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=initializer,
                               initargs=initargs)


def ordered_map(pool: ProcessPoolExecutor, fn, items, in_flight: int):
    """Like `pool.map`, in input order, but reading at most `in_flight` items ahead of the consumer (`map`
    submits every item at once, holding the whole input in memory)."""
    pending = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def library_versions(*names: str) -> dict:
    """{"python": ..., name: installed version, ...}: what a manifest records of the code that wrote it."""
    from importlib.metadata import version

    return {"python": platform.python_version()} | {name: version(name) for name in names}
