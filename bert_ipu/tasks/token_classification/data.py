"""CoNLL-style files -> sentences of (word, tag) -> WordPiece features with one label a word.

    sentences, report = read_conll("train.txt")
    features = featurize(sentences, wordpiece, labels, max_seq_length=128, report=report)

A feature is [CLS] the sentence's sub-tokens [SEP]; a word's tag is the label of its first sub-token and every
other position is -100 (no loss), as Hugging Face's token classification examples do. A sentence longer than
the pack length is cut at a word boundary: its last words are not seen by the model, are predicted O and scored
so (counted in the report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...data.instances import WordPiece
from ...data.layout import IGNORE_INDEX
from ...data.text import DataInputError


@dataclass
class Report:
    sentences: int = 0
    words: int = 0
    cut_sentences: int = 0
    cut_words: int = 0

    def summary(self) -> str:
        return (f"{self.sentences:,} sentences, {self.words:,} words; {self.cut_sentences:,} cut at the pack length "
                f"({self.cut_words:,} words unseen, predicted O)")


@dataclass
class Features:
    input_ids: np.ndarray      # (T,) every sentence's tokens back to back
    labels: np.ndarray         # (T,) a word's tag id at its first sub-token, -100 elsewhere
    lengths: np.ndarray        # (N,) tokens per sentence
    first: list = field(default_factory=list)  # per sentence: the token offset of each scored word ...
    words: list = field(default_factory=list)  # ... and that word's index in the sentence (a word the tokenizer
                                               # makes no token of, as a zero-width space, has none)


def read_conll(path: str | Path) -> tuple[list[list[tuple[str, str]]], Report]:
    """[[(word, tag), ...] per sentence]; a line without a tag is a DataInputError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataInputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}; give a CoNLL text file "
                             "(one 'word TAG' line a token, a blank line between sentences)") from None
    sentences, current, report = [], [], Report()
    for number, line in enumerate(lines, 1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if current:
                sentences.append(current)
                current = []
            continue
        if len(columns) < 2:
            raise DataInputError(f"{path}:{number}: {line.strip()!r} has no tag; give 'word TAG' lines")
        current.append((columns[0], columns[-1]))
    if current:
        sentences.append(current)
    if not sentences:
        raise DataInputError(f"{path}: no sentence; give 'word TAG' lines, a blank line between sentences")
    report.sentences, report.words = len(sentences), sum(len(s) for s in sentences)
    return sentences, report


def featurize(sentences, wp: WordPiece, labels: list[str], max_seq_length: int, report: Report) -> Features:
    """One feature a sentence (see the module docstring); `labels` maps tags to ids (a tag outside it is an
    error naming it)."""
    index = {tag: i for i, tag in enumerate(labels)}
    unknown = sorted({t for s in sentences for _, t in s} - set(index))
    if unknown:
        raise DataInputError(f"tags {', '.join(unknown)} are not in the training data's tags "
                             f"({', '.join(labels)}); train on data that has them")
    encoded = wp.tokenizer.encode_batch([[w for w, _ in s] for s in sentences], is_pretokenized=True,
                                        add_special_tokens=False)
    ids, tags, lengths, firsts, scored = [], [], [], [], []
    cls, sep = wp.ids["[CLS]"], wp.ids["[SEP]"]
    for sentence, enc in zip(sentences, encoded):
        words = enc.word_ids
        keep = max_seq_length - 2
        if len(words) > keep:  # cut at a word boundary: a word is kept whole or not at all
            while keep > 0 and words[keep] == words[keep - 1]:
                keep -= 1
            report.cut_sentences += 1
            report.cut_words += len(sentence) - (words[keep - 1] + 1 if keep else 0)
        row_ids, row_tags, first, which = [cls], [IGNORE_INDEX], [], []
        for position, (token, word) in enumerate(zip(enc.ids[:keep], words[:keep]), 1):
            starts = position == 1 or words[position - 2] != word
            row_ids.append(token)
            row_tags.append(index[sentence[word][1]] if starts else IGNORE_INDEX)
            if starts:
                first.append(position)
                which.append(word)
        row_ids.append(sep)
        row_tags.append(IGNORE_INDEX)
        ids += row_ids
        tags += row_tags
        lengths.append(len(row_ids))
        firsts.append(first)
        scored.append(which)
    return Features(np.array(ids, np.int64), np.array(tags, np.int64), np.array(lengths, np.int64), firsts, scored)
