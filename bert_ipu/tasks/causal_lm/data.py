"""Causal language-model data: text or chats -> token sequences with next-token labels -> packs.

Two formats (`data.format`):
- text: documents (the built-in corpus, text files, JSON lines with `text`, a saved `datasets` dataset: as
  bert_ipu.data.text reads them), each cut at sentence boundaries into sequences of at most the pack length
  (a sentence longer than that is cut), each starting with the BOS token; every next token is a label.
- sft: JSON lines, one example per line, either `{"messages": [{"role": ..., "content": ...}, ...]}` (a chat,
  rendered with the tokenizer's chat template, which it must have) or `{"prompt": ..., "response": ...}`
  (also `completion`; rendered as a user/assistant chat when the tokenizer has a template, else
  prompt + response + EOS). Only the assistant's tokens are labels (the prompt mask).

Labels never cross a sequence: label[t] = token[t + 1] of the same sequence where token t + 1 is a label
token, -100 elsewhere, so the last token of every sequence predicts nothing. The packer
(bert_ipu/data/contiguous.py) moves each sequence whole into one row, and its labels with it.

Skipped and counted (`CausalReport`): chats without an assistant turn, examples whose response is empty (no
label token), empty documents; with `too_long: drop`, examples longer than the pack length. Errors
(`DataInputError`, one line naming the file, line and fix): malformed JSON, a record of neither form, a chat
without a chat template, an example longer than the pack length (`too_long: error`, the default).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ...data.layout import IGNORE_INDEX
from ...data.text import DataInputError, json_line, read_documents

SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# the chat template of a tokenizer trained here: role token, content, <|end|>; a prompt ends with <|assistant|>
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


@dataclass
class CausalReport:
    examples: int = 0                 # documents (text) or JSON lines (sft) read
    sequences: int = 0                # kept
    tokens: int = 0
    label_tokens: int = 0
    empty: int = 0                    # empty documents / lines
    no_assistant_turn: int = 0        # chats with nothing to learn
    empty_response: int = 0           # an assistant turn with no token
    too_long_dropped: int = 0         # with too_long: drop
    sentences_cut: int = 0            # text: sentences longer than the pack length, cut into pieces

    def summary(self) -> str:
        skipped = {k: v for k, v in asdict(self).items()
                   if k in ("empty", "no_assistant_turn", "empty_response", "too_long_dropped", "sentences_cut") and v}
        text = (f"{self.examples:,} read, {self.sequences:,} sequences, {self.tokens:,} tokens, "
                f"{self.label_tokens:,} label tokens")
        return text + (f"; skipped or cut: {', '.join(f'{k} {v:,}' for k, v in skipped.items())}" if skipped else "")


@dataclass
class CausalSequences:
    """N token sequences, flat: sequence i is input_ids[starts[i]:starts[i] + lengths[i]], its labels beside."""
    lengths: np.ndarray     # (N,)
    input_ids: np.ndarray   # (sum lengths,)
    labels: np.ndarray      # (sum lengths,) next token of the same sequence, or -100

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, index: np.ndarray) -> "CausalSequences":
        starts = np.cumsum(self.lengths) - self.lengths
        take = np.concatenate([np.arange(starts[i], starts[i] + self.lengths[i]) for i in index]) \
            if len(index) else np.zeros(0, np.int64)
        return CausalSequences(self.lengths[index], self.input_ids[take], self.labels[take])


def next_token_labels(ids: list[int], learn: list[bool]) -> list[int]:
    """label[t] = ids[t + 1] where token t + 1 is learnt, else -100; the last token predicts nothing."""
    return [ids[t + 1] if learn[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)] + [IGNORE_INDEX]


def _collect(items, max_len: int, report: CausalReport) -> CausalSequences:
    lengths, ids, labels = [], [], []
    for tokens, learn in items:
        lab = next_token_labels(tokens, learn)
        lengths.append(len(tokens))
        ids.extend(tokens)
        labels.extend(lab)
        report.sequences += 1
        report.tokens += len(tokens)
        report.label_tokens += sum(x != IGNORE_INDEX for x in lab)
    if not lengths:
        raise DataInputError("no usable sequence in the input (" + report.summary() + "); give more data")
    return CausalSequences(np.asarray(lengths, np.int64), np.asarray(ids, np.int64), np.asarray(labels, np.int64))


# --- text ----------------------------------------------------------------------------------------------------

def text_sequences(inputs: list[str], tokenizer, max_len: int, report: CausalReport) -> CausalSequences:
    """Documents cut at sentence boundaries into sequences of at most `max_len` tokens (BOS first)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise DataInputError("the tokenizer has no BOS token; give a tokenizer with bos_token (text format)")

    def chunks() -> Iterator[tuple[list[int], list[bool]]]:
        for document in read_documents(inputs):
            report.examples += 1
            sentences = [s for s in document if s.strip()]
            if not sentences:
                report.empty += 1
                continue
            encoded = tokenizer([(" " if i else "") + s for i, s in enumerate(sentences)],
                                add_special_tokens=False)["input_ids"]
            current = [bos]
            for piece in encoded:
                if len(piece) > max_len - 1:  # a sentence longer than a sequence: cut it
                    report.sentences_cut += 1
                if len(current) + len(piece) > max_len and len(current) > 1:
                    yield current, [True] * len(current)
                    current = [bos]
                while len(current) + len(piece) > max_len:
                    room = max_len - len(current)
                    current.extend(piece[:room])
                    piece = piece[room:]
                    yield current, [True] * len(current)
                    current = [bos]
                current.extend(piece)
            if len(current) > 1:
                yield current, [True] * len(current)

    return _collect(chunks(), max_len, report)


