"""The two data-preparation steps behind data/create_pretraining_data.py and data/pack_pretraining_data.py.

text --create_pretraining_data--> unpacked instances (packs of one) --pack_pretraining_data--> packed shards

Both write through `DatasetWriter` (temporary folder, manifest last, rename), so an interrupted or failed
run leaves no dataset behind.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import packing
from .instances import (MAX_TRAINED_VOCAB, SPECIAL, InstanceConfig, WordPiece, create_instances, default_vocab,
                        mlm_slots_for, train_vocab)
from ..files import sha256_of
from .jobs import Progress, library_versions, open_engine, stops
from .layout import PackLayout, lengths_of, pack_instances, pack_rows, stack_packs
from .shards import DatasetError, DatasetWriter, PackedDataset, gather, write_shard_files
from .text import BUILTIN, BUILTIN_LICENSE, DataInputError, TextStats, input_files, read_documents
from .wikipedia.writer import listed_shards

_WORKER: dict = {}


def versions() -> dict:
    return library_versions("numpy", "scipy", "tokenizers")


def _chunks(documents, size):
    chunk = []
    for doc in documents:
        chunk.append(doc)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def inputs_sha256(inputs: list[str]) -> str:
    """A fingerprint of the text a dataset is made from: every file read (name and sha256, about 1 s per GB)."""
    if inputs == [BUILTIN]:
        return BUILTIN
    h = hashlib.sha256()
    for path in input_files(inputs):
        for f in sorted(q for q in path.rglob("*") if q.is_file()) if path.is_dir() else [path]:
            h.update(f"{f.name} {sha256_of([f])}\n".encode())
    return h.hexdigest()


def up_to_date(output: Path, made_from: dict, say=print) -> dict | None:
    """The manifest of `output` (with "kept": True) when it was made from `made_from` (the same input fingerprint
    and arguments), else None; says which (a changed input is remade, over a dataset of this project only)."""
    if not (output / "manifest.json").is_file():
        return None
    try:
        manifest = PackedDataset(output).manifest
    except DatasetError:
        return None  # the writer refuses a folder that is not one of our datasets
    if manifest.get("made_from") == made_from:
        say(f"{output} is up to date (made from the same input and arguments): kept")
        return manifest | {"kept": True}  # the commands' summaries say kept, not wrote (not saved in the manifest)
    before = manifest.get("made_from") or {}
    what = "another input" if before.get("input") != made_from["input"] else "other arguments"
    say(f"{output} was made from {what}: remaking it")
    return None


def _input_bytes(inputs: list[str]) -> int | None:
    """The size of the input files, what the progress line counts towards (None for the built-in corpus)."""
    if inputs == [BUILTIN]:
        return None
    return sum(p.stat().st_size for p in input_files(inputs) if p.is_file()) or None


def _init_worker(vocab: str, config: InstanceConfig, validation_fraction: float, docs_per_shard: int) -> None:
    _WORKER.update(wp=WordPiece(vocab), config=config, validation_fraction=validation_fraction,
                   docs_per_shard=docs_per_shard)


def held_out(index: int, count: int, seed: int, fraction: float, docs_per_shard: int) -> list[bool]:
    """Which documents of chunk `index` (of `count` documents) are validation documents: each with probability
    `fraction`, drawn from (seed, chunk); with a fraction above 0 the corpus's first document is always held out and
    its second always trained on, so that two documents give both splits whatever the fraction (0.02 of a small
    corpus gave no validation document, found only when training)."""
    import random

    rng = random.Random(f"{seed}-split-{index}")
    out = [rng.random() < fraction for _ in range(count)]
    first = index * docs_per_shard  # every chunk but the last holds docs_per_shard documents
    if fraction > 0:
        for j in range(max(0, min(count, 2 - first))):
            out[j] = first + j == 0
    return out


def _process_chunk(job):
    """One chunk of documents -> rows (packs of one) per split, and counts. Runs in a worker."""
    index, documents = job
    wp, config = _WORKER["wp"], _WORKER["config"]
    held = held_out(index, len(documents), config.seed, _WORKER["validation_fraction"], _WORKER["docs_per_shard"])
    layout = PackLayout(config.max_seq_length, config.max_predictions, 1)
    counts: dict = {}
    out, documents_per_split = {}, {}
    for split, docs in (("train", [d for d, h in zip(documents, held) if not h]),
                        ("validation", [d for d, h in zip(documents, held) if h])):
        instances = create_instances(docs, wp, config, chunk_index=2 * index + (split == "validation"), counts=counts)
        out[split] = stack_packs([pack_instances([x], layout) for x in instances]) if instances else None
        documents_per_split[split] = len(docs)
    text_bytes = sum(len(s.encode("utf-8")) + 1 for d in documents for s in d)
    return out, counts, text_bytes, documents_per_split


def no_instances_reason(stats: TextStats, counts: dict) -> str:
    """Why an input gave no instance, and what to give instead (one line)."""
    if stats.documents == 0:
        return (f"the input produced no instances: it holds no document with text ({stats.files} files, "
                f"{stats.empty_files} empty, {stats.empty_documents} empty documents)")
    if counts.get("no_partner_document"):
        return (f"the input produced no instances: its {stats.documents} document(s) hold {stats.sentences} "
                "sentence(s), and an NSP pair needs two segments: a document of one sentence (a single line "
                "without sentence breaks is one) takes its second segment from another document; give at least "
                "two documents (a blank line between documents, or one file per document with --raw), or text "
                "with sentence breaks (one sentence per line, or --raw to split prose)")
    return (f"the input produced no instances from {stats.documents} document(s) ({counts.get('empty_segment', 0)} "
            "pairs with an empty segment); give more text")


def empty_split_reason(counts: dict, validation_fraction: float) -> str | None:
    """Why a split that --validation-fraction asks for holds no instance, with the numbers and the fix (one line);
    None when both have instances."""
    docs, instances = counts["documents"], counts["instances"]
    empty = [split for split in ("train", "validation") if instances[split] == 0]
    if not empty:
        return None
    holds = "; ".join(f"{split}: {docs[split]} document{'s' if docs[split] != 1 else ''}, {instances[split]} "
                      "instances" for split in instances)
    if sum(docs.values()) < 2:
        return (f"--validation-fraction {validation_fraction} holds whole documents out, and the input has "
                f"{sum(docs.values())} document: give at least 2 documents (one for each split), or "
                "--validation-fraction 0 for no validation split")
    return (f"the {' and '.join(empty)} split gave no instances ({holds}): its documents are too short for a "
            "pair of segments; give more text, or --validation-fraction 0 for no validation split")


def create_pretraining_data(inputs: list[str], output: str | Path, config: InstanceConfig, vocab: str | None = None,
                            train_vocab_size: int | None = None, raw: bool = False, workers: int = 1,
                            docs_per_shard: int = 2000, validation_fraction: float = 0.02, overwrite: bool = False,
                            progress: bool = True, engine: str = "local", address: str | None = None,
                            if_changed: bool = False) -> dict:
    """Text -> unpacked instances (packs of one) in the shard format. Returns the manifest.

    The manifest's `made_from` records the input's fingerprint and the arguments; `if_changed` keeps an output
    made from the same ones (nothing is redone) and remakes one made from others (`make wikipedia` reruns).

    The main process reads the text and writes the shards in order; chunks of `docs_per_shard` documents are
    turned into instances by `workers` processes of the `engine` (`jobs.open_engine`: "local", or "dask" on the
    scheduler at `address` or a local Dask cluster). The output does not depend on the engine or its workers."""
    if docs_per_shard < 1 or workers < 1 or not 0 <= validation_fraction < 1:
        raise DataInputError("docs_per_shard and workers must be >= 1 and validation_fraction in [0, 1)")
    if train_vocab_size is not None and not len(SPECIAL) < train_vocab_size <= MAX_TRAINED_VOCAB:
        raise DataInputError(f"--train-vocab {train_vocab_size} is not a vocab size this tool trains: give "
                             f"{len(SPECIAL) + 1} to {MAX_TRAINED_VOCAB:,} (BERT's are 30,522, multilingual 119,547)")
    # a prepare_wikipedia folder: the shards its wikipedia.json lists (an unfinished or damaged one is refused)
    inputs = [str(p) for item in inputs for p in (Path(item).is_dir() and listed_shards(Path(item)) or [item])]
    if train_vocab_size is not None and vocab is not None:  # (the vocab given was not read: not even its path)
        raise DataInputError("give a vocab (--vocab) or train one (--train-vocab), not both")
    output = Path(output)
    for source in inputs:  # a dataset inside its own input would be read as input by the next run
        if source != BUILTIN and Path(source).exists():
            check_apart(source, output)
    layout = PackLayout(config.max_seq_length, config.max_predictions, 1)
    made_from = {"input": inputs_sha256(inputs),
                 "arguments": {"instance_config": asdict(config), "validation_fraction": validation_fraction,
                               "vocab": sha256_of([vocab]) if vocab and Path(vocab).is_file() else vocab,
                               "train_vocab_size": train_vocab_size,
                               "raw": raw, "docs_per_shard": docs_per_shard,
                               # the split rule: a dataset split by the earlier one (no document guaranteed on
                               # either side) is remade by --if-changed
                               "validation_split": "by document, the first held out and the second trained on"}}
    if if_changed:
        kept = up_to_date(output, made_from, print if progress else (lambda *_: None))
        if kept is not None:
            return kept
        overwrite = True
    start = time.perf_counter()
    # the engine first: a bad --address writes nothing (not even the writer's lock); its workers stop before the
    # writer removes DATASET.partial on Ctrl-C or an error (`stops`: a worker still writing a shard made it again
    # after); the progress line last: after the dataset is complete
    with (open_engine(engine, workers, address) as runner, DatasetWriter(output, layout, overwrite) as writer,
          stops(runner), Progress(progress, "creating instances", _input_bytes(inputs)) as bar):
        if train_vocab_size:
            vocab_path = train_vocab(read_documents(inputs, raw), train_vocab_size, writer.partial)
        else:
            vocab_path = Path(vocab) if vocab else default_vocab()
        wp = WordPiece(vocab_path)  # validates the vocab before any work starts
        if vocab_path != writer.partial / "vocab.txt":
            shutil.copyfile(vocab_path, writer.partial / "vocab.txt")  # every dataset carries its vocab
        stats = TextStats()
        documents = read_documents(inputs, raw, stats)
        counts: dict = {"instances": {"train": 0, "validation": 0}, "documents": {"train": 0, "validation": 0}}
        for rows, chunk_counts, text_bytes, split_documents in runner.map(
                _process_chunk, enumerate(_chunks(documents, docs_per_shard)), initializer=_init_worker,
                initargs=(str(vocab_path), config, validation_fraction, docs_per_shard)):
            for split, arrays in rows.items():
                counts["documents"][split] += split_documents[split]
                if arrays is not None:
                    writer.write_shard(split, arrays)
                    counts["instances"][split] += len(arrays["input_ids"])
            for key, value in chunk_counts.items():
                counts[key] = counts.get(key, 0) + value
            bar.update(pieces=1, add_bytes=text_bytes, extra=f"{sum(counts['instances'].values()):,} instances")
        if sum(counts["instances"].values()) == 0:
            raise DataInputError(no_instances_reason(stats, counts))
        if validation_fraction > 0 and (why := empty_split_reason(counts, validation_fraction)):
            raise DataInputError(why)  # a dataset without validation instances failed only at training
        seconds = time.perf_counter() - start
        info = {
            "kind": "instances",
            "source": {"inputs": inputs, "raw": raw, "license": BUILTIN_LICENSE if inputs == [BUILTIN] else None},
            "vocab": {"file": "vocab.txt", "source": "trained on the input" if train_vocab_size else str(vocab_path),
                      "size": len(wp), "lowercase": wp.lowercase,
                      "sha256": sha256_of([writer.partial / "vocab.txt"])},  # readers check it (PackedDataset)
            "instance_config": asdict(config) | {"max_predictions_per_seq": config.max_predictions},
            "validation_fraction": validation_fraction, "docs_per_shard": docs_per_shard,
            "text": {"files": stats.files, "bytes": stats.bytes, "documents": stats.documents,
                     "sentences": stats.sentences, "skipped_empty_files": stats.empty_files,
                     "skipped_empty_documents": stats.empty_documents,
                     "single_sentence_documents": stats.single_sentence_documents},
            "counts": counts, "seconds": seconds, "versions": versions(), "made_from": made_from,
        }
        writer.finish(info)
    return PackedDataset(output).manifest


def _open_source(path: str) -> None:
    _WORKER["source"] = PackedDataset(path)  # the driver verified it; a worker only maps its shards


def _shard_lengths(job) -> np.ndarray:
    """(split, shard index) -> the lengths of its sequences. Runs in a worker; the map is dropped on return (a
    mapped page that was read counts as resident memory)."""
    split, index = job
    return lengths_of(_WORKER["source"].shard(split, index, ["sequence_ids"])["sequence_ids"])


def _write_packed_shard(job) -> tuple[dict, int]:
    """(split, pack groups (packs, K) of source row indices or -1, layout, shard folder) -> the shard's manifest
    entry (less its name) and its bytes. Runs in a worker: gathers the rows from the source and writes them."""
    split, block, layout, folder = job
    src = _WORKER["source"]
    used = block[block >= 0]
    rows = gather(src.shard_sizes(split), lambda i: src.shard(split, i), used)
    local = np.full(block.shape, -1)
    local[block >= 0] = np.arange(len(used))
    entry = write_shard_files(Path(folder), pack_rows(rows, local, layout), layout)
    return entry, sum(p.stat().st_size for p in Path(folder).iterdir())


def _compact(groups: np.ndarray, width: int) -> np.ndarray:
    """Pack rows of sequence indices with the empty slots (-1) last, cut or padded to `width` columns."""
    order = np.argsort(groups < 0, axis=1, kind="stable")
    groups = np.take_along_axis(groups, order, axis=1)[:, :width]
    return np.pad(groups, ((0, 0), (0, width - groups.shape[1])), constant_values=-1)


def check_apart(source: str | Path, output: str | Path) -> None:
    """A DataInputError (one line) when an output folder is its input, lies inside it (the next run would read its
    own output) or holds it (--overwrite would delete the input with the old output)."""
    src, out = Path(source).resolve(), Path(output).resolve()
    if out == src or src in out.parents:
        raise DataInputError(f"--output {output} is inside --input {source} (or is it): the input would be replaced "
                             "or the next run would read its own output; choose an output folder outside the input")
    if out in src.parents:
        raise DataInputError(f"--input {source} is inside --output {output}: writing the output would replace the "
                             "input; choose an output folder that does not hold the input")


def pack_pretraining_data(input_dir: str | Path, output: str | Path, algorithm: str = "cghp",
                          max_sequences_per_pack: int | str | None = 3, seed: int = 0, packs_per_shard: int = 4096,
                          overwrite: bool = False, progress: bool = True, workers: int = 1, engine: str = "local",
                          address: str | None = None, if_changed: bool = False) -> dict:
    """Unpacked instances -> packed shards with a `bert_ipu.packing` algorithm. Returns the manifest.
    `made_from` and `if_changed` as in `create_pretraining_data` (the input: its manifest, shard checksums
    included).

    Three phases: the sequence lengths, read shard by shard by the workers (a reduction: 2 bytes a sequence
    reach the main process); the packing solved once, here; the packed shards, each gathered and written by a
    worker into the dataset's temporary folder (`packs_per_shard` packs: a worker holds one shard's rows).
    Workers: `workers` processes of the `engine` (`jobs.open_engine`); the output does not depend on them.

    max_sequences_per_pack: the depth limit, `N | max | auto` (see `packing.parse_depth`): an int, None or
    "max" for unlimited, or "auto" for `packing.auto_depth` of the training split's histogram.
    `algorithm="none"` (and the other depth-free algorithms) writes the unpacked baseline in the same format
    (packs of one, limit 1).

    Every split is packed first; the layout's K (NSP slots, and with it the MLM slots) is then the largest
    number of sequences any pack of any split holds, never more than the limit. The manifest records the
    limit the packer ran with (`max_sequences_per_pack`: an int or "max"), what the caller asked for
    (`depth_requested`) and, in `layout`, K."""
    check_apart(input_dir, output)  # before anything is read or written, --overwrite or not
    requested = packing.parse_depth(max_sequences_per_pack)
    if algorithm not in packing.ALGORITHMS:
        raise packing.PackingInputError(f"unknown algorithm {algorithm!r}; choose from "
                                        f"{', '.join(packing.ALGORITHMS)}")
    src = PackedDataset(input_dir, verify=True)  # a corrupt source must not come out with fresh checksums
    if src.layout.max_sequences_per_pack != 1 or src.manifest.get("kind") != "instances":
        raise DatasetError(f"{input_dir} is already packed; give the output of data/create_pretraining_data.py")
    config = src.instance_config()
    S = src.layout.pack_len
    made_from = {"input": sha256_of([src.path / "manifest.json"]),
                 "arguments": {"algorithm": algorithm, "max_sequences_per_pack": str(max_sequences_per_pack),
                               "seed": seed, "packs_per_shard": packs_per_shard}}
    if if_changed:
        kept = up_to_date(Path(output), made_from, print if progress else (lambda *_: None))
        if kept is not None:
            return kept
        overwrite = True
    start = time.perf_counter()
    source = (_open_source, (str(src.path),))
    # the engine first, its workers stopped before the writer cleans up (as above); the progress line last: after
    # the dataset is complete. The layout is known once every split is packed.
    with (open_engine(engine, workers, address) as runner, DatasetWriter(output, None, overwrite) as writer,
          stops(runner), Progress(progress, "packing") as bar):
        lengths = {}
        for split in src.splits:
            jobs = [(split, i) for i in range(len(src.shard_sizes(split)))]
            lengths[split] = np.concatenate(list(runner.map(_shard_lengths, jobs, initializer=source[0],
                                                            initargs=source[1])))
        histograms = {split: packing.histogram_of(x, S) for split, x in lengths.items()}
        basis = histograms["train"] if "train" in histograms else sum(histograms.values())
        limit = packing.resolve_depth(requested, basis, algorithm)
        results, groups = {}, {}
        for split in src.splits:
            results[split] = packing.pack(histograms[split], algorithm, limit)
            groups[split] = packing.assign(lengths[split], results[split].mixture, S, seed=seed)
        del lengths
        K = max((int((g >= 0).sum(axis=1).max()) for g in groups.values() if len(g)), default=1)
        assert limit is None or K <= limit, (K, limit)
        layout = PackLayout(S, mlm_slots_for(config, S, K), K)
        writer.layout = layout
        shutil.copyfile(src.path / "vocab.txt", writer.partial / "vocab.txt")
        per_split = {}
        bar.total_pieces = sum(-(-len(g) // packs_per_shard) for g in groups.values())
        for split in src.splits:
            split_groups = _compact(groups.pop(split), K)
            starts = range(0, len(split_groups), packs_per_shard)
            names = [writer.next_shard(split, n) for n in range(len(starts))]
            jobs = ((split, split_groups[lo:lo + packs_per_shard], layout, str(writer.partial / name))
                    for name, lo in zip(names, starts))
            for entry, written in runner.map(_write_packed_shard, jobs, initializer=source[0], initargs=source[1]):
                writer.add_shard(split, {"name": writer.next_shard(split), **entry})
                bar.update(pieces=1, add_bytes=written, extra=split)
            result = results[split]
            per_split[split] = {**{k: v for k, v in result.to_json().items() if k != "seconds"},
                                "solver_seconds": result.seconds, "histogram": histograms[split]}
        info = {
            "kind": "packed", "source": str(Path(input_dir).resolve()), "algorithm": algorithm,
            "max_sequences_per_pack": "max" if limit is None else limit,
            "depth_requested": "max" if requested is None else requested,
            "seed": seed, "instance_config": src.manifest["instance_config"], "vocab": src.manifest["vocab"],
            "packing": per_split, "seconds": time.perf_counter() - start, "versions": versions(),
            "made_from": made_from,
        }
        writer.finish(info)
    return PackedDataset(output).manifest


# --- a dataset for a run's config -------------------------------------------------------------------------

def dataset_settings(manifest: dict) -> dict:
    """What a dataset was made with, as the config names it."""
    packed = manifest.get("kind") == "packed"
    return {"max_seq_length": manifest["layout"]["pack_len"],
            "algorithm": manifest.get("algorithm", "none") if packed else "none",
            "max_sequences_per_pack": manifest.get("max_sequences_per_pack", 1) if packed else 1,
            "depth_requested": manifest.get("depth_requested") if packed else 1}


def check_dataset_matches(path: Path, manifest: dict, data) -> None:
    """A config's data settings against an existing dataset: a one-line error naming both values."""
    have = dataset_settings(manifest)
    problems = []
    if data.max_seq_length != have["max_seq_length"]:
        problems.append(f"data.max_seq_length={data.max_seq_length} but its packs are {have['max_seq_length']} long")
    if data.algorithm != have["algorithm"]:
        problems.append(f"data.algorithm={data.algorithm} but it was packed with {have['algorithm']}")
    elif data.algorithm != "none" and data.max_sequences_per_pack not in (have["max_sequences_per_pack"],
                                                                           have["depth_requested"]):
        problems.append(f"data.max_sequences_per_pack={data.max_sequences_per_pack} but it was packed with depth "
                        f"limit {have['max_sequences_per_pack']}")
    if problems:
        fix = ", ".join(f"data.{k}={have[k]}" for k in ("max_seq_length", "algorithm", "max_sequences_per_pack"))
        raise DatasetError(f"dataset {path} does not match the config: {'; '.join(problems)}. Train on it with {fix}, "
                           "or point data.dataset at a new folder to create a dataset with these settings")


