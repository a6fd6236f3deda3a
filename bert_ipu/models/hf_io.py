"""Hugging Face I/O: our models load from and save to `transformers` folders with the same names (strict),
start from Hugging Face's initialisation, and export as a folder that `transformers` uses as it is.

    model = from_hf(PackedBertForQuestionAnswering, BertForQuestionAnswering, "runs/x/hf", {}, kwargs)
    save_as_hf(model, BertForQuestionAnswering, "out/")

`export_model(model, folder, vocab_file, card=...)` writes, atomically:

    config.json, model.safetensors      the model (`model.save_pretrained`)
    vocab.txt                           the WordPiece vocabulary, as given
    tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                        a fast BERT tokenizer over that vocabulary, lower-casing iff the vocab
                                        has no upper-case word (as `bert_ipu.data.instances.WordPiece`)
    README.md                           a model card: YAML front matter, what was trained on what, the metrics

so that `AutoTokenizer.from_pretrained(folder)`, `AutoModelFor*.from_pretrained(folder)` and
`pipeline(task, model=folder)` work offline. The folder is built in `FOLDER.partial`, every file and folder
fsynced, then swapped in (old FOLDER -> FOLDER.old, FOLDER.partial -> FOLDER, FOLDER.old removed): a failure
at any point leaves the previous FOLDER as it was and no half-written FOLDER.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from torch import nn

from ..data.instances import WordPiece
from ..files import describe_os_error
from ..files import fsync_dir as _fsync_dir
from ..files import fsync_tree as _fsync_tree

# --- loading and saving ---------------------------------------------------------------------------------------

def init_weights(module: nn.Module, std: float) -> None:
    """Hugging Face's initialisation (`_init_weights` of BERT, GPT-2 and Llama alike) of one module."""
    import torch

    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        with torch.no_grad():
            module.weight[module.padding_idx].zero_()
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def from_hf(cls, hf_class, path, hf_kwargs: dict, kwargs: dict):
    """Our model `cls` from a Hugging Face folder read by `hf_class` (a head it lacks starts fresh, silently:
    "some weights were newly initialised" is expected), its state dict loaded with strict=True. The names of
    the weights that started fresh (missing from the folder, or of another shape there) are the model's
    `newly_initialised`: an evaluation-only run refuses a model with any (it would score a random head)."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        hf, info = hf_class.from_pretrained(str(path), output_loading_info=True, **hf_kwargs)
    finally:
        logging.set_verbosity(verbosity)
    model = cls(hf.config, **kwargs)
    model.load_state_dict(hf.state_dict(), strict=True)
    fresh = list(info.get("missing_keys", [])) + [k[0] if isinstance(k, tuple) else k
                                                  for k in info.get("mismatched_keys", [])]
    model.newly_initialised = sorted(str(k) for k in fresh)
    return model


@contextlib.contextmanager
def quiet_off_terminal():
    """transformers' progress bars ("Writing model shards") off while stderr is not a terminal: in a log file
    they are only noise (carriage returns and bar glyphs)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not sys.stderr.isatty():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_as_hf(model: nn.Module, hf_class, path, generation: dict | None = None) -> None:
    """Write `model` as a folder that `hf_class.from_pretrained` loads (same names, strict); `generation`: settings
    of its generation_config (a model that generates)."""
    hf = hf_class(model.config)
    hf.load_state_dict(model.state_dict(), strict=True)
    for key, value in (generation or {}).items():
        setattr(hf.generation_config, key, value)
    with quiet_off_terminal():
        hf.save_pretrained(str(path))


# --- exports ---------------------------------------------------------------------------------------------------

class ExportError(RuntimeError):
    """An export that could not be written (a full disk, a folder that cannot be created): one line; the previous
    export, if any, is intact."""


PIPELINE_TAGS = ("fill-mask", "question-answering", "text-classification", "text-generation")

