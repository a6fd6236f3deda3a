"""The data pipeline: text -> instances -> packed shards -> loader, with nothing lost."""

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_ipu.data.loader import PackedLoader
from bert_ipu.data.instances import InstanceConfig, mlm_slots_for
from bert_ipu.data.layout import FIELDS, PackLayout, pack_instances, pack_rows, stack_packs, unpack
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data
from bert_ipu.data.shards import DatasetError, DatasetWriter, PackedDataset
from bert_ipu.data.text import split_sentences
from bert_ipu.packing import PackingInputError, auto_depth, depth_label, histogram_of, pack, parse_depth
from packed_bert_helpers import random_instances

import create_pretraining_data as create_cli  # data/ scripts, on sys.path via conftest
import inspect_packed_data as inspect_cli
import pack_pretraining_data as pack_cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small real English corpus in BERT's format: some pydoc topics, one sentence per line, plus documents
    of every odd kind (one sentence, very long sentence, empty)."""
    import pydoc_data.topics

    folder = tmp_path_factory.mktemp("corpus")
    docs = [split_sentences(pydoc_data.topics.topics[name]) for name in sorted(pydoc_data.topics.topics)[:24]]
    docs.append(["A document of one single sentence."])
    docs.append(["word " * 400 + "end."])  # longer than max_seq_length
    text = "\n\n".join("\n".join(d) for d in docs if d)
    (folder / "a.txt").write_text(text, encoding="utf-8")
    (folder / "empty.txt").write_text("", encoding="utf-8")
    return folder


def key(inst):
    return (inst.input_ids.tobytes(), inst.token_type_ids.tobytes(), inst.masked_lm_labels.tobytes(),
            inst.next_sentence_label)


def all_instances(path, split="train"):
    data = PackedDataset(path, verify=True)
    return [inst for pack in unpack(data.read(split)) for inst in pack]


@pytest.fixture(scope="module")
def instances_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "instances"
    create_pretraining_data([str(corpus)], out, InstanceConfig(max_seq_length=64), docs_per_shard=7,
                            validation_fraction=0.3, progress=False)
    return out


@pytest.mark.parametrize("algorithm, depth", [("cghp", 3), ("lpfhp", None), ("none", 1), ("greedy", 3)])
def test_unpacking_gives_back_every_instance_once(instances_dir, tmp_path, algorithm, depth):
    """Unpacking a packed dataset gives back exactly the unpacked instances, every field, each once."""
    out = tmp_path / "packed"
    manifest = pack_pretraining_data(instances_dir, out, algorithm, depth, progress=False, packs_per_shard=50)
    for split in ("train", "validation"):
        before = Counter(key(x) for x in all_instances(instances_dir, split))
        after = Counter(key(x) for x in all_instances(out, split))
        assert before == after and sum(before.values()) > 0
    info = manifest["packing"]["train"]
    assert info["sequences"] == sum(1 for _ in all_instances(instances_dir))
    assert manifest["layout"]["mlm_slots"] == mlm_slots_for(InstanceConfig(max_seq_length=64), 64,
                                                            manifest["layout"]["max_sequences_per_pack"])
    if algorithm != "none":
        assert info["packing_factor"] > 1


def test_fast_layout_equals_reference_layout():
    """pack_rows (vectorised) lays packs out exactly as pack_instances does, one pack at a time."""
    rng = np.random.default_rng(0)
    inst = random_instances(rng, 60, 5, 30, 50)
    src = stack_packs([pack_instances([x], PackLayout(32, 8, 1)) for x in inst])
    layout = PackLayout(90, 14, 3)
    groups = np.array([[3 * i, 3 * i + 1, 3 * i + 2] if i % 3 else [3 * i, -1, -1] for i in range(20)])
    fast = pack_rows(src, groups, layout)
    slow = stack_packs([pack_instances([inst[i] for i in g if i >= 0], layout) for g in groups])
    for field in FIELDS:
        np.testing.assert_array_equal(fast[field], slow[field], err_msg=field)


def test_mlm_slots_never_overflow_on_short_sequences(corpus, tmp_path):
    """Packs of many short instances (short_seq_prob 1) at depth 3 still fit their masked tokens."""
    out = tmp_path / "short"
    create_pretraining_data([str(corpus)], out, InstanceConfig(max_seq_length=128, short_seq_prob=1.0),
                            validation_fraction=0, progress=False)
    manifest = pack_pretraining_data(out, tmp_path / "packed", "cghp", 3, progress=False)
    packs = PackedDataset(tmp_path / "packed").read("train")
    assert (packs["masked_lm_labels"] != -100).sum(axis=1).max() <= manifest["layout"]["mlm_slots"]
    assert (packs["sequence_ids"].max(axis=1) == 3).mean() > 0.2  # the bound is exercised by full packs


def test_deterministic_and_independent_of_workers(corpus, tmp_path):
    """Same input and seed give byte-identical shards, with 1 worker or 2."""
    config = InstanceConfig(max_seq_length=64, seed=7)
    a = create_pretraining_data([str(corpus)], tmp_path / "a", config, docs_per_shard=9, progress=False)
    b = create_pretraining_data([str(corpus)], tmp_path / "b", config, docs_per_shard=9, workers=2, progress=False)
    c = create_pretraining_data([str(corpus)], tmp_path / "c", InstanceConfig(max_seq_length=64, seed=8),
                                docs_per_shard=9, progress=False)
    assert a["splits"] == b["splits"]
    assert a["splits"] != c["splits"]
    pa = pack_pretraining_data(tmp_path / "a", tmp_path / "pa", progress=False)
    pb = pack_pretraining_data(tmp_path / "b", tmp_path / "pb", progress=False)
    assert pa["splits"] == pb["splits"]


def test_interrupted_run_leaves_no_dataset_and_rerun_completes(corpus, tmp_path, monkeypatch):
    """A run that fails midway leaves neither the dataset nor its temporary folder; a folder left by a
    killed run is replaced; the rerun equals an uninterrupted run."""
    config = InstanceConfig(max_seq_length=64)
    calls = {"n": 0}
    real = DatasetWriter.write_shard

    def failing(self, split, arrays):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, split, arrays)

    monkeypatch.setattr(DatasetWriter, "write_shard", failing)
    with pytest.raises(KeyboardInterrupt):
        create_pretraining_data([str(corpus)], tmp_path / "ds", config, docs_per_shard=5, progress=False)
    monkeypatch.undo()
    assert not (tmp_path / "ds").exists() and not (tmp_path / "ds.partial").exists()
    (tmp_path / "ds.partial" / "train").mkdir(parents=True)  # what a SIGKILL leaves behind
    with pytest.raises(DatasetError, match="interrupted run"):
        PackedDataset(tmp_path / "ds")
    again = create_pretraining_data([str(corpus)], tmp_path / "ds", config, docs_per_shard=5, progress=False)
    clean = create_pretraining_data([str(corpus)], tmp_path / "clean", config, docs_per_shard=5, progress=False)
    assert again["splits"] == clean["splits"]


def test_bad_inputs_fail_cleanly(tmp_path, capsys):
    """Non-UTF-8 bytes, malformed JSON lines, a missing or malformed vocab, a missing input: exit 2, one
    line naming the problem, no dataset written."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait.\nsecond line.\n".encode("latin-1"))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "fine. really."}\n{"txt": 1}\n')
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("hello\nworld\n")
    cases = [
        (["--input", str(bad)], "is not UTF-8"),
        (["--input", str(jsonl)], 'string "text" field'),
        (["--input", str(tmp_path / "nope.txt")], "does not exist"),
        (["--vocab", str(vocab)], "not a BERT WordPiece vocab"),
        (["--vocab", str(tmp_path / "missing.txt")], "cannot read vocab"),
        (["--max-seq-length", "4"], "at least 8"),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        assert create_cli.main([*args, "--output", str(out)]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (args, err)
        assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_skipped_inputs_are_counted(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "empty.txt").write_text("")
    (folder / "blank.txt").write_text("\n\n   \n")
    (folder / "one.txt").write_text("Only one sentence here.\n\nThe second document has two sentences.\nYes.\n")
    manifest = create_pretraining_data([str(folder)], tmp_path / "ds", InstanceConfig(max_seq_length=32),
                                       validation_fraction=0, progress=False)
    assert manifest["text"]["skipped_empty_files"] == 1
    assert manifest["text"]["documents"] == 2
    assert manifest["text"]["single_sentence_documents"] == 1
    assert manifest["counts"]["instances"]["train"] >= 2


@pytest.mark.parametrize("docs_per_shard", [1, 2])
def test_two_documents_give_both_splits_whatever_the_fraction(tmp_path, capsys, docs_per_shard):
    """With a validation fraction above 0, the first document is held out and the second trained on, so two
    documents give a validation and a training split at any fraction, in one chunk or two (0.02 of a small corpus
    gave no validation document, and training failed on it); the command says what each split holds."""
    import pydoc_data.topics

    docs = ["\n".join(split_sentences(pydoc_data.topics.topics[name])) for name in ("assignment", "class")]
    (tmp_path / "two.txt").write_text("\n\n".join(docs), encoding="utf-8")
    out = tmp_path / "out"
    assert create_cli.main(["--input", str(tmp_path / "two.txt"), "--output", str(out), "--max-seq-length", "64",
                            "--docs-per-shard", str(docs_per_shard), "--validation-fraction", "0.02"]) == 0
    manifest = PackedDataset(out, verify=True).manifest
    assert manifest["counts"]["documents"] == {"train": 1, "validation": 1}
    assert manifest["counts"]["instances"]["train"] > 0 and manifest["counts"]["instances"]["validation"] > 0
    summary = capsys.readouterr().out
    assert "train instances (1 document)" in summary and "validation instances (1 document)" in summary, summary


def test_one_document_cannot_be_split(tmp_path, capsys):
    """One document and a validation fraction above 0: refused at creation naming the numbers and the fix, nothing
    left (it wrote a dataset of no validation instances, which failed only at training); a fraction of 0 takes it."""
    import pydoc_data.topics

    (tmp_path / "one.txt").write_text("\n".join(split_sentences(pydoc_data.topics.topics["assignment"])))
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "one.txt"), "--output", str(out), "--max-seq-length", "64"]
    assert create_cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 document" in err[0] and "--validation-fraction 0" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt"]  # (its lock file removed too)
    assert create_cli.main([*args, "--validation-fraction", "0"]) == 0
    assert PackedDataset(out).manifest["counts"]["documents"] == {"train": 1, "validation": 0}