# --- supervised fine-tuning ----------------------------------------------------------------------------------

def _render(tokenizer, messages: list[dict], generation_prompt: bool, where: str) -> list[int]:
    from jinja2.exceptions import SecurityError, TemplateError

    try:  # transformers renders the template in Jinja's immutable sandbox
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except SecurityError as e:
        raise DataInputError(f"{where}: the tokenizer's chat template tried what Jinja's sandbox forbids ({e}); it "
                             "is refused for safety: give a tokenizer with a trusted chat template") from None
    except TemplateError as e:
        raise DataInputError(f"{where}: the tokenizer's chat template failed on this chat "
                             f"({type(e).__name__}: {e}); fix the template or the chat") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_tokens(tokenizer, messages: list[dict], where: str) -> tuple[list[int], list[bool]]:
    """A chat's tokens and which are the assistant's (its turns' content and end token): each assistant turn
    is what rendering the chat up to and including it adds to rendering it up to it with a generation prompt."""
    full = _render(tokenizer, messages, False, where)
    learn = [False] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, where)
        through = _render(tokenizer, messages[: i + 1], False, where)
        if full[: len(through)] != through or through[: len(before)] != before:
            raise DataInputError(f"{where}: the chat template does not render this chat's turns as a prefix of the "
                                 "whole chat, so the assistant's tokens cannot be found; use a template that renders "
                                 "turns one after another")
        for t in range(len(before), len(through)):
            learn[t] = True
    return full, learn


def _record(tokenizer, value, where: str):
    """One JSON line -> (tokens, learn), or a skip reason."""
    if not isinstance(value, dict):
        raise DataInputError(f"{where}: expected an object with messages, or prompt and response")
    if "messages" in value:
        messages = value["messages"]
        if not (isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                   and isinstance(m.get("content"), str) for m in messages)):
            raise DataInputError(f"{where}: messages must be a list of {{\"role\": str, \"content\": str}}")
        if tokenizer.chat_template is None:
            raise DataInputError(f"{where}: a chat needs the tokenizer's chat template and this tokenizer has none; "
                                 "give a tokenizer with a chat template (data.tokenizer) or prompt/response pairs")
        if not any(m["role"] == "assistant" for m in messages):
            return "no_assistant_turn"
        if messages and messages[0]["role"] == "assistant":   # (transformers cannot render the empty chat before it)
            raise DataInputError(f"{where}: the chat starts with the assistant's turn, which follows no prompt; start "
                                 "it with a system or user message, or leave that turn out")
        if all(not m["content"] for m in messages if m["role"] == "assistant"):
            return "empty_response"
        return chat_tokens(tokenizer, messages, where)
    response = value.get("response", value.get("completion"))
    if not isinstance(value.get("prompt"), str) or not isinstance(response, str):
        raise DataInputError(f"{where}: expected \"messages\", or string \"prompt\" and \"response\" (or "
                             "\"completion\") fields")
    if not response:
        return "empty_response"
    if tokenizer.chat_template is not None:
        return chat_tokens(tokenizer, [{"role": "user", "content": value["prompt"]},
                                       {"role": "assistant", "content": response}], where)
    if tokenizer.eos_token_id is None:
        raise DataInputError(f"{where}: the tokenizer has neither a chat template nor an EOS token to end a response")
    prompt = tokenizer(value["prompt"], add_special_tokens=False)["input_ids"]
    answer = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + answer, [False] * len(prompt) + [True] * len(answer)


