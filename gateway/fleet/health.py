"""Active health checks: poll every replica's `/health` and keep `Replica.healthy` current.

Passive signals (a refused connection during a request) mark replicas down immediately in
the pipeline; this loop is what brings them back.
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
        self._fleet.refresh()
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
        else:
            threshold = 1 if first else self._spec.failures_to_unhealthy
            replica.mark_failed(reason, threshold=threshold)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