# model class name (suffix) -> the pipeline that uses it
_PIPELINE_BY_CLASS = (("ForQuestionAnswering", "question-answering"), ("ForPreTraining", "fill-mask"),
                      ("ForMaskedLM", "fill-mask"), ("ForSequenceClassification", "text-classification"),
                      ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"))


# --- model card ----------------------------------------------------------------------------------------------

def _yaml_str(value: str) -> str:
    """A YAML scalar for any string (a JSON string is valid YAML)."""
    return value if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", value) else json.dumps(value)


def _cell(value: Any) -> str:
    """Text for a Markdown table cell."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def _infer_pipeline_tag(task: str) -> str | None:
    t = task.lower()
    if "question" in t or "squad" in t:
        return "question-answering"
    if "pretrain" in t or "mlm" in t or "masked" in t:
        return "fill-mask"
    if "classif" in t or "glue" in t:
        return "text-classification"
    return None


def _is_hub_id(name: str) -> bool:
    """Whether `name` looks like a Hugging Face Hub model id (front matter `base_model` takes only those)."""
    return (bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", name))
            and name.lower() != "from scratch" and not Path(name).exists())


def _packing_text(packing: dict) -> str:
    algorithm = packing.get("algorithm")
    if not algorithm or str(algorithm).upper() == "NONE":
        return "without packing" if algorithm else ""
    details = []
    if packing.get("max_sequences_per_pack") is not None:
        details.append(f"up to {packing['max_sequences_per_pack']} sequences per pack")
    if packing.get("packing_factor") is not None:
        details.append(f"packing factor {float(packing['packing_factor']):.3f}")
    if packing.get("efficiency") is not None:
        e = float(packing["efficiency"])
        details.append(f"efficiency {e:.1%}" if e <= 1 else f"efficiency {e:.1f}%")
    return f"with {algorithm} packing" + (f" ({', '.join(details)})" if details else "")


def model_card(card: dict) -> str:
    """README.md text for an export. `card` keys, all optional but `task`: task, pipeline_tag, base_model,
    data, steps, sequences_seen, packing (algorithm, max_sequences_per_pack, packing_factor, efficiency),
    metrics (name -> float), command."""
    if not card.get("task"):
        raise ValueError("model card: give card['task'], e.g. 'pretraining (MLM + NSP)'")
    task = str(card["task"])
    tag = card.get("pipeline_tag") or _infer_pipeline_tag(task)
    base = card.get("base_model")
    base = str(base) if base else None

    front = ["---", "library_name: transformers"]
    if tag:
        front.append(f"pipeline_tag: {_yaml_str(str(tag))}")
    front.append(f"tags: [{', '.join(card.get('tags') or ('bert', 'packed-bert'))}]")
    if base and _is_hub_id(base):
        front.append(f"base_model: {_yaml_str(base)}")
    front.append("---")

    architecture = card.get("architecture", "BERT")
    sentence = f"A {architecture} model trained for {task}"
    if card.get("data"):
        sentence += f" on {card['data']}"
    if card.get("steps") is not None:
        sentence += f" for {_number(int(card['steps']))} steps"
    if card.get("sequences_seen") is not None:
        sentence += f" ({_number(card['sequences_seen'])} sequences seen)"
    packing = _packing_text(dict(card.get("packing") or {}))
    if packing:
        sentence += f" {packing}"
    if base:
        sentence += ", from scratch" if base.lower() == "from scratch" else f", starting from `{base}`"
    sentence += "."

    lines = front + ["", f"# Packed {architecture}: {task}", "", sentence,
                     "", "Sequences were packed without cross-contamination (Krell et al., \"Efficient Sequence "
                     f"Packing without Cross-contamination\"); the exported weights are a standard Hugging Face "
                     f"{architecture} and need no packing to use.", ""]
    metrics = dict(card.get("metrics") or {})
    if metrics:
        lines += ["## Final metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {_cell(name)} | {_cell(_number(value))} |" for name, value in metrics.items()]
        lines.append("")
    lines += ["## Use", "", "```python", *usage(tag), "```", ""]
    if card.get("command"):
        lines += ["## Command", "", "```", str(card["command"]), "```", ""]
    return "\n".join(lines)


QA_USAGE = """import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

folder = "path/to/this/folder"
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForQuestionAnswering.from_pretrained(folder).eval()
question, context = "What is the capital of France?", "Paris is the capital of France."
inputs = tokenizer(question, context, truncation="only_second", return_tensors="pt")
with torch.no_grad():
    out = model(**inputs)
context_tokens = torch.tensor([s == 1 for s in inputs.sequence_ids(0)])
start = out.start_logits[0].masked_fill(~context_tokens, -1e9).argmax()
end = start + out.end_logits[0, start:start + 30].masked_fill(~context_tokens[start:start + 30], -1e9).argmax()
answer = tokenizer.decode(inputs["input_ids"][0, start:end + 1])"""


def usage(tag: str | None) -> list[str]:
    """The card's code: `pipeline(tag)` where the installed transformers has that pipeline; question answering,
    whose pipeline transformers 5 removed, by the model and tokenizer classes (the best span in the context)."""
    if tag == "question-answering":
        from transformers.pipelines import SUPPORTED_TASKS

        if tag not in SUPPORTED_TASKS:
            return QA_USAGE.splitlines()
    return ["from transformers import pipeline", "",
            f"pipe = pipeline({json.dumps(tag or 'feature-extraction')}, model=\"path/to/this/folder\")"]


# --- export --------------------------------------------------------------------------------------------------

def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _write_tokenizer(path: Path, vocab_file: Path, lowercase: bool, model_max_length: int | None) -> None:
    """vocab.txt + tokenizer.json + tokenizer_config.json + special_tokens_map.json in `path`."""
    from transformers import BertTokenizerFast

    shutil.copyfile(vocab_file, path / "vocab.txt")
    # from a folder holding vocab.txt: `BertTokenizerFast(vocab_file=...)` would build a 5-token vocab in 5.x
    kwargs = {"model_max_length": model_max_length} if model_max_length else {}
    tok = BertTokenizerFast.from_pretrained(str(path), do_lower_case=lowercase, local_files_only=True, **kwargs)
    words = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    if len(tok) != len(words):
        raise RuntimeError(f"tokenizer built from {vocab_file} has {len(tok)} tokens, the vocab {len(words)}")
    tok.save_pretrained(str(path))
    # transformers 5 folds the special tokens into tokenizer_config.json; older versions read this file too
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]"}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):  # loading details of this run, not properties of the tokenizer
        config.pop(key, None)
    config.update(special, do_lower_case=lowercase, tokenizer_class=config.get("tokenizer_class", "BertTokenizer"))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _model_pipeline_tag(model) -> str | None:
    name = type(model).__name__
    return next((tag for suffix, tag in _PIPELINE_BY_CLASS if name.endswith(suffix)), None)


def export_model(model, folder: str | Path, vocab_file: str | Path | None = None, *, card: dict,
                 lowercase: bool | None = None, tokenizer=None) -> Path:
    """Write `folder`: the model (`model.save_pretrained`), the tokenizer files (a BERT tokenizer over the
    WordPiece `vocab_file`, or `tokenizer.save_pretrained`: any `transformers` tokenizer) and README.md, so that
    `transformers` loads it as it is. `lowercase` None = lower-case iff the vocab has no upper-case letter in its
    non-special tokens. Atomic: built in FOLDER.partial, then swapped in; on any error a previous FOLDER stays
    intact. Returns the folder's path."""
    folder = Path(folder)
    if (vocab_file is None) == (tokenizer is None):
        raise ValueError("export_model: give a WordPiece vocab_file or a tokenizer, one of them")
    if tokenizer is None:
        vocab_file = Path(vocab_file)
        wordpiece = WordPiece(vocab_file)  # checks the vocab (readable, special tokens, no duplicates)
        if lowercase is None:
            lowercase = wordpiece.lowercase
    config = getattr(model, "config", None)
    card = dict(card)
    if not card.get("pipeline_tag"):
        card["pipeline_tag"] = _model_pipeline_tag(model) or _infer_pipeline_tag(str(card.get("task", "")))
    text = model_card(card)  # before writing anything: a bad card fails early
    vocab_size = getattr(config, "vocab_size", None)
    tokens = len(wordpiece) if tokenizer is None else len(tokenizer)
    if isinstance(vocab_size, int) and vocab_size < tokens:  # larger is fine: a padded embedding
        raise ValueError(f"the model has vocab_size {vocab_size}, the tokenizer {tokens} tokens: give the "
                         "tokenizer the model was trained with")
    max_length = getattr(config, "max_position_embeddings", None)

    try:
        return _write_export(model, folder, vocab_file, lowercase, max_length, text, tokenizer)
    except OSError as e:
        kept = " (the export already there is unchanged)" if folder.exists() else ""
        raise ExportError(f"writing the export {folder} failed: {describe_os_error(e)}; nothing was written{kept}: "
                          "free space (or fix the cause) and export again") from None


def _write_export(model, folder: Path, vocab_file: Path | None, lowercase: bool, max_length, text: str,
                  tokenizer=None) -> Path:
    partial = folder.with_name(folder.name + ".partial")
    old = folder.with_name(folder.name + ".old")
    folder.parent.mkdir(parents=True, exist_ok=True)
    if old.exists() and not folder.exists():  # an earlier export died between its two renames: put it back
        os.replace(old, folder)
    _remove(partial)
    _remove(old)
    try:
        partial.mkdir()
        if tokenizer is None:
            _write_tokenizer(partial, vocab_file, lowercase, max_length)
        else:
            tokenizer.save_pretrained(str(partial))
        with quiet_off_terminal():
            model.save_pretrained(partial)  # keeps config.id2label / label2id: they are in the model's config
        if not (partial / "config.json").exists():
            raise RuntimeError(f"{type(model).__name__}.save_pretrained wrote no config.json")
        (partial / "README.md").write_text(text, encoding="utf-8")
        _fsync_tree(partial)
        if folder.exists() or folder.is_symlink():
            os.replace(folder, old)
            try:
                os.replace(partial, folder)
            except BaseException:
                os.replace(old, folder)
                raise
        else:
            os.replace(partial, folder)
        _fsync_dir(folder.parent)
    except BaseException:
        _remove(partial)
        raise
    _remove(old)
    _fsync_dir(folder.parent)
    return folder


__all__ = ["export_model", "model_card", "ExportError", "PIPELINE_TAGS", "from_hf", "save_as_hf", "init_weights"]
