"""Active health checks: poll every replica's `/health` and keep `Replica.healthy` current.

Passive signals (a refused connection during a request) mark replicas down immediately in
the pipeline; this loop is what brings them back. Once a replica is up it also reads the
engine's context window from its `/v1/models` (vLLM's `max_model_len`), once per time it
comes up (a restarted engine may run with another), for trimming budgets that follow it.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from gateway.fleet.replicas import Fleet, Replica
from gateway.periodic import Periodic
from gateway.policy.schema import HealthSpec

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(self, fleet: Fleet, session: aiohttp.ClientSession, spec: HealthSpec) -> None:
        self._fleet = fleet
        self._session = session
        self._spec = spec
        self._loop = Periodic("health-monitor", spec.interval_s, self.check_all)

    async def check_all(self, *, first: bool = False) -> None:
        """Poll every replica once. The first round, before serving, trusts no replica that
        fails it; later rounds wait for `failures_to_unhealthy` failures in a row."""
        self._fleet.reread_engine_state()
        replicas = self._fleet.all_replicas()
        if replicas:
            await asyncio.gather(*(self._check(r, first=first) for r in replicas))

    async def _check(self, replica: Replica, *, first: bool) -> None:
        was_healthy = replica.healthy
        try:
            timeout = aiohttp.ClientTimeout(total=self._spec.timeout_s)
            async with self._session.get(f"{replica.url}/health", timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
                reason = f"/health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, reason = False, f"/health failed: {type(exc).__name__}: {exc}"
        if ok:
            replica.mark_ok()
            if not was_healthy:
                log.info("replica %s (%s) is healthy again", replica.id, replica.url)
                replica.context_read = False  # it may have come back with another context
            if not replica.context_read:
                await self._read_context(replica)
        else:
            threshold = 1 if first else self._spec.failures_to_unhealthy
            replica.mark_failed(reason, threshold=threshold)

    async def _read_context(self, replica: Replica) -> None:
        """The engine's `max_model_len` for the model the replica serves (else its only
        model's). Asked once per time the replica comes up, answered or not: an engine
        that reports none (not vLLM) is not asked again on every poll."""
        replica.context_read = True
        try:
            timeout = aiohttp.ClientTimeout(total=self._spec.timeout_s)
            async with self._session.get(f"{replica.url}/v1/models", timeout=timeout) as resp:
                listing = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.debug("replica %s: /v1/models unreadable: %s", replica.id, exc)
            return
        replica.context_tokens = context_window(listing, replica.served_model)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()


def context_window(listing: object, served_model: str) -> int | None:
    """`max_model_len` from an OpenAI-style model listing, for `served_model` or, when
    the listing has one model only, for that one; None when it says none."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    models = [m for m in data if isinstance(m, dict)]
    chosen = next((m for m in models if m.get("id") == served_model), None)
    if chosen is None and len(models) == 1:
        chosen = models[0]
    value = chosen.get("max_model_len") if chosen is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
