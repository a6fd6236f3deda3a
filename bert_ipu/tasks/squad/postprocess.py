"""Start/end logits per feature -> one answer text per question (the reference's write_predictions).

For each feature: the `n_best_size` highest start and end logits; a pair (start, end) is a candidate span
when both are context tokens, end >= start, it is at most `max_answer_length` tokens long, and the start
token is in its max-context window; its score is start logit + end logit. A question's answer is its best
span over all of its features, cut out of the context with the offset mapping; no valid span gives "".
"""

from __future__ import annotations

import numpy as np

from .features import Features, SquadExample


def feature_logits(features: Features, packed, start_logits: np.ndarray, end_logits: np.ndarray):
    """Per-feature (start, end) logits (each of the feature's length) out of the packed logits
    (P, K, S) of `packed` (a PackedFeatures)."""
    out = []
    for f in range(len(features)):
        r, k, o, n = packed.row[f], packed.slot[f], packed.offset[f], features.lengths[f]
        out.append((start_logits[r, k, o:o + n], end_logits[r, k, o:o + n]))
    return out


def best_spans(features: Features, logits: list[tuple[np.ndarray, np.ndarray]], n_best_size: int = 20,
               max_answer_length: int = 30) -> list[tuple[float, int, int] | None]:
    """Per feature: (score, start, end) of its best valid span (token positions in the feature), or None."""
    starts = features.starts
    best = []
    for f, (start_logits, end_logits) in enumerate(logits):
        lo, n = starts[f], features.lengths[f]
        in_context = features.offsets[lo:lo + n, 0] >= 0
        max_context = features.max_context[lo:lo + n]
        top_start = np.argsort(-start_logits, kind="stable")[:n_best_size]
        top_end = np.argsort(-end_logits, kind="stable")[:n_best_size]
        s, e = np.meshgrid(top_start, top_end, indexing="ij")
        valid = (in_context[s] & in_context[e] & max_context[s] & (e >= s) & (e - s + 1 <= max_answer_length))
        if not valid.any():
            best.append(None)
            continue
        score = np.full(valid.shape, -np.inf)
        score[valid] = start_logits[s[valid]].astype(np.float64) + end_logits[e[valid]]
        i = np.unravel_index(np.argmax(score), score.shape)  # first maximum: the reference's stable order
        best.append((float(score[i]), int(s[i]), int(e[i])))
    return best


def predictions(examples: list[SquadExample], features: Features, logits, n_best_size: int = 20,
                max_answer_length: int = 30) -> dict[str, str]:
    """Question id -> answer text, for every example (an example without a valid span answers "")."""
    spans = best_spans(features, logits, n_best_size, max_answer_length)
    starts = features.starts
    best: dict[int, tuple[float, str]] = {}
    for f, span in enumerate(spans):
        if span is None:
            continue
        score, s, e = span
        ex = int(features.example_index[f])
        if ex not in best or score > best[ex][0]:
            lo = starts[f]
            text = examples[ex].context[features.offsets[lo + s, 0]:features.offsets[lo + e, 1]]
            best[ex] = (score, text)
    return {example.qid: best[i][1] if i in best else "" for i, example in enumerate(examples)}
