"""The token classification task (bert_ipu/tasks/token_classification/), the worked example of
docs/adding-a-task.md: packed == Hugging Face's BertForTokenClassification on the same sentences unpadded, its
data and metrics on hand-made cases, and the command the walkthrough gives, run end to end."""

from __future__ import annotations

import contextlib
import json
import re

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForTokenClassification

from bert_ipu.data.contiguous import pack_sequences
from bert_ipu.data.instances import WordPiece, default_vocab
from bert_ipu.data.text import DataInputError
from bert_ipu.tasks.token_classification.data import Report, featurize, read_conll
from bert_ipu.tasks.token_classification.metrics import entities, score
from bert_ipu.tasks.token_classification.model import PackedBertForTokenClassification

from training_helpers import ROOT, entry

DOC = ROOT / "docs" / "adding-a-task.md"


def tiny(labels=5) -> BertConfig:
    return BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=64, num_labels=labels, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_packed_equals_transformers_on_the_sentences_unpadded(dtype, tol):
    """Seven sentences of 3-20 tokens packed (CGHP, up to 4 a row) against BertForTokenClassification on the
    same sentences padded in one batch: the same logits at every token, the same loss (the mean over labelled
    tokens: our sum over the global count) and the same gradient of every parameter. float64 agrees to
    rounding; float32 within 1e-5 (HF's own float32 error is about 1e-5)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    hf = BertForTokenClassification(tiny()).to(dtype)
    ours = PackedBertForTokenClassification(tiny(), max_sequences_per_pack=4).to(dtype)
    ours.load_state_dict(hf.state_dict(), strict=True)
    lengths = rng.integers(3, 21, 7)
    ids = rng.integers(5, 60, lengths.sum())
    labels = np.where(rng.random(lengths.sum()) < 0.7, rng.integers(0, 5, lengths.sum()), -100)
    packed = pack_sequences(lengths, {"input_ids": ids, "labels": labels}, 32, "cghp", 4, fill={"labels": -100})
    rows = {k: torch.from_numpy(v) for k, v in packed.rows.items()}
    logits = ours(rows["input_ids"], rows["position_ids"], torch.zeros_like(rows["input_ids"]), rows["sequence_ids"])
    S = int(lengths.max())
    starts = np.cumsum(lengths) - lengths
    batch = torch.zeros(7, S, dtype=torch.long)
    mask, target = torch.zeros(7, S, dtype=torch.long), torch.full((7, S), -100)
    for i, (a, n) in enumerate(zip(starts, lengths)):
        batch[i, :n], mask[i, :n], target[i, :n] = torch.from_numpy(ids[a:a + n]), 1, torch.from_numpy(labels[a:a + n])
    hf_out = hf(input_ids=batch, attention_mask=mask, labels=target)
    for i, n in enumerate(lengths):
        mine = logits[packed.row[i], packed.offset[i]:packed.offset[i] + n]
        assert (mine - hf_out.logits[i, :n]).abs().max() <= tol * hf_out.logits.abs().max()
    flat = rows["labels"]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), flat.flatten(), reduction="sum") / (flat != -100).sum()
    assert abs(loss.item() - hf_out.loss.item()) <= tol * hf_out.loss.item()
    loss.backward()
    hf_out.loss.backward()
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        assert (p.grad - theirs[name].grad).abs().max() <= tol * max(theirs[name].grad.abs().max().item(), 1e-3), name


def test_conll_reading_and_word_labels(tmp_path):
    """-DOCSTART- and blank lines separate sentences, the tag is the last column; a word's tag labels its first
    sub-token only ([CLS], [SEP] and continuations are -100); a sentence over the pack length is cut at a word
    boundary and its lost words counted; a line without a tag, a tag unseen in training, an empty file: one
    clear error each."""
    path = tmp_path / "x.txt"
    path.write_text("-DOCSTART- O\n\ntokenizations NN O\nlondon NNP B-LOC\n\npeter B-PER\n")
    sentences, report = read_conll(path)
    assert sentences == [[("tokenizations", "O"), ("london", "B-LOC")], [("peter", "B-PER")]]
    assert (report.sentences, report.words) == (2, 3)
    wp = WordPiece(default_vocab())
    labels = ["O", "B-LOC", "B-PER"]
    f = featurize(sentences, wp, labels, 64, report)
    pieces = wp.tokenizer.encode("tokenizations", add_special_tokens=False).ids
    assert len(pieces) > 1 and f.lengths.tolist() == [2 + len(pieces) + 1, 3]
    assert f.labels[:f.lengths[0]].tolist() == [-100, 0] + [-100] * (len(pieces) - 1) + [1, -100]
    assert f.first == [[1, 1 + len(pieces)], [1]]
    cut = featurize(sentences[:1], wp, labels, 2 + len(pieces), Report())  # room for the first word only
    assert cut.lengths.tolist() == [2 + len(pieces)] and cut.first == [[1]]
    report = Report()
    featurize(sentences[:1], wp, labels, 2 + len(pieces) - 1, report)  # not even the first word fits whole
    assert (report.cut_sentences, report.cut_words) == (1, 2)
    path.write_text("london\n")
    with pytest.raises(DataInputError, match="x.txt:1: 'london' has no tag"):
        read_conll(path)
    with pytest.raises(DataInputError, match="tags B-ORG are not in the training data's tags"):
        featurize([[("ford", "B-ORG")]], wp, labels, 64, Report())
    path.write_text("\n-DOCSTART- O\n")
    with pytest.raises(DataInputError, match="no sentence"):
        read_conll(path)


def test_entities_and_scores_as_conll_counts_them():
    """An entity is B-X I-X...; an I-X that does not continue an X starts one; a type change ends one. F1 is
    micro over all sentences; word accuracy counts every word."""
    assert entities(["B-PER", "I-PER", "O", "B-LOC"]) == {(0, 1, "PER"), (3, 3, "LOC")}
    assert entities(["I-ORG", "I-ORG", "I-LOC"]) == {(0, 1, "ORG"), (2, 2, "LOC")}
    assert entities(["B-PER", "B-PER"]) == {(0, 0, "PER"), (1, 1, "PER")}
    s = score([["B-PER", "I-PER", "O"], ["B-LOC"]], [["B-PER", "O", "O"], ["B-LOC"]])
    assert s["entity_precision"] == 0.5 and s["entity_recall"] == 0.5 and s["entity_f1"] == 0.5
    assert s["word_accuracy"] == 3 / 4


def test_bioes_tags_end_and_make_entities_as_conlleval_does():
    """BIOES (IOBES): E-X ends an entity, S-X is one of a single word, an E-X or I-X after an ending starts one;
    they were read as no boundary (an E- entity ended a word early, an S- one was lost: F1 1.0 for a prediction
    that found one of two entities, and a wrong one)."""
    assert entities(["B-LOC", "E-LOC", "O", "S-PER"]) == {(0, 1, "LOC"), (3, 3, "PER")}
    assert entities(["S-PER", "S-PER", "E-ORG", "I-ORG", "E-ORG", "B-LOC", "I-LOC", "E-LOC"]) == \
        {(0, 0, "PER"), (1, 1, "PER"), (2, 2, "ORG"), (3, 4, "ORG"), (5, 7, "LOC")}
    s = score([["B-LOC", "E-LOC", "O", "S-PER"]], [["B-LOC", "O", "O", "O"]])
    assert (s["entity_precision"], s["entity_recall"], s["entity_f1"]) == (0.0, 0.0, 0.0)


def test_the_walkthrough_runs(tmp_path):
    """docs/adding-a-task.md's command (`python -m bert_ipu --config ner_tiny_packed`) trains and scores (one
    epoch here): every evaluation sentence gets one tag a word, the scores are in results.json, and the export
    is a BertForTokenClassification whose logits are the packed model's."""
    commands = re.findall(r"^python -m bert_ipu --config (\S+)$", DOC.read_text(), re.M)
    assert commands == ["ner_tiny_packed"]
    out = tmp_path / "run"
    assert entry("token_classification", ["--config", commands[0], f"output_dir={out}",
                                          "train.num_train_epochs=1"]) == 0
    result = json.loads((out / "results.json").read_text())
    dev, _ = read_conll(ROOT / "tests" / "fixtures" / "ner" / "dev.txt")
    predicted = json.loads((out / "predictions.json").read_text())
    assert [len(p) for p in predicted] == [len(s) for s in dev]
    assert 0 <= result["entity_f1"] <= 1 and result["packing"]["train"]["packing_factor"] > 4
    hf = BertForTokenClassification.from_pretrained(str(out / "hf")).eval()
    ours = PackedBertForTokenClassification.from_pretrained(out / "hf", hf.config.id2label,
                                                            max_sequences_per_pack=1).eval()
    ids = torch.tensor([[2, 2000, 3000, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, torch.arange(4)[None], torch.zeros_like(ids), torch.ones_like(ids)),
                                   hf(ids).logits)
    assert hf.config.id2label[0] == "O" and len(hf.config.id2label) == 7


def test_a_word_the_tokenizer_drops_leaves_the_other_words_tags_in_place(tmp_path):
    """A word that WordPiece makes no token of (a zero-width space) gets "O", and every other word keeps its own
    prediction: predictions were lined up by count, so each later word took its left neighbour's tag (a
    helper's run: entity F1 1.0 -> 0.0 with such a word at the start of every sentence)."""
    from types import SimpleNamespace

    from bert_ipu.tasks import load_config
    from bert_ipu.tasks.token_classification.task import TokenClassificationTask

    dev = ROOT / "tests" / "fixtures" / "ner" / "dev.txt"
    sentences, _ = read_conll(dev)
    shifted = tmp_path / "dev.txt"
    shifted.write_text("\n\n".join("\n".join(["\u200b O"] + [f"{w} {t}" for w, t in s]) for s in sentences) + "\n",
                       encoding="utf-8")

    class Stub(torch.nn.Module):  # "predicts" a tag from the token id, so a word's tag follows its tokens
        def forward(self, input_ids, **_):
            return torch.nn.functional.one_hot(input_ids % 7, 7).float()

    predicted = []
    with contextlib.chdir(ROOT):
        for path in (dev, shifted):
            task = TokenClassificationTask(load_config("ner_tiny", [f"data.eval_file={path}"]))
            task.prepare(SimpleNamespace(device=torch.device("cpu"), say=lambda *a, **k: None))
            assert len(task.labels) == 7
            predicted.append(task.predict(Stub(), "eval"))
    assert [p[0] for p in predicted[1]] == ["O"] * len(sentences)
    assert [p[1:] for p in predicted[1]] == predicted[0]
    assert len({t for p in predicted[0] for t in p}) > 2  # (the stub's tags vary, so a shift would show)


def test_training_data_with_one_tag_is_refused(tmp_path):
    """A training file whose words all have one tag made a one-output head, which the loss treats as a regression
    on the tag ids (a helper's run: loss 8.0e4, accuracy 1.0). One line naming the file."""
    from types import SimpleNamespace

    from bert_ipu.engine.runtime import RunError
    from bert_ipu.tasks import load_config
    from bert_ipu.tasks.token_classification.task import TokenClassificationTask

    sentences, _ = read_conll(ROOT / "tests" / "fixtures" / "ner" / "train.txt")
    plain = tmp_path / "train.txt"
    plain.write_text("\n\n".join("\n".join(f"{w} O" for w, _ in s) for s in sentences) + "\n")
    task = TokenClassificationTask(load_config("ner_tiny", [f"data.train_file={plain}", "data.eval_file=null"]))
    with contextlib.chdir(ROOT), pytest.raises(RunError, match="every word has the tag O; .*at least 2 tags"):
        task.prepare(SimpleNamespace(device=torch.device("cpu"), say=lambda *a, **k: None))
