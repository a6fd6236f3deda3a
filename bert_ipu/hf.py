"""Our packing inside Hugging Face `datasets` and `transformers.Trainer`, without cross-contamination.

    from bert_ipu.hf import pack_dataset, pack_iterable, PackedDataCollator, token_loss, token_metrics, unpack_outputs
    from bert_ipu.hf import packed_sequence_classifier   # several documents a pack, one label each
    packed = pack_dataset(dataset, 2048, causal=True)        # datasets.Dataset -> a datasets.Dataset of packs
    stream = pack_iterable(iterable, 2048, buffer_size=100_000)   # IterableDataset -> packs, a buffer at a time
    collator = PackedDataCollator(model)                     # reads the attention implementation off the model
    args = TrainingArguments(..., remove_unused_columns=False)   # keep sequence_lengths for the collator
    Trainer(model, args, train_dataset=packed, data_collator=collator, compute_loss_func=token_loss(causal=True))
    rows = unpack_outputs(packed, trainer.predict(packed).predictions)   # per source row, in source order
    preprocess, compute = token_metrics(causal=True)  # evaluate: token-average loss/accuracy, same as unpacked

`pack_dataset` reads only the lengths of the source (Arrow, batch by batch), packs their histogram with any
algorithm of `bert_ipu.packing` (CGHP by default: a proven lower bound on the packs), assigns every sequence to
one pack, and writes the packs as Arrow files (one per shard, `num_proc` processes; the same files whatever
`num_proc`), returned memory-mapped: the source and the packs need not fit in memory. Each pack has
`input_ids` (pack_length tokens: its documents back to back, then padding), `sequence_lengths` (its documents'
lengths, in order), `labels` where the source has per-token labels, and `source_rows`; the packing report is
printed and kept in `info.description` (`packing_report`). Everything else follows from the lengths and is made
by the collator, per micro-batch: `position_ids` (0, 1, ... restarting in every document), `sequence_ids`
(1..k, 0 = padding) and a causal LM's labels (its input_ids). Storing them would be four times the bytes to
write (TRL's packs store ids and lengths alike).

Labels never cross documents. A causal LM's model shifts labels inside (the logit at t is scored against
label t + 1), so the label at each document's first token, which the previous document's last token would be
asked to predict, is IGNORE_INDEX, as is padding. An encoder keeps the source's per-token labels.

`PackedDataCollator` turns packs into what the model's attention implementation isolates documents with: a
4D block-diagonal (document-causal for causal LMs) mask for eager and sdpa (transformers uses a 4D mask as
given), flattened rows with `cu_seq_lens` for the flash implementations, `sequence_ids` for this project's own
packed models. Any other implementation (flex_attention included: not verified here, its CPU kernel crashes the
process in torch 2.13) is refused with a ValueError: nothing is warned and run.
`token_loss` is a `compute_loss_func` summing token losses and dividing by the Trainer's `num_items_in_batch`
(the valid labels of the whole update, over gradient accumulation and ranks), so a packed run's loss and
gradients equal the unpacked run's on the same sequences.

numpy at import; `datasets`, `pyarrow`, `torch` and `transformers` are imported inside the functions.
"""

from __future__ import annotations

import collections.abc
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data.contiguous import rows_from_packs
from .data.layout import IGNORE_INDEX
from .packing.api import ALGORITHMS, pack, resolve_depth
from .packing.assign import assign_ragged
from .packing.histogram import histogram_of

REPORT_KEY = "bert_ipu.packing_report"   # the key of the report in a packed dataset's info.description (JSON)
TOO_LONG = ("error", "truncate", "drop")
MASK_IMPLEMENTATIONS = ("eager", "sdpa")   # transformers uses a 4D mask as given (tests/test_hf.py checks both)
FLASH_PREFIX = "flash_attention_"                            # varlen kernels: cu_seq_lens of flattened rows
OWN_MODELS = "bert_ipu"                                      # this project's packed models: sequence_ids
LAYOUT = "sequence_lengths"   # what a pack stores besides its tokens (in the cache key: other layouts are not reused)
CHUNK_TOKENS = 2**18          # pack tokens built and written at a time (bounds the memory of pack_dataset;
                              # 2**18 was 15% faster than 2**20 on 400k SFT-like sequences: arrays stay in the heap)
SHARD_CHUNKS = 16             # chunks per Arrow file: one file = one unit of work for num_proc


# ------------------------------------------------------------------------------------------------ pack_dataset

@dataclass(frozen=True)
class _Plan:
    """What every shard writer needs: which source rows go into which pack, and how to lay them out."""
    source: object              # the columns of the datasets.Dataset it reads, formatted as Arrow
    columns: tuple              # token-level columns copied into the packs (input_ids first)
    label_column: str | None    # the source's per-token labels, if any
    pack_length: int
    causal: bool
    pad_token_id: int
    offsets: np.ndarray         # (packs + 1,): pack p holds rows[offsets[p]:offsets[p + 1]]
    rows: np.ndarray            # (packed sequences,) source row indices in pack order
    sequence_label_column: str | None = None  # the source's label per row (sequence classification), if any
    sequence_label_width: int | None = None   # None: a class index per row (int64); 0: one float per row
                                              # (regression); k: k floats per row (multi-label, multi-output)


