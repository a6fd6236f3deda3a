"""SQuAD v1.1 examples -> features -> packs.

Reading: the official JSON format ({"data": [{"paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}]}]}]}]}) or a `datasets` dataset saved to disk with the columns of the
`squad` dataset (id, context, question, answers = {"text": [...], "answer_start": [...]}).

Features follow the reference implementation (Google's run_squad.py), with the fast tokenizer's offset
mapping instead of whitespace tokens:
- the question is cut to `max_query_length` tokens;
- a long context is covered by windows of at most max_seq_length - len(question) - 3 tokens, each starting
  `doc_stride` tokens after the previous one; a feature is [CLS] question [SEP] window [SEP];
- a context token's "max context" window is the one where it has the most tokens on its smaller side (plus
  0.01 x the window length); only there may an answer start (post-processing);
- the training label is the first and last token of the answer's character span; a window that does not
  hold the whole answer is labelled with its [CLS] token (position 0), as in the reference.

Bad input never gives a silent wrong label: an example whose answer text is not the context at
`answer_start` is left out of training, and empty contexts or questions are left out; each is counted in the
report, and a file that is not SQuAD is a clear `SquadInputError`. Questions longer than the limit are cut
and counted (what the reference does).

Packing: the features' lengths form a histogram; any packing algorithm of bert_ipu.packing packs it and
every feature lands in exactly one pack (assign). Inside a pack the features lie one after another, each
keeping its own token order, positions restarting at 0, sequence ids 1..k: see `PackedFeatures`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...data.contiguous import PackedSequences, pack_sequences
from ...data.instances import WordPiece
from ...data.layout import IGNORE_INDEX
from ...packing import PackingInputError  # noqa: F401 - raised by pack_features, part of its API


class SquadInputError(ValueError):
    """The input is not usable SQuAD data; the message says what is wrong and how to fix it."""


@dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list[str]              # every ground-truth text (evaluation scores against the best)
    answer_start: int | None = None  # character offset of answers[0] in context (the training label)


@dataclass
class InputReport:
    """What was read and what was left out, and why."""
    questions: int = 0
    examples: int = 0                   # questions kept
    empty_context: int = 0
    empty_question: int = 0
    answer_mismatch: int = 0            # training: answer text is not the context at answer_start
    no_answer: int = 0                  # training: the question has no answer
    truncated_questions: int = 0        # cut to max_query_length tokens
    features: int = 0
    features_answer_outside: int = 0    # training: windows that do not hold the answer (labelled [CLS])

    def summary(self) -> str:
        left_out = {k: v for k, v in (("empty context", self.empty_context), ("empty question", self.empty_question),
                                      ("answer text does not match the context at answer_start",
                                       self.answer_mismatch), ("no answer", self.no_answer)) if v}
        text = f"{self.questions} questions, {self.examples} kept, {self.features} features"
        if left_out:
            text += "; left out: " + ", ".join(f"{v} {k}" for k, v in left_out.items())
        if self.truncated_questions:
            text += f"; {self.truncated_questions} questions cut to the query limit"
        if self.features_answer_outside:
            text += f"; {self.features_answer_outside} windows without the answer (labelled [CLS])"
        return text


# --- reading -----------------------------------------------------------------------------------------------

def _records(path: Path):
    """(qid, question, context, [answer texts], [answer starts]) from a SQuAD JSON file or a datasets folder."""
    if path.is_dir():
        from datasets import DatasetDict, load_from_disk

        try:
            ds = load_from_disk(str(path))
        except Exception as e:  # datasets raises several types for a folder that is not a dataset
            raise SquadInputError(f"{path} is not a dataset saved with `datasets` ({e}); give a SQuAD JSON file "
                                  "or a folder written by Dataset.save_to_disk") from None
        if isinstance(ds, DatasetDict):
            raise SquadInputError(f"{path} holds the splits {', '.join(ds)}; give the folder of one split "
                                  f"(e.g. {path / next(iter(ds))})")
        need = {"id", "question", "context", "answers"}
        if not need <= set(ds.column_names):
            raise SquadInputError(f"{path}: the dataset lacks the column(s) {', '.join(sorted(need - set(ds.column_names)))}"
                                  "; SQuAD datasets have id, question, context and answers")
        for row in ds:
            answers = row["answers"] or {}
            yield (str(row["id"]), row["question"], row["context"], list(answers.get("text", [])),
                   list(answers.get("answer_start", [])))
        return
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SquadInputError(f"{path} does not exist; give a SQuAD v1.1 JSON file (e.g. train-v1.1.json from "
                              "the SQuAD site) or a datasets folder") from None
    except (UnicodeDecodeError, ValueError) as e:  # (ValueError: JSON's errors, and an integer of 4,300+ digits)
        raise SquadInputError(f"{path} is not valid JSON ({str(e)[:200]}); give a SQuAD v1.1 JSON file") from None
    except RecursionError:
        raise SquadInputError(f"{path} is not valid JSON (nested too deeply to read); give a SQuAD v1.1 JSON "
                              "file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise SquadInputError(f"{path}: expected an object with a list under \"data\" (the SQuAD v1.1 format)")
    try:
        for article in raw["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = qa.get("answers", [])
                    yield (str(qa["id"]), qa["question"], context, [a["text"] for a in answers],
                           [a["answer_start"] for a in answers])
    except (KeyError, TypeError) as e:
        raise SquadInputError(f"{path}: not in the SQuAD v1.1 format (missing or malformed {e}); each article "
                              "needs paragraphs, each paragraph a context and qas with id, question and "
                              "answers [{text, answer_start}]") from None


def read_squad(path: str | Path, training: bool) -> tuple[list[SquadExample], list[SquadExample], InputReport]:
    """(kept, left out, report). Left-out evaluation questions still count in EM/F1 (they score 0)."""
    path = Path(path)
    report = InputReport()
    kept, dropped = [], []
    seen = set()
    for qid, question, context, texts, starts in _records(path):
        if qid in seen:
            raise SquadInputError(f"{path}: question id {qid!r} appears twice; ids must be unique")
        seen.add(qid)
        report.questions += 1
        if not isinstance(context, str) or not isinstance(question, str):
            raise SquadInputError(f"{path}: question {qid!r} has a context or question that is not text")
        if not all(isinstance(t, str) for t in texts):
            raise SquadInputError(f"{path}: question {qid!r} has an answer whose text is not text "
                                  f"({str(texts)[:60]}); give each answer's text as a string")
        example = SquadExample(qid, question, context, [str(t) for t in texts])
        if not context.strip():
            report.empty_context += 1
        elif not question.strip():
            report.empty_question += 1
        elif training and not texts:
            report.no_answer += 1
        elif training and not _answer_matches(context, texts[0], starts[0] if starts else None):
            report.answer_mismatch += 1
        else:
            if training:
                example.answer_start = int(starts[0])
            kept.append(example)
            continue
        dropped.append(example)
    report.examples = len(kept)
    if not kept:
        raise SquadInputError(f"{path}: no usable question ({report.summary()})")
    return kept, dropped, report


def _answer_matches(context: str, text: str, start) -> bool:
    return (isinstance(start, int) and not isinstance(start, bool) and 0 <= start and bool(text.strip())
            and context[start:start + len(text)] == text)


# --- features ----------------------------------------------------------------------------------------------

@dataclass
class Features:
    """Every feature's tokens one after another (ragged, flat); feature f is tokens
    [starts[f], starts[f] + lengths[f])."""
    input_ids: np.ndarray        # (T,) int32
    token_type_ids: np.ndarray   # (T,) int8: 0 for [CLS] question [SEP], 1 for window [SEP]
    candidate: np.ndarray        # (T,) bool: may start or end an answer: context tokens and [CLS]
    max_context: np.ndarray      # (T,) bool: a context token in its max-context window
    offsets: np.ndarray          # (T, 2) int32: character span in the context, -1 for non-context tokens
    lengths: np.ndarray          # (F,) int64
    example_index: np.ndarray    # (F,) int64: which example (of the list given) the feature comes from
    start_position: np.ndarray   # (F,) int64: answer start in the feature; 0 = [CLS]; -100 = no label
    end_position: np.ndarray     # (F,) int64
    report: InputReport = field(default_factory=InputReport)

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)


def _windows(doc_len: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window, as the reference's `doc_spans`."""
    spans, start = [], 0
    while start < doc_len:
        length = min(doc_len - start, max_tokens)
        spans.append((start, length))
        if start + length == doc_len:
            break
        start += min(length, stride)
    return spans


