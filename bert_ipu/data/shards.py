"""The dataset format: memory-mapped numpy shards plus a JSON manifest, for packed and unpacked data alike
(unpacked data is packs of one).

    DATASET/
      manifest.json                      written last: a dataset without it is not a dataset
      train/shard-00000/input_ids.npy    one .npy per field, (packs, ...) in the storage dtype below
      train/shard-00000/...
      train/shard-00000/sequence_lengths.npy   derived by the writer from sequence_ids (see DERIVED)
      validation/shard-00000/...

The manifest holds the layout (pack_len, mlm_slots, max_sequences_per_pack), per split the shards with
their pack counts and a sha256 over the shard's files, the derived fields it holds (`derived_fields`, each
with its own sha256 per shard in `derived_sha256`), and whatever the writer adds (counts, algorithm,
efficiency, histogram, seed, source, tool versions). A dataset is written into `DATASET.partial/`, every file
fsynced, and renamed when complete (an existing dataset is swapped out through `DATASET.old`, so one of the
two is always whole), so an interrupted run, a power loss or a full disk leaves nothing that looks like a
dataset. A writer holds `DATASET.lock` (flock) while it writes: a second writer of the same folder is refused.

Reading refuses, naming the file: a shard file that is truncated, not a .npy of the storage dtype (garbage,
a pickle, an object array), a manifest whose totals disagree with its shards, a vocab.txt of another size than
the manifest's vocab; with `verify` also a shard whose sha256 changed, a token id beyond the vocab, a row that
holds no sequence (all sequence ids 0) and a derived field that disagrees with the fields it is derived from.

Derived fields are facts about a pack that a reader would otherwise compute from its tokens: the writer
computes them from the shard's own arrays (no caller can get them wrong), so a reader needs only O(packs)
memory-mapped bytes, not O(tokens). `sequence_lengths` (packs, K) int32: column j - 1 = the tokens of the
pack's sequence of id j, 0 = none (the attention cost of a pack follows: `bert_ipu.data.loader`). Backward
and forward compatible without a format version change: a dataset written before has no `derived_fields`
(readers compute from `sequence_ids`), and the shard's `sha256` still covers the FIELDS files alone, so
code that does not know a derived field reads and verifies a dataset that has it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

from ..files import (PARTIAL, OutputBusy, OutputLock, describe_os_error, followed, fsync_dir, fsync_tree,
                     sha256_of, write_json)
from .layout import FIELDS, STORAGE, PackLayout, sequence_lengths_per_id

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# storage dtypes; the loader widens them to int64 / float32 tensors
# fields every writer derives from FIELDS (not model inputs); name -> (N, ...) arrays of the shard -> array
DERIVED = {"sequence_lengths": lambda arrays, layout: sequence_lengths_per_id(arrays["sequence_ids"],
                                                                               layout.max_sequences_per_pack)}


class DatasetError(ValueError):
    """A dataset on disk that is missing, incomplete or corrupt; the message says what and how to fix it."""


class DatasetWriter:
    """Write shards into DATASET.partial/, then `finish()` writes the manifest and renames.

    Use as a context manager: on an exception the partial folder is removed, the lock released, and a failed
    write (a full disk, a vanished folder: any OSError) becomes one DatasetError naming the file."""

    def __init__(self, out_dir: str | Path, layout: PackLayout, overwrite: bool = False):
        self.out_dir = followed(out_dir)  # a link to a dataset: the dataset is replaced where it is, the link kept
        self.layout = layout
        self._check_output(overwrite)  # before the lock: a refusal writes nothing
        try:
            self.lock = OutputLock(self.out_dir)
        except OutputBusy as e:
            raise DatasetError(str(e)) from None
        except OSError as e:
            raise DatasetError(f"cannot create {self.out_dir} ({e.strerror}); choose a folder that can be "
                               "written") from None
        try:  # again under the lock: a writer that finished meanwhile made a dataset there
            self._check_output(overwrite)
        except DatasetError:
            self.lock.release()
            raise
        self.partial = self.out_dir.with_name(self.out_dir.name + ".partial")
        self.old = self.out_dir.with_name(self.out_dir.name + ".old")
        try:
            if (self.old / MANIFEST).is_file() and not self.out_dir.exists():
                os.replace(self.old, self.out_dir)  # a replacement killed between its two renames: put it back
            elif self.old.exists():  # killed before (or while) removing the replaced dataset
                if _foreign(self.old):
                    raise DatasetError(f"{self.old} is in the way (a dataset's replacement is swapped out through "
                                       "it) and is not a dataset of this project; move it away") from None
                shutil.rmtree(self.old)
            if self.partial.exists():
                if _foreign(self.partial, partial=True):
                    raise DatasetError(f"{self.partial} is in the way (a dataset is written there before it takes "
                                       "its name) and is not a dataset of this project; move it away") from None
                shutil.rmtree(self.partial)  # left by an interrupted run
            self.partial.mkdir(parents=True)
        except OSError as e:
            self.lock.release()
            raise DatasetError(f"cannot create {self.out_dir} ({e.strerror}); choose a folder that can be "
                               "written") from None
        self.splits: dict[str, list[dict]] = {}

    def _check_output(self, overwrite: bool) -> None:
        if self.out_dir.exists() and not overwrite:
            raise DatasetError(f"{self.out_dir} exists; choose another output or pass --overwrite")
        if self.out_dir.exists() and not (self.out_dir / MANIFEST).is_file():
            raise DatasetError(f"{self.out_dir} exists and is not a dataset of this project (no {MANIFEST}); "
                               "--overwrite only replaces a dataset, nothing was deleted: choose another output")
        foreign = _foreign(self.out_dir) if self.out_dir.is_dir() else []  # a run's output_dir, a user's notes
        if foreign:
            raise DatasetError(f"{self.out_dir} holds files this project's dataset writer did not write "
                               f"({', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}); --overwrite "
                               "replaces a dataset whole, so nothing was deleted: move them away, or choose "
                               "another output")

    def write_shard(self, split: str, arrays: dict[str, np.ndarray]) -> dict:
        name = self.next_shard(split)
        return self.add_shard(split, {"name": name, **write_shard_files(self.partial / name, arrays, self.layout)})

    def next_shard(self, split: str, offset: int = 0) -> str:
        """The name of the split's shard `offset` places after those added so far (a worker can write it)."""
        return f"{split}/shard-{len(self.splits.get(split, [])) + offset:05d}"

    def add_shard(self, split: str, entry: dict) -> dict:
        """Record a shard written (by `write_shard_files`) into `self.partial / entry["name"]`, in order."""
        assert entry["name"] == self.next_shard(split), (entry["name"], "shards out of order")
        self.splits.setdefault(split, []).append(entry)
        return entry

    def finish(self, info: dict) -> Path:
        """Manifest, the checks every reader makes (a DatasetError here leaves nothing), fsync, then swap
        DATASET.partial in: DATASET -> DATASET.old, DATASET.partial -> DATASET, DATASET.old removed. A kill at any
        point leaves the old or the new dataset whole (the next writer puts DATASET.old back if DATASET is
        missing)."""
        manifest = {
            "format_version": FORMAT_VERSION,
            "layout": {"pack_len": self.layout.pack_len, "mlm_slots": self.layout.mlm_slots,
                       "max_sequences_per_pack": self.layout.max_sequences_per_pack},
            "splits": {split: {"packs": sum(s["packs"] for s in shards), "shards": shards}
                       for split, shards in self.splits.items()},
            **info,
            "derived_fields": list(DERIVED),  # after info: what this writer wrote, whatever a caller copied
        }
        write_json(self.partial / MANIFEST, manifest, default=_json_default)
        try:  # what every reader checks, before the name is taken: a dataset that cannot be read is never left
            PackedDataset(self.partial)
        except DatasetError as e:
            raise DatasetError(f"{self.out_dir} was not written: what was about to be written fails its own "
                               f"checks ({e})") from None
        fsync_tree(self.partial)
        if self.out_dir.exists():
            os.replace(self.out_dir, self.old)
        os.replace(self.partial, self.out_dir)
        fsync_dir(self.out_dir.parent)
        if self.old.exists():
            shutil.rmtree(self.old)
        self.lock.release()
        return self.out_dir

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            if self.old.exists() and not self.out_dir.exists():
                os.replace(self.old, self.out_dir)  # failed between the two renames: the old dataset stays
            if self.partial.exists():
                shutil.rmtree(self.partial, ignore_errors=True)
        self.lock.release()
        if isinstance(exc, OSError):  # the disk, not the input: say which file and that nothing was left
            kept = " (the dataset already there is unchanged)" if self.out_dir.exists() else ""
            raise DatasetError(f"writing {self.out_dir} failed: {describe_os_error(exc)}; nothing was written{kept}: "
                               "free space (or fix the cause) and run again") from None
        return False


