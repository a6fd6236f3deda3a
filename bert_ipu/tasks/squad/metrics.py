"""Exact match and F1 as the official SQuAD v1.1 evaluation script computes them (evaluate-v1.1.py):
answers are lower-cased, stripped of punctuation and of the articles a/an/the, and white space is collapsed;
F1 is over the bags of words; each question scores its best over the ground-truth answers; the totals are
percentages over every question of the dataset (a question without a prediction scores 0)."""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    pred, truth = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    same = sum((Counter(pred) & Counter(truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def evaluate(answers: dict[str, list[str]], predictions: dict[str, str]) -> dict:
    """answers: question id -> ground-truth texts; predictions: question id -> text. Returns
    {"exact_match", "f1"} in percent over all questions of `answers`, and how many had no prediction."""
    if not answers:
        raise ValueError("no questions to evaluate")
    em = f1 = 0.0
    missing = 0
    for qid, truths in answers.items():
        if qid not in predictions:
            missing += 1
            continue
        em += max(exact_match_score(predictions[qid], t) for t in truths)
        f1 += max(f1_score(predictions[qid], t) for t in truths)
    return {"exact_match": 100.0 * em / len(answers), "f1": 100.0 * f1 / len(answers), "questions": len(answers),
            "unanswered": missing}