def check_sft_source(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataInputError(f"data.source {path} is not a file; give a JSON-lines file of chats or "
                             "prompt/response pairs")
    return path


def sft_sequences(path: str | Path, tokenizer, max_len: int, too_long: str, report: CausalReport) -> CausalSequences:
    """The JSON-lines file `path` of chats or prompt/response pairs -> sequences with the prompt mask."""
    path = check_sft_source(path)

    def items() -> Iterator[tuple[list[int], list[bool]]]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DataInputError(f"{path}: not UTF-8 text; give a JSON-lines file") from None
        for n, line in enumerate(lines, 1):
            where = f"{path}:{n}"
            report.examples += 1
            if not line.strip():
                report.empty += 1
                continue
            try:
                value = json_line(line)
            except json.JSONDecodeError as e:
                raise DataInputError(f"{where}: not valid JSON ({e.msg}); give one JSON object per line") from None
            got = _record(tokenizer, value, where)
            if isinstance(got, str):
                setattr(report, got, getattr(report, got) + 1)
                continue
            tokens, learn = got
            if len(tokens) > max_len:
                if too_long == "drop":
                    report.too_long_dropped += 1
                    continue
                raise DataInputError(f"{where}: {len(tokens)} tokens, longer than the pack length {max_len}; raise "
                                     "data.max_seq_length or drop such examples with data.too_long=drop")
            if not any(learn[1:]):
                report.empty_response += 1
                continue
            yield tokens, learn

    return _collect(items(), max_len, report)


# --- tokenizer -----------------------------------------------------------------------------------------------

def train_tokenizer(texts: Iterator[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `texts` (deterministic), with BOS/EOS <|endoftext|>, a pad token,
    role tokens and CHAT_TEMPLATE: what a model trained from scratch here exports."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", chat_template=CHAT_TEMPLATE,
                                   additional_special_tokens=list(SPECIAL_TOKENS[2:]))


def bos_first(tokenizer):
    """`tokenizer`, or a copy that puts BOS first when called (`tokenizer(text)`), as every sequence of the text
    format was trained (`text_sequences`): for its export. The tokenizer trained here, or GPT-2's, added none, so
    `pipeline("text-generation")` gave the model inputs unlike any it learnt from. A slow tokenizer, or one
    that already puts BOS first, is returned as it is."""
    import copy

    from tokenizers.processors import TemplateProcessing

    bos = tokenizer.bos_token
    ids = tokenizer("a")["input_ids"]
    if bos is None or not tokenizer.is_fast or (ids and ids[0] == tokenizer.bos_token_id):
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.bos_token_id)])
    return tokenizer


def source_texts(fmt: str, source: str) -> Iterator[str]:
    """The text a tokenizer is trained on: the documents, or the chats' contents."""
    if fmt == "text":
        for document in read_documents([source]):
            yield " ".join(document)
        return
    try:
        lines = check_sft_source(source).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise DataInputError(f"{source}: not UTF-8 text; give a JSON-lines file") from None
    for line in lines:
        try:
            value = json_line(line)
        except json.JSONDecodeError:
            continue  # reported where the examples are read
        if isinstance(value, dict):
            for m in value.get("messages", []) if isinstance(value.get("messages"), list) else []:
                if isinstance(m, dict) and isinstance(m.get("content"), str):
                    yield m["content"]
            for key in ("prompt", "response", "completion"):
                if isinstance(value.get(key), str):
                    yield value[key]


def turn_end_token(labels: np.ndarray, tokenizer) -> int | None:
    """The token that ends the learnt spans of `labels` (an SFT set's: the assistant's turns), past any
    whitespace after it (ChatML's `<|im_end|>\n`, Phi-3's, Gemma's), where one token ends at least half of them: a
    chat template's end-of-turn token, or the EOS that ends each response; else None."""
    learnt = labels != IGNORE_INDEX
    ends = np.nonzero(learnt & ~np.append(learnt[1:], False))[0]   # (a sequence's last label is IGNORE_INDEX)
    blank = {}

    def is_blank(token: int) -> bool:
        if token not in blank:
            blank[token] = not tokenizer.decode([token]).strip()
        return blank[token]

    found = []
    for t in ends:
        while t > 0 and learnt[t - 1] and is_blank(int(labels[t])):
            t -= 1
        found.append(int(labels[t]))
    if not found:
        return None
    values, counts = np.unique(found, return_counts=True)
    return int(values[np.argmax(counts)]) if counts.max() * 2 >= len(found) else None


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise DataInputError(f"tokenizer {path} is not a folder; give a Hugging Face tokenizer folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataInputError(f"tokenizer {path}: cannot load it ({str(e).splitlines()[0]}); give a Hugging Face "
                             "tokenizer folder") from None
    if not tokenizer("a b", add_special_tokens=False)["input_ids"]:
        # (transformers makes an empty GPT-2 tokenizer of a model folder without tokenizer files: every example
        # then tokenized to nothing, and the run blamed the data)
        raise DataInputError(f"tokenizer {path}: it has no vocabulary (a folder without tokenizer files encodes "
                             f"text to nothing, {len(tokenizer)} token(s)); give the model's tokenizer folder "
                             "(data.tokenizer)")
    return tokenizer
