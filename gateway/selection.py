"""Choosing a replica: filter, then score, then pick.

Filters drop replicas that cannot take the request. Scorers are pure functions
`(candidates) -> {replica: score in [0, 1]}`; each is multiplied by its weight and the
sums compared. Ties go round-robin so equal replicas share load. State that scorers read
(in-flight counts, health) is updated elsewhere: scoring never mutates anything.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.replicas import Replica

Scorer = Callable[[Sequence[Replica]], dict[Replica, float]]


def least_inflight(candidates: Sequence[Replica]) -> dict[Replica, float]:
    """1.0 for an idle replica, falling towards 0 as its in-flight requests grow."""
    return {r: 1.0 / (1.0 + r.inflight) for r in candidates}


@dataclass(frozen=True)
class WeightedScorer:
    name: str
    weight: float
    score: Scorer


class ReplicaChooser:
    def __init__(self, scorers: Sequence[WeightedScorer]) -> None:
        self._scorers = tuple(scorers)
        self._turn = itertools.count()

    def choose(
        self, replicas: Sequence[Replica], *, exclude: frozenset[Replica] = frozenset()
    ) -> Replica | None:
        candidates = [r for r in replicas if r.healthy and r not in exclude]
        if not candidates:
            return None
        totals = dict.fromkeys(candidates, 0.0)
        for scorer in self._scorers:
            for replica, value in scorer.score(candidates).items():
                totals[replica] += scorer.weight * min(1.0, max(0.0, value))
        best = max(totals.values())
        top = [r for r in candidates if totals[r] >= best - 1e-9]
        return top[next(self._turn) % len(top)]


def default_chooser() -> ReplicaChooser:
    return ReplicaChooser([WeightedScorer("load", 1.0, least_inflight)])
