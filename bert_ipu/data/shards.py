"""The dataset format: memory-mapped numpy shards plus a JSON manifest, for packed and unpacked data alike
(unpacked data is packs of one).

    DATASET/
      manifest.json                      written last: a dataset without it is not a dataset
      train/shard-00000/input_ids.npy    one .npy per field, (packs, ...) in the storage dtype below
      train/shard-00000/...
      validation/shard-00000/...

The manifest holds the layout (pack_len, mlm_slots, max_sequences_per_pack), per split the shards with
their pack counts and a sha256 over the shard's files, and whatever the writer adds (counts, algorithm,
efficiency, histogram, seed, source, tool versions). A dataset is written into `DATASET.partial/` and
renamed when complete, so an interrupted run leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from .layout import FIELDS, PackLayout

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# storage dtypes; the loader widens them to int64 / float32 tensors
STORAGE = {"input_ids": np.int32, "position_ids": np.int16, "token_type_ids": np.int8, "sequence_ids": np.int16,
           "masked_lm_labels": np.int32, "next_sentence_labels": np.int8, "next_sentence_weights": np.int8}


class DatasetError(ValueError):
    """A dataset on disk that is missing, incomplete or corrupt; the message says what and how to fix it."""


def _sha256_files(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


class DatasetWriter:
    """Write shards into DATASET.partial/, then `finish()` writes the manifest and renames.

    Use as a context manager: on an exception the partial folder is removed."""

    def __init__(self, out_dir: str | Path, layout: PackLayout, overwrite: bool = False):
        self.out_dir = Path(out_dir)
        self.layout = layout
        if self.out_dir.exists() and not overwrite:
            raise DatasetError(f"{self.out_dir} exists; choose another output or pass --overwrite")
        if self.out_dir.exists() and not (self.out_dir / MANIFEST).is_file():
            raise DatasetError(f"{self.out_dir} exists and is not a dataset of this project (no {MANIFEST}); "
                               "--overwrite only replaces a dataset, nothing was deleted: choose another output")
        self.partial = self.out_dir.with_name(self.out_dir.name + ".partial")
        if self.partial.exists():
            shutil.rmtree(self.partial)  # left by an interrupted run
        try:
            self.partial.mkdir(parents=True)
        except OSError as e:
            raise DatasetError(f"cannot create {self.out_dir} ({e.strerror}); choose a folder that can be written") from None
        self.splits: dict[str, list[dict]] = {}

    def write_shard(self, split: str, arrays: dict[str, np.ndarray]) -> dict:
        shards = self.splits.setdefault(split, [])
        name = f"{split}/shard-{len(shards):05d}"
        folder = self.partial / name
        folder.mkdir(parents=True)
        packs = len(arrays["input_ids"])
        paths = []
        for field in FIELDS:
            data = np.ascontiguousarray(arrays[field]).astype(STORAGE[field], copy=False)
            if len(data) != packs:
                raise ValueError(f"field {field} has {len(data)} rows, expected {packs}")
            np.save(folder / f"{field}.npy", data)
            paths.append(folder / f"{field}.npy")
        entry = {"name": name, "packs": packs, "sha256": _sha256_files(paths)}
        shards.append(entry)
        return entry

    def finish(self, info: dict) -> Path:
        manifest = {
            "format_version": FORMAT_VERSION,
            "layout": {"pack_len": self.layout.pack_len, "mlm_slots": self.layout.mlm_slots,
                       "max_sequences_per_pack": self.layout.max_sequences_per_pack},
            "splits": {split: {"packs": sum(s["packs"] for s in shards), "shards": shards}
                       for split, shards in self.splits.items()},
            **info,
        }
        tmp = self.partial / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, default=_json_default) + "\n")
        os.replace(tmp, self.partial / MANIFEST)
        if self.out_dir.exists():
            shutil.rmtree(self.out_dir)
        os.replace(self.partial, self.out_dir)
        return self.out_dir

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.partial.exists():
            shutil.rmtree(self.partial, ignore_errors=True)
        return False


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
            hint = f" ({partial} is an interrupted run: run the command again)" if partial.exists() else ""
            raise DatasetError(f"{self.path} is not a dataset: no {MANIFEST}{hint}; create it with "
                               "data/create_pretraining_data.py or data/pack_pretraining_data.py")
        try:
            self.manifest = json.loads(manifest_path.read_text())
            lay = self.manifest["layout"]
            self.layout = PackLayout(lay["pack_len"], lay["mlm_slots"], lay["max_sequences_per_pack"])
            self.manifest["splits"]  # noqa: B018 - must exist
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetError(f"{manifest_path} is malformed ({e}); recreate the dataset") from None
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise DatasetError(f"{self.path}: format version {self.manifest.get('format_version')} is not "
                               f"{FORMAT_VERSION}; recreate the dataset with this version")
        self._check_shards()
        if verify:
            self.verify_checksums()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def packs(self, split: str) -> int:
        self._require(split)
        return self.manifest["splits"][split]["packs"]

    def _require(self, split: str) -> None:
        if split not in self.manifest["splits"]:
            raise DatasetError(f"{self.path} has no split {split!r}; it has {', '.join(self.splits)}")

    def _shape_of(self, field: str) -> tuple:
        S, M, K = self.layout.pack_len, self.layout.mlm_slots, self.layout.max_sequences_per_pack
        return {"masked_lm_labels": (M,), "next_sentence_labels": (K,), "next_sentence_weights": (K,)}.get(field, (S,))

    def _check_shards(self) -> None:
        """Cheap consistency of manifest and files: every shard and field present with the right shape, and
        each split's total the sum of its shards."""
        for split, info in self.manifest["splits"].items():
            if info.get("packs") != sum(shard["packs"] for shard in info["shards"]):
                raise DatasetError(f"{self.path}: split {split} says {info.get('packs')} packs but its shards hold "
                                   f"{sum(shard['packs'] for shard in info['shards'])}; recreate the dataset")
            for shard in info["shards"]:
                for field in FIELDS:
                    path = self.path / shard["name"] / f"{field}.npy"
                    if not path.is_file():
                        raise DatasetError(f"{self.path}: {shard['name']}/{field}.npy is missing; the dataset does "
                                           "not match its manifest: recreate it")
                    arr = np.load(path, mmap_mode="r")
                    if arr.shape != (shard["packs"], *self._shape_of(field)):
                        raise DatasetError(f"{path}: shape {arr.shape} does not match the manifest "
                                           f"({shard['packs']}, {self._shape_of(field)}); recreate the dataset")

    def verify_checksums(self) -> None:
        for split, info in self.manifest["splits"].items():
            for shard in info["shards"]:
                paths = [self.path / shard["name"] / f"{field}.npy" for field in FIELDS]
                if _sha256_files(paths) != shard["sha256"]:
                    raise DatasetError(f"{self.path}: checksum mismatch in {shard['name']}: the files changed "
                                       "after writing; recreate the dataset")

    def shards(self, split: str) -> list[dict[str, np.ndarray]]:
        """The shards of a split as dicts of memory-mapped arrays."""
        self._require(split)
        return [self.shard(split, i) for i in range(len(self.manifest["splits"][split]["shards"]))]

    def shard(self, split: str, index: int, fields=FIELDS) -> dict[str, np.ndarray]:
        """One shard as memory maps. Mapped pages that were read count as resident memory until the maps
        are dropped, so bulk passes open shards one at a time and let them go."""
        self._require(split)
        name = self.manifest["splits"][split]["shards"][index]["name"]
        return {field: np.load(self.path / name / f"{field}.npy", mmap_mode="r") for field in fields}

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
    shapes = {}
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
