"""GLUE tasks: reading a split into examples, and examples into token features.

Reading (`read_split`) takes either
- a GLUE task folder with the official TSV files (train.tsv, dev.tsv, test.tsv; MNLI dev_matched.tsv,
  dev_mismatched.tsv, test_matched.tsv, test_mismatched.tsv), read with the csv module and quoting off
  (QUOTE_NONE: GLUE's sentences hold unbalanced quotes); CoLA's train/dev files have no header; or
- a Hugging Face `datasets` dataset written with `save_to_disk`, with the columns of the `glue/<task>` dataset:
  a DatasetDict (splits train/validation/test; MNLI validation_matched, validation_mismatched, test_matched,
  test_mismatched) or a single Dataset folder. A label of -1 (what test splits hold) means "no label".
A folder holding the task's folder (GLUE's download: SST-2, STS-B, ...; or the task name) is accepted too.

Labels are class indices in the order of the `glue` dataset (see TASKS), or floats (0-5) for STS-B.
Bad input never gives a silently wrong label: an unknown task, a missing file, split or column, a label outside
the task's set, a non-numeric STS-B score or a file that is not UTF-8 is a `GlueInputError` naming the file,
the problem and the fix. An example with an empty (or white-space only) sentence is left out and counted;
a split without labels (test) reads with `label=None`, counted as unlabeled.

Features (`featurize`): [CLS] a [SEP] or [CLS] a [SEP] b [SEP] with BERT's token types (0 up to and including
the first [SEP], 1 for b and its [SEP]), cut to max_seq_length by removing the last token of the longer text
one at a time (ties: b), as Google's run_classifier.py and Hugging Face's slow tokenizers' "longest_first" do
(its fast tokenizers give an odd budget's last token to the longer text instead: 43 of 400 random truncated
pairs differ by that token; untruncated pairs are the same). The features of all
examples lie one after another in flat arrays (ragged), ready for packing.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...data.instances import WordPiece
from ...data.layout import IGNORE_INDEX


class GlueInputError(ValueError):
    """The input is not usable GLUE data; the message names the file, the problem and the fix, in one line."""


# --- tasks -------------------------------------------------------------------------------------------------

_SPLITS = ("train", "dev", "test")
_MNLI_SPLITS = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")


@dataclass(frozen=True)
class GlueTaskSpec:
    """What a GLUE task is and where its fields lie in the official TSV files and in the `datasets` layout."""
    name: str
    labels: tuple[str, ...] | None              # class names in `glue` dataset order; None = regression (STS-B)
    metrics: tuple[str, ...]                    # keys of metrics.compute
    glue_dir: str                               # the task's folder in GLUE's download (SST-2, STS-B, ...)
    tsv_text: tuple[str, ...]                   # TSV column(s) of text a (and b)
    tsv_label: str                              # TSV label column (test files have none)
    tsv_label_values: tuple[str, ...] | None    # how each class is written in the TSV, in `labels` order
    hf_text: tuple[str, ...]                    # `datasets` column(s) of text a (and b)
    tsv_id: str | None = "index"                # TSV id column, used when the file has it
    tsv_headerless: tuple[str, ...] = ()        # splits whose TSV has no header (CoLA train and dev) ...
    tsv_columns: tuple[str, ...] = ()           # ... and the names of their columns, in order
    splits: tuple[str, ...] = _SPLITS           # split names read_split takes

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def is_pair(self) -> bool:
        return len(self.tsv_text) == 2

    @property
    def num_labels(self) -> int:
        """Outputs of the head: classes, or 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    def tsv_file(self, split: str) -> str:
        return f"{split}.tsv"

    def datasets_split(self, split: str) -> str:
        """The `datasets` split name: dev -> validation, dev_matched -> validation_matched."""
        return "validation" + split[3:] if split.startswith("dev") else split

    def has_header(self, split: str) -> bool:
        return split not in self.tsv_headerless


_BINARY = ("0", "1")

