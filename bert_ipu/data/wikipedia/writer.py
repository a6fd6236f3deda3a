"""Writing BERT's text format from a Wikipedia source: ordered, resumable shards and a manifest written last.

    prepare("enwiki-latest-pages-articles.xml.bz2", "wiki/", workers=8)   # -> wiki/wiki-00000.txt, ...

Output: OUTPUT/wiki-00000.txt, wiki-00001.txt, ... with `docs_per_shard` articles each (the last one
fewer; an article that is empty after cleaning takes its place in the count but writes nothing), in the
dump's order, byte-identical for any number of workers. Workers convert and split; the main process reads
the dump and writes the shards in order.

Resumable: a shard is written to NAME.partial and renamed when complete; OUTPUT/progress.json (the source,
its size, docs_per_shard, and every complete shard with its counts, size and sha256) is rewritten after
each shard. A rerun with the same source and output re-reads the dump but skips the conversion of the
articles of complete shards, and writes what an uninterrupted run writes. OUTPUT/wikipedia.json, the
manifest (source, counts, shards, seconds), is written last and atomically. Every shard and record is fsynced
before its rename; a write that fails (a full disk) keeps the complete shards, as an interruption does. A run
holds OUTPUT.lock (flock) while it writes: a second run on the same output is refused.

Bad input (`WikipediaError`, one line): a missing or empty file, bytes that are not XML, XML that is not a
MediaWiki export, a truncated or corrupt compressed file, a dump without a <page> or without an article
that has text, an output that is a file or a folder that holds something else. When the input turns out bad
while shards are being written, this run's files are removed: no manifest and no shard is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from ...files import PARTIAL, OutputBusy, OutputLock, describe_os_error, followed, sha256_of, write_json
from ..jobs import Progress, library_versions, open_engine
from ..text import DataInputError
from .reader import WikipediaError, check_source, hf_pages, hf_rows, iter_pages, page_kind, sniff, source_size
from .wikitext import convert_batch

FORMAT_VERSION = 1
MANIFEST = "wikipedia.json"
PROGRESS = "progress.json"
SHARD = "wiki-{:05d}.txt"
_SHARD_RE = re.compile(r"^wiki-\d{5,}\.txt(\.partial)?$")
DEFAULT_DOCS_PER_SHARD = 10000
DEFAULT_BATCH_BYTES = 1 << 19  # wikitext a piece of work holds (0.5 MB)
MAX_BATCH_BYTES = 1 << 30  # a piece is held whole by a worker and (3 a worker in flight) by the scheduler
LICENSE = "the dump's licence (Wikipedia text: CC BY-SA 4.0 and GFDL)"


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None



WRITTEN_BY = "bert_ipu prepare_wikipedia"
"""the marker in this tool's records (progress.json, wikipedia.json): a folder is its output only when one of them
holds it, never because of the files' names"""


def marked(path: Path) -> bool:
    """Whether `path` is a record this tool wrote: its marker, or (records written before the marker) the identity
    of a conversion (source, docs_per_shard, sha256)."""
    record = _read_json(path)
    if record is None:
        return False
    identity = record.get("identity")
    return record.get("written_by") == WRITTEN_BY or (
        isinstance(identity, dict) and {"source", "docs_per_shard", "sha256"} <= set(identity))


def listed_shards(folder: Path) -> list[Path] | None:
    """The text shards of a `prepare_wikipedia.py` output (its records carry the tool's marker), as its
    wikipedia.json lists them, each checked against its recorded size; None for any other folder. An
    unfinished conversion (no wikipedia.json yet), a shard missing or of another size is refused: read as a
    plain folder it gave a corpus of whatever shards were there, without a word."""
    if not any(marked(folder / name) for name in (MANIFEST, PROGRESS)):
        return None
    fix = f"run data/prepare_wikipedia.py again with the same arguments to finish or repair {folder}"
    if not marked(folder / MANIFEST):
        raise DataInputError(f"{folder} is an unfinished prepare_wikipedia conversion (no {MANIFEST} yet); {fix}")
    try:
        records = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["shards"]
        shards = [(folder / r["file"], int(r["bytes"])) for r in records]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataInputError(f"{folder / MANIFEST} is malformed ({e}); {fix}") from None
    for path, size in shards:
        if not path.is_file() or path.stat().st_size != size:
            found = f"{path.stat().st_size:,} bytes" if path.is_file() else "missing"
            raise DataInputError(f"{path}: {found}, where {MANIFEST} records {size:,} bytes (changed or damaged); "
                                 f"{fix}")
    return [path for path, _ in shards]