def _arrow_lengths(dataset, column: str, batch_size: int, first_row: int = 0,
                   leave_out: str = "leave it out of columns") -> np.ndarray:
    """The number of tokens of every row of `column`, read batch by batch as Arrow (no Python loop over rows).
    Refused in one line: a column that holds no lists, or lists of anything but whole numbers within int32 (the
    packs' type: a float column was cast to it, an id past 2**31 wrapped), missing rows or values (a None inside
    a list was stored as -2**31). `first_row`: the first row's number in the messages (a stream's buffer)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts, row = [], first_row
    for batch in dataset.select_columns([column]).with_format("arrow").iter(batch_size=batch_size):
        values = batch[column]
        kind = values.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
            raise ValueError(f"column {column!r} holds {kind}, not lists of token ids: tokenize it first (or "
                             f"{leave_out})")
        value = kind.value_type
        if not (pa.types.is_integer(value) or pa.types.is_boolean(value)):
            raise ValueError(f"column {column!r} holds lists of {value}; packed columns are whole numbers "
                             "(int32): cast it to integers, or leave it out of columns")
        lengths = pc.list_value_length(values)
        if lengths.null_count:
            raise ValueError(f"column {column!r} has missing rows (None); filter them out before packing")
        flat = pc.list_flatten(values)
        bad = pc.is_null(flat)
        if pa.types.is_integer(value) and value.bit_width >= 32 and len(flat):   # (narrower ones fit int32)
            known = pc.fill_null(flat, 0)   # (a comparison with a null is null, which pc.any passes over)
            bad = pc.or_(bad, pc.greater(known, pa.scalar(2**31 - 1, value)))   # (in the column's own type)
            if pa.types.is_signed_integer(value) and value.bit_width > 32:
                bad = pc.or_(bad, pc.less(known, pa.scalar(-2**31, value)))
        if pc.any(bad).as_py():
            at = int(pc.list_parent_indices(values).to_numpy()[int(np.argmax(bad.to_numpy(zero_copy_only=False)))])
            raise ValueError(f"row {row + at} of column {column!r} holds a missing value (None) or one outside int32 "
                             "(the packs' type): fix or filter that row before packing")
        parts.append(lengths.to_numpy(zero_copy_only=False))
        row += len(values)
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def pack_dataset(dataset, pack_length: int, algorithm: str = "cghp", max_sequences_per_pack="max", *,
                 columns=("input_ids",), label_column: str | None = "labels", causal: bool = True,
                 sequence_label_column: str | None = None, too_long: str = "error", pad_token_id: int = 0,
                 seed: int = 0, num_proc: int | None = None,
                 cache_dir: str | os.PathLike | None = None, time_limit: float | None = None,
                 batch_size: int = 10_000, verbose: bool = True):
    """Pack a `datasets.Dataset` of token sequences into a `datasets.Dataset` of `pack_length`-token rows.

    columns: the token-level columns to pack, `input_ids` first (e.g. ("input_ids", "token_type_ids")); every
        one must have as many entries per row as input_ids. Other columns are left out (`source_rows` finds them).
    label_column: the source's per-token labels (used when the column exists). Without it a causal LM's labels
        are its input_ids; an encoder's packs then have no labels column.
    causal: True for causal LMs (labels at each document's first token and on padding are IGNORE_INDEX, since the
        model shifts labels inside), False for encoders (the source labels as they are, IGNORE_INDEX on padding).
    sequence_label_column: a column of one label per row (sequence classification, e.g. "label"): a class index
        (an integer or ClassLabel column), a float (regression) or a list of as many numbers in every row (a
        multi-hot vector for multi-label classification, or several regression targets). The packs then get
        `sequence_labels`, one per document slot (as many slots as the fullest pack has documents; IGNORE_INDEX in
        the empty ones, float32 for float and list labels), and no token labels. Train them with
        packed_sequence_classifier.
    max_sequences_per_pack: "max" (unlimited: Hugging Face models pay S x S attention per pack however many
        documents it holds, so a depth limit only costs packs), a whole number, or "auto" (the smallest depth at
        which CGHP needs at most 0.1% more packs than unlimited; a CGHP run per depth tried).
    too_long: a sequence longer than pack_length is an "error" (a ValueError naming it), is "truncate"d to its
        first pack_length tokens, or is "drop"ped; the report counts both.
    num_proc: processes writing the packs (each writes its own shards; the result is the same for any num_proc).
    cache_dir: where the packed Arrow files go (default: the `datasets` cache); a second call with the same source
        fingerprint and arguments reuses them.

    Returns a memory-mapped `datasets.Dataset`, one row per pack: input_ids, the other `columns`, labels where the
    source has them (int32, (pack_length,) each: the collator makes them int64), sequence_lengths (the lengths of
    the pack's documents, in order) and source_rows (their source rows). PackedDataCollator derives position_ids,
    sequence_ids and a causal LM's labels from sequence_lengths. Its `info.description` holds the packing report
    (`packing_report`).
    """
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        raise ValueError("pack_dataset needs a datasets.Dataset (it reads every length before packing); pack an "
                         "IterableDataset with pack_iterable (a buffer at a time) or write it to disk first")
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"pack_dataset takes a datasets.Dataset, got {type(dataset).__name__}; "
                         "wrap the data with datasets.Dataset.from_dict")
    pack_length, columns, pad_token_id = _checked(pack_length, algorithm, columns, too_long, label_column,
                                                  sequence_label_column, pad_token_id)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1 (rows read at a time), got {batch_size!r}")
    batch_size = int(batch_size)
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"the dataset has no column {missing[0]!r} (columns: {', '.join(dataset.column_names)})")
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ValueError(f"num_proc must be a whole number >= 1 or None, got {num_proc!r}")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: there is nothing to pack")
    width = None
    if sequence_label_column is not None:
        width = _sequence_label_width(dataset, sequence_label_column, batch_size)
        label_column = None  # one label per document instead of per token
    plan, report = _plan(dataset, pack_length, algorithm, max_sequences_per_pack, columns, label_column, causal,
                         too_long, pad_token_id, seed, time_limit, batch_size, sequence_label_column, width)
    offsets, rows = plan.offsets, plan.rows
    key = hashlib.sha256(json.dumps([dataset._fingerprint, pack_length, columns, label_column, causal, too_long,
                                     pad_token_id, sequence_label_column, width, LAYOUT, CHUNK_TOKENS,
                                     SHARD_CHUNKS]).encode()
                         + offsets.tobytes() + rows.tobytes()).hexdigest()[:24]
    root = Path(cache_dir) if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE) / "bert_ipu_packed"
    packed = _write(plan, root / key, num_proc or 1)
    packed.info.description = json.dumps({REPORT_KEY: report})
    if verbose:
        print(format_report(report))
    return packed


def _checked(pack_length, algorithm, columns, too_long, label_column=None,
             sequence_label_column=None, pad_token_id=0) -> tuple[int, tuple, int]:
    """pack_dataset's and pack_iterable's arguments checked (a one-line ValueError each): pack_length, columns
    (no column twice, nor a label column among them: it packs apart, under its own name; label_column is unused
    where sequence_label_column is given)."""
    if isinstance(pack_length, bool) or not isinstance(pack_length, (int, np.integer)) or pack_length < 1:
        raise ValueError(f"pack_length must be a whole number >= 1, got {pack_length!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    columns = (columns,) if isinstance(columns, str) else tuple(columns)
    if not columns or columns[0] != "input_ids":
        raise ValueError(f"columns must start with 'input_ids', got {columns!r}")
    twice = [c for c in columns if columns.count(c) > 1]
    if twice:
        raise ValueError(f"columns names {twice[0]!r} twice: name each column once")
    used = (("label_column", None if sequence_label_column else label_column),
            ("sequence_label_column", sequence_label_column))
    for name, label in used:
        if label in columns:
            raise ValueError(f"{label!r} is the {name} and is packed as labels: leave it out of columns (or pass "
                             f"{name}=None to pack it as a plain column)")
    if too_long not in TOO_LONG:
        raise ValueError(f"too_long must be one of {', '.join(TOO_LONG)}, got {too_long!r}")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)) \
            or not -2**31 <= pad_token_id < 2**31:
        raise ValueError(f"pad_token_id must be a whole number within int32 (the packs' type), got {pad_token_id!r}: "
                         "give the tokenizer's pad_token_id, or its eos_token_id where it has none (GPT-2, Llama)")
    return int(pack_length), columns, int(pad_token_id)   # (a numpy integer would not make a cache key)


def _sequence_label_width(dataset, column: str, batch_size: int) -> int | None:
    """What `column` holds per row: a class index (None; integer, bool or ClassLabel), a float (0) or a list of
    k numbers, k the same in every row (k). Refused: any other type, a missing label (None: it would pack as a
    huge index or NaN), a negative class index other than IGNORE_INDEX (ClassLabel's -1: no label, as in test
    splits), and a float or list label that is IGNORE_INDEX once stored as float32 (-100.0 marks an empty slot)."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    if column not in dataset.column_names:
        raise ValueError(f"the dataset has no column {column!r} (columns: {', '.join(dataset.column_names)})")
    feature = dataset.features[column]
    missing = (f"sequence_label_column {column!r} has missing labels (None); filter those rows out or fill them "
               "before packing")
    if isinstance(feature, datasets.Value) and feature.dtype == "null":
        raise ValueError(missing)

    def kind(f, inner=False) -> str | None:
        if isinstance(f, datasets.Value) and f.dtype.startswith(("int", "uint", "bool")):
            return "index"
        if isinstance(f, datasets.ClassLabel) and not inner:   # (a list of class ids is not a multi-hot vector)
            return "index"
        return "float" if isinstance(f, datasets.Value) and f.dtype.startswith("float") else None

    listed = isinstance(feature, (datasets.Sequence, datasets.List)) and kind(getattr(feature, "feature", None),
                                                                              inner=True)
    if not (kind(feature) or listed):
        raise ValueError(f"sequence_label_column {column!r} is {feature}; it must hold one label per row: a class "
                         "index (an integer or ClassLabel column), a float (regression) or a list of numbers of "
                         "the same length in every row (a multi-hot vector of num_labels, not class ids)")
    widths = set()
    for batch in dataset.select_columns([column]).with_format("arrow").iter(batch_size=batch_size):
        values = batch[column]
        if listed:
            widths.update(np.unique(pc.list_value_length(values).to_numpy(zero_copy_only=False)).tolist())
            values = pc.list_flatten(values)
        if batch[column].null_count or values.null_count:
            raise ValueError(missing)
        if isinstance(feature, datasets.ClassLabel):   # (-1: ClassLabel's "no label"; integers may be targets)
            negative = pc.and_(pc.less(values, 0), pc.not_equal(values, IGNORE_INDEX))
            if pc.any(negative).as_py():
                raise ValueError(f"sequence_label_column {column!r} holds the class index -1 (no label, as in a "
                                 "test split); filter those rows out")
        elif listed or kind(feature) == "float":
            stored = pc.cast(values, pa.float32(), safe=False)
            if pc.any(pc.equal(stored, IGNORE_INDEX)).as_py():
                raise ValueError(f"sequence_label_column {column!r} holds the value {IGNORE_INDEX} (as float32), "
                                 "which marks an empty document slot in the packs: shift or rescale those labels")
            if not pc.all(pc.is_finite(stored)).as_py():
                raise ValueError(f"sequence_label_column {column!r} holds NaN or infinite labels (as float32); "
                                 "filter or fix those rows before packing")
    if not listed:
        return None if kind(feature) == "index" else 0
    if len(widths) == 1 and min(widths) > 0:
        return int(min(widths))
    raise ValueError(f"sequence_label_column {column!r} holds lists of {sorted(widths)[:5]} numbers; a list label "
                     "must have as many numbers in every row (a multi-hot vector of num_labels)")


def pack_iterable(dataset, pack_length: int, algorithm: str = "cghp", max_sequences_per_pack="max", *,
                  buffer_size: int = 100_000, columns=("input_ids",), label_column: str | None = "labels",
                  causal: bool = True, sequence_label_column: str | None = None, too_long: str = "error",
                  pad_token_id: int = 0, seed: int = 0, time_limit: float | None = None, verbose: bool = False):
    """Pack a `datasets.IterableDataset` (or a list or other re-iterable collection of dicts) as it streams: an
    IterableDataset of packs.

    The stream is read `buffer_size` rows at a time, and each buffer is packed on its own exactly as
    `pack_dataset` packs a dataset (the same columns; `source_rows` count rows from the start of the stream): a
    pack never holds rows of two buffers, and memory holds one buffer of rows and its packs. The packing of each
    buffer is as good as CGHP makes it on that buffer; only the last, partial buffer packs fewer rows. With
    verbose, each buffer's report is printed. Arguments as for `pack_dataset`; with `sequence_label_column`, a
    buffer's packs have as many `sequence_labels` slots as its fullest pack has documents (PackedDataCollator
    pads a batch's to its widest), and a list label must keep its length across buffers. The Trainer's
    `set_epoch` reaches the packs, not `dataset`: a shuffled IterableDataset source reshuffles each epoch only if
    its own `set_epoch` is called (a TrainerCallback's on_epoch_begin)."""
    import datasets

    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size must be a whole number >= 1, got {buffer_size!r}")
    if isinstance(dataset, datasets.Dataset):
        raise ValueError("pack_iterable streams an IterableDataset; pack a datasets.Dataset with pack_dataset")
    if not isinstance(dataset, collections.abc.Iterable) or isinstance(dataset, (str, bytes, collections.abc.Mapping)):
        raise ValueError(f"pack_iterable streams rows (dicts); got a {type(dataset).__name__} (a dict of splits: "
                         "pick one; a dict of columns: datasets.Dataset.from_dict, then pack_dataset)")
    if isinstance(dataset, collections.abc.Iterator):
        raise ValueError(f"pack_iterable reads its stream again every epoch, and a {type(dataset).__name__} can be "
                         "read once: give a datasets.IterableDataset (IterableDataset.from_generator) or a list")
    pack_length, columns, pad_token_id = _checked(pack_length, algorithm, columns, too_long, label_column,
                                                  sequence_label_column, pad_token_id)
    settings = dict(pack_length=pack_length, algorithm=algorithm, max_sequences_per_pack=max_sequences_per_pack,
                    columns=columns, label_column=None if sequence_label_column else label_column, causal=causal,
                    too_long=too_long, pad_token_id=pad_token_id, seed=seed, time_limit=time_limit,
                    sequence_label_column=sequence_label_column)
    # (datasets splits a list in gen_kwargs into one shard per element: a list of rows became one stream per row,
    # each row packed alone as source row 0; a tuple it passes whole)
    stream = tuple(dataset) if isinstance(dataset, list) else dataset
    return datasets.IterableDataset.from_generator(
        _stream_packs, gen_kwargs={"stream": stream, "buffer_size": buffer_size, "settings": settings,
                                   "verbose": verbose})


def _stream_packs(stream, buffer_size: int, settings: dict, verbose: bool):
    """The packs of `stream`, one buffer of rows at a time (pack_iterable's generator)."""
    start, widths, kept = 0, [], 0
    for buffer in _buffers(_rows(stream, buffer_size), buffer_size):
        for pack in _buffer_packs(buffer, start, settings, verbose, widths):
            kept += 1
            yield pack
        start += len(buffer)
    if not start:
        raise ValueError("the stream is empty: there is nothing to pack")
    if not kept:   # (too_long="drop" dropped every row)
        raise ValueError(f"every row is longer than pack_length {settings['pack_length']}; nothing to pack")


def _buffers(rows, size: int):
    """`rows` in lists of `size` (the last one shorter)."""
    buffer = []
    for row in rows:
        buffer.append(row)
        if len(buffer) == size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def _rows(stream, batch_size: int):
    """The rows of `stream`, all of them: a datasets.IterableDataset read by `__iter__` inside a DataLoader
    worker yields only that worker's share of its shards (only worker 0 runs pack_iterable's generator, which
    has one shard: half the rows of a 4-shard stream were lost under 2 workers), so it is read by `.iter()`."""
    import datasets

    if not isinstance(stream, datasets.IterableDataset):
        yield from stream
        return
    for batch in stream.iter(batch_size=batch_size):
        keys = list(batch)
        for i in range(len(batch[keys[0]]) if keys else 0):
            yield {k: batch[k][i] for k in keys}


def _buffer_packs(buffer: list, start: int, settings: dict, verbose: bool, widths: list):
    """The packs of one buffer of rows; `widths`: the sequence label width of the buffers before (kept alike)."""
    import datasets

    if settings["too_long"] == "drop" and all(row.get("input_ids") is not None
                                              and len(row["input_ids"]) > settings["pack_length"] for row in buffer):
        if verbose:
            print(f"rows {start}-{start + len(buffer) - 1}: every row is longer than pack_length "
                  f"{settings['pack_length']}; dropped")
        return
    extra = [c for c in (settings["label_column"], settings["sequence_label_column"]) if c]
    keys = set().union(*buffer)   # (a row without a column another row has: None there, refused as missing)
    chunk = datasets.Dataset.from_dict({c: [row.get(c) for row in buffer]
                                        for c in list(settings["columns"]) + extra if c in keys})
    width, column = None, settings["sequence_label_column"]
    if column:
        if widths and widths[0] == 0 and column in keys and isinstance(chunk.features[column], datasets.Value) \
                and chunk.features[column].dtype.startswith(("int", "uint")):   # (whole numbers in a float stream)
            chunk = chunk.cast_column(column, datasets.Value("float64"))
        width = _sequence_label_width(chunk, column, len(buffer))
        if widths and width != widths[0]:
            raise ValueError(f"rows {start}-{start + len(buffer) - 1} of the stream have sequence labels of another "
                             f"kind than the rows before (width {width} after {widths[0]}; None: class indices, 0: "
                             "one float): give every row the same kind of label")
        widths.append(width)
    plan, report = _plan(chunk, **settings, batch_size=len(buffer), sequence_label_width=width, first_row=start)
    if verbose:
        print(format_report(report))
    n_packs = len(plan.offsets) - 1
    for a in range(0, n_packs, _chunk(plan.pack_length)):
        batch = _build(plan, a, min(a + _chunk(plan.pack_length), n_packs))
        batch["source_rows"] = [[start + r for r in rows] for rows in batch["source_rows"].to_pylist()]
        batch["sequence_lengths"] = batch["sequence_lengths"].to_pylist()
        for p in range(len(batch["source_rows"])):
            yield {k: v[p] for k, v in batch.items()}


def _plan(dataset, pack_length, algorithm, max_sequences_per_pack, columns, label_column, causal, too_long,
          pad_token_id, seed, time_limit, batch_size, sequence_label_column=None, sequence_label_width=None,
          first_row=0):
    """Read the lengths, pack their histogram, assign the rows: the _Plan of the packs and the report.
    `first_row`: the number of the dataset's first row in the messages (a stream's buffer starts past 0)."""
    label_column = label_column if label_column and label_column in dataset.column_names else None

    lengths = _arrow_lengths(dataset, "input_ids", batch_size, first_row)
    for column in columns[1:] + ((label_column,) if label_column else ()):
        other = _arrow_lengths(dataset, column, batch_size, first_row, leave_out=(
            f"pass label_column=None, or sequence_label_column={column!r} for a label per row"
            if column == label_column else "leave it out of columns"))
        if not np.array_equal(other, lengths):
            i = int(np.argmax(other != lengths))
            raise ValueError(f"row {first_row + i}: {other[i]} {column} for {lengths[i]} input_ids; {column} must be "
                             "per token")
    if (lengths == 0).any():
        raise ValueError(f"row {first_row + int(np.argmax(lengths == 0))} is empty (0 tokens); filter out empty rows "
                         "first")
    long = np.nonzero(lengths > pack_length)[0]
    if len(long) and too_long == "error":
        i = int(long[0])
        raise ValueError(f"row {first_row + i} has {lengths[i]} tokens, more than pack_length {pack_length} "
                         f"({len(long)} such rows); raise pack_length or pass too_long='truncate' or too_long='drop'")
    keep = np.arange(len(lengths)) if too_long != "drop" else np.nonzero(lengths <= pack_length)[0]
    if len(keep) == 0:
        raise ValueError(f"every row is longer than pack_length {pack_length}; nothing to pack")
    kept = np.minimum(lengths[keep], pack_length)

    histogram = histogram_of(kept, pack_length)
    depth = resolve_depth(max_sequences_per_pack, histogram, algorithm)
    result = pack(histogram, algorithm, depth, seed=seed, time_limit=time_limit)
    offsets, order = assign_ragged(kept, result.mixture, pack_length, seed=seed)
    rows = keep[order]

    report = result.to_json() | {
        "pack_length": pack_length, "source_rows": len(lengths), "causal": causal, "too_long": too_long,
        "truncated": 0 if too_long != "truncate" else len(long), "dropped": 0 if too_long != "drop" else len(long),
        "gap_to_bound": result.packs / result.lower_bound_packs - 1 if result.lower_bound_packs else 0.0,
    }
    wanted = list(columns) + [c for c in (label_column, sequence_label_column) if c]
    # the source's columns as Arrow, made once: each select_columns / with_format builds a new Dataset (its
    # table's batch offsets, a deep copy of its info), which per chunk of packs was a sixth of the time
    source = dataset.select_columns(wanted).with_format("arrow")
    causal = causal and sequence_label_column is None  # one label per document: no next-token labels
    return _Plan(source, columns, label_column, pack_length, causal, pad_token_id, offsets, rows,
                 sequence_label_column, sequence_label_width), report


def _chunk(pack_length: int) -> int:
    return max(1, CHUNK_TOKENS // pack_length)


def _shards(n_packs: int, pack_length: int) -> list[tuple[int, int]]:
    """Pack ranges written to one Arrow file each: fixed by the data alone, so num_proc changes only who writes."""
    size = _chunk(pack_length) * SHARD_CHUNKS
    return [(a, min(a + size, n_packs)) for a in range(0, n_packs, size)]


def _write(plan: _Plan, folder: Path, num_proc: int):
    """Write every shard of the packs under `folder` (reused when a finished run left it) and load them."""
    import datasets

    from filelock import FileLock

    shards = _shards(len(plan.offsets) - 1, plan.pack_length)
    paths = [folder / f"packs-{i:05d}.arrow" for i in range(len(shards))]
    # one writer at a time: processes packing the same data into the same cache (torchrun's ranks, each calling
    # pack_dataset) wait for the first, then read what it wrote (two writers crashed on each other's .tmp files)
    if not (folder / "done").exists():   # (a finished cache is read without the lock: it may be read-only)
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if not (folder / "done").exists():
                _write_all(plan, folder, shards, paths, num_proc)
    return datasets.concatenate_datasets([datasets.Dataset.from_file(str(p)) for p in paths])


def _write_all(plan: _Plan, folder: Path, shards, paths, num_proc: int) -> None:
    """Every shard written (in `num_proc` processes), then the `done` marker."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs = list(zip(shards, paths))
    if num_proc > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(num_proc, len(jobs)), mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(_write_shard, [plan] * len(jobs), jobs))
    else:
        for job in jobs:
            _write_shard(plan, job)
    (folder / "done").write_text("ok\n")


def _features(plan: _Plan):
    import datasets

    ids = datasets.Sequence(datasets.Value("int32"), length=plan.pack_length)
    features = {c: ids for c in plan.columns}
    if plan.sequence_label_column:
        slots = int(np.diff(plan.offsets).max())
        width = plan.sequence_label_width
        value = datasets.Value("int64" if width is None else "float32")
        if width:
            value = datasets.Sequence(value, length=width)
        features["sequence_labels"] = datasets.Sequence(value, length=slots)
    elif plan.label_column:
        features["labels"] = ids
    features["sequence_lengths"] = datasets.Sequence(datasets.Value("int32"))
    features["source_rows"] = datasets.Sequence(datasets.Value("int64"))
    return datasets.Features(features)


def _write_shard(plan: _Plan, job) -> None:
    """Build packs [a, b) chunk by chunk from the source rows they hold and write them to one Arrow file."""
    from datasets.arrow_writer import ArrowWriter

    (a, b), path = job
    tmp = Path(str(path) + ".tmp")
    features = _features(plan)
    schema = features.arrow_schema  # computed once: datasets builds it anew on every access
    with ArrowWriter(features=features, path=str(tmp)) as writer:
        step = _chunk(plan.pack_length)
        for start in range(a, b, step):
            writer.write_table(_table(_build(plan, start, min(start + step, b)), schema))
        writer.finalize()
    os.replace(tmp, path)


def _build(plan: _Plan, a: int, b: int) -> dict:
    """The columns of packs [a, b) (int32 rows; `sequence_lengths` and `source_rows` Arrow list arrays): the
    source rows are read once, as Arrow, truncated to pack_length."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = plan.offsets[a:b + 1] - plan.offsets[a]
    rows = plan.rows[plan.offsets[a]:plan.offsets[b]]
    wanted = plan.columns + ((plan.label_column,) if plan.label_column else ())
    table = plan.source[rows]
    flat = {}
    for column in wanted:
        values = table[column]
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
        if lengths.max(initial=0) > plan.pack_length:  # truncation: only then a sliced copy
            values = pc.list_slice(values, 0, plan.pack_length)
            lengths = np.minimum(lengths, plan.pack_length)
        flat[column] = pc.list_flatten(values).to_numpy(zero_copy_only=False)
    fields = {c: flat[c] for c in plan.columns}
    if plan.label_column:
        fields["labels"] = flat[plan.label_column]
    fill = {"input_ids": plan.pad_token_id, "labels": IGNORE_INDEX}
    batch, pack, _, column = rows_from_packs(lengths, fields, plan.pack_length, offsets, np.arange(len(rows)),
                                             fill=fill, dtype=np.int32, layout=False)
    if plan.causal and "labels" in batch:
        batch["labels"][pack, column] = IGNORE_INDEX   # a document's first token: never a target
    pack_offsets = pa.array(offsets.astype(np.int32))
    batch["sequence_lengths"] = pa.ListArray.from_arrays(pack_offsets, pa.array(lengths.astype(np.int32)))
    batch["source_rows"] = pa.ListArray.from_arrays(pack_offsets, pa.array(rows, pa.int64()))
    if plan.sequence_label_column:  # document k of a pack (sequence_ids k + 1) -> slot k
        width = plan.sequence_label_width
        labels = table[plan.sequence_label_column]
        if width:
            labels = pc.list_flatten(labels).to_numpy(zero_copy_only=False).reshape(len(rows), width)
        else:
            labels = labels.to_numpy(zero_copy_only=False)
        labels = labels.astype(np.int64 if width is None else np.float32)
        slots = np.full((b - a, int(np.diff(plan.offsets).max())) + labels.shape[1:], IGNORE_INDEX,
                        dtype=labels.dtype)
        for p in range(b - a):
            slots[p, :offsets[p + 1] - offsets[p]] = labels[offsets[p]:offsets[p + 1]]
        batch["sequence_labels"] = slots
    return batch


def _table(batch: dict, schema):
    """`_build`'s columns as one Arrow table of `schema` (the packed dataset's), without copying the rows: each
    (packs, width) array is the values buffer of a fixed-size list array (datasets' own conversion copied and
    checked them value by value, a third of pack_dataset's time)."""
    import pyarrow as pa

    columns = []
    for field in schema:
        values = batch[field.name]
        if isinstance(values, np.ndarray):  # (packs, width, ...): nested fixed-size lists, innermost first
            flat = pa.array(values.reshape(-1))
            for width in values.shape[:0:-1]:
                flat = pa.FixedSizeListArray.from_arrays(flat, width)
            values = flat
        columns.append(values.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def packing_report(packed) -> dict:
    """The packing report `pack_dataset` stored in a packed dataset's info.description."""
    try:
        return json.loads(packed.info.description)[REPORT_KEY]
    except (TypeError, ValueError, KeyError):
        raise ValueError("this dataset carries no packing report; make it with bert_ipu.hf.pack_dataset") from None


def format_report(report: dict) -> str:
    """One paragraph: packs, efficiency, the gap to the proven bound, what was truncated or dropped."""
    return (f"packed {report['sequences']:,} of {report['source_rows']:,} rows into {report['packs']:,} packs of "
            f"{report['pack_length']} ({report['algorithm']}, "
            f"max_sequences_per_pack {report['max_sequences_per_pack']})"
            f": efficiency {report['efficiency']:.3%}, {report['packing_factor']:.3f} sequences a pack, "
            f"{report['gap_to_bound']:+.3%} packs over the proven lower bound {report['lower_bound_packs']:,}; "
            f"truncated {report['truncated']}, dropped {report['dropped']}; {report['seconds']:.2f} s")


def unpack_outputs(packed, outputs) -> list:
    """Outputs of the packs -> one array per source row, in source row order (a row of the source that was
    dropped gets None). Token-level outputs (packs, pack_length, ...): row r's are its (possibly truncated)
    tokens'; on packs with `sequence_labels` (sequence classification), outputs per document slot (packs, slots,
    ...): row r's are its document's (packed_sequence_classifier's logits: (num_labels,) a row). `outputs` is
    what `Trainer.predict(packed).predictions` returns for a mask-based collator."""
    outputs = np.asarray(outputs)
    report = packing_report(packed)
    documents = "sequence_labels" in packed.column_names
    width, what = (packed.features["sequence_labels"].length, "slots") if documents else (report["pack_length"],
                                                                                        "pack_length")
    if outputs.shape[:2] != (len(packed), width):
        raise ValueError(f"outputs of shape {outputs.shape} are not (packs, {what}, ...) = "
                         f"({len(packed)}, {width}, ...); predict on the packed dataset, in order")
    result = [None] * report["source_rows"]
    columns = packed.select_columns(["sequence_lengths", "source_rows"]).with_format("numpy")
    step = _chunk(report["pack_length"])
    for start in range(0, len(packed), step):
        chunk = columns[start:start + step]
        for p, (lengths, sources) in enumerate(zip(chunk["sequence_lengths"], chunk["source_rows"])):
            ends = np.cumsum(lengths)
            for k, (row, begin, end) in enumerate(zip(sources, ends - lengths, ends)):
                result[int(row)] = outputs[start + p][k] if documents else outputs[start + p][begin:end]
    return result


# ------------------------------------------------------------------------------------------------ the collator

def _is_causal(model) -> bool:
    """Whether `model` attends causally: not if its config sets use_bidirectional_attention (EmbeddingGemma's Gemma 3:
    a causal mask put it 2.8 off); else a decoder (`config.is_decoder`), a causal LM (its class or a base
    class), any head on a decoder-only architecture (one with a causal LM and no masked LM in `transformers`:
    Llama's or GPT-2's sequence and token classifiers), or a classifier head named `score` (decoders' name for
    it: Mistral 4's, whose causal LM `transformers` lists only as image-text-to-text) unless every attention
    module of the model says it is not causal (`is_causal` False: T5Gemma's encoder-only classifier, OpenAI's
    privacy filter, ESM C attend both ways; a causal mask put their logits 0.03-0.08 off)."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    if _bidirectional_setting(model):  # EmbeddingGemma's
        return False
    kind = getattr(model.config, "model_type", None)
    decoder_only = kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    names = [c.__name__ for c in type(model).__mro__]
    causal_lm = any(n in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() or n.endswith("ForCausalLM") for n in names)
    flags = {m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)}
    scored = hasattr(model, "score") and names[0].endswith(("ForSequenceClassification", "ForTokenClassification")) \
        and flags != {False}
    return bool(getattr(model.config, "is_decoder", False)) or causal_lm or decoder_only or scored \
        or flags == {True}


def _bidirectional_setting(model) -> bool:
    """Whether config.use_bidirectional_attention makes the text attend both ways: True (Gemma 1-3) or "all"
    (Gemma 4; its "vision", the default of Gemma 4 Unified, keeps text causal: a both-ways mask was 0.42 off)."""
    setting = getattr(_text_config(model), "use_bidirectional_attention", None)
    return setting is True or setting == "all"


def _refuse_encoder_decoder(model, what: str) -> None:
    """An encoder-decoder (`config.is_encoder_decoder`, and its base has a decoder: BART's, T5's classifiers)
    runs its decoder on the packed rows too, where it reads across the documents of a pack (a BART classifier ran
    on them without an error): refused. An encoder alone (T5EncoderModel, UMT5's token classifier, whose configs
    may still say is_encoder_decoder) is not."""
    if getattr(model.config, "is_encoder_decoder", False) and hasattr(getattr(model, "base_model", model), "decoder"):
        raise ValueError(f"{what} packs encoder-only and decoder-only models; {type(model).__name__} is an "
                         "encoder-decoder (config.is_encoder_decoder), whose decoder would read across the "
                         "documents of a pack: train it unpacked")


# Model types whose documents a packed row cannot keep apart, and why: each found by running every document of a
# pack against it alone (float64, 2026-11-29), where it ran at all. Not refused: a Switch Transformers encoder (its
# experts' capacity is shared by a row's tokens, as by a batch's unpacked).
_MIXES = "it mixes tokens outside attention, so one document of a pack reads the next"
_MASK_2D = "its attention takes a 2D padding mask only, not the 4D mask that keeps a pack's documents apart"
_POSITIONS = "it numbers positions from the start of the row and ignores position_ids"
UNPACKABLE_MODEL_TYPES = {
    "fnet": _MIXES + " (Fourier transforms)",
    "convbert": _MIXES + " (convolutions)",
    "mobilebert": _MIXES + " (its embeddings read the neighbouring tokens)",
    "nystromformer": _MIXES + " (its approximation of attention ignores the mask)",
    "mra": _MIXES + " (its approximation of attention ignores the mask)",
    "layoutlm": "it reads the 4D mask as a 2D one (NaN logits)",
    "markuplm": "it reads the 4D mask as a 2D one",
    "cpmant": "it makes its own attention mask from the input ids and ignores the one given (logits 25 off)",
    **dict.fromkeys(("trocr", "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                     "pegasus", "plbart", "musicgen_decoder", "musicgen_melody_decoder"), _POSITIONS),
    "blt": "it groups bytes into patches outside attention (the second document 5.0 off under sdpa)",
    "reformer": _MASK_2D,
    "neomme": "its windows are set per layer and its forward takes masks by layer index, not by layer type",
    "rwkv": "it is recurrent: its state runs from one document of a pack into the next",
    "xlstm": "it is recurrent: its state runs from one document of a pack into the next",
    **dict.fromkeys(("bloom", "canine", "deberta", "deberta-v2", "esm", "flaubert", "funnel", "longformer", "longt5",
                     "openai-gpt", "prophetnet", "xlm", "xlnet", "yoso"), _MASK_2D),
}
# Settings under which a model type's documents cannot be kept apart: (model type, config attribute) -> why
UNPACKABLE_SETTINGS = {
    ("falcon", "alibi"): _MASK_2D + " (ALiBi, as in the falcon-rw checkpoints)",
}
# config.layer_types that keep the documents of a pack apart under the collator's mask (others, linear attention
# and recurrent or hybrid layers, carry a state from one document into the next)
MASKED_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "mlp", "moe")


def _unwrap(model):
    """The `transformers` model inside the wrappers a Trainer's model may wear, which the collator reads for what
    the model is: torch.compile's (`_orig_mod`), PEFT's (`get_base_model()`: LoRA's layers are swapped in place, so
    the base runs them) and `packed_sequence_classifier`'s. Read through them, a compiled token classifier lost its
    document starts' labels and a PEFT RoBERTa its position offset (logits 0.19 off)."""
    for _ in range(16):
        if getattr(type(model), "wraps_model", False):   # packed_sequence_classifier's
            inner = model.model
        elif hasattr(model, "_orig_mod"):
            inner = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config"):
            if getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
                raise ValueError(f"{type(model).__name__} uses prompt or prefix tuning, whose virtual tokens are "
                                 "added to every row, not to each document of a pack: use LoRA (or another adapter "
                                 "that swaps layers), or train it unpacked")
            inner = model.get_base_model()
        else:
            return model
        if inner is model:
            return model
        model = inner
    return model


def _text_config(model):
    """The config of the model's language part (a multimodal model's text config; else the config itself)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _refuse_unpackable(model, what: str) -> None:
    """A model whose documents a packed row cannot keep apart, whatever the collator's mask: refused by model type
    (UNPACKABLE_MODEL_TYPES: it mixes tokens outside attention, or its attention takes no 4D mask), by a setting
    of its config (UNPACKABLE_SETTINGS: Falcon's ALiBi failed with a traceback inside transformers) or by its layer
    types (linear attention, Mamba: a state carried from one document into the next)."""
    kind = getattr(model.config, "model_type", None)
    layers = sorted(set(getattr(_text_config(model), "layer_types", None) or ()) - set(MASKED_LAYER_TYPES))
    for (setting_kind, setting), why in UNPACKABLE_SETTINGS.items():
        if kind == setting_kind and getattr(model.config, setting, False):
            raise ValueError(f"{what} cannot keep packed documents apart in {type(model).__name__} (model type "
                             f"{kind}, config.{setting}=True): {why}; train it unpacked")
    if kind in UNPACKABLE_MODEL_TYPES or layers:
        why = UNPACKABLE_MODEL_TYPES.get(kind) or \
            f"its layer types {', '.join(layers)} carry a state from one document of a pack into the next"
        raise ValueError(f"{what} cannot keep packed documents apart in {type(model).__name__} (model type {kind}): "
                         f"{why}; train it unpacked")


def _refuse_half_bidirectional(model, what: str) -> None:
    """Gemma 1-2 with use_bidirectional_attention: transformers turns off only their attention modules' is_causal
    and still builds a causal mask, so unpacked they attend both ways under sdpa (no mask) and causally under eager
    (8e-3 to 9e-2 apart, float64): no one mask packs both. So does Gemma 3's multimodal wrapper
    (Gemma3ForConditionalGeneration: its masks ignore the setting, eager and sdpa 0.125 apart). Refused; Gemma 3's
    text models apply the setting in their masks and pack exactly, both ways."""
    if _bidirectional_setting(model) and (
            getattr(_text_config(model), "model_type", None) in ("gemma", "gemma2")
            or getattr(model.config, "model_type", None) == "gemma3"):
        raise ValueError(f"{what}: {type(model).__name__} sets use_bidirectional_attention, which transformers "
                         "applies to Gemma 1-2 (and Gemma 3's multimodal wrapper) under sdpa but not eager, so the "
                         "model unpacked has no one mask to pack with: use Gemma 3's text model (EmbeddingGemma's "
                         "base), or train it unpacked")


def _refuse_router_logits(model, what: str) -> None:
    """A mixture of experts asked for its router logits (config.output_router_logits: the load-balancing loss)
    reads attention_mask as a 2D padding mask (`load_balancing_loss_func`): on packed masks it failed with a
    traceback (Mixtral, GPT-OSS). Refused under eager and sdpa, naming the setting; a flash kernel's flattened rows
    carry no mask (the loss then balances over the micro-batch's tokens, as over an unpacked batch's)."""
    if getattr(_text_config(model), "output_router_logits", False):
        raise ValueError(f"{what}: {type(model).__name__} has output_router_logits=True, whose load-balancing loss "
                         "reads attention_mask as a 2D padding mask, not a packed one: set "
                         "config.output_router_logits=False (no auxiliary loss), or train it unpacked")


def _refuse_bidirectional_causal_lm(model, what: str) -> None:
    """A causal LM class of an encoder family (BertLMHeadModel, RobertaForCausalLM, BertGenerationDecoder) attends
    causally only when config.is_decoder is set; without it transformers runs it both ways (and warns), while its
    loss still shifts labels. The collator's causal mask would then differ from the model unpacked (logits 3e-3 to
    5e-3 off), and a bidirectional one would let a document's first label be read from the one before it: refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(model.config, "is_decoder", False):
        return
    encoder_family = getattr(model.config, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES \
        or type(getattr(model, "base_model", model)).__name__.endswith("Encoder")
    causal_lm = any(c.__name__.endswith(("ForCausalLM", "LMHeadModel", "Decoder")) for c in type(model).__mro__)
    if encoder_family and causal_lm:
        raise ValueError(f"{what}: {type(model).__name__} is a causal LM of an encoder family whose config has "
                         "is_decoder=False, so transformers runs it bidirectionally: load it with is_decoder=True "
                         "(from_pretrained(..., is_decoder=True))")


def _refuse(model, what: str, masked: bool) -> None:
    """Every refusal of a model the collator (or `packed_sequence_classifier`) cannot pack exactly; `masked`: its
    batches carry an eager or sdpa mask (not flattened rows)."""
    if model is None:
        return
    _refuse_encoder_decoder(model, what)
    _refuse_unpackable(model, what)
    _refuse_bidirectional_causal_lm(model, what)
    _refuse_half_bidirectional(model, what)
    if masked:  # (flattened rows have no mask to misread)
        _refuse_router_logits(model, what)


# the masking_utils functions (or Gemma 3's own overlay) by which a model's forward applies a sliding window
WINDOW_MASKS = ("create_sliding_window_causal_mask", "create_bidirectional_sliding_window_mask",
                "sliding_window_overlay", "sliding_window_bidirectional", "_bidirectional_window_overlay")


class _Overlay:
    """transformers' mask overlay `module.name(*args)` (a closure), made where it is first applied: the collator
    then pickles, as a DataLoader's workers started by spawn or forkserver need (a closure did not)."""

    def __init__(self, module: str, name: str, *args):
        self.module, self.name, self.args, self._made = module, name, args, None

    def __call__(self, b, h, q, k):
        if self._made is None:
            import importlib

            self._made = getattr(importlib.import_module(self.module), self.name)(*self.args)
        return self._made(b, h, q, k)

    def __getstate__(self):
        return dict(self.__dict__, _made=None)


class _Chunks:
    """Llama 4's chunked attention inside a document: q and k in the same chunk (picklable, as `_Overlay`)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, b, h, q, k):
        return q // self.size == k // self.size


def _layer_limits(model, causal: bool) -> tuple[tuple | None, dict, bool]:
    """How far each kind of layer attends, which the collator's eager or sdpa mask must say itself (transformers
    passes a 4D mask through as given, so a document longer than a window would attend too far back: Gemma 3's
    logits were 0.23 off). Returns (layer types, {layer type or None: (span, overlay)}, masks_by_type):

    - the model's distinct `layer_types` (None where it has none: every layer alike);
    - per kind of layer that sees less than its whole document, its span and overlay: a sliding window (Mistral's
      on every layer when set, Gemma 2-3's, GPT-OSS's, OLMo 3's sliding_attention layers; both ways for an
      encoder: OpenAI's privacy filter) or chunks (Llama 4's chunked_attention layers); key None for every layer
      of a model without layer types. The overlays are transformers' own (`masking_utils`), applied to positions
      inside documents;
    - whether the model takes a mask per layer type (a dict, as its forward accepts: `attention_mask, dict)`).
    """
    import inspect
    import sys

    from transformers import masking_utils

    text = _text_config(model)
    kinds = getattr(text, "layer_types", None)
    kinds = tuple(dict.fromkeys(kinds)) if kinds else None
    sources = []   # the forwards of the model's modules: which masks they build, whether they take a dict
    for cls in {type(m) for m in model.modules()}:
        try:
            sources.append(inspect.getsource(cls.__dict__["forward"]) if "forward" in cls.__dict__ else "")
        except (OSError, TypeError):
            continue
    code = "\n".join(sources)
    limits = {}
    # a window only where the model's own masks apply one (Moshi's config has a window its mask never uses)
    window = getattr(text, "sliding_window", None) if any(name in code for name in WINDOW_MASKS) else None
    if window and getattr(text, "use_sliding_window", True) is not False and (kinds is None
                                                                              or "sliding_attention" in kinds):
        where = (masking_utils.__name__, "sliding_window_overlay")
        if not causal:  # both ways: |q - k| <= window (the privacy filter's), or the model's own (Gemma 3's is <)
            own = hasattr(sys.modules[type(model).__module__], "_bidirectional_window_overlay")
            where = (type(model).__module__, "_bidirectional_window_overlay") if own else \
                (masking_utils.__name__, "sliding_window_bidirectional_overlay")
        limits["sliding_attention" if kinds else None] = (int(window), _Overlay(*where, int(window)))
    chunk = getattr(text, "attention_chunk_size", None)
    if chunk and kinds and "chunked_attention" in kinds and "create_chunked_causal_mask" in code:
        # (masking_utils.chunked_overlay with no left padding: chunks count from each document's start)
        limits["chunked_attention"] = (int(chunk), _Chunks(int(chunk)))
    return kinds, limits, bool(kinds and limits) and "attention_mask, dict)" in code


def _token_classifier(model) -> bool:
    """Whether `model` (or a base class) is a *ForTokenClassification: its labels are per position, not
    shifted as a causal LM's are."""
    return any(c.__name__.endswith("ForTokenClassification") for c in type(model).__mro__)


def _position_offset(model) -> int:
    """RoBERTa-style embeddings (RoBERTa's family, MPNet) number positions from padding_idx + 1 (they make
    position_ids from input_ids when none are given); our positions start at 0, so they are shifted by that much."""
    embeddings = getattr(getattr(model, "base_model", model), "embeddings", None)
    # (RoBERTa's embeddings have both methods, MPNet's only the second: the first is a module function there)
    padding_positions = ("create_position_ids_from_input_ids", "create_position_ids_from_inputs_embeds")
    if embeddings is not None and any(hasattr(type(embeddings), name) for name in padding_positions) \
            and getattr(embeddings, "padding_idx", None) is not None:
        return int(embeddings.padding_idx) + 1
    return 0


class LayerMasks(dict):
    """The collator's masks by layer type, as transformers takes `attention_mask` where layers differ (Gemma 2-3's
    sliding and full layers): a dict (what transformers checks for) that also answers `sum()` as the full layers'
    4D mask does. TRL's SFTTrainer logs `attention_mask.sum()` as its token count (under any 4D mask a count of mask
    entries, not of tokens: docs/hf.md); a plain dict made it fail with an AttributeError."""

    def sum(self, *args, **kwargs):
        return self.get("full_attention", next(iter(self.values()))).sum(*args, **kwargs)


class PackedDataCollator:
    """A `data_collator` for `transformers.Trainer` (and TRL's SFTTrainer) taking packed rows (`pack_dataset`:
    input_ids, sequence_lengths, labels if any) to inputs on which the model attends within documents only.

    From each pack's sequence_lengths it makes position_ids (restarting at 0 in every document, 0 on padding),
    sequence_ids (1..k, 0 on padding) and, for a causal LM whose packs hold no labels, labels: the input_ids,
    IGNORE_INDEX at every document's first token and on padding (the model shifts labels inside). A causal LM's
    stored labels get IGNORE_INDEX at document starts too; other models' stored labels (a decoder's token
    classifier's too: its labels are not shifted) are used as they are.

    model: read for the attention implementation (`model.config._attn_implementation`), whether it is causal
        (a decoder, a causal LM or a subclass of one, a head on a decoder-only architecture such as
        LlamaForTokenClassification, or a classifier whose head is `score` unless no attention module is causal),
        whether it shifts labels (a causal model that is no token classifier), which token of a document
        `packed_sequence_classifier` pools (the last for a causal model or under a `score` head, else the
        first), its sliding windows or chunks (applied in the mask: one per layer type where the model takes a dict
        of them) and RoBERTa's (or MPNet's) position offset; or give them. An encoder-decoder
        with a decoder in its base, a model whose documents a pack cannot keep apart (it mixes tokens outside
        attention, its attention takes no 4D mask or it ignores position_ids: UNPACKABLE_MODEL_TYPES), an encoder
        family's causal LM without config.is_decoder (transformers runs it bidirectionally) and Gemma 1-2 with
        use_bidirectional_attention (both ways under sdpa, causal under eager) are refused.
    attn_implementation: "eager", "sdpa" -> a 4D mask (batch, 1, S, S) that is block-diagonal (and causal
        inside each document for causal LMs; windowed or chunked as the layers are; a dict of them by layer type
        where the model takes one): additive float (0 / dtype min) for eager, boolean (True = attend)
        for sdpa; padding attends to itself only, so no row is empty. "flash_attention_*"
        -> the micro-batch's documents flattened into one row without padding, with position_ids and
        cu_seq_lens_q/k, max_length_q/k (what the varlen kernels take). "bert_ipu" -> input_ids, position_ids,
        sequence_ids, labels for this project's packed models (a causal LM's labels as they take them: the next
        token of the same document at each position). Anything else: ValueError.
    causal, shift_labels, position_offset, pad_token_id: override what `model` says (shift_labels defaults to
        `causal`, except for a *ForTokenClassification; pad_token_id: where the last token is pooled, a document's
        last token that is not this one is, as a decoder's classifier pools a row's). dtype: the float mask's dtype
        (the model's).

    The Trainer must keep `sequence_lengths`: TrainingArguments(remove_unused_columns=False).
    """

    def __init__(self, model=None, *, attn_implementation: str | None = None, causal: bool | None = None,
                 shift_labels: bool | None = None, position_offset: int | None = None, dtype=None,
                 pad_token_id: int | None = None):
        import torch

        if model is None and (attn_implementation is None or causal is None):
            raise ValueError("PackedDataCollator needs the model, or both attn_implementation and causal")
        model = _unwrap(model) if model is not None else None
        if attn_implementation is None:
            attn_implementation = getattr(model.config, "_attn_implementation", None) or "eager"
        if not (attn_implementation in MASK_IMPLEMENTATIONS or attn_implementation == OWN_MODELS
                or attn_implementation.startswith(FLASH_PREFIX)):
            raise ValueError(f"attn_implementation {attn_implementation!r} is not known to keep packed documents "
                             "apart: load the model with attn_implementation= one of "
                             f"{', '.join(MASK_IMPLEMENTATIONS)} or a {FLASH_PREFIX}* kernel, or train it unpacked")
        _refuse(model, "PackedDataCollator", masked=attn_implementation in MASK_IMPLEMENTATIONS)
        self.attn_implementation = attn_implementation
        self.causal = _is_causal(model) if causal is None else bool(causal)
        # a document's pooled token for packed_sequence_classifier: the last for a causal model or under a `score`
        # head (where their own forward pools, T5Gemma's bidirectional encoder-only classifier's too), else the
        # first
        self.pool_last = self.causal or (model is not None and hasattr(model, "score"))
        # ... and there, as their forward does, the last token that is not the pad token (pad_token_id is often
        # the end-of-text token, which ends every document)
        self.pad_token_id = pad_token_id if pad_token_id is not None or model is None or not self.pool_last \
            else getattr(_text_config(model), "pad_token_id", None)   # (CodeGen's config has none)
        self.layer_types, self.limits, self.masks_by_type = _layer_limits(model, self.causal) \
            if model is not None else (None, {}, False)
        if shift_labels is None:  # a causal model's labels are next tokens, but a token classifier's
            shift_labels = self.causal and not (model is not None and _token_classifier(model))
        self.shift_labels = bool(shift_labels)
        self.position_offset = (_position_offset(model) if model is not None else 0) if position_offset is None \
            else int(position_offset)
        self.dtype = dtype if dtype is not None else (model.dtype if model is not None else torch.float32)

    def __call__(self, features: list[dict]) -> dict:
        import torch

        if not features:
            raise ValueError("an empty batch: there are no packs to collate")
        if "input_ids" not in features[0]:
            raise ValueError(f"the packs have no input_ids (they have {', '.join(features[0]) or 'nothing'}): make "
                             "them with bert_ipu.hf.pack_dataset, and keep its columns in the Trainer")
        if "sequence_lengths" not in features[0]:
            raise ValueError("the packs have no sequence_lengths (the Trainer removes columns the model does not "
                             "take): set TrainingArguments(remove_unused_columns=False) and pack with "
                             "bert_ipu.hf.pack_dataset")
        widths = sorted({len(f["input_ids"]) for f in features})
        if len(widths) > 1:
            raise ValueError(f"one batch holds packs of {widths[0]} and {widths[-1]} tokens: batch packs of one "
                             "pack_length only (one pack_dataset call, or one dataset per pack length)")
        if self.limits and self.layer_types and not self.masks_by_type \
                and self.attn_implementation in MASK_IMPLEMENTATIONS:
            span = min(span for span, _ in self.limits.values())
            longest = max((int(n) for f in features for n in f["sequence_lengths"]), default=0)
            if longest > span:
                raise ValueError(f"a document of {longest} tokens is longer than the model's sliding window or "
                                 f"chunk ({span}), which the collator's {self.attn_implementation} mask applies only "
                                 "to a model taking a mask per layer type: pack documents of at most "
                                 f"{span} tokens, or use a flash_attention_* kernel")
        stack = {k: torch.as_tensor(np.stack([np.asarray(f[k]) for f in features]), dtype=torch.long)
                 for k in ("input_ids", "labels", "token_type_ids") if k in features[0]}
        positions, sequence_ids = _layout([f["sequence_lengths"] for f in features], stack["input_ids"].shape[1])
        stack["position_ids"], stack["sequence_ids"] = torch.from_numpy(positions), torch.from_numpy(sequence_ids)
        if self.shift_labels and "sequence_labels" not in features[0]:
            labels = stack["labels"] if "labels" in stack else stack["input_ids"].clone()
            stack["labels"] = labels.masked_fill_((stack["position_ids"] == 0) | (stack["sequence_ids"] == 0),
                                                  IGNORE_INDEX)   # a document's first token: never a target
        if "sequence_labels" in features[0]:  # sequence classification: a label and a pooled token per document
            if self.attn_implementation.startswith(FLASH_PREFIX) or self.attn_implementation == OWN_MODELS:
                raise ValueError("packs with sequence_labels train with packed_sequence_classifier on an eager or "
                                 f"sdpa model; attn_implementation {self.attn_implementation!r} is not supported")
            each = [np.asarray(f["sequence_labels"]) for f in features]
            slots = max(len(x) for x in each)   # (pack_iterable's buffers may have fewer: padded as empty slots)
            labels = np.stack([np.concatenate([x, np.full((slots - len(x),) + x.shape[1:], IGNORE_INDEX, x.dtype)])
                               for x in each])
            # (float labels, regression or multi-label, as float32: what Hugging Face's collators make of them)
            stack["labels"] = torch.as_tensor(labels.astype(np.float32) if labels.dtype.kind == "f" else labels)
            pads = stack["input_ids"] == self.pad_token_id if self.pool_last and self.pad_token_id is not None \
                else None   # (a decoder's classifier pools a document's last token that is no pad_token_id)
            stack["pooled_positions"] = document_positions(stack["sequence_ids"], stack["labels"].shape[1],
                                                           last=self.pool_last, skip=pads)
        if self.attn_implementation == OWN_MODELS:
            if self.shift_labels and "labels" in stack:  # our causal LMs take next-token labels (models.causal_lm)
                stack["labels"] = torch.nn.functional.pad(stack["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)
            return stack
        sequence_ids = stack.pop("sequence_ids")
        positions = stack["position_ids"]
        stack["position_ids"] = positions + self.position_offset
        if self.attn_implementation.startswith(FLASH_PREFIX):
            return self._flattened(stack, sequence_ids)
        if self.layer_types and self.masks_by_type:  # one mask per layer type, as the model's forward takes them
            masks = {key: self._mask(sequence_ids, positions, limit) for key, limit in self.limits.items()}
            full = self._mask(sequence_ids, positions)
            stack["attention_mask"] = LayerMasks({kind: masks.get(kind, full) for kind in self.layer_types})
        else:
            stack["attention_mask"] = self._mask(sequence_ids, positions, self.limits.get(None))
        return stack

    def _mask(self, sequence_ids, positions, limit=None):
        """(B, 1, S, S): query t sees key u iff both are in the same document (and u <= t if causal, and the
        `limit` (span, overlay) allows their positions in the document); a padding token sees itself."""
        import torch

        same = (sequence_ids[:, :, None] == sequence_ids[:, None, :]) & (sequence_ids[:, :, None] > 0)
        if self.causal:
            same &= torch.ones(same.shape[1:], dtype=torch.bool).tril()
        if limit is not None:
            same &= limit[1](None, None, positions[:, :, None], positions[:, None, :])
        same |= torch.eye(same.shape[1], dtype=torch.bool)
        if self.attn_implementation == "sdpa":
            return same[:, None]
        mask = torch.zeros(same.shape, dtype=self.dtype).masked_fill_(~same, torch.finfo(self.dtype).min)
        return mask[:, None]

    def _flattened(self, stack, sequence_ids):
        """Every document of the micro-batch back to back in one row (padding left out), as flash varlen takes."""
        import torch

        real = sequence_ids > 0
        out = {k: v[real][None] for k, v in stack.items()}
        starts = (out["position_ids"][0] == self.position_offset).nonzero().flatten()
        cu = torch.cat([starts, torch.tensor([out["input_ids"].shape[1]])]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        return out | {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def _layout(sequence_lengths: list, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids, sequence_ids), (B, width) int64 each, of packs holding documents of these lengths back to
    back from column 0: positions restart at 0 in every document, ids are 1..k; 0 on padding for both."""
    positions = np.zeros((len(sequence_lengths), width), dtype=np.int64)
    sequence_ids = np.zeros((len(sequence_lengths), width), dtype=np.int64)
    for p, lengths in enumerate(sequence_lengths):
        lengths = np.asarray(lengths, dtype=np.int64)
        used = int(lengths.sum())
        if (lengths < 1).any() or used > width:
            raise ValueError(f"pack {p} has sequence_lengths {lengths.tolist()}: they must be >= 1 and sum to at "
                             f"most its {width} tokens; make the packs with bert_ipu.hf.pack_dataset")
        starts = np.cumsum(lengths) - lengths
        positions[p, :used] = np.arange(used) - np.repeat(starts, lengths)
        sequence_ids[p, :used] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    return positions, sequence_ids


def document_positions(sequence_ids, slots: int, last: bool = False, skip=None):
    """(B, slots): the position of each document's first token (`last`: its last token) in its pack, document k
    of a pack in slot k - 1; -1 in the slots of a pack with fewer documents. `skip` (B, S) bool, with `last`: the
    last token not skipped (a decoder's classifier pools the rightmost token that is not its pad_token_id), or,
    in a document of skipped tokens only, its first (where that classifier's argmax over no such token lands)."""
    import torch

    B, S = sequence_ids.shape
    k = torch.arange(1, slots + 1)
    inside = sequence_ids[:, None, :] == k[None, :, None]                     # (B, slots, S)
    at = torch.arange(S).expand(B, slots, S)
    first = torch.where(inside, at, S).min(-1).values
    final = torch.where(inside, at, -1).max(-1).values
    if skip is not None:
        kept = torch.where(inside & ~skip[:, None, :], at, -1).max(-1).values
        final = torch.where(kept >= 0, kept, first)
    pos = final if last else first
    return torch.where(inside.any(-1), pos, -1)


PROBLEM_TYPES = (None, "single_label_classification", "multi_label_classification", "regression")


def packed_sequence_classifier(model):
    """Sequence classification of every document of a pack with a Hugging Face `*ForSequenceClassification`
    model (whose own forward pools one token per row, so it cannot classify several documents of a pack).

        packed = pack_dataset(ds, 128, causal=False, sequence_label_column="label", columns=(...))
        model = packed_sequence_classifier(AutoModelForSequenceClassification.from_pretrained(..., num_labels=2))
        Trainer(model, args, train_dataset=packed, data_collator=PackedDataCollator(model.model), ...)
        model.model.save_pretrained(...)   # the wrapped model is the Hugging Face model itself, unchanged

    The forward runs the model's base (`model.base_model`) on the packs with the collator's mask, gathers each
    document's pooled token (the collator's `pooled_positions`: its last token that is not the pad token for a
    causal model or under a `score` head, as their own forward pools, else its first) and applies the model's own
    head to it, as its forward does to a row's: BERT-style (`base_model.pooler`, ALBERT's `pooler_activation` after
    it, `dropout`, `classifier`), RoBERTa-style (`classifier` taking the [CLS] hidden state; a plain Linear
    `classifier` too, CTRL's) or decoder-style (`score`). A model with any other module beside its base and dropout
    (DistilBERT's pre_classifier, ModernBERT's head) is refused. Returns `logits` (B, slots, num_labels), and `loss`
    when labels are given: the documents' summed loss divided by `num_items_in_batch` (the Trainer's count of labels
    other than IGNORE_INDEX over the whole update: documents, or documents x num_labels for list labels), so packed
    and unpacked runs agree however the update is cut (Hugging Face's own forward takes each micro-batch's mean
    instead). The loss is the one the model's own forward picks (`config.problem_type`, or as it infers it, and then
    keeps in the config: regression where num_labels is 1, single-label for class indices, else
    multi-label): cross-entropy, squared error or binary cross-entropy on logits."""
    return _classifier_class()(model)


@functools.cache
def _classifier_class():
    import torch

    class _Classifier(torch.nn.Module):
        wraps_model = True   # (`_unwrap`: the collator reads the model inside)

        def __init__(self, model):
            super().__init__()
            if hasattr(model, "_orig_mod"):
                raise ValueError("packed_sequence_classifier takes the model uncompiled (it runs the model's base "
                                 "and head itself): compile the classifier, torch.compile(packed_sequence_classifier("
                                 "model))")
            given, model = model, _unwrap(model)   # (PEFT's LoRA layers are in its base model, which runs them)
            _refuse(model, "packed_sequence_classifier", masked=True)
            config = model.config
            if config.problem_type not in PROBLEM_TYPES or (config.num_labels < 2 and config.problem_type
                                                            == "single_label_classification"):
                raise ValueError(f"packed_sequence_classifier takes problem_type "
                                 f"{', '.join(map(str, PROBLEM_TYPES))} (classification with num_labels >= 2); this "
                                 f"model has num_labels {config.num_labels}, problem_type {config.problem_type!r}")
            # the modules beside the base and dropout: what the model's forward applies to its pooled token
            heads = sorted(name for name, child in model.named_children()
                           if child is not model.base_model and not isinstance(child, torch.nn.Dropout))
            if heads == ["score"]:
                self.kind = "score"
            elif heads == ["classifier"] and getattr(model.base_model, "pooler", None) is not None \
                    and isinstance(getattr(model, "dropout", None), torch.nn.Dropout):
                self.kind = "pooler"  # (BigBird's base has a pooler its classification head does not use)
            elif heads == ["classifier"]:
                self.kind = "cls"
            else:
                raise ValueError(f"{type(model).__name__}'s head ({', '.join(heads) or 'none'}) is not one that "
                                 "packed_sequence_classifier knows (a classifier, after the base's pooler or not, "
                                 "or a score): give a *ForSequenceClassification model of such a head, or train "
                                 "it unpacked")
            # `model`: the model given (a PeftModel saves its adapter); the one run, unregistered (its parameters
            # are the given model's)
            self.model, self.config = given, config
            object.__setattr__(self, "_run", model)

        def forward(self, input_ids, attention_mask, position_ids, pooled_positions, labels=None,
                    token_type_ids=None, num_items_in_batch=None, **kwargs):
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            hidden = self._run.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids, **extra).last_hidden_state
            B, slots = pooled_positions.shape
            index = pooled_positions.clamp_min(0)
            pooled = torch.gather(hidden, 1, index[..., None].expand(B, slots, hidden.shape[-1]))
            flat = pooled.reshape(B * slots, 1, -1)
            if self.kind == "pooler":
                base = self._run.base_model
                summary = base.pooler(flat)
                if hasattr(base, "pooler_activation"):  # ALBERT's pooler is a Linear, its tanh apart
                    summary = base.pooler_activation(summary)
                logits = self._run.classifier(self._run.dropout(summary))
            elif self.kind == "cls":
                logits = self._run.classifier(flat)
            else:
                logits = self._run.score(flat[:, 0])
            logits = logits.reshape(B, slots, -1)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = self._loss(logits, labels.to(logits.device), pooled_positions >= 0, num_items_in_batch)
            return out

        def _loss(self, logits, labels, present, num_items_in_batch):
            """The documents' summed loss over num_items_in_batch (default: this batch's labels), the loss the
            model's own forward takes for its problem type (inferred as it does where the config names none)."""
            functional = torch.nn.functional
            counted = labels.ne(IGNORE_INDEX)   # (the Trainer's count of num_items_in_batch)
            logits = _at_least_float32(logits)
            problem = self.config.problem_type or ("regression" if self.config.num_labels == 1 else
                                                   "single_label_classification" if not labels.is_floating_point()
                                                   else "multi_label_classification")
            if problem == "single_label_classification":
                if labels.is_floating_point():
                    raise ValueError("single_label_classification takes class indices: pack an integer or "
                                     "ClassLabel sequence_label_column, or set the model's problem_type to "
                                     "regression or multi_label_classification")
                total = functional.cross_entropy(logits.flatten(0, 1), labels.reshape(-1),
                                                 ignore_index=IGNORE_INDEX, reduction="sum")
            else:
                if labels.numel() != logits.numel():
                    raise ValueError(f"{problem} takes {logits.shape[-1]} numbers a document (num_labels); the labels "
                                     f"have {labels[0, 0].numel()}: give sequence labels of num_labels numbers, or "
                                     "class indices as an integer column")
                targets = labels.to(logits.dtype).reshape(logits.shape)
                if problem == "regression":
                    each = functional.mse_loss(logits, targets, reduction="none")
                else:
                    each = functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
                # empty slots, and labels of IGNORE_INDEX (integers under regression), are left out of the sum as
                # the count leaves them out
                total = each[present[..., None] & counted.reshape(logits.shape)].sum()
            count = num_items_in_batch if num_items_in_batch is not None else counted.sum()
            self.config.problem_type = problem   # (as the model's own forward does: saved with it, for pipelines)
            return total / count

    return _Classifier


def _at_least_float32(logits):
    """Half-precision logits in float32 for the loss (as transformers' own loss does); float64 kept (a float64
    run's loss was 3e-7 off Hugging Face's float64 one when cast down)."""
    import torch

    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def token_loss(causal: bool):
    """A `compute_loss_func` for `transformers.Trainer`: the sum of the token cross-entropies of the micro-batch
    divided by `num_items_in_batch`, the Trainer's count of valid labels over the whole update (all gradient
    accumulation steps, and all ranks with average_tokens_across_devices). Packed or not, every token of an
    update then weighs 1 / (its tokens): the loss and gradients do not depend on how the update is cut into
    micro-batches or rows. causal: score the logit at t against label t + 1 (what causal LMs do)."""
    import torch

    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"]
        if causal:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        total = torch.nn.functional.cross_entropy(_at_least_float32(logits.reshape(-1, logits.shape[-1])),
                                                  labels.reshape(-1).to(logits.device),
                                                  ignore_index=IGNORE_INDEX, reduction="sum")
        count = num_items_in_batch if num_items_in_batch is not None else labels.ne(IGNORE_INDEX).sum()
        return total / count

    return loss


def token_metrics(causal: bool):
    """(preprocess_logits_for_metrics, compute_metrics) for `Trainer`: the token-average loss and accuracy over the
    whole evaluation set, `eval_token_loss` and `eval_token_accuracy`, the same packed and unpacked.

    Trainer's own `eval_loss` is the mean over rows of each batch's mean, so it depends on how the set is cut into
    batches and rows (packs hold several documents): it differs packed and unpacked. Here each batch's logits are
    reduced at once to per-token losses and hits (aligned with the labels they score: the next token for causal
    LMs), and compute_metrics sums them over every label that is not IGNORE_INDEX."""
    import torch

    def preprocess(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        if causal:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        losses = torch.nn.functional.cross_entropy(_at_least_float32(logits.transpose(1, -1)), labels,
                                                   ignore_index=IGNORE_INDEX, reduction="none")
        hits = (logits.argmax(-1) == labels).float()
        if causal:  # back to the position of the label they score
            losses, hits = (torch.nn.functional.pad(x, (1, 0)) for x in (losses, hits))
        return torch.stack([losses, hits], dim=-1)

    def compute(prediction):
        values, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
        valid = labels != IGNORE_INDEX
        if causal:
            valid[..., 0] = False
        count = max(int(valid.sum()), 1)
        return {"token_loss": float(values[..., 0][valid].astype(np.float64).sum() / count),
                "token_accuracy": float(values[..., 1][valid].astype(np.float64).sum() / count)}

    return preprocess, compute
