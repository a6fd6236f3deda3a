"""GLUE metrics, as GLUE defines them, computed by scikit-learn and scipy (no formulas of our own).

    cola                  matthews_correlation
    sst2, qnli, rte, wnli accuracy
    mrpc, qqp             accuracy, f1 (binary F1 of the positive class: equivalent / duplicate)
    stsb                  pearson, spearman
    mnli                  accuracy (of one split: matched and mismatched are reported separately)

Values are what the libraries give: accuracy and F1 in [0, 1], correlations in [-1, 1] (not x100).
"""

from __future__ import annotations

import numpy as np

from ...data.layout import IGNORE_INDEX
from .data import task_spec


def compute(task: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's metrics of `predictions` (class indices, or scores for stsb) against `labels`.
    Raises ValueError on empty input, mismatched lengths, or missing labels (-100 / NaN)."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    spec = task_spec(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim != 1 or labels.ndim != 1:
        raise ValueError(f"{spec.name}: predictions and labels must be 1-D (got shapes {predictions.shape} and "
                         f"{labels.shape}); pass class indices (argmax of the logits) or scores")
    if len(predictions) != len(labels):
        raise ValueError(f"{spec.name}: {len(predictions)} predictions for {len(labels)} labels; pass one "
                         "prediction per labelled example")
    if len(labels) == 0:
        raise ValueError(f"{spec.name}: no predictions and labels; metrics need at least one example")
    if spec.is_regression:
        predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
        if not (np.all(np.isfinite(labels)) and np.all(np.isfinite(predictions))) or np.any(labels == IGNORE_INDEX):
            raise ValueError(f"{spec.name}: labels or predictions hold NaN, inf or -100 (no label); score only "
                             "examples that have labels")
    elif np.any(labels < 0):
        raise ValueError(f"{spec.name}: labels hold negative values (-100 = no label?); score only examples "
                         "that have labels")

    out: dict[str, float] = {}
    for name in spec.metrics:
        if name == "accuracy":
            out[name] = float(accuracy_score(labels, predictions))
        elif name == "f1":
            out[name] = float(f1_score(labels, predictions, average="binary", pos_label=1))
        elif name == "matthews_correlation":
            out[name] = float(matthews_corrcoef(labels, predictions))
        elif name == "pearson":
            out[name] = float(pearsonr(predictions, labels).statistic)
        elif name == "spearman":
            out[name] = float(spearmanr(predictions, labels).statistic)
        else:  # a GlueTaskSpec naming a metric this module lacks
            raise ValueError(f"{spec.name}: unknown metric {name!r}")
    return out
