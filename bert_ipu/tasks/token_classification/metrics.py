"""Named-entity scores as CoNLL's evaluation defines them: an entity is a maximal run of B-X I-X ... tags (an I-X
that does not continue an X starts one), counted correct when its words and type match exactly."""

from __future__ import annotations


def entities(tags: list[str]) -> set[tuple[int, int, str]]:
    """(first word, last word, type) of every entity in one sentence's tags, found as CoNLL's conlleval finds
    them: BIO (IOB1, IOB2) and BIOES (IOBES), where E- ends an entity and S- is one of a single word (they were
    read as no boundary: an E- entity ended a word early, an S- one was lost). An I- or E- that does not continue
    an entity of its type starts one; a tag of no known prefix is outside every entity."""
    found, start, before, before_kind = set(), None, "O", ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, kind = tag.partition("-")
        if prefix not in ("B", "I", "E", "S"):
            prefix, kind = "O", ""
        if start is not None and (before in ("E", "S") or prefix in ("B", "S", "O") or kind != before_kind):
            found.add((start, i - 1, before_kind))
            start = None
        if prefix in ("B", "S") or (prefix in ("I", "E") and (start is None or kind != before_kind)):
            start = i
        before, before_kind = prefix, kind
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