def write_shard_files(folder: Path, arrays: dict[str, np.ndarray], layout: PackLayout) -> dict:
    """One shard's .npy files (FIELDS, then DERIVED) into the new `folder`: its manifest entry, less its name.
    Any process may run it (the packing step's workers do), the writer records the entries in order. A task run
    again after its worker was killed mid-write finds the folder of its first try: it rewrites every file whole."""
    folder.mkdir(parents=True, exist_ok=True)
    packs = len(arrays["input_ids"])
    paths = []
    for field in FIELDS:
        data = np.ascontiguousarray(arrays[field]).astype(STORAGE[field], copy=False)
        if len(data) != packs:
            raise ValueError(f"field {field} has {len(data)} rows, expected {packs}")
        np.save(folder / f"{field}.npy", data)
        paths.append(folder / f"{field}.npy")
    entry = {"packs": packs, "sha256": sha256_of(paths), "derived_sha256": {}}
    for field, derive in DERIVED.items():
        np.save(folder / f"{field}.npy", derive(arrays, layout).astype(STORAGE[field], copy=False))
        entry["derived_sha256"][field] = sha256_of([folder / f"{field}.npy"])
    return entry


def _split_names(folder: Path) -> set[str]:
    """The split folders a DatasetWriter writes into a dataset folder: train, validation and those its manifest
    names."""
    names = {"train", "validation"}
    try:
        splits = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("splits", {})
        names |= {str(name) for name in splits} if isinstance(splits, dict) else set()
    except (OSError, ValueError, AttributeError):
        pass
    return names


