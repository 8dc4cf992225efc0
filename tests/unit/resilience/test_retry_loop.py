"""The dispatcher's retry loop: how long it waits between tries, and when it stops."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from gateway.errors import UpstreamError
from gateway.fleet.replicas import Fleet
from gateway.policy import parse_policy
from gateway.policy.resilience import RetrySpec
from gateway.resilience.dispatcher import Dispatcher, _backoff, _Retryable
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from tests.fakes import FakeUpstream, Scripted

POLICY = parse_policy("""
pools: {p: {served_model: m, replicas: [{url: "http://a.test:1"}, {url: "http://b.test:1"}]}}
models: {m: {pool: p}}
resilience: {retries: {attempts: 4, backoff_base_s: 0.1, backoff_max_s: 2.0, retry_after_cap_s: 5.0}}
timeouts: {total_s: 10}
""")


def failure(retry_after_s: float | None = None) -> _Retryable:
    return _Retryable(UpstreamError("engine said 503"), retry_after_s)


def test_retry_after_is_honoured_up_to_its_cap() -> None:
    spec = RetrySpec(retry_after_cap_s=5.0)
    assert _backoff(failure(1.5), 1, spec) == 1.5
    assert _backoff(failure(60.0), 1, spec) == 5.0


def test_backoff_is_full_jitter_under_a_doubling_ceiling() -> None:
    spec = RetrySpec(backoff_base_s=0.1, backoff_max_s=2.0)
    random.seed(7)
    for tries, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (20, 2.0)):
        waits = [_backoff(failure(), tries, spec) for _ in range(2_000)]
        assert min(waits) >= 0.0 and max(waits) <= ceiling
        assert max(waits) > 0.9 * ceiling and min(waits) < 0.1 * ceiling  # the whole range


class Clock:
    """The loop's time as the retry loop reads it: moved only by its waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class FailingTries:
    """Stands for `Dispatcher._try_replica`: every try fails, answering with `retry_after_s`."""

    def __init__(self, clock: Clock, retry_after_s: float | None) -> None:
        self.clock = clock
        self.started: list[float] = []
        self.retry_after_s = retry_after_s

    async def __call__(self, *_: object) -> None:
        self.started.append(self.clock.now)
        raise failure(self.retry_after_s)


async def send_failing(
    monkeypatch: pytest.MonkeyPatch, retry_after_s: float | None
) -> tuple[FailingTries, Clock, UpstreamError]:
    clock = Clock()
    tries = FailingTries(clock, retry_after_s)
    upstream = FakeUpstream(lambda call: Scripted())
    built = Dispatcher(
        POLICY, build_router(POLICY.routing, time.monotonic), upstream, GatewayMetrics()
    )
    monkeypatch.setattr(built, "_try_replica", tries)
    monkeypatch.setattr(asyncio, "sleep", clock.sleep)  # the loop awaits asyncio.sleep
    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock.time)
    pool = Fleet(POLICY).pools["p"]
    with pytest.raises(UpstreamError) as raised:
        await built.send(
            pool, "m", "/v1/chat/completions", b"{}", {}, RouteRequest(()),
            RequestRecord.detached(),
        )  # fmt: skip
    return tries, clock, raised.value


async def test_it_stops_after_the_attempts_and_raises_the_last_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries, clock, error = await send_failing(monkeypatch, retry_after_s=None)
    assert len(tries.started) == 4  # retries.attempts, the first included
    assert len(clock.waits) == 3
    assert all(0 <= wait <= 2.0 for wait in clock.waits)
    assert error.message == "engine said 503"


async def test_no_try_starts_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry-After 4 s with a 10 s deadline: tries at 0, 4 and 8 s; one at 12 s would
    start past the deadline, so the third failure is the answer, attempts left or not."""
    tries, clock, _ = await send_failing(monkeypatch, retry_after_s=4.0)
    assert tries.started == [0.0, 4.0, 8.0]
    assert clock.waits == [4.0, 4.0]