def _ours(path: Path) -> bool:
    """A file of this tool's output, in a folder whose records are marked (`marked`)."""
    return bool(_SHARD_RE.match(path.name)) or path.name in (
        MANIFEST, PROGRESS, MANIFEST + PARTIAL, PROGRESS + PARTIAL,
        MANIFEST + ".tmp", PROGRESS + ".tmp")  # .tmp: what this tool's records were written as before


class _ShardWriter:
    """Articles arrive in order (index, sentences); shard k holds articles [k N, (k + 1) N). Each shard is
    written to NAME.partial and renamed once its last article is in; then progress.json is rewritten."""

    def __init__(self, output: Path, docs_per_shard: int, identity: dict, done: list[dict]):
        self.output, self.n, self.identity = output, docs_per_shard, identity
        self.shards = list(done)
        self.base = sum(r["articles"] for r in done)  # articles in the complete shards
        self.file = None
        self.partial: Path | None = None
        self._new_record()

    def _new_record(self) -> None:
        self.record = {"file": SHARD.format(len(self.shards)), "articles": 0, "documents": 0,
                       "empty_after_cleaning": 0, "sentences": 0, "bytes": 0}
        self.hash = hashlib.sha256()

    def add(self, index: int, sentences: list[str]) -> None:
        assert index == self.base + self.record["articles"], "articles out of order"
        if self.file is None:
            self.partial = self.output / (self.record["file"] + ".partial")
            self.file = open(self.partial, "wb")
        r = self.record
        r["articles"] += 1
        if sentences:
            data = ("\n" if r["documents"] else "") + "\n".join(sentences) + "\n"
            data = data.encode("utf-8")
            self.file.write(data)
            self.hash.update(data)
            r["documents"] += 1
            r["sentences"] += len(sentences)
            r["bytes"] += len(data)
        else:
            r["empty_after_cleaning"] += 1
        if r["articles"] == self.n:
            self.commit()

    def commit(self) -> None:
        if self.file is None:
            return
        self.file.flush()
        os.fsync(self.file.fileno())  # the shard's bytes reach the disk before its name and progress.json do
        self.file.close()
        self.file = None
        self.record["sha256"] = self.hash.hexdigest()
        os.replace(self.partial, self.output / self.record["file"])
        self.partial = None
        self.shards.append(self.record)
        self.base += self.record["articles"]
        _commit_shard(self.output, self.identity, self.shards)
        self._new_record()

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.partial is not None:
            self.partial.unlink(missing_ok=True)
            self.partial = None


def _write_progress(output: Path, identity: dict, shards: list[dict]) -> None:
    write_json(output / PROGRESS, {"written_by": WRITTEN_BY, "identity": identity, "shards": shards})


def _commit_shard(output: Path, identity: dict, shards: list[dict]) -> None:
    """Record the complete shards (after each one): what a rerun skips."""
    _write_progress(output, identity, shards)


def _check_output(output: Path, identity: dict, overwrite: bool) -> list[dict]:
    """The complete shards a rerun keeps (a verified prefix of progress.json); raises on an output that is
    a file or holds something else."""
    if output.exists() and not output.is_dir():
        raise WikipediaError(f"--output {output} is an existing file; give a folder (new, or one this tool "
                             "wrote for the same dump)")
    if not output.exists():
        return []
    entries = list(output.iterdir())
    # this tool's output only where its own record says so: a user's progress.json or wiki-00000.txt is theirs
    ours = any(marked(output / name) for name in (PROGRESS, MANIFEST))
    foreign = sorted(p.name for p in entries if not (ours and _ours(p)))
    if foreign:
        raise WikipediaError(f"--output {output} holds files this tool did not write ({', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}; no {PROGRESS} of this tool's); nothing was "
                             "changed: give a new or empty folder")
    if overwrite or not entries:
        for p in entries:
            p.unlink()
        return []
    progress = _read_json(output / PROGRESS) or {}
    manifest = _read_json(output / MANIFEST) or {}
    recorded = progress.get("identity") or manifest.get("identity")
    if recorded is None and not any(_SHARD_RE.match(p.name) and not p.name.endswith(".partial") for p in entries):
        for p in entries:  # only half-written files of a run stopped before its first shard
            p.unlink()
        return []
    if recorded != identity:
        if recorded is None:
            raise WikipediaError(f"--output {output} holds shards without {PROGRESS}; pass --overwrite to "
                                 "start over")
        if {k: v for k, v in recorded.items() if k != "sha256"} == {k: v for k, v in identity.items() if k != "sha256"}:
            raise WikipediaError(f"--output {output} holds the text of an earlier {recorded.get('source')}: its "
                                 "content changed since; pass --overwrite to make the text of the new one")
        raise WikipediaError(f"--output {output} holds the output of {recorded.get('source')} with "
                             f"--docs-per-shard {recorded.get('docs_per_shard')}; rerun with those to resume, "
                             "or pass --overwrite to start over")
    shards = progress.get("shards") or manifest.get("shards") or []
    done = []
    for i, record in enumerate(shards):
        path = output / SHARD.format(i)
        if (not isinstance(record, dict) or record.get("file") != path.name or not path.is_file()
                or path.stat().st_size != record.get("bytes") or sha256_of([path]) != record.get("sha256")
                or (done and done[-1].get("articles") != identity["docs_per_shard"])):  # only the last is short
            break
        done.append(record)
    # everything after the verified prefix is redone: drop it, and any half-written shard
    keep = {r["file"] for r in done} | {PROGRESS}
    for p in entries:
        if p.name not in keep and p.name != MANIFEST:
            p.unlink()
    if len(done) < len(shards):
        (output / MANIFEST).unlink(missing_ok=True)
    return done


