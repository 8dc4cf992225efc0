"""Runtime pools and replicas, built once from the policy.

A pool's replicas come from the policy (`replicas:`) and from the state file `engine up`
writes (`engine_state:`), which is re-read whenever it changes so engines can come and go
under a running gateway. Replica objects keep their identity (and health, in-flight count)
across re-reads for as long as their URL stays listed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import ModelNotFound
from gateway.policy import Endpoint, Policy
from gateway.policy.schema import PoolSpec

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Replica:
    """One engine process. Mutable health and load state live here, nowhere else."""

    pool: str
    url: str
    served_model: str
    healthy: bool = True
    consecutive_failures: int = 0
    last_error: str | None = None
    inflight: int = 0
    id: str = field(init=False)

    def __post_init__(self) -> None:
        # Clients see this id (X-Gateway-Replica), never the engine's address.
        self.id = f"{self.pool}/{hashlib.sha256(self.url.encode()).hexdigest()[:8]}"

    def mark_ok(self) -> None:
        self.healthy = True
        self.consecutive_failures = 0
        self.last_error = None

    def mark_failed(self, reason: str, *, threshold: int) -> None:
        self.consecutive_failures += 1
        self.last_error = reason
        if self.consecutive_failures >= threshold and self.healthy:
            log.warning("replica %s (%s) leaves the rotation: %s", self.id, self.url, reason)
            self.healthy = False

    def mark_down(self, reason: str) -> None:
        """A refused connection is conclusive: no need to wait for more failed polls."""
        self.mark_failed(reason, threshold=1)


class Pool:
    def __init__(self, name: str, spec: PoolSpec) -> None:
        self.name = name
        self.spec = spec
        self._static = [Replica(name, r.url, spec.served_model) for r in spec.replicas]
        self._discovered: list[Replica] = []
        self._state_stamp: tuple[int, int] | None = None

    @property
    def replicas(self) -> list[Replica]:
        return self._static + self._discovered

    @property
    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy]

    def serves(self, endpoint: Endpoint) -> bool:
        return endpoint in self.spec.serves

    def refresh_from_engine_state(self) -> None:
        """Re-read the engine state file if it changed since the last look."""
        if self.spec.engine_state is None:
            return
        path = Path(self.spec.engine_state)
        try:
            stat = path.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._state_stamp:
            return
        self._state_stamp = stamp
        entries = _read_state_entries(path) if stamp else []
        known = {r.url: r for r in self._discovered}
        static_urls = {r.url for r in self._static}
        fresh: list[Replica] = []
        for entry in entries:
            if entry.get("pool") != self.name:
                continue
            url = str(entry.get("url", "")).rstrip("/")
            if not url or url in static_urls:
                continue
            served = str(entry.get("served_model") or self.spec.served_model)
            fresh.append(known.get(url) or Replica(self.name, url, served))
        if [r.url for r in fresh] != [r.url for r in self._discovered]:
            log.info("pool %s: %d replica(s) from %s", self.name, len(fresh), path)
        self._discovered = fresh


def _read_state_entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("cannot read engine state %s: %s", path, exc)
        return []
    replicas = data.get("replicas") if isinstance(data, dict) else None
    return [r for r in replicas if isinstance(r, dict)] if isinstance(replicas, list) else []


class Fleet:
    """Model aliases and the pools behind them."""

    def __init__(self, policy: Policy) -> None:
        self.pools = {name: Pool(name, spec) for name, spec in policy.pools.items()}
        # Fixed aliases; a routable alias (`tiering`) is resolved per request by the tiers.
        self.models = {
            alias: self.pools[m.pool] for alias, m in policy.models.items() if m.pool is not None
        }
        self.descriptions = {alias: m.description for alias, m in policy.models.items()}
        self.refresh()

    def refresh(self) -> None:
        for pool in self.pools.values():
            pool.refresh_from_engine_state()

    def pool_for(self, alias: str, endpoint: Endpoint) -> Pool:
        pool = self.models.get(alias)
        if pool is None or not pool.serves(endpoint):
            detail = "does not exist" if pool is None else f"does not serve /v1/{_path(endpoint)}"
            available = ", ".join(sorted(self.descriptions))
            raise ModelNotFound(
                f"The model `{alias}` {detail}. Available models: {available}.",
                param="model",
            )
        return pool

    def all_replicas(self) -> list[Replica]:
        return [r for pool in self.pools.values() for r in pool.replicas]


def _path(endpoint: Endpoint) -> str:
    return "chat/completions" if endpoint is Endpoint.chat else endpoint.value