TASKS: dict[str, GlueTaskSpec] = {t.name: t for t in (
    GlueTaskSpec("cola", ("unacceptable", "acceptable"), ("matthews_correlation",), "CoLA",
             ("sentence",), "label", _BINARY, ("sentence",),
             tsv_headerless=("train", "dev"), tsv_columns=("source", "label", "original_label", "sentence")),
    GlueTaskSpec("sst2", ("negative", "positive"), ("accuracy",), "SST-2",
             ("sentence",), "label", _BINARY, ("sentence",)),
    GlueTaskSpec("mrpc", ("not_equivalent", "equivalent"), ("accuracy", "f1"), "MRPC",
             ("#1 String", "#2 String"), "Quality", _BINARY, ("sentence1", "sentence2")),
    GlueTaskSpec("qqp", ("not_duplicate", "duplicate"), ("accuracy", "f1"), "QQP",
             ("question1", "question2"), "is_duplicate", _BINARY, ("question1", "question2"), tsv_id="id"),
    GlueTaskSpec("stsb", None, ("pearson", "spearman"), "STS-B",
             ("sentence1", "sentence2"), "score", None, ("sentence1", "sentence2")),
    GlueTaskSpec("mnli", ("entailment", "neutral", "contradiction"), ("accuracy",), "MNLI",
             ("sentence1", "sentence2"), "gold_label", ("entailment", "neutral", "contradiction"),
             ("premise", "hypothesis"), splits=_MNLI_SPLITS),
    GlueTaskSpec("qnli", ("entailment", "not_entailment"), ("accuracy",), "QNLI",
             ("question", "sentence"), "label", ("entailment", "not_entailment"), ("question", "sentence")),
    GlueTaskSpec("rte", ("entailment", "not_entailment"), ("accuracy",), "RTE",
             ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), ("sentence1", "sentence2")),
    GlueTaskSpec("wnli", ("not_entailment", "entailment"), ("accuracy",), "WNLI",
             ("sentence1", "sentence2"), "label", _BINARY, ("sentence1", "sentence2")),
)}

STSB_RANGE = (0.0, 5.0)


def task_spec(task: str) -> GlueTaskSpec:
    """The GlueTaskSpec of `task`, also spelt as GLUE does ("SST-2", "STS-B", "MNLI")."""
    key = str(task).lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise GlueInputError(f"unknown GLUE task {task!r}; the tasks are {', '.join(TASKS)}")
    return TASKS[key]


def _split_name(spec: GlueTaskSpec, split: str) -> str:
    """The canonical split name; `datasets` names (validation, validation_matched) are accepted too."""
    name = "dev" + split[len("validation"):] if split.startswith("validation") else split
    if name not in spec.splits:
        raise GlueInputError(f"{spec.name} has no split {split!r}; its splits are {', '.join(spec.splits)}")
    return name


def _is_test(split: str) -> bool:
    return split.startswith("test")


# --- examples and the report ---------------------------------------------------------------------------------

@dataclass
class GlueExample:
    uid: str                          # the id column (TSV index/id, datasets idx), else "<split>-<row>"
    text_a: str
    text_b: str | None
    label: int | float | None         # class index, STS-B score, or None (no label)


@dataclass
class InputReport:
    """What was read and what was left out, and why."""
    rows: int = 0
    examples: int = 0          # kept
    empty: int = 0             # left out: an empty or white-space only sentence
    unlabeled: int = 0         # kept examples without a label
    truncated: int = 0         # examples cut to max_seq_length (featurize)

    def summary(self) -> str:
        text = f"{self.rows} rows, {self.examples} examples"
        if self.empty:
            text += f"; left out {self.empty} with an empty sentence"
        if self.unlabeled:
            text += f"; {self.unlabeled} without a label"
        if self.truncated:
            text += f"; {self.truncated} cut to the maximum sequence length"
        return text


# --- reading -------------------------------------------------------------------------------------------------

_TSV_MARKERS = ("train.tsv", "dev.tsv", "test.tsv", "dev_matched.tsv", "test_matched.tsv")
_DATASETS_MARKERS = ("dataset_dict.json", "state.json")


def _resolve_source(spec: GlueTaskSpec, source: Path) -> Path:
    """The folder holding the task's files: `source`, or its subfolder for the task (GLUE's download)."""
    if not source.exists():
        raise GlueInputError(f"{source} does not exist; give a GLUE {spec.name} folder (the official "
                             f"{spec.glue_dir}/ with its .tsv files) or a dataset written by save_to_disk")
    if not source.is_dir():
        raise GlueInputError(f"{source} is a file; give the folder that holds it (a GLUE {spec.name} folder "
                             f"with {spec.tsv_file(spec.splits[0])}, ...) or a dataset written by save_to_disk")
    if any((source / m).exists() for m in _TSV_MARKERS + _DATASETS_MARKERS):
        return source
    for name in (spec.glue_dir, spec.name):
        for child in sorted(source.iterdir()):
            if child.is_dir() and child.name.lower() == name.lower():
                return child
    return source