def prepare(dump_or_dataset: str | Path, output: str | Path, workers: int = 1,
            docs_per_shard: int = DEFAULT_DOCS_PER_SHARD, progress: bool = True, overwrite: bool = False,
            source_type: str | None = None, batch_bytes: int = DEFAULT_BATCH_BYTES, engine: str = "local",
            address: str | None = None) -> dict:
    """A MediaWiki XML dump (file) or a Hugging Face wikipedia dataset (folder saved with save_to_disk) ->
    OUTPUT/wiki-NNNNN.txt in BERT's text format and OUTPUT/wikipedia.json. Returns the manifest.

    batch_bytes: the wikitext of a piece of work (a worker's task; at most batch_bytes / 1 KB articles, and 512
    whatever the size): larger pieces cost the scheduler less on a large cluster (see docs/data.md).
    workers: processes that clean and split (the output does not depend on it); engine, address: where they run
    (`jobs.open_engine`: "local" processes, or "dask": the scheduler at address, or a local Dask cluster of
    `workers`); the main process reads the source and writes the shards in order. source_type: "dump" or
    "hf-dataset" to insist on one (default: a folder is a dataset, a file a dump). Resumes the shards of an
    interrupted run with the same source and docs_per_shard; `overwrite` starts over instead."""
    start = time.perf_counter()
    if workers < 1 or docs_per_shard < 1:
        raise WikipediaError("--workers and --docs-per-shard must be >= 1")
    if batch_bytes > MAX_BATCH_BYTES:  # 1e9 MB made the whole dump one piece of work, held in memory
        raise WikipediaError(f"--batch-mb {batch_bytes / 2**20:g} is above {MAX_BATCH_BYTES >> 20} MB: a piece of work "
                             f"is held whole in memory, by a worker and by the scheduler; give at most "
                             f"{MAX_BATCH_BYTES >> 20} (default {DEFAULT_BATCH_BYTES / 2**20:g})")
    source, output = Path(dump_or_dataset), followed(output)  # a link: its folder, and the lock beside that
    kind = check_source(source, source_type)
    size = source_size(source)
    # by content, not path and size: a new dump saved over the old one (same path, same size) is another source
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    identity = {"source": str(source.resolve()), "type": kind, "bytes": size, "sha256": sha256_of(files),
                "docs_per_shard": docs_per_shard, "format_version": FORMAT_VERSION}
    with open_engine(engine, workers, address) as runner:  # first: a bad --address writes nothing, not even a lock
        try:
            lock = OutputLock(output)  # a second run writing the same folder is refused, not interleaved
        except OutputBusy as e:
            raise WikipediaError(str(e)) from None
        except OSError as e:
            raise WikipediaError(f"--output {output}: cannot create it ({e.strerror}); choose a folder that can be "
                                 "written") from None
        try:
            return _prepare(source, output, kind, size, identity, overwrite, runner, docs_per_shard, progress,
                            batch_bytes, start)
        except OSError as e:  # before the shards (progress.json, the folder itself): nothing is lost
            raise WikipediaError(f"{describe_os_error(e)}; fix the cause (free space) and run the same command "
                                 "again") from None
        finally:
            lock.release()


