"""The per-replica breaker: consecutive failures, error rate over a window, open for a
while, bounded half-open trials, and what it reports."""

from __future__ import annotations

from gateway.policy.resilience import BreakerSpec
from gateway.resilience.breaker import ReplicaBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    changes: list[tuple[str, str, str]] = []
    breaker = ReplicaBreaker(
        "r1", BreakerSpec(consecutive_failures=3), on_change=lambda *c: changes.append(c)
    )
    breaker.failed()
    breaker.failed()
    breaker.succeeded()
    breaker.failed()
    breaker.failed()
    assert breaker.state == "closed"
    assert breaker.admits()
    breaker.failed()
    assert breaker.state == "open"
    assert not breaker.admits()
    assert changes == [("r1", "closed", "open")]


def test_half_open_admits_a_bounded_trial_then_closes_on_success() -> None:
    clock = Clock()
    spec = BreakerSpec(consecutive_failures=1, open_s=15, half_open_trials=1)
    changes: list[str] = []
    breaker = ReplicaBreaker(
        "r", spec, on_change=lambda _r, _o, new: changes.append(new), clock=clock
    )
    breaker.failed()
    assert not breaker.admits()
    clock.now = 14.9
    assert not breaker.admits()
    clock.now = 15.0
    assert breaker.admits()
    trial = breaker.started()
    assert trial
    assert not breaker.admits()  # one trial at a time
    breaker.succeeded(trial)
    assert breaker.state == "closed"
    assert breaker.admits()
    assert not breaker.started()
    assert changes == ["open", "half-open", "closed"]


def test_a_failed_trial_opens_it_again_for_another_open_period() -> None:
    clock = Clock()
    breaker = ReplicaBreaker("r", BreakerSpec(consecutive_failures=1, open_s=15), clock=clock)
    breaker.failed()
    clock.now = 20.0
    trial = breaker.started()
    assert breaker.state == "half-open"
    breaker.failed(trial)
    assert breaker.state == "open"
    assert not breaker.admits()
    clock.now = 34.9  # open from 20, not from 0
    assert not breaker.admits()
    clock.now = 35.0
    assert breaker.admits()


def test_an_abandoned_trial_frees_its_slot() -> None:
    clock = Clock()
    breaker = ReplicaBreaker("r", BreakerSpec(consecutive_failures=1, open_s=15), clock=clock)
    breaker.failed()
    clock.now = 15.0
    trial = breaker.started()
    assert not breaker.admits()
    breaker.released(trial)
    assert breaker.admits()


def test_the_error_rate_over_the_window_opens_it() -> None:
    clock = Clock()
    spec = BreakerSpec(consecutive_failures=100, error_rate=0.5, window_s=60, min_calls=10)
    breaker = ReplicaBreaker("r", spec, clock=clock)
    for _ in range(4):  # failing one call in two never fails twice in a row
        breaker.succeeded()
        breaker.failed()
    assert breaker.state == "closed"  # 8 calls: too few to judge
    breaker.succeeded()
    breaker.failed()
    assert breaker.state == "open"


def test_old_calls_leave_the_window() -> None:
    clock = Clock()
    spec = BreakerSpec(consecutive_failures=100, error_rate=0.5, window_s=60, min_calls=4)
    breaker = ReplicaBreaker("r", spec, clock=clock)
    breaker.failed()
    breaker.failed()
    breaker.succeeded()
    clock.now = 61.0  # the two failures are now out of the window
    breaker.succeeded()
    breaker.succeeded()
    breaker.failed()
    assert breaker.state == "closed"


def test_closing_starts_a_fresh_window() -> None:
    """The failures that opened it say nothing about the replica once a trial succeeded:
    one failure after closing does not open it again."""
    clock = Clock()
    spec = BreakerSpec(consecutive_failures=100, error_rate=0.5, window_s=60, min_calls=4, open_s=1)
    breaker = ReplicaBreaker("r", spec, clock=clock)
    for _ in range(4):
        breaker.failed()
    assert breaker.state == "open"
    clock.now = 1.0
    breaker.succeeded(breaker.started())
    assert breaker.state == "closed"
    for _ in range(3):
        breaker.succeeded()
    breaker.failed()
    assert breaker.state == "closed"  # 1 of 4 in the new window


def test_outcomes_of_requests_sent_before_it_opened_change_nothing_while_open() -> None:
    clock = Clock()
    changes: list[str] = []
    breaker = ReplicaBreaker(
        "r",
        BreakerSpec(consecutive_failures=1, open_s=15),
        on_change=lambda _r, _o, new: changes.append(new),
        clock=clock,
    )
    breaker.failed()
    breaker.succeeded()  # sent before, answered after: the replica stays open
    breaker.failed()
    assert breaker.state == "open"
    assert not breaker.admits()
    assert changes == ["open"]