def read_split(task: str, source: str | Path, split: str) -> tuple[list[GlueExample], InputReport]:
    """The examples of one split ("train", "dev", "test"; MNLI "dev_matched", "dev_mismatched",
    "test_matched", "test_mismatched") of a GLUE TSV folder or a saved `datasets` dataset, and the report."""
    spec = task_spec(task)
    split = _split_name(spec, split)
    folder = _resolve_source(spec, Path(source))
    if any((folder / m).exists() for m in _DATASETS_MARKERS):
        return _read_datasets(spec, folder, split)
    return _read_tsv(spec, folder, split)


def one_dataset(task: str, source: str | Path) -> bool:
    """Whether `source` is one saved `datasets.Dataset` (not a DatasetDict of splits, nor a TSV folder): every split
    read from it is the same rows."""
    folder = _resolve_source(task_spec(task), Path(source))
    return (folder / "state.json").exists() and not (folder / "dataset_dict.json").exists()


def _labels_text(spec: GlueTaskSpec) -> str:
    if spec.labels is None:
        return f"a number from {STSB_RANGE[0]:g} to {STSB_RANGE[1]:g}"
    if spec.tsv_label_values == spec.labels:
        return ", ".join(spec.labels)
    return ", ".join(f"{v} ({n})" for v, n in zip(spec.tsv_label_values, spec.labels))


def _score(spec: GlueTaskSpec, where: str, value) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if not (STSB_RANGE[0] <= score <= STSB_RANGE[1]):  # also NaN and inf
        raise GlueInputError(f"{where}: the score {value!r} is not {_labels_text(spec)}; fix or remove the row")
    return score


class _Collector:
    """Keeps examples, counts rows, empty sentences and missing labels."""

    def __init__(self, spec: GlueTaskSpec):
        self.spec, self.examples, self.report = spec, [], InputReport()
        self.seen: dict[str, str] = {}  # example id -> where it was read (predictions are keyed by the id)

    def add(self, uid: str, a, b, label, where: str) -> None:
        if uid in self.seen:
            raise GlueInputError(f"{where}: the example id {uid!r} repeats {self.seen[uid]} (predictions are written "
                                 "per id, so one would overwrite the other); give each row its own id")
        self.seen[uid] = where
        self.report.rows += 1
        if not isinstance(a, str) or not a.strip() or (self.spec.is_pair and (not isinstance(b, str)
                                                                             or not b.strip())):
            self.report.empty += 1
            return
        if label is None:
            self.report.unlabeled += 1
        self.examples.append(GlueExample(uid, a, b if self.spec.is_pair else None, label))

    def done(self, where: Path, split: str) -> tuple[list[GlueExample], InputReport]:
        self.report.examples = len(self.examples)
        if not self.examples:
            raise GlueInputError(f"{where}: no usable example in the {self.spec.name} {split} split "
                                 f"({self.report.summary()}); give a file with at least one non-empty example")
        return self.examples, self.report


