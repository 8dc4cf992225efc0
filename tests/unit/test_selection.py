"""Replica choice: unhealthy and excluded replicas are filtered, the least loaded wins,
and ties rotate."""

from __future__ import annotations

from gateway.replicas import Replica
from gateway.selection import ReplicaChooser, WeightedScorer, default_chooser, least_inflight


def replicas(n: int) -> list[Replica]:
    return [Replica("pool", f"http://127.0.0.1:{9000 + i}", "m") for i in range(n)]


def test_least_loaded_replica_wins() -> None:
    a, b, c = replicas(3)
    a.inflight, b.inflight, c.inflight = 3, 0, 1
    assert default_chooser().choose([a, b, c]) is b


def test_ties_rotate_over_equal_replicas() -> None:
    pool = replicas(3)
    chooser = default_chooser()
    picked = [chooser.choose(pool) for _ in range(6)]
    assert picked == pool + pool


def test_unhealthy_and_excluded_replicas_are_filtered() -> None:
    a, b, c = replicas(3)
    a.healthy = False
    assert default_chooser().choose([a, b, c], exclude=frozenset({b})) is c


def test_no_candidate_gives_none() -> None:
    (a,) = replicas(1)
    a.healthy = False
    assert default_chooser().choose([a]) is None


def test_scores_are_clamped_and_weighted() -> None:
    a, b = replicas(2)
    chooser = ReplicaChooser(
        [
            WeightedScorer("load", 1.0, least_inflight),
            WeightedScorer("wild", 2.0, lambda cands: {cands[0]: 50.0, cands[1]: -3.0}),
        ]
    )
    a.inflight = 5  # a loses on load (1/6) but wins on the clamped second scorer (1.0 * 2)
    assert chooser.choose([a, b]) is a


def test_scorers_do_not_mutate_replicas() -> None:
    pool = replicas(2)
    before = [(r.inflight, r.healthy) for r in pool]
    least_inflight(pool)
    assert [(r.inflight, r.healthy) for r in pool] == before
