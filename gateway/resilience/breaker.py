"""A circuit breaker per replica.

pybreaker (the design card's choice) keeps the state machine: it opens after
`consecutive_failures`, and after `open_s` lets a call through half-open, closing on its
success and re-opening on its failure. Two things it does not do are added here: it also
opens when the error rate over a sliding window passes `error_rate` (a replica failing one
request in two never fails five in a row), and half-open admits at most
`half_open_trials` requests at once (pybreaker lets every concurrent call through).

Outcomes are recorded, not wrapped around a call: a stream's outcome is only known when it
ends, long after the call that started it returned.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pybreaker

from gateway.policy.resilience import BreakerSpec

# Called on every state change: (replica id, old state, new state).
StateChange = Callable[[str, str, str], None]


class _Failed(Exception):
    """Stands for the failure being recorded, so pybreaker counts it."""


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, replica: str, on_change: StateChange) -> None:
        self._replica = replica
        self._on_change = on_change

    def state_change(
        self,
        cb: pybreaker.CircuitBreaker,
        old_state: pybreaker.CircuitBreakerState | None,
        new_state: pybreaker.CircuitBreakerState,
    ) -> None:
        old = old_state.name if old_state is not None else "closed"
        self._on_change(self._replica, old, new_state.name)


class ReplicaBreaker:
    def __init__(
        self,
        replica: str,
        spec: BreakerSpec,
        *,
        on_change: StateChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._spec = spec
        self._clock = clock
        self._storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
        listeners = [_Listener(replica, on_change)] if on_change else []
        self._breaker = pybreaker.CircuitBreaker(
            fail_max=spec.consecutive_failures,
            reset_timeout=spec.open_s,
            state_storage=self._storage,
            listeners=listeners,
            name=replica,
        )
        self._window: deque[tuple[float, bool]] = deque()
        self._trials = 0  # half-open requests in flight

    @property
    def state(self) -> str:
        return str(self._breaker.current_state)

    def admits(self) -> bool:
        """Whether a request may be sent to this replica now."""
        state = self.state
        if state == pybreaker.STATE_CLOSED:
            return True
        if state == pybreaker.STATE_OPEN and not self._open_elapsed():
            return False
        return self._trials < self._spec.half_open_trials

    def started(self) -> bool:
        """A request was sent; True when it is a half-open trial (to be ended by `finish`)."""
        if self.state == pybreaker.STATE_CLOSED:
            return False
        self._trials += 1
        return True

    def succeeded(self, trial: bool = False) -> None:
        self._end(trial)
        self._note(ok=True)
        # Opened meanwhile by another request's failure: then there is nothing to record.
        with contextlib.suppress(pybreaker.CircuitBreakerError):
            self._breaker.call(_nothing)

    def failed(self, trial: bool = False) -> None:
        self._end(trial)
        self._note(ok=False)
        with contextlib.suppress(_Failed, pybreaker.CircuitBreakerError):
            self._breaker.call(_raise_failed)
        if self.state == pybreaker.STATE_CLOSED and self._rate_exceeded():
            self._breaker.open()

    def released(self, trial: bool) -> None:
        """The request ended without an outcome (the client went away)."""
        self._end(trial)

    def _end(self, trial: bool) -> None:
        if trial and self._trials > 0:
            self._trials -= 1

    def _note(self, *, ok: bool) -> None:
        now = self._clock()
        self._window.append((now, ok))
        horizon = now - self._spec.window_s
        while self._window and self._window[0][0] < horizon:
            self._window.popleft()

    def _rate_exceeded(self) -> bool:
        calls = len(self._window)
        if calls < self._spec.min_calls:
            return False
        failures = sum(1 for _, ok in self._window if not ok)
        return failures / calls >= self._spec.error_rate

    def _open_elapsed(self) -> bool:
        opened = self._storage.opened_at
        if opened is None:
            return True
        return datetime.now(UTC) >= opened + timedelta(seconds=self._spec.open_s)


def _nothing() -> None:
    return None


def _raise_failed() -> None:
    raise _Failed