def _read_tsv(spec: GlueTaskSpec, folder: Path, split: str) -> tuple[list[GlueExample], InputReport]:
    path = folder / spec.tsv_file(split)
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.tsv"))
        have = (f"it holds {', '.join(present)}" if present else "it holds no .tsv file")
        raise GlueInputError(f"{path} does not exist ({have}); give the GLUE {spec.name} folder "
                             f"({spec.glue_dir}/ of GLUE's download) with {spec.tsv_file(split)}")
    collector = _Collector(spec)
    line = 0
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:  # -sig: MRPC's files may start with a BOM
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            if spec.has_header(split):
                header = next(reader, None)
                if header is None:
                    raise GlueInputError(f"{path} is empty; give the GLUE {spec.name} {split} file")
                header = [h.strip() for h in header]
            else:
                header = list(spec.tsv_columns)

            def column(name: str, required: bool = True) -> int | None:
                if name in header:
                    return header.index(name)
                if required:
                    raise GlueInputError(f"{path} has no column {name!r} (its columns: {', '.join(header)}); "
                                         f"a GLUE {spec.name} {split} file has the columns "
                                         f"{', '.join(spec.tsv_text)}"
                                         f"{'' if _is_test(split) else ', ' + spec.tsv_label}")
                return None

            text_cols = [column(c) for c in spec.tsv_text]
            label_col = column(spec.tsv_label, required=not _is_test(split))
            id_col = column(spec.tsv_id, required=False) if spec.tsv_id else None
            values = dict(zip(spec.tsv_label_values or (), range(len(spec.tsv_label_values or ()))))
            for n, row in enumerate(r for r in reader if r):  # blank lines (end of file) are no rows
                line = reader.line_num
                if len(row) != len(header):
                    raise GlueInputError(f"{path} line {line} has {len(row)} tab-separated fields, expected "
                                         f"{len(header)} ({', '.join(header)}); fix the row (a tab inside a "
                                         "sentence?) or remove it")
                label = None
                if label_col is not None:
                    raw = row[label_col].strip()
                    if spec.labels is None:
                        label = _score(spec, f"{path} line {line}", raw)
                    elif raw in values:
                        label = values[raw]
                    else:
                        raise GlueInputError(f"{path} line {line}: the label {raw!r} is not one of {spec.name}'s "
                                             f"labels ({_labels_text(spec)}); fix or remove the row")
                uid = row[id_col] if id_col is not None else f"{split}-{n}"
                collector.add(uid, row[text_cols[0]], row[text_cols[1]] if spec.is_pair else None, label,
                              f"{path} line {line}")
    except UnicodeDecodeError as e:
        raise GlueInputError(f"{path} is not UTF-8 text ({e.reason} after line {line}); save it as UTF-8") from None
    except csv.Error as e:
        raise GlueInputError(f"{path} line {line + 1} is not a tab-separated row ({e}); fix the row") from None
    return collector.done(path, split)


def _read_datasets(spec: GlueTaskSpec, folder: Path, split: str) -> tuple[list[GlueExample], InputReport]:
    from datasets import ClassLabel, DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(folder))
    except Exception as e:  # datasets raises several types for a folder that is not a dataset
        raise GlueInputError(f"{folder} is not a dataset saved with `datasets` ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); give a folder written by "
                             f"save_to_disk or the GLUE {spec.name} TSV folder") from None
    where = folder
    if isinstance(ds, DatasetDict):
        name = spec.datasets_split(split)
        if name not in ds:
            raise GlueInputError(f"{folder} has no split {name!r} (for {split!r}); it has {', '.join(ds)}; "
                                 f"give a dataset with the splits of glue/{spec.name}")
        ds, where = ds[name], folder / name
    columns = set(ds.column_names)
    need = list(spec.hf_text) + ([] if _is_test(split) else ["label"])
    missing = [c for c in need if c not in columns]
    if missing:
        raise GlueInputError(f"{where}: the dataset has no column {missing[0]!r} (its columns: "
                             f"{', '.join(ds.column_names)}); glue/{spec.name} has the columns "
                             f"{', '.join(spec.hf_text)}, label, idx")
    feature = ds.features.get("label")
    if isinstance(feature, ClassLabel) and spec.labels is not None and tuple(feature.names) != spec.labels:
        raise GlueInputError(f"{where}: the label names are {', '.join(feature.names)}; {spec.name} needs "
                             f"{', '.join(spec.labels)} in this order (as glue/{spec.name}); map the labels")
    n = len(ds)
    texts = [list(ds[c]) for c in spec.hf_text]
    labels = list(ds["label"]) if "label" in columns else [None] * n
    ids = [str(i) for i in ds["idx"]] if "idx" in columns else [f"{split}-{i}" for i in range(n)]
    collector = _Collector(spec)
    for i in range(n):
        raw = labels[i]
        if raw is None or raw == -1:
            label = None
        elif spec.labels is None:
            label = _score(spec, f"{where} row {i}", raw)
        elif isinstance(raw, (int, np.integer)) and not isinstance(raw, bool) and 0 <= raw < len(spec.labels):
            label = int(raw)
        else:
            raise GlueInputError(f"{where} row {i}: the label {raw!r} is not one of {spec.name}'s labels "
                                 f"(0..{len(spec.labels) - 1}: {', '.join(spec.labels)}; -1 = no label); "
                                 "fix or remove the row")
        collector.add(ids[i], texts[0][i], texts[1][i] if spec.is_pair else None, label, f"{where} row {i}")
    return collector.done(where, split)


