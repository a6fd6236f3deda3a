"""Length histograms: reading, validating and converting the input every packer starts from.

`hist[i]` is the number of sequences of length `i + 1`; `len(hist)` is the maximum sequence length (the
pack length). Everything that reads user input raises `PackingInputError` with a message that names the
problem and the fix, so that command-line tools can print it as one line.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

import numpy as np


class PackingInputError(ValueError):
    """Bad user input to the packing library (a histogram, lengths, or an option)."""


MAX_COUNT = 2 ** 62
MAX_PACK_LENGTH = 2 ** 22          # the longest histogram (pack length) read from a file: 4,194,304 tokens
MAX_TEXT_BYTES = 256 * 2 ** 20     # a histogram or lengths text file is read up to this size (.npy: no limit)
_SNIFF_BYTES = 65536               # read first: a NUL byte or bad UTF-8 there is a binary file, refused at once


def whole_number(value, name: str, minimum: int = 0) -> int:
    """`value` as an int of at least `minimum` (numpy integers too; not a bool, a float or a string), else a
    PackingInputError naming `name`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise PackingInputError(f"{name} is {value!r}; it must be a whole number >= {minimum}")
    return int(value)


def check_pack_length(max_len: int, what: str) -> None:
    """Refuse a pack length above MAX_PACK_LENGTH before a histogram of that many counts is allocated."""
    if max_len > MAX_PACK_LENGTH:
        raise PackingInputError(f"{what} is {max_len:,} tokens, above the longest pack length supported, "
                                f"{MAX_PACK_LENGTH:,} (the histogram holds a count per length: "
                                f"{8 * max_len / 2**30:,.1f} GiB here)")


def read_text(path: Path, binary: str) -> str:
    """A text file's contents, read with a cap: `binary` (the message) if its first 64 KiB hold a NUL byte or
    are not UTF-8, an error past MAX_TEXT_BYTES; so /dev/urandom or an endless pipe stops at once or at the cap."""
    import codecs

    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        except UnicodeDecodeError:
            raise PackingInputError(binary) from None
        if b"\0" in head:
            raise PackingInputError(binary)
        data = head + f.read(MAX_TEXT_BYTES + 1 - len(head))
    if len(data) > MAX_TEXT_BYTES:
        raise PackingInputError(f"{path}: more than {MAX_TEXT_BYTES // 2**20} MiB of text; for more sequences give "
                                "a .npy array of lengths (or a histogram)")
    try:
        return data.decode("utf-8-sig")  # (a byte-order mark, as some editors write, is not part of the text)
    except UnicodeDecodeError:
        raise PackingInputError(binary) from None


def validate_histogram(values, source: str = "histogram") -> np.ndarray:
    """Check a list of counts and return it as an int64 array.

    Counts must be non-negative whole numbers (3 and 3.0 are fine, 2.5, -1, "x" and True are not), and at
    least one must be positive.
    """
    if isinstance(values, np.ndarray):
        if values.ndim == 1 and np.issubdtype(values.dtype, np.integer) and len(values) and values.min() >= 0:
            # already counts (every packer is handed the array again): checked without a Python step per length
            # (0.8 s a call at a million lengths), below 2^61 tokens in floating point, where int64 is safe
            tokens = float(np.dot(np.arange(1, len(values) + 1, dtype=np.float64), values.astype(np.float64)))
            if values.max() < MAX_COUNT and tokens < 2.0 ** 61 and values.any():
                return values.astype(np.int64)
        values = values.tolist()  # anything else: the checks below, which name the bad count
    if not isinstance(values, (list, tuple)):
        raise PackingInputError(f"{source}: expected a JSON list of counts, got {type(values).__name__}")
    if len(values) == 0:
        raise PackingInputError(f"{source}: the histogram is empty; it needs one count per length 1..max_len")
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        where = f"{source}: count for length {i + 1}"
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, float)):
            raise PackingInputError(f"{where} is {v!r}, not a number")
        v = int(v) if isinstance(v, numbers.Integral) else v   # (a list of numpy integers: np.bincount's, listed)
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
        text = read_text(path, f"{path}: not a JSON text file (not UTF-8); expected a list of counts such as [0, 3, 5]")
    except OSError as e:
        raise PackingInputError(f"cannot read histogram file {str(path)!r}: {e.strerror or e}") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise PackingInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); "
                                "expected a list of counts such as [0, 3, 5]") from None
    except RecursionError:  # lists nested thousands deep exhaust the decoder's recursion
        raise PackingInputError(f"{path}: JSON nested too deeply; expected a flat list of counts such as "
                                "[0, 3, 5]") from None
    if isinstance(values, list):
        check_pack_length(len(values), f"{path}: the histogram's length")
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
            lines = [ln.strip() for ln in read_text(path, f"{path}: not a text file of lengths (not UTF-8); give "
                                                             "one whole number per line, or a .npy array").splitlines()]
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
    except MemoryError:
        raise PackingInputError(f"{path}: the .npy array does not fit in memory") from None
    lengths = validate_lengths(lengths, max_len, source=str(path))
    if max_len is None:
        check_pack_length(int(lengths.max()), f"{path}: the longest sequence")
    return lengths


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
    elif arr.dtype == np.uint64 and (arr >= MAX_COUNT).any():   # (cast to int64 it read as a negative length)
        i = int(np.argmax(arr))
        raise PackingInputError(f"{source}: sequence {i} has length {int(arr[i]):,}, far above any pack length; "
                                "lengths must be whole numbers in 1..max_len")
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
    """The histogram of validated lengths (`validate_lengths`): element i counts sequences of length i+1. A length
    above `max_len` is refused (it made a longer histogram, silently)."""
    lengths = np.asarray(lengths)
    if len(lengths) and lengths.max() > max_len:
        raise PackingInputError(f"a sequence of {int(lengths.max())} tokens is longer than max_len {max_len}")
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


def check_memory(needed: int, what: str) -> None:
    """Refuse, in one line, work estimated to need more than the memory available now (MemAvailable on
    Linux): past it the kernel kills the process rather than raise a MemoryError. Unknown memory: no check."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return
    if needed > available:
        raise PackingInputError(f"{what}: about {needed / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} "
                                "GiB of memory available; use fewer sequences")
