"""What the engines report about themselves, read from each replica's /metrics about once
a second: load (queue, running, KV-cache usage) for routing and admission, and the prefix
cache and speculative decoding counters the gateway re-exports and charts.

Every gateway replica reads the same numbers, so their load views agree without talking
to each other.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from gateway.fleet.replicas import Fleet
from gateway.periodic import Periodic

log = logging.getLogger(__name__)


# vLLM's metric -> the EngineStats field it feeds. Gauges are summed over label sets (one
# per model/engine) except KV-cache usage, of which the fullest counts.
@dataclass(frozen=True)
class EngineLoad:
    """What routing reads of an engine's own load: requests waiting, KV cache in use."""

    waiting: int = 0
    kv_usage: float = 0.0


class EngineLoads(Protocol):
    def get(self, url: str) -> EngineLoad | None: ...


_FIELDS = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:spec_decode_num_drafts_total": "spec_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
}


@dataclass(frozen=True)
class EngineStats:
    """One scrape of an engine's /metrics: load, prefix cache, speculative decoding."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    spec_drafts: float = 0.0
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0

    @property
    def load(self) -> EngineLoad:
        return EngineLoad(waiting=int(self.waiting), kv_usage=self.kv_usage)

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        """Prompt tokens served from the prefix cache, since the engine started."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Draft tokens the target model accepted, of those proposed."""
        if not self.spec_draft_tokens:
            return None
        return self.spec_accepted_tokens / self.spec_draft_tokens

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens produced per verification step (vLLM's definition: 1 + accepted per
        draft): what speculative decoding multiplies decode speed by, at best."""
        return 1 + self.spec_accepted_tokens / self.spec_drafts if self.spec_drafts else None


def parse_engine_stats(text: str) -> EngineStats:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        field_ = _FIELDS.get(line.split("{", 1)[0].split(" ", 1)[0])
        if field_ is None:
            continue
        value = _value(line)
        if field_ == "kv_usage":
            values[field_] = max(values.get(field_, 0.0), value)
        else:
            values[field_] = values.get(field_, 0.0) + value
    return EngineStats(**values)


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
        self._stats: dict[str, EngineStats] = {}
        self._loop = Periodic("engine-metrics", interval_s, self.scrape_all)

    def get(self, url: str) -> EngineLoad | None:
        stats = self._stats.get(url)
        return stats.load if stats is not None else None

    def stats(self, url: str) -> EngineStats | None:
        return self._stats.get(url)

    async def scrape_all(self) -> None:
        replicas = [r for r in self._fleet.all_replicas() if r.healthy]
        await asyncio.gather(*(self._scrape(r.url) for r in replicas))

    async def _scrape(self, url: str) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=self._interval_s)
            async with self._session.get(f"{url}/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    return
                self._stats[url] = parse_engine_stats(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError):
            self._stats.pop(url, None)  # stale numbers are worse than none

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
