"""Engine load as the engines report it: `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc` read from each replica's /metrics about once a second.

Every gateway replica reads the same numbers, so their load views agree without talking
to each other.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from gateway.periodic import Periodic
from gateway.replicas import Fleet
from gateway.routing.router import EngineLoad

log = logging.getLogger(__name__)

_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = "vllm:kv_cache_usage_perc"


def parse_engine_load(text: str) -> EngineLoad:
    """Sum over label sets (one per model/engine) of the two gauges in Prometheus text."""
    waiting = 0.0
    kv_usage = 0.0
    for line in text.splitlines():
        if line.startswith(_WAITING):
            waiting += _value(line)
        elif line.startswith(_KV_USAGE):
            kv_usage = max(kv_usage, _value(line))
    return EngineLoad(waiting=int(waiting), kv_usage=kv_usage)


def _value(line: str) -> float:
    try:
        return float(line.rsplit(" ", 1)[1])
    except (IndexError, ValueError):
        return 0.0


class EngineMetricsScraper:
    def __init__(self, fleet: Fleet, session: aiohttp.ClientSession, interval_s: float) -> None:
        self._fleet = fleet
        self._session = session
        self._interval_s = interval_s
        self._loads: dict[str, EngineLoad] = {}
        self._loop = Periodic("engine-metrics", interval_s, self.scrape_all)

    def get(self, url: str) -> EngineLoad | None:
        return self._loads.get(url)

    async def scrape_all(self) -> None:
        replicas = [r for r in self._fleet.all_replicas() if r.healthy]
        await asyncio.gather(*(self._scrape(r.url) for r in replicas))

    async def _scrape(self, url: str) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=self._interval_s)
            async with self._session.get(f"{url}/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    return
                self._loads[url] = parse_engine_load(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError):
            self._loads.pop(url, None)  # stale numbers are worse than none

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