def test_corrupt_datasets_are_refused(instances_dir, tmp_path, capsys):
    """A manifest that does not match its shards, or a changed byte: a clear error naming the fix."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(instances_dir, copy)
    shard = copy / json.loads((copy / "manifest.json").read_text())["splits"]["train"]["shards"][0]["name"]
    path = shard / "input_ids.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert inspect_cli.main([str(copy)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err
    os.remove(shard / "sequence_ids.npy")
    with pytest.raises(DatasetError, match="does not match its manifest"):
        PackedDataset(copy)
    with pytest.raises(DatasetError, match="already packed"):
        out = tmp_path / "p"
        pack_pretraining_data(instances_dir, out, progress=False)
        pack_pretraining_data(out, tmp_path / "pp", progress=False)
    with pytest.raises(DatasetError, match="exists"):
        pack_pretraining_data(instances_dir, out, progress=False)


def test_loader_shuffles_shards_by_rank_and_resumes(instances_dir, tmp_path):
    """Each epoch is a seeded permutation; ranks get disjoint equal parts; a restored state continues with
    exactly the next micro-batch."""
    pack_pretraining_data(instances_dir, tmp_path / "p", progress=False)
    data = PackedDataset(tmp_path / "p")
    n = data.packs("train")

    def ids(loader, batches):
        it = iter(loader)
        return [next(it)["input_ids"] for _ in range(batches)]

    ranks = [PackedLoader(data, "train", 2, seed=3, rank=r, world_size=2) for r in range(2)]
    seen = [torch.cat(list(b["input_ids"] for b in loader)) for loader in ranks]
    assert seen[0].shape == seen[1].shape == ((n // 2) // 2 * 2, 64)
    rows = {tuple(r.tolist()) for s in seen for r in s}
    assert len(rows) == 2 * len(seen[0])  # disjoint
    a = PackedLoader(data, "train", 2, seed=3)
    first = ids(a, 3)
    state = a.state_dict()
    rest = ids(a, 2)
    b = PackedLoader(data, "train", 2, seed=3)
    b.load_state_dict(state)
    for x, y in zip(ids(b, 2), rest):
        assert torch.equal(x, y)
    epoch0 = torch.cat([bt["input_ids"] for bt in PackedLoader(data, "train", 2, seed=3)])
    loader = PackedLoader(data, "train", 2, seed=3)
    list(loader)
    epoch1 = torch.cat(list(bt["input_ids"] for bt in loader))
    assert not torch.equal(epoch0, epoch1) and torch.equal(first[0], epoch0[:2])


def test_builtin_corpus_end_to_end(tmp_path):
    """The built-in corpus (no download) -> instances -> packs -> loader -> packed BERT: a finite loss."""
    from bert_ipu.models.bert import PackedBertForPreTraining
    from transformers import BertConfig

    manifest = create_pretraining_data(["builtin"], tmp_path / "i", InstanceConfig(max_seq_length=128),
                                       progress=False)
    assert manifest["text"]["bytes"] > 1_000_000 and "Python Software Foundation" in manifest["source"]["license"]
    packed = pack_pretraining_data(tmp_path / "i", tmp_path / "p", progress=False)
    assert packed["packing"]["train"]["efficiency"] > 0.98
    data = PackedDataset(tmp_path / "p", verify=True)
    batch = next(iter(PackedLoader(data, "train", 4)))
    config = BertConfig(vocab_size=manifest["vocab"]["size"], hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    out = PackedBertForPreTraining(config, data.layout.max_sequences_per_pack)(**batch)
    assert torch.isfinite(out.loss) and out.mlm_count > 0 and out.nsp_count >= 4


def test_hf_dataset_jsonl_and_raw_inputs(tmp_path):
    """A `datasets` dataset on disk, JSON lines and raw documents give the same instances for the same text."""
    import datasets

    texts = ["First sentence of doc one. Second sentence here! And a third one?",
             "Doc two starts. It goes on for a while. Then it ends."] * 5
    datasets.Dataset.from_dict({"text": texts, "id": list(range(len(texts)))}).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    raw = tmp_path / "raw"
    raw.mkdir()
    for i, t in enumerate(texts):
        (raw / f"{i:02d}.txt").write_text(t)
    config = InstanceConfig(max_seq_length=32)
    made = {}
    for name, inputs, is_raw in (("hf", [str(tmp_path / "hf")], False), ("jsonl", [str(tmp_path / "docs.jsonl")], False),
                                 ("raw", [str(raw)], True)):
        m = create_pretraining_data(inputs, tmp_path / f"out_{name}", config, raw=is_raw, validation_fraction=0,
                                    progress=False)
        assert m["text"]["documents"] == 10 and m["text"]["sentences"] == 30
        made[name] = Counter(key(x) for x in all_instances(tmp_path / f"out_{name}"))
    assert made["hf"] == made["jsonl"] == made["raw"] and sum(made["hf"].values()) > 0


def test_whole_word_masking_dupe_factor_and_trained_vocab(corpus, tmp_path):
    """Whole-word masking masks every piece of a chosen word; dupe_factor 2 adds a second pass with other
    masks (and other short-sequence draws) to the first; --train-vocab writes a vocab into the dataset and
    tokenizes with it."""
    wwm = create_pretraining_data([str(corpus)], tmp_path / "wwm", InstanceConfig(max_seq_length=64,
                                  whole_word_masking=True), validation_fraction=0, progress=False)
    vocab = (tmp_path / "wwm" / "vocab.txt").read_text().splitlines()
    pieces = 0
    for inst in all_instances(tmp_path / "wwm"):
        masked = inst.masked_lm_labels != -100
        original = np.where(masked, inst.masked_lm_labels, inst.input_ids)
        for i in range(1, len(original)):
            if vocab[original[i]].startswith("##") and vocab[original[i - 1]] not in ("[CLS]", "[SEP]"):
                pieces += 1
                assert masked[i] == masked[i - 1], "a word is masked whole or not at all"
    assert pieces > 0
    one = create_pretraining_data([str(corpus)], tmp_path / "d1", InstanceConfig(max_seq_length=64),
                                  validation_fraction=0, progress=False)
    two = create_pretraining_data([str(corpus)], tmp_path / "d2", InstanceConfig(max_seq_length=64, dupe_factor=2),
                                  validation_fraction=0, progress=False)
    first, both = Counter(map(key, all_instances(tmp_path / "d1"))), Counter(map(key, all_instances(tmp_path / "d2")))
    assert first <= both and sum(both.values()) > 1.5 * sum(first.values())  # round 1 is dupe_factor 1's output
    assert two["counts"]["instances"]["train"] == sum(both.values())
    trained = create_pretraining_data([str(corpus)], tmp_path / "tv", InstanceConfig(max_seq_length=64),
                                      train_vocab_size=800, validation_fraction=0, progress=False)
    size = len((tmp_path / "tv" / "vocab.txt").read_text().splitlines())
    assert trained["vocab"]["size"] == size <= 800
    assert max(int(x.input_ids.max()) for x in all_instances(tmp_path / "tv")) < size


def most_sequences_in_a_row(path) -> int:
    """The largest number of distinct nonzero sequence ids in any row of any split of a dataset."""
    data = PackedDataset(path)
    most = 0
    for split in data.splits:
        ids = np.sort(data.read(split)["sequence_ids"], axis=1)
        distinct = (np.diff(ids, axis=1) > 0).sum(axis=1) + (ids[:, 0] > 0)
        most = max(most, int(distinct.max()))
    return most


def train_histogram(instances_dir, pack_len=64):
    rows = PackedDataset(instances_dir).read("train")["sequence_ids"]
    return histogram_of((rows > 0).sum(axis=1), pack_len)


@pytest.mark.parametrize("algorithm, depth", [("cghp", None), ("greedy", "max")])
def test_unlimited_depth_gives_as_many_nsp_slots_as_the_fullest_pack(instances_dir, tmp_path, algorithm, depth):
    """At unlimited depth K (NSP slots) is the most sequences any pack holds, not a bound like S // 5."""
    manifest = pack_pretraining_data(instances_dir, tmp_path / "p", algorithm, depth, progress=False)
    K = manifest["layout"]["max_sequences_per_pack"]
    assert K == most_sequences_in_a_row(tmp_path / "p") == max(i["max_depth_used"] for i in manifest["packing"].values())
    assert 1 < K < 64 // 5
    assert manifest["layout"]["mlm_slots"] == mlm_slots_for(InstanceConfig(max_seq_length=64), 64, K)
    assert manifest["max_sequences_per_pack"] == manifest["depth_requested"] == "max"
    assert PackedDataset(tmp_path / "p").read("train")["next_sentence_weights"].shape[1] == K


