"""Text input: documents as lists of sentences, from the formats users bring and from the built-in corpus.

Formats (`read_documents`):
- BERT's text format (`.txt`): one sentence per line, a blank line between documents;
- raw documents: a folder of `.txt`/`.md` files (one document per file) or JSON lines (`.jsonl`, one
  document per line in a `text` field; a lone surrogate escape such as `\ud800` is read as U+FFFD), split into
  sentences here;
- a Hugging Face `datasets` dataset saved with `save_to_disk` (a folder with `dataset_info.json` or
  `dataset_dict.json`): one document per record, from its `text` column (every split of a DatasetDict);
- `builtin`: the built-in corpus (below).

Skipped and counted (in `TextStats`): empty files, empty documents, lines that are empty after whitespace
is collapsed. Errors (`DataInputError`, one line naming the file and the fix): bytes that are not UTF-8,
malformed JSON lines, a JSON line without a string `text`, a path that does not exist.

The built-in corpus is English prose that ships with Python itself, so the main job needs no download: the
documentation topics of `pydoc_data` (the text of the Python reference manual, as `help()` shows it) and the
docstrings of the standard-library sources, read with `ast` (nothing is imported). About 2 MB of text.
Licence: Python Software Foundation License, Version 2 (https://docs.python.org/3/license.html).
"""

from __future__ import annotations

import ast
import json
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..arguments import at_least  # noqa: F401  (the data commands' argparse type, imported from here)

BUILTIN = "builtin"
BUILTIN_LICENSE = "Python Software Foundation License Version 2 (pydoc_data topics and standard-library docstrings)"

Document = list  # of sentences (str)


MAX_WORKERS = 512
"""--workers of the data commands: processes on this machine (a Dask cluster's own workers are not counted)"""


def workers_arg():
    """The argparse type of the data commands' --workers: 1..MAX_WORKERS (each is a process of this machine;
    100,000 of them would exhaust it before any work)."""
    return at_least(1, MAX_WORKERS, " (each worker is a process on this machine; use a Dask cluster, "
                                    "--engine dask --address, for more)")


class DataInputError(ValueError):
    """Bad user input to the data pipeline; the message names the problem and the fix."""


@dataclass
class TextStats:
    files: int = 0
    documents: int = 0
    sentences: int = 0
    bytes: int = 0
    empty_files: int = 0
    empty_documents: int = 0
    single_sentence_documents: int = 0

    def merge(self, other: "TextStats") -> None:
        for name in ("files", "documents", "sentences", "bytes", "empty_files", "empty_documents",
                     "single_sentence_documents"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before whitespace and an
# upper-case letter, digit or opening quote. Deliberately simple: no abbreviation list, no model. BERT only
# needs segments of roughly sentence size, and a wrong split costs nothing but a slightly odd NSP pair.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
_SPACE = re.compile(r"\s+")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")  # what JSON's "\ud800" escapes decode to; no UTF-8 text holds one


def json_line(line: str):
    """One JSON line with every lone surrogate in its strings (JSON's "\\ud800" escapes, which no UTF-8 encoder
    takes) as U+FFFD, as a tokenizer does with bad bytes: the one reader of JSON lines of text. Raises
    json.JSONDecodeError as json.loads."""
    def clean(value):
        if isinstance(value, str):
            return _LONE_SURROGATE.sub("\ufffd", value)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        return value
    try:
        return clean(json.loads(line))
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # an integer of more than 4,300 digits (Python's limit on converting them)
        raise json.JSONDecodeError(str(e).split(";")[0], line[:80], 0) from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise json.JSONDecodeError("nested too deeply to read", line[:80], 0) from None


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences; paragraphs (blank lines) always end a sentence."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = _SPACE.sub(" ", paragraph).strip()
        if paragraph:
            out.extend(s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip())
    return out


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataInputError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")  # (a byte-order mark is no text: it began the first sentence, or broke JSON)
    except UnicodeDecodeError as e:
        at = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)  # (utf-8-sig counts after the mark)
        raise DataInputError(f"{path}: byte {at} is not UTF-8 ({data[at:at + 1]!r}); convert the "
                             "file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def _bert_format(path: Path, stats: TextStats) -> Iterator[Document]:
    """One sentence per line, blank lines between documents."""
    doc: Document = []
    for line in _read_text(path).splitlines():
        line = _SPACE.sub(" ", line).strip()
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _jsonl(path: Path, stats: TextStats) -> Iterator[Document]:
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json_line(line)
        except json.JSONDecodeError as e:
            raise DataInputError(f"{path}:{number}: not valid JSON ({e.msg}); expected one object per line "
                                 'with a "text" field') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataInputError(f'{path}:{number}: expected an object with a string "text" field')
        yield split_sentences(record["text"])


def _raw_file(path: Path, stats: TextStats) -> Iterator[Document]:
    yield split_sentences(_read_text(path))


def builtin_documents() -> Iterator[Document]:
    """The built-in corpus, in a fixed order: pydoc topics, then one document per standard-library file
    made of its docstrings in source order."""
    import pydoc_data.topics

    for name in sorted(pydoc_data.topics.topics):
        yield split_sentences(pydoc_data.topics.topics[name])
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
    for path in files:
        if {"test", "tests", "idlelib", "site-packages", "lib2to3"} & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        sentences = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    # drop interactive examples: they are code, not prose
                    prose = "\n".join(ln for ln in doc.splitlines() if not ln.lstrip().startswith((">>>", "...")))
                    sentences.extend(split_sentences(prose))
        yield sentences


def is_hf_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in
                                 ("dataset_info.json", "dataset_dict.json", "state.json"))


