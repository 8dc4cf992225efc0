"""Sending a request to an engine: admission, one retry loop, a breaker per replica.

Each try: the candidates are the pool's replicas that are healthy, whose breaker admits a
request and that have room (in flight under `max_inflight_per_replica`, the engine's own
queue under `routing.max_waiting`; gateway/resilience/admission.py); the router picks
among them, preferring one this request has not tried. A refused connection, a timeout
before the first byte, and the statuses in `retries.on_status` are retried (exponential
backoff with full jitter, an engine's Retry-After honoured up to a cap, never past the
request's deadline) until `retries.attempts`; everything happens before the first byte
reaches the client, so a retry can never duplicate output. When every replica is full the
request is shed with a 429 (or waits a bounded time for room, per policy) instead of
piling onto a drowning engine.

The replica's slot and its breaker outcome are given back exactly once, by `Dispatch.
finish`, when the answer has been read or the stream has ended: a replica that fails
mid-stream is caught by its breaker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway import headers as gateway_headers
from gateway.errors import (
    GatewayError,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.fleet.engine_metrics import EngineLoad
from gateway.fleet.replicas import Pool, Replica
from gateway.policy import Policy
from gateway.policy.resilience import RetrySpec
from gateway.resilience.admission import Admission
from gateway.resilience.breaker import Breakers, ReplicaBreaker
from gateway.resilience.fair_share import FairQueue, PeerTenants, no_peers
from gateway.routing.costs import RouteRequest
from gateway.routing.router import ReplicaChoice, Router, none_elsewhere
from gateway.telemetry import names
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import Attempt, RequestRecord
from gateway.upstream.client import ConnectFailed, Upstream, UpstreamResponse
from gateway.upstream.engine_errors import upstream_error_from_body

log = logging.getLogger(__name__)

SlotOutcome = Literal["ok", "failed", "released"]


@dataclass
class _Slot:
    """A request's place at a replica: its in-flight count (its tenant's too) and, while
    the breaker is half-open, its trial. Given back exactly once, with the outcome the
    breaker records; whoever is first in the pool's line is then woken."""

    replica: Replica
    breaker: ReplicaBreaker
    trial: bool
    tenant: str
    line: FairQueue
    pool: Pool
    done: bool = False

    def give_back(self, outcome: SlotOutcome) -> None:
        if self.done:
            return
        self.done = True
        replica = self.replica
        replica.inflight -= 1
        held = replica.by_tenant.get(self.tenant, 0) - 1
        if held > 0:
            replica.by_tenant[self.tenant] = held
        else:
            replica.by_tenant.pop(self.tenant, None)
        self.line.released(self.pool.replicas)
        if outcome == "ok":
            self.breaker.succeeded(self.trial)
        elif outcome == "failed":
            self.breaker.failed(self.trial)
        else:
            self.breaker.released(self.trial)


@dataclass
class Dispatch:
    decision: ReplicaChoice
    response: UpstreamResponse
    _slot: _Slot
    _attempt: Attempt
    deadline: float = 0.0
    attempts: int = 1
    # The engine's context window, when the request's output-token fields asked for more
    # and were brought down to it (InboundRequest.output_capped).
    output_capped_to: int | None = None

    @property
    def replica(self) -> Replica:
        return self.decision.replica

    def headers(self) -> dict[str, str]:
        out = {
            gateway_headers.REPLICA: self.replica.id,
            gateway_headers.ROUTE: self.decision.header(),
        }
        if self.attempts > 1:
            out[gateway_headers.ATTEMPTS] = str(self.attempts)
        if self.output_capped_to is not None:
            out[gateway_headers.MAX_TOKENS] = str(self.output_capped_to)
        return out

    def finish(self, outcome: SlotOutcome) -> None:
        """The answer was read (ok), broke (failed) or was abandoned by the client."""
        self._slot.give_back(outcome)
        self._attempt.end(outcome)


@dataclass(frozen=True)
class _Outbound:
    """What is sent, the same on every try."""

    pool: Pool
    model: str
    path: str
    body: bytes
    headers: dict[str, str]
    route: RouteRequest
    record: RequestRecord


