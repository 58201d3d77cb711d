"""GLUE's official metrics of one task, and the GLUE average that papers with Crammed BERT report.

:func:`task_metrics` gives each task's official metrics (Wang et al., 2019) as fractions: CoLA
Matthews' correlation; SST-2, QNLI, RTE, WNLI and MNLI accuracy (MNLI's matched and mismatched dev
sets each get their own call: the caller keeps the mismatched one as ``accuracy_mm``); MRPC and QQP
accuracy and the F1 of the positive class (1: equivalent, duplicate); STS-B Pearson's and Spearman's
correlations of the predicted scores with the gold ones.

A constant prediction has no correlation with anything: scikit-learn's Matthews coefficient is 0
for it already, and the correlations are 0 here too, where SciPy gives NaN (with a warning). An
untrained model that predicts one class or one score thus scores 0, not NaN, and averages stay numbers.

:func:`glue_average` is the average of the Cramming code (Geiping & Goldstein, 2022): the target
metric of each task in its ``eval/GLUE_sane.yaml``, averaged arithmetically over the nine terms of
:data:`AVERAGE_TERMS` in its ``eval.py``: CoLA Matthews, MNLI matched accuracy, MNLI mismatched
accuracy, MRPC F1, QNLI accuracy, QQP F1, RTE accuracy, SST-2 accuracy and STS-B Pearson. WNLI is
left out, as in Cramming and in BERT's paper. The GLUE leaderboard's own score differs: it first
averages each task's metrics (MRPC's F1 with its accuracy, STS-B's Pearson with its Spearman, MNLI's
two accuracies …), then averages the tasks, WNLI included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .formats import GlueSpec

#: The GLUE average as the Cramming code computes it (eval/GLUE_sane.yaml's target metrics, averaged
#: arithmetically in eval.py), the average the conditioned-attention papers report with Crammed BERT:
AVERAGE_TERMS: tuple[tuple[str, str], ...] = (
    ("cola", "matthews"),
    ("mnli", "accuracy"),
    ("mnli", "accuracy_mm"),
    ("mrpc", "f1"),
    ("qnli", "accuracy"),
    ("qqp", "f1"),
    ("rte", "accuracy"),
    ("sst2", "accuracy"),
    ("stsb", "pearson"),
)


def task_metrics(spec: GlueSpec, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """``spec``'s official metrics (``spec.metrics``) of ``predictions`` (class indices, or STS-B's
    scores) against ``labels``, as fractions keyed by metric name."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1 or len(labels) == 0:
        raise ValueError(
            f"predictions {predictions.shape} and labels {labels.shape}: one equal, non-empty length"
        )
    return {name: float(METRICS[name](predictions, labels)) for name in spec.metrics}


def _matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import matthews_corrcoef

    return matthews_corrcoef(labels, predictions)


def _accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import accuracy_score

    return accuracy_score(labels, predictions)


def _f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """F1 of class 1; 0 when neither the predictions nor the labels hold it (sklearn would warn)."""
    from sklearn.metrics import f1_score

    return f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0)


def _correlation(kind: str):
    """Pearson's or Spearman's correlation, 0 where either side is constant (SciPy: NaN)."""

    def correlation(predictions: np.ndarray, labels: np.ndarray) -> float:
        from scipy.stats import pearsonr, spearmanr

        predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
        if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
            return 0.0
        return (pearsonr if kind == "pearson" else spearmanr)(predictions, labels)[0]

    return correlation


METRICS = {
    "matthews": _matthews,
    "accuracy": _accuracy,
    "f1": _f1,
    "pearson": _correlation("pearson"),
    "spearman": _correlation("spearman"),
}


def glue_average(results: Mapping[str, Mapping[str, float]]) -> tuple[float | None, list[str]]:
    """The mean of the :data:`AVERAGE_TERMS` present in ``results[task][metric]`` and the terms
    missing, as ``"task/metric"`` (the mean is None when none is present). A NaN counts as present
    (it makes the mean NaN: a broken run should not vanish from the average unseen)."""
    present, missing = [], []
    for task, metric in AVERAGE_TERMS:
        value = results.get(task, {}).get(metric)
        if value is None:
            missing.append(f"{task}/{metric}")
        else:
            present.append(float(value))
    return (math.fsum(present) / len(present) if present else None), missing