_SHARD_FILES = {f"{field}.npy" for field in (*FIELDS, *DERIVED)}


def _foreign(folder: Path, partial: bool = False) -> list[str]:
    """What in a dataset folder a DatasetWriter does not write (relative paths; empty: the folder holds nothing but
    its output, so removing it deletes no user file): at the top, the manifest (or the file it is written to
    first) and vocab.txt as files, and split folders (`_split_names`; in a `partial` DATASET.partial also any
    folder holding shard folders: a split the manifest, not written yet, would name) holding only shard-NNNNN
    folders of the fields' .npy files. A user's file anywhere, in a split folder or a shard too, is foreign."""
    found, splits = [], _split_names(folder)
    for p in sorted(folder.iterdir()):
        if p.is_file() and not p.is_symlink() and p.name in {"vocab.txt", MANIFEST, MANIFEST + ".tmp",
                                                             MANIFEST + PARTIAL}:
            continue
        if not p.is_dir() or p.is_symlink() or not (p.name in splits or partial and _holds_shards(p)):
            found.append(p.name)
            continue
        for shard in sorted(p.iterdir()):
            if not (_SHARD.fullmatch(shard.name) and shard.is_dir() and not shard.is_symlink()):
                found.append(f"{p.name}/{shard.name}")
                continue
            found += [f"{p.name}/{shard.name}/{q.name}" for q in sorted(shard.iterdir())
                      if q.name not in _SHARD_FILES or not q.is_file() or q.is_symlink()]
    return found


