"""A circuit breaker per replica: closed, open, half-open, on one clock.

- **Closed**: requests go through. It opens after `consecutive_failures` failures in a
  row, or when the share of failures over the last `window_s` reaches `error_rate` once
  `min_calls` outcomes are in the window (a replica failing one request in two never
  fails five in a row).
- **Open**: nothing is sent for `open_s`. Then the next request sent is a trial, and the
  breaker is half-open.
- **Half-open**: at most `half_open_trials` trials in flight at once. A success closes it
  (the count and the window start afresh); a failure opens it again for `open_s`.

Outcomes are recorded, not wrapped around a call: a stream's outcome is only known when it
ends, long after the call that started it returned. An outcome of a request sent before
the breaker opened changes nothing while it is open.

This was pybreaker, fed outcomes through `call(_nothing)` and a private exception raised
through `call`, with the window and the half-open cap added around it, and its open timer
on the wall clock where the window had the injected one. Its `call` took 1% of the
gateway's CPU per request (py-spy, c=32) to record successes that changed nothing. The
machine here is the three states SGLang's router keeps, on one injected clock, so the
tests drive the open timer without sleeping (docs/development/dependencies.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from gateway.fleet.replicas import Replica
from gateway.policy.resilience import BreakerSpec
from gateway.telemetry.metrics import GatewayMetrics

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half-open"

# Called on every state change: (replica id, old state, new state).
StateChange = Callable[[str, str, str], None]

log = logging.getLogger(__name__)


class ReplicaBreaker:
    def __init__(
        self,
        replica: str,
        spec: BreakerSpec,
        *,
        on_change: StateChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replica = replica
        self._spec = spec
        self._on_change = on_change
        self._clock = clock
        self._state: str = CLOSED
        self._failures = 0  # in a row, while closed
        self._opened_at = 0.0
        self._trials = 0  # half-open requests in flight
        self._window: deque[tuple[float, bool]] = deque()

    @property
    def state(self) -> str:
        return self._state

    def admits(self) -> bool:
        """Whether a request may be sent to this replica now."""
        state = self._state
        if state == CLOSED:
            return True
        if state == OPEN and self._clock() - self._opened_at < self._spec.open_s:
            return False
        return self._trials < self._spec.half_open_trials

    def started(self) -> bool:
        """A request was sent; True when it is a half-open trial (to be ended by one of
        `succeeded`, `failed` or `released`)."""
        if self._state == CLOSED:
            return False
        if self._state == OPEN:
            self._become(HALF_OPEN)
        self._trials += 1
        return True

    def succeeded(self, trial: bool = False) -> None:
        self._end(trial)
        if self._state == CLOSED:
            self._failures = 0
            self._note(ok=True)
        elif self._state == HALF_OPEN:
            self._close()

    def failed(self, trial: bool = False) -> None:
        self._end(trial)
        if self._state == CLOSED:
            self._failures += 1
            self._note(ok=False)
            if self._failures >= self._spec.consecutive_failures or self._rate_exceeded():
                self._open()
        elif self._state == HALF_OPEN:
            self._open()

    def released(self, trial: bool) -> None:
        """The request ended without an outcome (the client went away)."""
        self._end(trial)

    def _end(self, trial: bool) -> None:
        if trial and self._trials > 0:
            self._trials -= 1

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._become(OPEN)

    def _close(self) -> None:
        self._failures = 0
        self._window.clear()  # what opened it says nothing about the replica now
        self._become(CLOSED)

    def _become(self, state: str) -> None:
        old, self._state = self._state, state
        if self._on_change is not None and old != state:
            self._on_change(self._replica, old, state)

    def _note(self, *, ok: bool) -> None:
        now = self._clock()
        self._window.append((now, ok))
        horizon = now - self._spec.window_s
        while self._window[0][0] < horizon:
            self._window.popleft()

    def _rate_exceeded(self) -> bool:
        calls = len(self._window)
        if calls < self._spec.min_calls:
            return False
        failures = sum(1 for _, ok in self._window if not ok)
        return failures / calls >= self._spec.error_rate


class Breakers:
    """One breaker per replica, made on first use."""

    def __init__(self, spec: BreakerSpec, metrics: GatewayMetrics) -> None:
        self._spec = spec
        self._metrics = metrics
        self._by_replica: dict[str, ReplicaBreaker] = {}

    def of(self, replica: Replica) -> ReplicaBreaker:
        breaker = self._by_replica.get(replica.id)
        if breaker is None:
            breaker = ReplicaBreaker(replica.id, self._spec, on_change=self._changed)
            self._by_replica[replica.id] = breaker
        return breaker

    def _changed(self, replica: str, old: str, new: str) -> None:
        log.warning("breaker of %s: %s -> %s", replica, old, new)
        self._metrics.breaker_transitions.labels(replica, new).inc()