def test_none_is_depth_one(instances_dir, tmp_path):
    """Algorithm none: the packer ran at depth 1 and the layout has one NSP slot, whatever was asked."""
    manifest = pack_pretraining_data(instances_dir, tmp_path / "none", "none", 3, progress=False)
    assert manifest["max_sequences_per_pack"] == 1 and manifest["depth_requested"] == 3
    assert manifest["layout"]["max_sequences_per_pack"] == 1 == most_sequences_in_a_row(tmp_path / "none")
    assert manifest["layout"]["mlm_slots"] == InstanceConfig(max_seq_length=64).max_predictions
    assert all(info["max_sequences_per_pack"] == 1 for info in manifest["packing"].values())


def test_auto_depth_resolves_on_the_training_split(instances_dir, tmp_path, capsys):
    """--max-sequences-per-pack auto packs at auto_depth of the train histogram: the smallest limit at which
    CGHP needs at most 0.1% more packs than unlimited; NNLSHP at most 3."""
    hist = train_histogram(instances_dir)
    depth = auto_depth(hist)
    unlimited = pack(hist, "cghp", None).packs
    enough = unlimited + unlimited // 1000
    assert pack(hist, "cghp", depth).packs <= enough
    assert depth == 1 or pack(hist, "cghp", depth - 1).packs > enough
    assert auto_depth(hist, "nnlshp") == min(depth, 3)
    assert pack_cli.main(["--input", str(instances_dir), "--output", str(tmp_path / "auto"),
                          "--max-sequences-per-pack", "auto"]) == 0
    assert f"depth limit {depth} (asked: auto)" in capsys.readouterr().out
    manifest = PackedDataset(tmp_path / "auto").manifest
    assert manifest["max_sequences_per_pack"] == depth and manifest["depth_requested"] == "auto"
    assert manifest["packing"]["train"]["max_sequences_per_pack"] == depth
    K = manifest["layout"]["max_sequences_per_pack"]
    assert K == most_sequences_in_a_row(tmp_path / "auto") <= depth
    nnlshp = pack_pretraining_data(instances_dir, tmp_path / "nnlshp", "nnlshp", "auto", progress=False)
    assert nnlshp["max_sequences_per_pack"] == min(depth, 3)


