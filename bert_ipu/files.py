"""Writing files so that a crash, a full disk or a second writer never leaves something that looks complete
but is not: fsync before a rename, an exclusive lock per output, and checksums. The one helper per fact:
every writer of the project (datasets, Wikipedia text, checkpoints, runs, exports) uses these.

    with OutputLock(Path("runs/data/packed_128")):     # a second writer of that folder is refused
        ...write NAME.partial/..., fsync_tree(partial), os.replace(partial, NAME), fsync_dir(NAME.parent)
    write_json(Path("runs/x/results.json"), result)   # whole or not at all
    sha256_of([Path("a.npy"), Path("b.npy")])          # one checksum over files, in order

An atomic rename only orders the names: without fsync a power loss after the rename can leave the new name
pointing at files whose data never reached the disk (empty or zero-filled). fsync of every file and folder of
the new tree, then of the parent folder after the rename, makes the rename the commit point.
"""

from __future__ import annotations

import errno
import hashlib
import json
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


PARTIAL = ".partial"  # the suffix of a file or folder being written; renamed when complete


def followed(output: Path) -> Path:
    """The folder an output named through a symbolic link stands for: where the link points (a dangling link: where
    it would point), so a writer's temporary names, lock and final rename sit beside the real folder and the link
    is kept (renaming over the link replaced the link, and the old folder's removal refused it). Other paths are
    returned as they are."""
    output = Path(output)
    return Path(os.path.realpath(output)) if output.is_symlink() else output


def write_atomic(path: Path, text: str) -> None:
    """Replace a small file whole: PATH.partial, fsync, rename, fsync of the folder. A reader sees the old text or
    the new, never a part (and after a power loss not an empty file under the new name)."""
    path = Path(path)
    tmp = path.with_name(path.name + PARTIAL)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_atomic_with(path: Path, write) -> None:
    """`write(f)` into PATH.partial (a binary file), then fsync and rename as `write_atomic` (for a figure:
    `lambda f: fig.savefig(f, format="png")`); the partial file is removed if `write` fails."""
    path = Path(path)
    tmp = path.with_name(path.name + PARTIAL)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_SOFTWARE = "bert_ipu"
"""the Software text of every figure this project writes (`save_png`): a PNG is its output only when it says so
(any PNG was replaced before, a user's figure too)"""


def save_png(fig, path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG marked as this project's (PNG_SOFTWARE), written atomically."""
    write_atomic_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=dpi,
                                                        metadata={"Software": PNG_SOFTWARE}))


def is_png(head: bytes) -> bool:
    """A PNG this project wrote (`save_png`): its signature, and its Software text chunk before the image data;
    or matplotlib's own, which every plot of this project carried before it had the mark (a rerun of `make
    report` would otherwise refuse its own earlier plots). Any other PNG is a user's: never replaced."""
    return head.startswith(PNG_SIGNATURE) and (b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in head
                                               or b"tEXtSoftware\x00Matplotlib version" in head)


def output_file_problem(path, flag: str, ours) -> str | None:
    """Why a command cannot write its output file `path` (`flag` names it in the message), to be asked before
    the work starts: its folder does not exist or cannot be written, it is a folder, or it is a non-empty file
    whose first 64 KiB `ours(bytes)` does not recognise as this project's output of that kind (a dataset's
    manifest.json given as --json, say): a file the project did not write is never replaced. None if it can be
    written."""
    path = Path(path)
    folder = path.absolute().parent
    if path.is_dir():
        return f"{flag} {path} is a folder; give a file name in it"
    if not folder.is_dir():
        return f"{flag} {path}: the folder {folder} does not exist; create it first"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{flag} {path}: the folder {folder} is not writable"
    if path.exists():
        try:
            with open(path, "rb") as f:
                head = f.read(65536)
        except OSError as e:
            return f"{flag} {path}: cannot read the file there ({describe_os_error(e)})"
        if head and not ours(head):
            return (f"{flag} {path} exists and is not an output of this kind that this project wrote; move it away "
                    "or choose another name")
    return None


BENCHMARK_MARK = "bert_ipu benchmarks"
"""the `written_by` of every JSON object or row a benchmark writes (`write_rows`): such a file is its output"""


def is_benchmark_json(head: bytes) -> bool:
    """A JSON file or JSON lines a benchmark wrote (`write_rows`): its first object says so."""
    return f'"written_by": "{BENCHMARK_MARK}/'.encode() in head[:4096]


def write_rows(path, rows, script: str, lines: bool = True) -> None:
    """A benchmark's rows (dicts), each marked `written_by: BENCHMARK_MARK script`, atomically: JSON lines, or
    (`lines=False`) one indented JSON value (a dict, or a list of rows). Check the path first, before measuring:
    `output_file_problem(path, flag, is_benchmark_json)`."""
    mark = {"written_by": f"{BENCHMARK_MARK}/{script}"}
    if lines:
        write_atomic(Path(path), "".join(json.dumps({**mark, **r}) + "\n" for r in rows))
    else:
        value = {**mark, **rows} if isinstance(rows, dict) else [{**mark, **r} for r in rows]
        write_atomic(Path(path), json.dumps(value, indent=1) + "\n")


def write_json(path: Path, value, default=str) -> None:
    """`value` as indented JSON (UTF-8, one trailing newline), written atomically (`write_atomic`); `default`
    turns what JSON has no type for into something it has (str by default: paths, numpy scalars' repr)."""
    write_atomic(path, json.dumps(value, indent=1, ensure_ascii=False, default=default) + "\n")


def sha256_of(paths) -> str:
    """One sha256 over the bytes of `paths` in order, read in 4 MiB blocks (about 1 s per GB)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def describe_os_error(e: OSError) -> str:
    """'No space left on device (runs/x/file.npy)': what failed, for a one-line error."""
    what = e.strerror or str(e)
    return f"{what} ({e.filename})" if e.filename else what


class OutputBusy(RuntimeError):
    """Another process is writing the same output."""


class OutputLock:
    """An exclusive, non-blocking lock (flock) held while a job writes the output NAME: on NAME.lock beside it
    by default, or on `lock_file` (a run folder locks OUTPUT/.lock inside itself: it is never replaced whole).

    The lock file is removed on release, while still locked, so that a finished job leaves nothing beside its
    output. A writer that locked a file just removed (it opened the name before the removal) sees that the name
    no longer leads to its file and tries again, so two writers never hold two files of one name. The kernel
    releases the lock when the process ends, even by SIGKILL, so a killed job never blocks its rerun (its lock
    file is then left, and reused)."""

    def __init__(self, output: Path, lock_file: Path | None = None):
        import fcntl

        output = Path(output)
        self.path = Path(lock_file) if lock_file is not None else output.with_name(output.name + ".lock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            self.file = open(self.path, "a+")
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.file.close()
                raise OutputBusy(f"another process is writing {output} (it holds {self.path}); wait for it to "
                                 "finish or choose another output") from None
            try:
                if os.stat(self.path).st_ino == os.fstat(self.file.fileno()).st_ino:
                    return
            except FileNotFoundError:
                pass
            self.file.close()  # the holder before removed it as this opened it: lock the name's file now

    def release(self) -> None:
        if not self.file.closed:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False
