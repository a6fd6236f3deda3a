"""Child processes that end with their parent: a kill -9 of a command must not leave its workers running.

    die_with_parent(parent_pid)   # first thing in a child process: a pool's initializer, a launched stage

Linux only (prctl PR_SET_PDEATHSIG); elsewhere nothing. Linux sends the signal when the thread that started the
child ends, so children are started from the main thread (the data steps' pools and the launcher are).
"""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send this process `sig` when its parent dies. A parent that died before the request took effect
    (this process has another parent now: `parent_pid` when given, else any re-parenting to init) sends it now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() == 1 or (parent_pid is not None and os.getppid() != parent_pid):
        os.kill(os.getpid(), sig)