def test_auto_depth_stops_at_the_unlimited_packings_depth(monkeypatch):
    """CGHP at a depth limit is a heuristic: on wide histograms (50,000 SFT-like lengths at 2048) it stayed a few
    packs above the unlimited count at every depth, and auto_depth ran one CGHP per depth up to the pack length.
    The search now ends at the unlimited packing's deepest pack, which that packing respects."""
    from bert_ipu.packing import api

    real, calls = api.pack, []
    hist = histogram_of(np.random.default_rng(0).integers(8, 64, 400), 256)
    deepest = real(hist, "cghp", None).mixture.depth
    monkeypatch.setattr(api, "pack", lambda h, a, d=None, **kw: WorsePacks(real(h, a, d, **kw), d, calls))
    assert api.auto_depth(hist) == deepest
    assert len(calls) <= deepest + 1


class WorsePacks:
    """A PackingResult whose limited runs report 50 more packs (as CGHP at a limit can stay above unlimited)."""

    def __init__(self, result, depth, calls):
        calls.append(depth)
        self.mixture, self.packs = result.mixture, result.packs + (50 if depth is not None else 0)


def test_inspect_prints_the_layout_depth(instances_dir, tmp_path, capsys):
    """inspect_packed_data reports how many sequences a row holds from the layout, not the requested depth."""
    pack_pretraining_data(instances_dir, tmp_path / "none", "none", 3, progress=False)
    assert inspect_cli.main([str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "algorithm none, unpacked (1 sequence a row)" in out
    assert "depth 3" not in out and "depth limit" not in out
    manifest = pack_pretraining_data(instances_dir, tmp_path / "cghp", "cghp", 3, progress=False)
    K = manifest["layout"]["max_sequences_per_pack"]
    assert inspect_cli.main([str(tmp_path / "cghp")]) == 0
    assert f"algorithm cghp, depth limit 3, at most {K} sequences a pack ({K} NSP slots)" in capsys.readouterr().out
    assert inspect_cli.main([str(instances_dir)]) == 0
    assert "\n  unpacked (1 sequence a row)\n" in capsys.readouterr().out


@pytest.mark.parametrize("value, expected", [(3, 3), ("3", 3), (1, 1), (np.int64(2), 2), ("max", None), (None, None),
                                             ("auto", "auto")])
def test_parse_depth_accepts(value, expected):
    assert parse_depth(value) == expected
    assert depth_label(parse_depth(value)) == ("max" if expected is None else str(expected))


@pytest.mark.parametrize("value", [0, -1, 2.5, "abc", True, "0", "-2", "2.5", "", [3]])
def test_parse_depth_refuses(value):
    """A bad depth: PackingInputError, one line naming the value and the valid forms."""
    with pytest.raises(PackingInputError) as e:
        parse_depth(value)
    message = str(e.value)
    assert "\n" not in message and str(value) in message
    assert "whole number >= 1, 'max' or 'auto'" in message


def test_pack_and_pack_multi_size_read_the_depth_limit_as_parse_depth_does():
    """docs/packing.md: the depth limit is "a number, max for unlimited, or auto; one type everywhere". `pack`
    raised a TypeError on "max", "3" and "auto" and took 2.5 and True as they were (reported as 2.5 and True);
    pack_multi_size raised a bare ValueError on "max", and on costs that are no numbers. A list of numpy integers
    (np.bincount's, listed) was refused as "not a number"."""
    from bert_ipu.packing.multisize import pack_multi_size

    hist = [0, 2, 1, 3, 0, 0, 0, 1]
    assert pack(hist, "cghp", "max").max_sequences_per_pack is None
    assert pack(hist, "cghp", "3").max_sequences_per_pack == 3
    assert pack(hist, "cghp", "auto").max_sequences_per_pack == auto_depth(np.array(hist), "cghp")
    for bad in (2.5, True, "x"):
        with pytest.raises(PackingInputError, match="whole number >= 1"):
            pack(hist, "cghp", bad)
    assert pack_multi_size(hist, [4, 8], "max").cost == pack_multi_size(hist, [4, 8], None).cost
    for bad in ("auto", 2.5):
        with pytest.raises(PackingInputError, match="max_sequences_per_pack"):
            pack_multi_size(hist, [4, 8], bad)
    with pytest.raises(PackingInputError, match="costs"):
        pack_multi_size(hist, [4, 8], None, ["a", 1])
    listed = list(np.bincount([2, 2, 3, 4, 4, 4, 8], minlength=9)[1:])
    assert np.array_equal(pack(listed, "cghp").histogram, np.array(hist))


def test_auto_depth_under_a_time_limit_gives_its_runs_the_time_left(monkeypatch):
    """pack(..., "auto", time_limit=t) ran auto_depth's CGHP runs with no limit, then packed within t: each of
    them now gets the time left, and a limit already past when the search would go on stops it at the
    unlimited packing's deepest pack (a limit that costs no pack)."""
    from bert_ipu.packing import api

    limits, real = [], api.pack

    def spy(histogram, algorithm, depth=None, **kwargs):
        limits.append(kwargs.get("time_limit"))
        return real(histogram, algorithm, depth, **kwargs)
    monkeypatch.setattr(api, "pack", spy)
    hist = np.bincount(np.random.default_rng(0).integers(1, 200, 3000), minlength=257)[1:]
    result = real(hist, "cghp", "auto", time_limit=60)
    assert limits and all(limit is not None and 0 < limit <= 60 for limit in limits)
    assert result.max_sequences_per_pack == api.auto_depth(hist)
    limits.clear()
    api.auto_depth(hist, deadline=api.time.perf_counter() - 1)   # (the time already up: no run at a limit)
    assert limits == [1e-3]


def test_pack_multi_size_refuses_more_sequences_than_memory_holds():
    """pack_multi_size realises its packs with every sequence in memory (about 160 bytes each): the command line
    refused more than the memory available in one line, the library ran out (10**9 sequences: killed at 22 GB).
    10**11 sequences (16 TB) are refused before any work, naming the memory."""
    from bert_ipu.packing.multisize import pack_multi_size

    hist = np.zeros(512, dtype=np.int64)
    hist[99] = 10**11
    with pytest.raises(PackingInputError, match="in memory"):
        pack_multi_size(hist, [256, 512])


def test_bad_depth_is_refused_before_any_work(instances_dir, tmp_path):
    for value in (0, 2.5, "abc"):
        with pytest.raises(PackingInputError, match="max_sequences_per_pack"):
            pack_pretraining_data(instances_dir, tmp_path / "p", "cghp", value, progress=False)
        assert not (tmp_path / "p").exists() and not (tmp_path / "p.partial").exists()


def test_if_changed_keeps_a_current_step_and_remakes_a_stale_one(corpus, tmp_path, capsys):
    """`make wikipedia` skipped a step whenever its output existed, so a new dump (or text, or VALIDATION)
    still trained on the old packs. Each step records what it was made from (the input's fingerprint and the
    arguments): --if-changed keeps an output made from the same (byte-identical, nothing rewritten) and remakes
    one whose input or arguments changed."""
    text = tmp_path / "text"
    text.mkdir()
    original = (corpus / "a.txt").read_text()
    (text / "a.txt").write_text(original)
    inst, packed = tmp_path / "inst", tmp_path / "packed"

    def chain(*extra):
        assert create_cli.main(["--input", str(text), "--output", str(inst), "--if-changed",
                                "--validation-fraction", "0.2", *extra]) == 0
        assert pack_cli.main(["--input", str(inst), "--output", str(packed), "--if-changed"]) == 0
        return {p.name: p.stat().st_mtime_ns for d in (inst, packed) for p in sorted(d.iterdir())}

    first = chain()
    capsys.readouterr()
    assert chain() == first  # the same input and arguments: nothing rewritten
    said = capsys.readouterr().out
    assert f"kept {packed} " in said and f"wrote {packed}" not in said and "made earlier" in said  # not "wrote"
    documents = json.loads((inst / "manifest.json").read_text())["text"]["documents"]
    (text / "a.txt").write_text(original + "\n\nA new document.\nIt has two sentences.\n")
    chain()
    assert "remaking" in capsys.readouterr().out
    assert json.loads((inst / "manifest.json").read_text())["text"]["documents"] == documents + 1
    before = json.loads((packed / "manifest.json").read_text())["made_from"]
    chain("--validation-fraction", "0.5")  # other arguments: remade too
    assert json.loads((inst / "manifest.json").read_text())["validation_fraction"] == 0.5
    assert json.loads((packed / "manifest.json").read_text())["made_from"] != before


def test_a_folder_input_skips_a_datasets_vocab(tmp_path):
    """create_pretraining_data --input FOLDER tokenized an earlier dataset's vocab.txt lying in that folder as
    text; a vocab.txt beside a manifest.json is not read."""
    from bert_ipu.data.text import input_files

    (tmp_path / "a.txt").write_text("Some text.")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (tmp_path / "old" / "manifest.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "vocab.txt").write_text("a word list the user wrote as text")
    assert [p.relative_to(tmp_path).as_posix() for p in input_files([str(tmp_path)])] == ["a.txt", "notes/vocab.txt"]


def test_special_tokens_written_in_the_text_are_read_as_text(tmp_path):
    """A literal "[CLS]", "[SEP]" or "[MASK]" in the corpus (an article about BERT) was matched as the special
    token: instances held extra separators and unlabelled masks inside their segments. Google's recipe reads
    them as text ("[", "sep", "]"); every instance now has one [CLS], its two [SEP]s, and a [MASK] only at a
    masked position."""
    from bert_ipu.data.instances import SPECIAL, WordPiece

    text = "BERT starts with [CLS] and ends segments with [SEP].\nMasked words become [MASK] or [PAD] or [UNK].\n" \
           "The model predicts them.\nThat is all.\n\n"
    (tmp_path / "bert.txt").write_text(text * 8)
    create_pretraining_data([str(tmp_path / "bert.txt")], tmp_path / "d", InstanceConfig(max_seq_length=64),
                            validation_fraction=0, progress=False)
    wp = WordPiece(tmp_path / "d" / "vocab.txt")
    ids = wp.encode(["[CLS] [SEP] [MASK] [PAD] [UNK]"])[0]
    assert not set(ids) & {wp.ids[t] for t in SPECIAL} and wp.encode(["["])[0] * 5 == [i for i in ids if i == ids[0]]
    rows = PackedDataset(tmp_path / "d").read("train")
    cls, sep, mask = wp.ids["[CLS]"], wp.ids["[SEP]"], wp.ids["[MASK]"]
    assert ((rows["input_ids"] == cls).sum(1) == 1).all() and ((rows["input_ids"] == sep).sum(1) == 2).all()
    labelled = np.zeros(rows["input_ids"].shape, dtype=bool)  # masked tokens come first in a pack (layout.py)
    M = rows["masked_lm_labels"].shape[1]
    labelled[:, :M] = rows["masked_lm_labels"] != -100
    assert (rows["input_ids"] == mask).any() and not ((rows["input_ids"] == mask) & ~labelled).any()


def test_a_byte_order_mark_is_not_text(tmp_path):
    """A .jsonl starting with a UTF-8 byte-order mark was refused ("decode using utf-8-sig"); in a .txt the mark
    began the first sentence. Both read as the same file without it."""
    from bert_ipu.data.text import read_documents

    (tmp_path / "a.jsonl").write_text('\ufeff{"text": "One. Two."}\n', encoding="utf-8")
    (tmp_path / "a.txt").write_text("\ufeffOne.\nTwo.\n", encoding="utf-8")
    assert list(read_documents([str(tmp_path / "a.jsonl")])) == list(read_documents([str(tmp_path / "a.txt")])) \
        == [["One.", "Two."]]
    # a suffix in capitals is the same format (CORPUS.TXT was refused once suffixes were checked)
    (tmp_path / "B.JSONL").write_text('{"text": "One. Two."}\n', encoding="utf-8")
    assert list(read_documents([str(tmp_path / "B.JSONL")])) == [["One.", "Two."]]