def _prepare(source: Path, output: Path, kind: str, size: int, identity: dict, overwrite: bool, runner,
             docs_per_shard: int, progress: bool, batch_bytes: int, start: float) -> dict:
    done = _check_output(output, identity, overwrite)
    manifest = _read_json(output / MANIFEST)
    if manifest and manifest.get("identity") == identity and len(done) == len(manifest.get("shards", [])):
        return manifest  # complete already: every shard verified
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    _write_progress(output, identity, done)  # from the start, the folder says whose output it is

    counts = {"pages": 0, "articles_kept": 0, "redirects": 0, "disambiguation": 0, "other_namespaces": 0,
              "empty_after_cleaning": 0, "sentences": 0, "bytes": 0}
    skip = sum(r["articles"] for r in done)  # articles of the complete shards: read, not converted
    writer = _ShardWriter(output, docs_per_shard, identity, done)
    if kind == "dump":
        bar = Progress(progress, f"{source.name} -> text", size)
        compression = sniff(source)
    else:
        bar = Progress(progress, f"{source.name} -> text", hf_rows(source), unit="rows")
        compression = None
    articles = 0  # article indices handed out, skipped ones included

    def on_progress(position: int) -> None:
        bar.update(done_bytes=position, extra=f"{articles:,} articles")

    def tasks():
        nonlocal articles
        pages = iter_pages(source, on_progress) if kind == "dump" else hf_pages(source, on_progress)
        text_kind = "wikitext" if kind == "dump" else "plain"
        batch, batch_size = [], 0
        for page in pages:
            counts["pages"] += 1
            what = page_kind(page)
            if what == "redirect":
                counts["redirects"] += 1
            elif what == "disambiguation":
                counts["disambiguation"] += 1
            elif what == "other_namespace":
                counts["other_namespaces"] += 1
            else:
                index = articles
                articles += 1
                if index < skip:
                    continue
                batch.append((index, page.text))
                batch_size += len(page.text)
                if batch_size >= batch_bytes or len(batch) >= max(512, batch_bytes >> 10):  # 1 KB an article
                    yield text_kind, batch
                    batch, batch_size = [], 0
        if batch:
            yield text_kind, batch

    ok = False
    try:
        for result in runner.map(convert_batch, tasks(), in_flight=3 * runner.workers):
            for index, sentences in result:
                writer.add(index, sentences)
            bar.update(pieces=1)
        writer.commit()  # the last shard, with fewer articles
        if articles < skip:
            raise WikipediaError(f"{source}: holds {articles:,} articles but {PROGRESS} records {skip:,} in "
                                 "complete shards; pass --overwrite to start over")
        shards = writer.shards
        for record in shards:
            counts["articles_kept"] += record["documents"]
            counts["empty_after_cleaning"] += record["empty_after_cleaning"]
            counts["sentences"] += record["sentences"]
            counts["bytes"] += record["bytes"]
        if counts["articles_kept"] == 0:
            raise WikipediaError(f"{source}: no article with text ({counts['pages']:,} pages: "
                                 f"{counts['redirects']:,} redirects, {counts['disambiguation']:,} disambiguation, "
                                 f"{counts['other_namespaces']:,} in other namespaces, "
                                 f"{counts['empty_after_cleaning']:,} empty after cleaning)")
        manifest = {
            "written_by": WRITTEN_BY,
            "kind": "wikipedia-text",
            "format": "BERT text: one sentence per line, a blank line between documents",
            "source": {"path": str(source), "type": kind, "bytes": size, "compression": compression,
                       "license": LICENSE},
            "identity": identity,
            "docs_per_shard": docs_per_shard,
            "counts": counts,
            "shards": shards,
            "resumed_shards": len(done),
            "seconds": time.perf_counter() - start,
            "versions": library_versions("mwparserfromhell", "sentencex"),
        }
        write_json(output / MANIFEST, manifest)  # last
        ok = True
    except WikipediaError:
        # bad input: nothing of this output is a conversion of it; leave nothing that looks complete
        writer.abort()
        for p in output.iterdir() if output.is_dir() else []:
            if _ours(p):
                p.unlink()
        if created:
            output.rmdir()
        raise
    except OSError as e:  # a full disk (or an unreadable dump): complete shards stay, as for an interruption
        writer.abort()
        raise WikipediaError(f"{describe_os_error(e)}; the complete shards in {output} are kept: fix the cause "
                             "(free space) and run the same command again to resume") from None
    except BaseException:
        writer.abort()  # interrupted: complete shards and progress.json stay for the rerun
        raise
    finally:
        bar.close(ok)
    return manifest
