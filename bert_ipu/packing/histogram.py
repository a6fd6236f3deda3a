"""Length histograms: reading, validating and converting the input every packer starts from.

`hist[i]` is the number of sequences of length `i + 1`; `len(hist)` is the maximum sequence length (the
pack length). Everything that reads user input raises `PackingInputError` with a message that names the
problem and the fix, so that command-line tools can print it as one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


class PackingInputError(ValueError):
    """Bad user input to the packing library (a histogram, lengths, or an option)."""


MAX_COUNT = 2 ** 62


def validate_histogram(values, source: str = "histogram") -> np.ndarray:
    """Check a list of counts and return it as an int64 array.

    Counts must be non-negative whole numbers (3 and 3.0 are fine, 2.5, -1, "x" and True are not), and at
    least one must be positive.
    """
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise PackingInputError(f"{source}: expected a JSON list of counts, got {type(values).__name__}")
    if len(values) == 0:
        raise PackingInputError(f"{source}: the histogram is empty; it needs one count per length 1..max_len")
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        where = f"{source}: count for length {i + 1}"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PackingInputError(f"{where} is {v!r}, not a number")
        if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
            raise PackingInputError(f"{where} is {v!r}; counts must be whole numbers")
        if v < 0:
            raise PackingInputError(f"{where} is {v}; counts must be >= 0")
        if v >= MAX_COUNT:
            raise PackingInputError(f"{where} is {v:.3g}; counts must be below {MAX_COUNT:.3g} (2^62)")
        out[i] = int(v)
    # in Python's exact integers: the totals the algorithms compute must fit in 64-bit integers
    tokens = sum((i + 1) * int(v) for i, v in enumerate(out.tolist()))
    if tokens >= MAX_COUNT:
        raise PackingInputError(f"{source}: the histogram holds {tokens:.3g} tokens, more than 64-bit integers "
                                "hold; scale the counts down (the packing of a histogram depends on its shape)")
    if out.sum() == 0:
        raise PackingInputError(f"{source}: all counts are zero; there is nothing to pack")
    return out


def load_histogram(path: str | Path) -> np.ndarray:
    """Read a histogram JSON file (a list of counts, as in shared/benchmarks/histograms/)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PackingInputError(f"cannot read histogram file {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PackingInputError(f"{path}: not a JSON text file (not UTF-8); expected a list of counts such as "
                                "[0, 3, 5]") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise PackingInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); "
                                "expected a list of counts such as [0, 3, 5]") from None
    return validate_histogram(values, source=str(path))


def load_lengths(path: str | Path, max_len: int | None = None) -> np.ndarray:
    """Read sequence lengths: a `.npy` array or a text file with one length per line."""
    path = Path(path)
    try:
        if path.suffix == ".npy":
            raw = np.load(path, allow_pickle=False)
            if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
                raise PackingInputError(f"{path}: expected a 1-D numeric array of lengths, "
                                        f"got shape {raw.shape} dtype {raw.dtype}")
            lengths = raw
        else:
            try:
                lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
            except UnicodeDecodeError:
                raise PackingInputError(f"{path}: not a text file of lengths (not UTF-8); give one whole number "
                                        "per line, or a .npy array") from None
            lines = [ln for ln in lines if ln]
            try:
                lengths = np.array([float(ln) for ln in lines], dtype=np.float64)
            except ValueError:
                bad = next(ln for ln in lines if not _is_number(ln))
                raise PackingInputError(f"{path}: {bad!r} is not a length; "
                                        "expected one whole number per line") from None
    except OSError as e:
        raise PackingInputError(f"cannot read lengths file {str(path)!r}: {e.strerror or e}") from None
    except ValueError as e:
        if isinstance(e, PackingInputError):
            raise
        raise PackingInputError(f"{path}: not a readable .npy array ({e})") from None
    return validate_lengths(lengths, max_len, source=str(path))


def validate_lengths(lengths, max_len: int | None = None, source: str = "lengths") -> np.ndarray:
    """Check an array of sequence lengths: whole numbers in 1..max_len. Returns int64."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise PackingInputError(f"{source}: expected a non-empty list of lengths")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all() or (arr != np.round(arr)).any():
            raise PackingInputError(f"{source}: lengths must be whole numbers")
        if (np.abs(arr) >= MAX_COUNT).any():
            i = int(np.argmax(np.abs(arr)))
            raise PackingInputError(f"{source}: sequence {i} has length {arr[i]:.3g}, far above any pack length; "
                                    "lengths must be whole numbers in 1..max_len")
    elif not np.issubdtype(arr.dtype, np.integer):
        raise PackingInputError(f"{source}: lengths must be numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 1:
        i = int(np.argmin(arr))
        raise PackingInputError(f"{source}: sequence {i} has length {arr[i]}; lengths must be >= 1")
    if max_len is not None and arr.max() > max_len:
        i = int(np.argmax(arr))
        raise PackingInputError(f"{source}: sequence {i} has length {arr[i]}, above the maximum {max_len}; "
                                "raise --max-len or truncate the data")
    return arr


def histogram_of(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """The histogram of validated lengths: element i counts sequences of length i+1."""
    return np.bincount(lengths - 1, minlength=max_len).astype(np.int64)


def expand_histogram(histogram: np.ndarray) -> np.ndarray:
    """One length per sequence, in ascending order: the inverse of `histogram_of`."""
    return np.repeat(np.arange(1, len(histogram) + 1, dtype=np.int64), histogram)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
