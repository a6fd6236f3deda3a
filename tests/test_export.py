"""The Hugging Face export (bert_ipu/models/hf_io.py): a folder that transformers' AutoTokenizer, AutoModel* and
pipelines use as it is, with the right vocabulary, a model card, and an atomic replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import (AutoModelForPreTraining, AutoModelForQuestionAnswering, AutoTokenizer, BertConfig,
                          pipeline)
from transformers.pipelines import SUPPORTED_TASKS

from bert_ipu.data.instances import default_vocab
from bert_ipu.models.hf_io import ExportError, export_model, model_card
from bert_ipu.models.bert import PackedBertForPreTraining, PackedBertForQuestionAnswering

VOCAB_SIZE = 30522

PRETRAIN_CARD = {
    "task": "pretraining (MLM + NSP)",
    "pipeline_tag": "fill-mask",
    "base_model": "from scratch",
    "data": "built-in corpus (runs/data/packed_128)",
    "steps": 300,
    "sequences_seen": 19200,
    "packing": {"algorithm": "CGHP", "max_sequences_per_pack": 3, "packing_factor": 2.0213, "efficiency": 0.9934},
    "metrics": {"mlm_accuracy": 0.4321, "nsp_accuracy": 0.8765, "loss": 3.1415},
    "command": "python run_pretraining.py --config pretrain_tiny_128_packed",
}


def tiny_config(**overrides) -> BertConfig:
    fields = dict(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    return BertConfig(**(fields | overrides))


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    head, _, _ = text[4:].partition("\n---\n")
    return yaml.safe_load(head)


def extractive_answer(folder: Path, question: str, context: str) -> dict:
    """What pipeline("question-answering") returns, for transformers versions without it (5.x removed it): the
    best-scoring span of the context, from AutoTokenizer + AutoModelForQuestionAnswering loaded from `folder`."""
    if "question-answering" in SUPPORTED_TASKS:
        return pipeline("question-answering", model=str(folder))(question=question, context=context)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
    enc = tok(question, context, return_offsets_mapping=True, truncation="only_second", return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    context_tokens = [i for i, s in enumerate(enc.sequence_ids(0)) if s == 1]
    with torch.no_grad():
        out = model(**enc)
    start, end = out.start_logits[0].log_softmax(-1), out.end_logits[0].log_softmax(-1)
    score, i, j = max((float(start[i] + end[j]), i, j) for i in context_tokens for j in context_tokens
                      if i <= j < i + 15)
    a, b = offsets[i][0], offsets[j][1]
    return {"score": float(torch.tensor(score).exp()), "start": a, "end": b, "answer": context[a:b]}


def same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def vocab_words() -> list[str]:
    return Path(default_vocab()).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def pretraining_export(tmp_path_factory):
    torch.manual_seed(0)
    config = tiny_config(id2label={0: "IsNext", 1: "NotNext"}, label2id={"IsNext": 0, "NotNext": 1})
    model = PackedBertForPreTraining(config).eval()
    folder = tmp_path_factory.mktemp("export") / "hf"
    returned = export_model(model, folder, default_vocab(), card=PRETRAIN_CARD)
    return model, Path(returned)


def test_pretraining_export_loads_tokenizer_model_and_fill_mask(pretraining_export, vocab_words):
    model, folder = pretraining_export
    assert folder.is_dir() and not folder.with_name("hf.partial").exists() and not folder.with_name("hf.old").exists()
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "README.md"):
        assert (folder / name).is_file(), name
    assert (folder / "vocab.txt").read_text(encoding="utf-8").splitlines() == vocab_words

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == VOCAB_SIZE
    ids = tok("Hello world", add_special_tokens=False)["input_ids"]
    assert ids == [vocab_words.index("hello"), vocab_words.index("world")]
    assert tok("Hello world")["input_ids"] == [vocab_words.index("[CLS]"), *ids, vocab_words.index("[SEP]")]
    assert tok.mask_token == "[MASK]" and tok.mask_token_id == vocab_words.index("[MASK]")
    assert tok.model_max_length == 64  # the model's positions, so pipelines truncate in range

    results = pipeline("fill-mask", model=str(folder))("paris is the [MASK] of france")
    assert results
    for r in results:
        assert isinstance(r["token_str"], str) and r["token_str"].strip(), r

    hf = AutoModelForPreTraining.from_pretrained(str(folder))
    same_state(hf.state_dict(), model.state_dict())
    assert hf.config.id2label == {0: "IsNext", 1: "NotNext"}
    assert hf.config.label2id == {"IsNext": 0, "NotNext": 1}

    text = (folder / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "fill-mask"
    assert meta["tags"] == ["bert", "packed-bert"]
    assert "base_model" not in meta  # "from scratch" is not a Hub id
    body = text.split("\n---\n", 1)[1]
    assert "# " in body and "pretraining (MLM + NSP)" in body
    assert "300 steps" in body and "CGHP" in body and "built-in corpus" in body and "from scratch" in body
    for name, value in PRETRAIN_CARD["metrics"].items():
        assert f"| {name} | {value:.4f} |" in body
    assert PRETRAIN_CARD["command"] in body


def test_question_answering_export_runs_qa_pipeline(tmp_path):
    torch.manual_seed(1)
    model = PackedBertForQuestionAnswering(tiny_config()).eval()
    card = {"task": "SQuAD v1.1 question answering", "base_model": "bert-base-uncased",
            "data": "SQuAD v1.1 train", "steps": 10, "metrics": {"exact_match": 12.5, "f1": 20.25}}
    folder = export_model(model, tmp_path / "squad", default_vocab(), card=card)

    context = "Paris is the capital of France."
    answer = extractive_answer(folder, "What is the capital of France?", context)
    assert isinstance(answer, dict) and "answer" in answer
    assert answer["answer"] and answer["answer"] == context[answer["start"]:answer["end"]]

    hf = AutoModelForQuestionAnswering.from_pretrained(str(folder))
    same_state(hf.state_dict(), model.state_dict())
    meta = front_matter((folder / "README.md").read_text(encoding="utf-8"))
    assert meta["pipeline_tag"] == "question-answering"  # from the model, none given
    assert meta["base_model"] == "bert-base-uncased"


def test_every_model_cards_code_runs(tmp_path):
    """The card's "Use" code runs as written against the pinned transformers (once it told users to call
    pipeline("question-answering"), which transformers 5 removed): for a question-answering export (the
    answer is a span of the context) and a fill-mask one."""
    import re

    torch.manual_seed(1)
    for name, model in (("squad", PackedBertForQuestionAnswering(tiny_config()).eval()),
                        ("mlm", PackedBertForPreTraining(tiny_config()).eval())):
        folder = export_model(model, tmp_path / name, default_vocab(), card={"task": name})
        code = re.search(r"## Use\n\n```python\n(.*?)```", (folder / "README.md").read_text(), re.S).group(1)
        scope: dict = {}
        exec(code.replace("path/to/this/folder", str(folder)), scope)  # noqa: S102 - our own card's code
        if name == "squad":
            answer = scope["answer"].replace(" ", "")  # a span of the context, as the tokenizer decodes it
            assert answer and answer in "parisisthecapitaloffrance."
        else:
            assert scope["pipe"]("paris is the [MASK] of france.")


def test_failed_export_leaves_previous_folder_intact(tmp_path, monkeypatch):
    torch.manual_seed(2)
    first = PackedBertForQuestionAnswering(tiny_config()).eval()
    folder = tmp_path / "hf"
    export_model(first, folder, default_vocab(), card={"task": "SQuAD v1.1 question answering"})
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    torch.manual_seed(3)
    second = PackedBertForQuestionAnswering(tiny_config()).eval()
    original = PackedBertForQuestionAnswering.save_pretrained

    def broken(self, path):
        original(self, path)  # writes config.json and the weights, then fails
        (Path(path) / "half-written.bin").write_bytes(b"\0" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(PackedBertForQuestionAnswering, "save_pretrained", broken)
    with pytest.raises(ExportError, match="disk full"):
        export_model(second, folder, default_vocab(), card={"task": "SQuAD v1.1 question answering"})

    assert not (tmp_path / "hf.partial").exists() and not (tmp_path / "hf.old").exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    hf = AutoModelForQuestionAnswering.from_pretrained(str(folder))
    same_state(hf.state_dict(), first.state_dict())

    # an export killed between its two renames left only FOLDER.old: the next export, failing too, puts it back
    folder.rename(tmp_path / "hf.old")
    with pytest.raises(ExportError, match="disk full"):
        export_model(second, folder, default_vocab(), card={"task": "SQuAD v1.1 question answering"})
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (tmp_path / "hf.partial").exists() and not (tmp_path / "hf.old").exists()

    # a left-over FOLDER.partial from a killed run is replaced, and a successful export replaces FOLDER
    monkeypatch.setattr(PackedBertForQuestionAnswering, "save_pretrained", original)
    (tmp_path / "hf.partial").mkdir()
    (tmp_path / "hf.partial" / "junk").write_text("junk")
    export_model(second, folder, default_vocab(), card={"task": "SQuAD v1.1 question answering"})
    assert not (tmp_path / "hf.partial").exists() and not (tmp_path / "hf.old").exists()
    assert not (folder / "junk").exists()
    same_state(AutoModelForQuestionAnswering.from_pretrained(str(folder)).state_dict(), second.state_dict())


def test_cased_vocab_gives_cased_tokenizer(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hello", "hello", "World", "world", "Paris", "paris",
             "the", "is", "##s", ".", ","]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    torch.manual_seed(4)
    model = PackedBertForPreTraining(tiny_config(vocab_size=len(words))).eval()
    folder = export_model(model, tmp_path / "cased", vocab, card={"task": "pretraining (MLM + NSP)"})

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == len(words)
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [words.index("Hello"), words.index("world")]
    assert tok("hello World", add_special_tokens=False)["input_ids"] == [words.index("hello"), words.index("World")]
    assert json.loads((folder / "tokenizer_config.json").read_text())["do_lower_case"] is False

    # and lowercase=True overrides the guess
    folder = export_model(model, tmp_path / "forced", vocab, card={"task": "pretraining"}, lowercase=True)
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert tok("Hello World", add_special_tokens=False)["input_ids"] == [words.index("hello"), words.index("world")]


def test_model_card_needs_task_and_renders_packing():
    with pytest.raises(ValueError, match="task"):
        model_card({"steps": 3})
    text = model_card({"task": "MNLI classification", "packing": {"algorithm": "LPFHP", "efficiency": 0.95},
                       "metrics": {"acc|m": 0.9}})
    assert front_matter(text)["pipeline_tag"] == "text-classification"
    assert "LPFHP packing" in text and "95.0%" in text and "acc\\|m" in text
