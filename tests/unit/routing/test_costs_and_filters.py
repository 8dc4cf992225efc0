"""Costs and filters are pure functions of the facts gathered before scoring."""

from __future__ import annotations

from gateway.fleet.replicas import Replica
from gateway.routing.costs import (
    Candidate,
    RouteRequest,
    bounded_load,
    load_cost,
    not_saturated,
    prefix_cost,
    queue_cost,
    session_cost,
)

REQUEST = RouteRequest(blocks=(1, 2, 3, 4), session="s1")


def candidate(i: int = 0, **facts: object) -> Candidate:
    defaults: dict[str, object] = {
        "replica": Replica("p", f"http://127.0.0.1:{9000 + i}", "m"),
        "cached_blocks": 0,
        "recent_work": 0.0,
        "excess_work": 0.0,
        "queued": 0,
        "kv_usage": 0.0,
        "session_home": False,
    }
    return Candidate(**{**defaults, **facts})  # type: ignore[arg-type]


def test_prefix_cost_counts_blocks_to_prefill_plus_one() -> None:
    assert prefix_cost(REQUEST, [candidate(cached_blocks=0), candidate(cached_blocks=3)]) == [5, 2]
    assert prefix_cost(RouteRequest(()), [candidate()]) == [1]


def test_load_and_queue_costs_read_the_facts() -> None:
    assert load_cost(REQUEST, [candidate(recent_work=40.0, excess_work=12.5)]) == [12.5]
    assert queue_cost(REQUEST, [candidate(queued=3), candidate(queued=0)]) == [3, 0]


def test_session_cost_only_for_leaving_the_sessions_replica() -> None:
    home, away = candidate(session_home=True), candidate(session_home=False)
    assert session_cost(REQUEST, [home, away]) == [0, 1]
    assert session_cost(RouteRequest((1,)), [home, away]) == [0, 0]


def test_saturated_replicas_are_dropped_unless_all_are() -> None:
    keep = not_saturated(max_waiting=4, max_kv_usage=0.9)
    busy, full, fine = candidate(0, queued=4), candidate(1, kv_usage=0.95), candidate(2, queued=3)
    assert keep(REQUEST, [busy, full, fine]) == [fine]
    assert keep(REQUEST, [busy, full]) == [busy, full]


def test_bounded_load_drops_replicas_far_above_the_mean() -> None:
    keep = bounded_load(max_factor=2.0, slack_blocks=10)
    hot, warm, cold = (
        candidate(0, recent_work=400),
        candidate(1, recent_work=50),
        candidate(2, recent_work=0),
    )
    # mean 150, limit 2*150+10 = 310: the hot replica is out whatever its cache holds
    assert keep(REQUEST, [hot, warm, cold]) == [warm, cold]


def test_bounded_load_leaves_a_quiet_system_alone() -> None:
    keep = bounded_load(max_factor=2.0, slack_blocks=64)
    few = [candidate(0, recent_work=30), candidate(1, recent_work=0)]
    assert keep(REQUEST, few) == few
    assert keep(REQUEST, few[:1]) == few[:1]