def check_text_column(part, path: Path) -> None:
    """A `datasets` split's "text" column holds strings (a list of sentences a row failed deep in the reader)."""
    feature = part.features["text"]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataInputError(f'{path}: the dataset\'s "text" column holds {feature}, not strings; give one string '
                             'of text a row (join a list of sentences with newlines first)')


def _hf_dataset(path: Path, stats: TextStats) -> Iterator[Document]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a damaged folder
        raise DataInputError(f"{path}: not a readable `datasets` dataset ({e})") from None
    parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for part in parts:
        if "text" not in part.column_names:
            raise DataInputError(f'{path}: the dataset has no "text" column (columns: {", ".join(part.column_names)})')
        check_text_column(part, path)
        for record in part.select_columns(["text"]).iter(batch_size=1000):
            for text in record["text"]:
                yield split_sentences(text or "")


TEXT_SUFFIXES = (".txt", ".text", ".md", ".jsonl")


def input_files(inputs: list[str]) -> list[Path]:
    """Expand folders (sorted, recursively: .txt .md .jsonl) and check that every input exists."""
    out = []
    for item in inputs:
        path = Path(item)
        if is_hf_dataset(path):
            out.append(path)
        elif path.is_dir():
            # not a dataset's vocab.txt (beside its manifest.json): a word list, not text to train on
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES
                           and not (p.name == "vocab.txt" and (p.parent / "manifest.json").is_file()))
            if not found:
                raise DataInputError(f"{path}: the folder holds no .txt, .text, .md or .jsonl files")
            out.extend(found)
        elif path.is_file():
            if path.suffix.lower() not in TEXT_SUFFIXES:  # (a .json of JSON lines read as sentences: garbage)
                kind = "JSON lines? name it .jsonl" if path.suffix.lower() == ".json" else "rename it"
                raise DataInputError(f"{path}: {path.suffix or 'no suffix'} is not a text format this reads ({kind}); "
                                     "give .txt or .text (one sentence a line, a blank line between documents), .md "
                                     "(prose) or .jsonl (a \"text\" field a line)")
            out.append(path)
        else:
            raise DataInputError(f"input {item!r} does not exist; give files, folders, or '{BUILTIN}'")
    return out


def read_documents(inputs: list[str], raw: bool = False, stats: TextStats | None = None) -> Iterator[Document]:
    """Documents from every input, in order. `.txt` files are BERT's one-sentence-per-line format unless
    `raw` (then each file is one document of prose); `.jsonl` is JSON lines with a `text` field."""
    stats = stats if stats is not None else TextStats()
    if inputs == [BUILTIN]:
        sources = [(None, lambda _p, _s: builtin_documents())]
    else:
        sources = []
        for path in input_files(inputs):
            if is_hf_dataset(path):
                sources.append((path, _hf_dataset))
            elif path.suffix.lower() == ".jsonl":  # (any case: CORPUS.TXT is a .txt)
                sources.append((path, _jsonl))
            elif raw or path.suffix.lower() == ".md":
                sources.append((path, _raw_file))
            else:
                sources.append((path, _bert_format))
    for path, reader in sources:
        stats.files += 1
        if path is not None and path.is_file():
            size = path.stat().st_size
            stats.bytes += size
            if size == 0:
                stats.empty_files += 1
                continue
        for doc in reader(path, stats):
            if not doc:
                stats.empty_documents += 1
                continue
            if path is None or path.is_dir():
                stats.bytes += sum(len(s.encode("utf-8")) + 1 for s in doc)
            stats.documents += 1
            stats.sentences += len(doc)
            stats.single_sentence_documents += len(doc) == 1
            yield doc