def prepare_dataset(data, say=print) -> Path:
    """The dataset a run's `data` config section names: created from `data.prepare_input` (text -> instances
    in DATASET_instances -> packed DATASET) when its folder does not exist. A folder that exists but holds no
    dataset is never touched (an error), nor is an instances folder of another length. Run it on one process."""
    from .instances import InstanceConfig

    d = data
    path = Path(d.dataset)
    if (path / "manifest.json").is_file():
        if d.prepare_input is not None:
            say(f"data.dataset {path} exists and is used as it is (data.prepare_input {d.prepare_input} only makes "
                "a missing dataset: remove the dataset, or point data.dataset at a new folder, to remake it)")
        return path
    instances = path.with_name(path.name + "_instances")
    if path.exists():
        raise DatasetError(f"data.dataset {path} exists but is not a dataset (no manifest.json); nothing was changed: "
                           "point data.dataset at a dataset or at a folder that does not exist yet")
    if d.prepare_input is None:
        raise DatasetError(f"dataset {path} does not exist; create it with data/create_pretraining_data.py and "
                           "data/pack_pretraining_data.py, or set data.prepare_input")
    if instances.exists() and not (instances / "manifest.json").is_file():
        raise DatasetError(f"{instances} exists but is not a dataset; nothing was changed: remove it or point "
                           "data.dataset elsewhere")
    if (instances / "manifest.json").is_file():
        made = PackedDataset(instances).layout.pack_len
        if made != d.max_seq_length:
            raise DatasetError(f"{instances} holds instances of {made} tokens, not data.max_seq_length="
                               f"{d.max_seq_length}; point data.dataset at a new folder")
        say(f"instances in {instances}: kept if made from {d.prepare_input} with these settings, else remade")
    else:
        say(f"creating pretraining instances from {d.prepare_input} -> {instances}")
    # (instances left by an earlier run from other text were packed as they were: if_changed remakes them)
    create_pretraining_data([d.prepare_input], instances, InstanceConfig(max_seq_length=d.max_seq_length),
                            validation_fraction=d.validation_fraction, if_changed=True)
    depth = None if d.max_sequences_per_pack == "max" else d.max_sequences_per_pack
    say(f"packing them ({d.algorithm}, depth limit {d.max_sequences_per_pack}) -> {path}")
    pack_pretraining_data(instances, path, d.algorithm, depth)
    return path
