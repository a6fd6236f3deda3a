"""Writing files so that a crash, a full disk or a second writer never leaves something that looks complete
but is not: fsync before a rename, and an exclusive lock per output.

    with OutputLock(Path("runs/data/packed_128")):     # a second writer of that folder is refused
        ...write NAME.partial/..., fsync_tree(partial), os.replace(partial, NAME), fsync_dir(NAME.parent)

An atomic rename only orders the names: without fsync a power loss after the rename can leave the new name
pointing at files whose data never reached the disk (empty or zero-filled). fsync of every file and folder of
the new tree, then of the parent folder after the rename, makes the rename the commit point.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (names created, renamed or removed in it) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a platform that cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):  # folders that cannot be synced: nothing to do
            raise
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root` (and `root` itself)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_file(Path(dirpath) / name)
        fsync_dir(Path(dirpath))


def write_atomic(path: Path, text: str) -> None:
    """Replace a small file whole: PATH.partial, fsync, rename, fsync of the folder. A reader sees the old text or
    the new, never a part (and after a power loss not an empty file under the new name)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def describe_os_error(e: OSError) -> str:
    """'No space left on device (runs/x/file.npy)': what failed, for a one-line error."""
    what = e.strerror or str(e)
    return f"{what} ({e.filename})" if e.filename else what


class OutputBusy(RuntimeError):
    """Another process is writing the same output."""


class OutputLock:
    """An exclusive, non-blocking lock (flock) on NAME.lock beside the output NAME, held while a job writes NAME.

    The lock file sits beside the output, not in it, because the output is replaced by a rename; it is left in
    place (removing it would let a third writer lock a new file while a second still holds the old one). The
    kernel releases the lock when the process ends, even by SIGKILL, so a killed job never blocks its rerun."""

    def __init__(self, output: Path):
        import fcntl

        output = Path(output)
        self.path = output.with_name(output.name + ".lock")
        output.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.close()
            raise OutputBusy(f"another process is writing {output} (it holds {self.path}); wait for it to finish "
                             "or choose another output") from None

    def release(self) -> None:
        if not self.file.closed:
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False
