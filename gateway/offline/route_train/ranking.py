"""How well scores rank outcomes: the Mann-Whitney AUC, for judging a router against the
outcomes it is meant to predict (shadow evaluation, learner selection)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


def auc(scores: Vector, passed: Vector) -> float | None:
    """The Mann-Whitney AUC, ties counted half; None without both outcomes."""
    positives, negatives = int(passed.sum()), int(len(passed) - passed.sum())
    if positives == 0 or negatives == 0:
        return None
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks over runs of equal scores
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    wins = float(ranks[passed == 1].sum()) - positives * (positives + 1) / 2
    return wins / (positives * negatives)
