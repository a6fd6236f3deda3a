"""Named-entity scores as CoNLL's evaluation defines them: an entity is a maximal run of B-X I-X ... tags (an I-X
that does not continue an X starts one), counted correct when its words and type match exactly."""

from __future__ import annotations


def entities(tags: list[str]) -> set[tuple[int, int, str]]:
    """(first word, last word, type) of every entity in one sentence's BIO tags."""
    found, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and label == kind
        if start is not None and not continues:
            found.add((start, i - 1, kind))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = i, label
    return found


def score(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity precision, recall and F1 (micro, over all sentences) and word accuracy."""
    right = found = wanted = words = same = 0
    for g, p in zip(gold, predicted):
        a, b = entities(g), entities(p)
        right, found, wanted = right + len(a & b), found + len(b), wanted + len(a)
        words, same = words + len(g), same + sum(x == y for x, y in zip(g, p))
    precision, recall = right / max(found, 1), right / max(wanted, 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"entity_precision": precision, "entity_recall": recall, "entity_f1": f1,
            "word_accuracy": same / max(words, 1)}