# --- features ------------------------------------------------------------------------------------------------

@dataclass
class GlueFeatures:
    """Every example's tokens one after another (ragged, flat); example i is tokens
    [starts[i], starts[i] + lengths[i])."""
    input_ids: np.ndarray        # (T,) int64
    token_type_ids: np.ndarray   # (T,) int64
    lengths: np.ndarray          # (N,) int64
    labels: np.ndarray           # (N,) int64 with -100 = no label, or float32 with NaN = no label (regression)
    uids: list[str] = field(default_factory=list)

    @property
    def starts(self) -> np.ndarray:
        return (np.cumsum(self.lengths) - self.lengths).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)


def _truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths after removing one token at a time from the longer of a and b (b on ties) until
    len_a + len_b <= budget: the closed form of that loop (tests check it against the loop)."""
    over = len_a + len_b > budget
    a = np.where(over, np.minimum(len_a, np.maximum(budget - len_b, (budget + 1) // 2)), len_a)
    return a, np.where(over, budget - a, len_b)


def featurize(examples: list[GlueExample], wp: WordPiece, max_seq_length: int, report: InputReport | None = None,
              *, regression: bool | None = None) -> GlueFeatures:
    """[CLS] a [SEP] (b [SEP]) per example, cut to max_seq_length (longest first); truncated examples are
    counted in `report`. Labels are float32 (NaN = none) when `regression`, else int64 (-100 = none);
    regression=None decides from the labels (any float label: regression)."""
    pairs = sum(e.text_b is not None for e in examples)
    if pairs not in (0, len(examples)):
        raise GlueInputError(f"{pairs} of {len(examples)} examples are pairs; featurize the examples of one task")
    pair = bool(examples) and pairs == len(examples)
    specials = 3 if pair else 2
    if max_seq_length < specials + (2 if pair else 1):
        raise GlueInputError(f"max_seq_length is {max_seq_length}; it must leave room for [CLS], [SEP] and at "
                             f"least one token of each text: use at least {specials + (2 if pair else 1)}")
    report = report if report is not None else InputReport()
    n = len(examples)
    a_ids = wp.encode([e.text_a for e in examples]) if n else []
    b_ids = wp.encode([e.text_b for e in examples]) if pair else [[] for _ in range(n)]
    len_a = np.array([len(x) for x in a_ids], dtype=np.int64)
    len_b = np.array([len(x) for x in b_ids], dtype=np.int64)
    keep_a, keep_b = _truncated_lengths(len_a, len_b, max_seq_length - specials)
    report.truncated += int(np.count_nonzero((keep_a < len_a) | (keep_b < len_b)))
    lengths = keep_a + keep_b + specials

    # every example's tokens, in order: [CLS], a[:keep_a], [SEP], (b[:keep_b], [SEP])
    cls, sep = wp.ids["[CLS]"], wp.ids["[SEP]"]
    pieces = []
    for a, b, ka, kb in zip(a_ids, b_ids, keep_a.tolist(), keep_b.tolist()):
        pieces += ([cls], a[:ka], [sep], b[:kb], [sep]) if pair else ([cls], a[:ka], [sep])
    input_ids = np.fromiter((t for p in pieces for t in p), dtype=np.int64, count=int(lengths.sum()))
    # token types: 1 from the start of b to the end of the example
    starts = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
    token_type_ids = (within >= np.repeat(keep_a + 2, lengths)).astype(np.int64) if pair else np.zeros_like(within)

    labels = [e.label for e in examples]
    if regression is None:
        regression = any(isinstance(x, float) for x in labels)
    if regression:
        label_array = np.array([math.nan if x is None else x for x in labels], dtype=np.float32)
    else:
        label_array = np.array([IGNORE_INDEX if x is None else x for x in labels], dtype=np.int64)
    return GlueFeatures(input_ids, token_type_ids, lengths.astype(np.int64), label_array,
                        [e.uid for e in examples])