_SHARD = re.compile(r"shard-\d{5,}")


def _holds_shards(folder: Path) -> bool:
    """Whether a folder holds shard folders (shard-NNNNN): a split's."""
    return any(_SHARD.fullmatch(q.name) for q in folder.iterdir())


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to the manifest")


class PackedDataset:
    """A dataset on disk: its manifest and memory-mapped shards."""

    def __init__(self, path: str | Path, verify: bool = False):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            partial = self.path.with_name(self.path.name + ".partial")
            previous = self.path.with_name(self.path.name + ".old")
            hint = (f" ({previous} is the dataset an interrupted --overwrite was replacing: run the command again, "
                    "or rename it back)" if (previous / MANIFEST).is_file()
                    else f" ({partial} is an interrupted run: run the command again)" if partial.exists() else "")
            raise DatasetError(f"{self.path} is not a dataset: no {MANIFEST}{hint}; create it with "
                               "data/create_pretraining_data.py or data/pack_pretraining_data.py")
        try:
            self.manifest = json.loads(manifest_path.read_text())
            lay = self.manifest["layout"]
            self.layout = PackLayout(lay["pack_len"], lay["mlm_slots"], lay["max_sequences_per_pack"])
            self.manifest["splits"]  # noqa: B018 - must exist
            bad = [k for k, v in vars(self.layout).items()
                   if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "mlm_slots" else 1)]
            if bad:
                raise TypeError(f"layout {', '.join(f'{k}={getattr(self.layout, k)!r}' for k in bad)}: not a whole "
                                "number of the right size")
        except UnicodeDecodeError:
            raise DatasetError(f"{manifest_path} is not a JSON text file (not UTF-8: damaged or not a manifest); "
                               "recreate the dataset") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetError(f"{manifest_path} is malformed ({e}); recreate the dataset") from None
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise DatasetError(f"{self.path}: format version {self.manifest.get('format_version')} is not "
                               f"{FORMAT_VERSION}; recreate the dataset with this version")
        self._check_shards()
        self._check_pretraining_files()
        if verify:
            self.verify_checksums()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def packs(self, split: str) -> int:
        self._require(split)
        return self.manifest["splits"][split]["packs"]

    def has_derived(self, field: str) -> bool:
        """Whether every shard holds the derived field (datasets written before it existed do not)."""
        listed = self.manifest.get("derived_fields", [])
        return field in DERIVED and isinstance(listed, list) and field in listed

    def _require(self, split: str) -> None:
        if split not in self.manifest["splits"]:
            raise DatasetError(f"{self.path} has no split {split!r}; it has {', '.join(self.splits)}")

    def _shape_of(self, field: str) -> tuple:
        S, M, K = self.layout.pack_len, self.layout.mlm_slots, self.layout.max_sequences_per_pack
        return {"masked_lm_labels": (M,), "next_sentence_labels": (K,), "next_sentence_weights": (K,),
                "sequence_lengths": (K,)}.get(field, (S,))

    def _check_shards(self) -> None:
        """Cheap consistency of manifest and files: every shard and field present with the right shape, and
        each split's total the sum of its shards."""
        splits = self.manifest["splits"]
        derived = [field for field in DERIVED if self.has_derived(field)]  # a field unknown here is ignored
        if not isinstance(splits, dict) or not splits or not all(isinstance(i, dict) and i.get("shards")
                                                                 for i in splits.values()):
            raise DatasetError(f"{self.path}: the manifest lists no split or a split of no shard: an empty or "
                               "damaged dataset; recreate it")
        unlisted = sorted(p.name for p in self.path.iterdir() if p.is_dir() and p.name not in splits
                          and _holds_shards(p))
        if unlisted:  # (a split removed from the manifest was silently gone, "checksums OK")
            raise DatasetError(f"{self.path}: split folder {unlisted[0]} holds shards the manifest does not list: a "
                               "damaged manifest; recreate the dataset")
        for split, info in splits.items():
            for shard in info["shards"]:  # every entry before any is read: a damaged manifest is one line
                ok = (isinstance(shard, dict) and isinstance(shard.get("name"), str) and shard["name"]
                      and not Path(shard["name"]).is_absolute() and ".." not in Path(shard["name"]).parts
                      and isinstance(shard.get("packs"), int)
                      and not isinstance(shard.get("packs"), bool) and shard["packs"] >= 0
                      and isinstance(shard.get("sha256"), str) and isinstance(shard.get("derived_sha256", {}), dict))
                if not ok:
                    raise DatasetError(f"{self.path}: split {split} lists a shard entry {str(shard)[:80]!r} without "
                                       "a name, a pack count and a sha256: a damaged manifest; recreate the dataset")
            packing = self.manifest.get("packing", {})  # instances (unpacked) have none: a factor of 1
            entry = packing.get(split, {}) if isinstance(packing, dict) else None
            factor = entry.get("packing_factor", 1.0) if isinstance(entry, dict) else None
            if (not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor)
                    or not 1 <= factor <= max(1, self.layout.max_sequences_per_pack)):
                raise DatasetError(f"{self.path}: split {split}'s packing factor {factor!r} is not a number between 1 "
                                   f"and the packs' depth {self.layout.max_sequences_per_pack}: a damaged manifest; "
                                   "recreate the dataset")
            if info.get("packs") != sum(shard["packs"] for shard in info["shards"]):
                raise DatasetError(f"{self.path}: split {split} says {info.get('packs')} packs but its shards hold "
                                   f"{sum(shard['packs'] for shard in info['shards'])}; recreate the dataset")
            for shard in info["shards"]:
                if any(field not in shard.get("derived_sha256", {}) for field in derived):
                    raise DatasetError(f"{self.path}: the manifest lists derived fields {derived} but shard "
                                       f"{shard['name']} has no checksum for them: a damaged manifest; recreate "
                                       "the dataset")
                for field in (*FIELDS, *derived):
                    path = self.path / shard["name"] / f"{field}.npy"
                    if not path.is_file():
                        raise DatasetError(f"{self.path}: {shard['name']}/{field}.npy is missing; the dataset does "
                                           "not match its manifest: recreate it")
                    arr = self._open(path, field)
                    if arr.shape != (shard["packs"], *self._shape_of(field)):
                        raise DatasetError(f"{path}: shape {arr.shape} does not match the manifest "
                                           f"({shard['packs']}, {self._shape_of(field)}); recreate the dataset")

    @staticmethod
    def _open(path: Path, field: str) -> np.ndarray:
        """A shard file as a memory map of its storage dtype, or a DatasetError naming the file (never a
        traceback, never unpickled)."""
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
            raise DatasetError(f"{path} is not a readable shard ({why}): truncated or not written by this "
                               "project; recreate the dataset") from None
        if not isinstance(arr, np.ndarray) or arr.dtype != STORAGE[field]:
            what = f"dtype {arr.dtype}" if isinstance(arr, np.ndarray) else "not a single array"
            raise DatasetError(f"{path} holds {what}, not {np.dtype(STORAGE[field])}: not written by this project; "
                               "recreate the dataset")
        return arr

    def _check_pretraining_files(self) -> None:
        """What every reader of a pretraining dataset needs besides the shards: vocab.txt and the manifest's
        vocab size and instance settings (packing rebuilds the instance config; training sizes the model)."""
        if self.manifest.get("kind") not in ("instances", "packed"):
            return
        if not (self.path / "vocab.txt").is_file():
            raise DatasetError(f"{self.path} has no vocab.txt (every dataset carries the vocab it was tokenized "
                               "with); recreate it with data/create_pretraining_data.py")
        vocab = self.manifest.get("vocab")
        size = vocab.get("size") if isinstance(vocab, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise DatasetError(f"{self.path / MANIFEST} has no vocab size (\"vocab\": {{\"size\": N}}); recreate "
                               "the dataset with data/create_pretraining_data.py")
        try:  # read as the tokenizer read it (WordPiece: one token a line), so the ids index it
            tokens = len((self.path / "vocab.txt").read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as e:
            raise DatasetError(f"{self.path / 'vocab.txt'} cannot be read ({getattr(e, 'strerror', None) or e}); "
                               "copy back the vocab the dataset was made with, or recreate it") from None
        if tokens != vocab["size"]:
            raise DatasetError(f"{self.path / 'vocab.txt'} holds {tokens} tokens but the dataset's ids index a vocab "
                               f"of {vocab['size']} ({MANIFEST}): a truncated or replaced vocab; copy back the vocab "
                               "the dataset was made with, or recreate the dataset")
        # the same size is not the same vocab (a shuffled one decodes every id into another word): its sha256, where
        # the manifest records it (datasets written before it do not), on every open (a vocab is a few hundred KB)
        if "sha256" in vocab and sha256_of([self.path / "vocab.txt"]) != vocab["sha256"]:
            raise DatasetError(f"{self.path / 'vocab.txt'} is not the vocab the dataset was made with (its sha256 "
                               f"differs from {MANIFEST}'s): copy back that vocab, or recreate the dataset")
        self.instance_config()

    def instance_config(self):
        """The InstanceConfig the instances were created with (from the manifest), or a DatasetError."""
        from .instances import InstanceConfig
        from .text import DataInputError

        raw = self.manifest.get("instance_config")
        try:
            return InstanceConfig(**raw)
        except (TypeError, DataInputError) as e:
            problem = "missing" if raw is None else f"malformed ({e})"
            raise DatasetError(f"{self.path / MANIFEST}: instance_config is {problem}; recreate the dataset with "
                               "data/create_pretraining_data.py") from None

    def verify_checksums(self) -> None:
        """Every shard's sha256 against the manifest, every token id inside the vocab, every row holds a
        sequence, and every derived field equals what the writer derives from the shard's fields (reads the whole
        dataset: sha256 runs at about 1.5 GB/s here)."""
        derived = [field for field in DERIVED if self.has_derived(field)]
        for split, info in self.manifest["splits"].items():
            for index, shard in enumerate(info["shards"]):
                paths = [self.path / shard["name"] / f"{field}.npy" for field in FIELDS]
                if sha256_of(paths) != shard["sha256"] or any(
                        sha256_of([self.path / shard["name"] / f"{field}.npy"]) != shard["derived_sha256"][field]
                        for field in derived):
                    raise DatasetError(f"{self.path}: checksum mismatch in {shard['name']}: the files changed "
                                       "after writing; recreate the dataset")
                self._verify_token_ids(split, index)
                ids = self.shard(split, index, ["sequence_ids"])["sequence_ids"]
                empty = np.flatnonzero(~(np.asarray(ids) != 0).any(axis=1))
                if len(empty):  # a pack of no sequence: no loss, no count, and a length 0 that packing cannot place
                    raise DatasetError(f"{self.path}: {shard['name']} row {int(empty[0])} holds no sequence (all "
                                       f"sequence ids 0; {len(empty)} such rows): not written by this project; "
                                       "recreate the dataset")
                self._verify_derived(split, index, derived, {"sequence_ids": ids})

    def _verify_token_ids(self, split: str, index: int) -> None:
        """Token ids and MLM labels inside the vocab (a model's embedding would fail on one beyond it, a decoder
        would print nothing for it). Pretraining datasets only: they carry the vocab their ids index."""
        if self.manifest.get("kind") not in ("instances", "packed"):
            return
        size = self.manifest["vocab"]["size"]
        shard = self.shard(split, index, ["input_ids", "masked_lm_labels"])
        top = max(int(np.max(shard[f], initial=0)) for f in ("input_ids", "masked_lm_labels"))
        if top >= size:
            name = self.manifest["splits"][split]["shards"][index]["name"]
            raise DatasetError(f"{self.path}: {name} holds token id {top} but the vocab has {size} tokens "
                               f"(vocab.txt, {MANIFEST}): not the vocab the dataset was made with; recreate the "
                               "dataset with data/create_pretraining_data.py")

    def _verify_derived(self, split: str, index: int, derived: list[str], arrays: dict) -> None:
        """A derived field that disagrees with its source fields (a writer's bug: the checksums only say the
        bytes did not change since) would silently mislead its readers (e.g. the balanced loader's costs)."""
        name = self.manifest["splits"][split]["shards"][index]["name"]
        for field in derived:
            stored = self.shard(split, index, [field])[field]
            try:
                expected = DERIVED[field](arrays, self.layout)
            except ValueError as e:
                raise DatasetError(f"{self.path}: {name}: {e}: not written by this project; recreate the "
                                   "dataset") from None
            bad = np.flatnonzero((np.asarray(stored) != expected).any(axis=1))
            if len(bad):
                raise DatasetError(f"{self.path}: {name} row {int(bad[0])}: stored {field} "
                                   f"{np.asarray(stored[bad[0]]).tolist()} disagree with its sequence_ids "
                                   f"({expected[bad[0]].tolist()}; {len(bad)} such rows): recreate the dataset "
                                   "with data/pack_pretraining_data.py (or data/create_pretraining_data.py)")

    def shards(self, split: str) -> list[dict[str, np.ndarray]]:
        """The shards of a split as dicts of memory-mapped arrays."""
        self._require(split)
        return [self.shard(split, i) for i in range(len(self.manifest["splits"][split]["shards"]))]

    def shard(self, split: str, index: int, fields=FIELDS) -> dict[str, np.ndarray]:
        """One shard as memory maps. Mapped pages that were read count as resident memory until the maps
        are dropped, so bulk passes open shards one at a time and let them go."""
        self._require(split)
        name = self.manifest["splits"][split]["shards"][index]["name"]
        return {field: self._open(self.path / name / f"{field}.npy", field) for field in fields}

    def shard_sizes(self, split: str) -> list[int]:
        self._require(split)
        return [s["packs"] for s in self.manifest["splits"][split]["shards"]]

    def read(self, split: str, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
        """Packs [start, stop) of a split, concatenated across shards, widened to int64 / float32."""
        parts, at = [], 0
        stop = self.packs(split) if stop is None else stop
        for shard in self.shards(split):
            n = len(shard["input_ids"])
            lo, hi = max(start - at, 0), min(stop - at, n)
            if lo < hi:
                parts.append({f: shard[f][lo:hi] for f in FIELDS})
            at += n
        return {f: widen(f, np.concatenate([p[f] for p in parts]) if parts else
                         np.zeros((0, *self._shape_of(f)), dtype=STORAGE[f])) for f in FIELDS}


def widen(field: str, array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32 if field == "next_sentence_weights" else np.int64)


def gather(sizes: list[int], open_shard, rows: np.ndarray, fields=FIELDS) -> dict[str, np.ndarray]:
    """Rows (global indices across shards of `sizes` rows, in the given order) of every field.

    Shards are visited one at a time in ascending row order through `open_shard(i) -> {field: array}`; a
    caller that passes an opener of fresh memory maps keeps at most one shard's touched pages resident
    (the page cache maps in whole neighbourhoods of a scattered read, so mapping every shard at once would
    make the whole input resident)."""
    rows = np.asarray(rows, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= offsets[-1]):
        raise IndexError("row index out of range")
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    shard_of = np.searchsorted(offsets, sorted_rows, side="right") - 1
    parts: dict[str, list] = {f: [] for f in fields}
    for s in np.unique(shard_of):
        shard = open_shard(int(s))
        local = sorted_rows[shard_of == s] - offsets[s]
        for f in fields:
            parts[f].append(np.asarray(shard[f][local]))
        del shard
    out = {}
    for f in fields:
        stacked = np.concatenate(parts[f]) if parts[f] else np.zeros((0,), dtype=np.int64)
        result = np.empty_like(stacked)
        result[order] = stacked
        out[f] = result
    return out