def _max_context(spans: list[tuple[int, int]], doc_len: int) -> np.ndarray:
    """For each context token, the index of the window where it has the most context (the reference's
    _check_is_max_context: min(left, right) + 0.01 * window length; the first window wins ties)."""
    best_score = np.full(doc_len, -np.inf)
    best = np.zeros(doc_len, dtype=np.int64)
    for i, (start, length) in enumerate(spans):
        pos = np.arange(start, start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = score > best_score[pos]
        best_score[pos[better]] = score[better]
        best[pos[better]] = i
    return best


def make_features(examples: list[SquadExample], wp: WordPiece, max_seq_length: int = 384, doc_stride: int = 128,
                  max_query_length: int = 64, training: bool = False, report: InputReport | None = None,
                  progress: bool = False) -> Features:
    """Windowed features of `examples` (labels when `training`). A context that tokenizes to nothing is
    counted as empty and gets no feature."""
    from tqdm import tqdm

    report = report or InputReport()
    cls, sep = wp.ids["[CLS]"], wp.ids["[SEP]"]
    contexts = list(dict.fromkeys(e.context for e in examples))
    encoded_contexts = dict(zip(contexts, wp.tokenizer.encode_batch(contexts, add_special_tokens=False)))
    questions = wp.tokenizer.encode_batch([e.question.lstrip() for e in examples], add_special_tokens=False)
    ids, types, cand, maxc, offs = [], [], [], [], []
    lengths, example_index, start_pos, end_pos = [], [], [], []
    for index, (example, q) in enumerate(tqdm(list(zip(examples, questions)), desc="features", unit="question",
                                               disable=not progress, leave=False)):
        query = q.ids
        if len(query) > max_query_length:
            report.truncated_questions += 1
            query = query[:max_query_length]
        ctx = encoded_contexts[example.context]
        ctx_ids = np.asarray(ctx.ids, dtype=np.int32)
        ctx_offsets = np.asarray(ctx.offsets, dtype=np.int32).reshape(-1, 2)
        if len(ctx_ids) == 0:
            report.empty_context += 1
            continue
        answer = None
        if training:
            a_start = example.answer_start
            a_end = a_start + len(example.answers[0])
            inside = np.nonzero((ctx_offsets[:, 1] > a_start) & (ctx_offsets[:, 0] < a_end))[0]
            if len(inside) == 0:  # the answer is only characters the tokenizer drops (e.g. white space)
                report.answer_mismatch += 1
                continue
            answer = (int(inside[0]), int(inside[-1]))
        spans = _windows(len(ctx_ids), max_seq_length - len(query) - 3, doc_stride)
        best = _max_context(spans, len(ctx_ids))
        head = len(query) + 2  # [CLS] question [SEP]
        for i, (start, length) in enumerate(spans):
            n = head + length + 1
            ids.append(np.concatenate([[cls], query, [sep], ctx_ids[start:start + length], [sep]]).astype(np.int32))
            t = np.zeros(n, dtype=np.int8)
            t[head:] = 1
            types.append(t)
            c = np.zeros(n, dtype=bool)
            c[0] = True
            c[head:head + length] = True
            cand.append(c)
            m = np.zeros(n, dtype=bool)
            m[head:head + length] = best[start:start + length] == i
            maxc.append(m)
            o = np.full((n, 2), -1, dtype=np.int32)
            o[head:head + length] = ctx_offsets[start:start + length]
            offs.append(o)
            lengths.append(n)
            example_index.append(index)
            if answer is None:
                start_pos.append(IGNORE_INDEX)
                end_pos.append(IGNORE_INDEX)
            elif start <= answer[0] and answer[1] < start + length:
                start_pos.append(head + answer[0] - start)
                end_pos.append(head + answer[1] - start)
            else:
                report.features_answer_outside += 1
                start_pos.append(0)
                end_pos.append(0)
    report.features = len(lengths)
    if not lengths:
        raise SquadInputError(f"no features: {report.summary()}")
    return Features(np.concatenate(ids), np.concatenate(types), np.concatenate(cand), np.concatenate(maxc),
                    np.concatenate(offs), np.asarray(lengths, dtype=np.int64),
                    np.asarray(example_index, dtype=np.int64), np.asarray(start_pos, dtype=np.int64),
                    np.asarray(end_pos, dtype=np.int64), report)


# --- packing -----------------------------------------------------------------------------------------------

ROW_FIELDS = ("input_ids", "position_ids", "token_type_ids", "sequence_ids", "candidate_mask")
SLOT_FIELDS = ("start_positions", "end_positions")


# Features packed into rows: feature f sits in row `row[f]`, slot `slot[f]` (sequence id slot + 1), tokens
# [offset[f], offset[f] + length[f]) of that row; rows holds ROW_FIELDS (P, S) and SLOT_FIELDS (P, K), positions
# in the row, -100 = none. The one type of contiguous packing (bert_ipu/data/contiguous.py).
PackedFeatures = PackedSequences


def pack_features(features: Features, max_len: int, algorithm: str = "cghp", max_sequences_per_pack: int = 3,
                  seed: int = 0) -> PackedFeatures:
    """Pack the features with any algorithm of bert_ipu.packing ("none": one per row), back to back
    (bert_ipu.data.contiguous). Every row has `max_sequences_per_pack` label slots (with "none" only the first
    is used), so one model takes both layouts. Vectorised: no Python loop over features or tokens."""
    packed = pack_sequences(features.lengths, {"input_ids": features.input_ids,
                                               "token_type_ids": features.token_type_ids,
                                               "candidate_mask": features.candidate}, max_len, algorithm,
                            max_sequences_per_pack, seed)
    rows = {k: packed.rows[k] for k in ROW_FIELDS}
    for name, labels in (("start_positions", features.start_position), ("end_positions", features.end_position)):
        # a label is a position in the row: the feature's offset + its position in the feature
        rows[name] = packed.slot_values(np.where(labels != IGNORE_INDEX, packed.offset + labels, IGNORE_INDEX),
                                        IGNORE_INDEX)
    packed.rows = rows
    return packed


def micro_batches(packed: PackedFeatures, micro_batch_size: int, order: np.ndarray | None = None):
    """(pack indices, batch of numpy arrays) per micro-batch, in `order` (default: row order). The last
    micro-batch is filled up with empty rows (all padding, no labels), so every batch has the same shape and
    no feature is dropped."""
    order = np.arange(packed.packs) if order is None else order
    for lo in range(0, len(order), micro_batch_size):
        idx = order[lo:lo + micro_batch_size]
        batch = {k: v[idx] for k, v in packed.rows.items()}
        missing = micro_batch_size - len(idx)
        if missing:
            for k, v in batch.items():
                fill = IGNORE_INDEX if k in SLOT_FIELDS else 0
                batch[k] = np.concatenate([v, np.full((missing, *v.shape[1:]), fill, dtype=v.dtype)])
        yield idx, batch