class _Retryable(Exception):
    def __init__(self, error: GatewayError, retry_after_s: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after_s = retry_after_s


class Dispatcher:
    def __init__(
        self,
        policy: Policy,
        router: Router,
        upstream: Upstream,
        metrics: GatewayMetrics,
        *,
        engine_load: Callable[[str], EngineLoad | None] | None = None,
        breakers: Breakers | None = None,
        peer_inflight: Callable[[str], int] | None = None,
        peer_tenants: PeerTenants | None = None,
    ) -> None:
        """`peer_inflight`: a replica's requests in flight from the other gateway processes,
        as they last published them (gateway/sharing/); without it, this gateway's own.
        `peer_tenants`: the same per tenant, for fair admission."""
        # The policy's sections a try reads, bound once (a new policy builds a new one).
        self._timeouts = policy.timeouts
        self._retries = policy.resilience.retries
        self._busy_retry_after_s = policy.resilience.admission.retry_after_s
        self._failures_to_unhealthy = policy.health.failures_to_unhealthy
        self._router = router
        self._upstream = upstream
        self._metrics = metrics
        self._breakers = breakers or Breakers(policy.resilience.breaker, metrics)
        self._admission = Admission(
            policy,
            metrics,
            self._breakers,
            engine_load or (lambda url: None),
            peer_inflight or none_elsewhere,
            peer_tenants or no_peers,
        )

    async def send(
        self,
        pool: Pool,
        model: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        route: RouteRequest,
        record: RequestRecord,
    ) -> Dispatch:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.total_s
        outbound = _Outbound(pool, model, path, body, headers, route, record)
        tried: set[Replica] = set()
        retries = self._retries
        tries = 1
        while True:
            try:
                dispatch = await self._try_replica(outbound, tried)
            except _Retryable as failed:
                error, wait = failed.error, _backoff(failed, tries, retries)
            else:
                dispatch.deadline, dispatch.attempts = deadline, tries
                return dispatch
            # No try starts after the request's deadline, however many are left.
            if tries >= retries.attempts or loop.time() + wait >= deadline:
                break
            del error  # its traceback holds the try's frames, and they the request's body
            await asyncio.sleep(wait)
            tries += 1
            self._metrics.retries.labels(pool.name).inc()
        try:
            # Raised outside the handler: no `__context__` back to the try's exception,
            # whose traceback would keep the request's body alive until the collector
            # found the cycle (an error storm of 50,000-token prompts against a dead
            # replica grew the process by 700 MB).
            raise error
        finally:
            del error  # the raised error's traceback holds this frame

    async def _try_replica(self, outbound: _Outbound, tried: set[Replica]) -> Dispatch:
        model = outbound.model
        pool, tenant = outbound.pool, outbound.route.tenant
        line = self._admission.line(pool)
        candidates = await self._admission.admitted(pool, model, tenant, line)
        # Another replica when one exists; the same ones again only when none is left.
        exclude = frozenset(tried) if any(r not in tried for r in candidates) else frozenset()
        with outbound.record.stage("choose_replica") as stage:
            decision = self._router.choose(candidates, outbound.route, exclude)
        if decision is None:
            raise self._admission.none_healthy(model)
        stage.attributes = {names.REPLICA: decision.replica.id, names.ROUTE_REASON: decision.reason}
        replica = decision.replica
        tried.add(replica)
        breaker = self._breakers.of(replica)
        # Recorded before sending, so a burst sharing a new prefix sees where it went.
        self._router.dispatched(decision, outbound.route)
        replica.inflight += 1
        replica.by_tenant[tenant] = replica.by_tenant.get(tenant, 0) + 1
        slot = _Slot(replica, breaker, breaker.started(), tenant, line, pool)
        attempt = outbound.record.attempt(replica.id, replica.pool)
        headers = outbound.headers
        if trace_headers := outbound.record.upstream_headers(attempt):
            headers = {**headers, **trace_headers}
        timeouts = self._timeouts
        try:
            async with asyncio.timeout(timeouts.first_byte_s):
                response = await self._upstream.post(
                    replica.url + outbound.path,
                    outbound.body,
                    headers,
                    connect_timeout_s=timeouts.connect_s,
                )
                attempt.responded(response.status)
                payload = await response.read() if response.status != 200 else b""
        except ConnectFailed as exc:
            slot.give_back("failed")
            attempt.end("failed", "connect_failed")
            replica.mark_down(exc.message)
            raise _Retryable(self._admission.none_healthy(model)) from exc
        except TimeoutError as exc:
            slot.give_back("failed")
            attempt.end("failed", "first_byte_timeout")
            waited = f"{timeouts.first_byte_s:g}s"
            error = UpstreamTimeout(f"The engine did not start answering within {waited}.")
            raise _Retryable(error) from exc
        except UpstreamError as exc:
            slot.give_back("failed")
            attempt.end("failed", exc.code or "upstream_error")
            raise _Retryable(exc) from exc
        except BaseException:
            slot.give_back("released")
            attempt.end("released")
            raise
        if response.status != 200:
            attempt.end("refused", f"http_{response.status}")
            raise self._refusal(model, replica, slot, response, payload)
        return Dispatch(decision, response, slot, attempt)

    def _refusal(
        self,
        model: str,
        replica: Replica,
        slot: _Slot,
        response: UpstreamResponse,
        payload: bytes,
    ) -> Exception:
        """The error an engine's non-200 answer becomes: retried when its status is."""
        refusal: GatewayError = upstream_error_from_body(response.status, payload)
        if response.status >= 500:
            slot.give_back("failed")
            replica.mark_failed(
                f"answered HTTP {response.status}",
                threshold=self._failures_to_unhealthy,
            )
        else:
            slot.give_back("ok")  # alive: a 4xx (or a 429) is not the engine failing
        retry_after = _seconds(response.retry_after)
        if response.status == 429:  # the engine is busy, not the client wrong
            wait = retry_after or self._busy_retry_after_s
            refusal = Overloaded(
                f"The engines of model `{model}` are busy ({refusal.message}); retry shortly.",
                retry_after_s=max(1, math.ceil(wait)),
            )
        if response.status in self._retries.on_status:
            return _Retryable(refusal, retry_after)
        return refusal


def _backoff(failed: _Retryable, tries: int, retries: RetrySpec) -> float:
    """The wait before the next try: the engine's Retry-After, up to the cap; else
    exponential backoff with full jitter (uniform up to base x 2^(tries - 1), capped)."""
    if failed.retry_after_s is not None:
        return min(failed.retry_after_s, retries.retry_after_cap_s)
    ceiling = min(retries.backoff_max_s, retries.backoff_base_s * 2.0 ** (tries - 1))
    return random.uniform(0.0, ceiling)


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: the backoff decides instead
