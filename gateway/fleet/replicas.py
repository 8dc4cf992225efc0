"""Runtime pools and replicas, built from the policy (again on a policy reload, keeping
the replica objects whose pool and URL stay: see `Pool`).

A pool's replicas come from three sources, in any mix: the policy (`replicas:`), the state
file `engine up` writes (`engine_state:`, re-read whenever it changes), and DNS
(`discover:`, resolved by gateway/fleet/discovery.py), so engines can come and go under a running
gateway. A replica object keeps its identity (and health, in-flight count, and, keyed by
its id, breaker and routing state) for as long as its URL is listed by any source; when
it stops being listed, the fleet's departure listeners are told (the router forgets what
the replica's cache held: a replica that comes back has an empty one).

A replica may publish its KV-cache events (gateway/fleet/kv_events.py follows them): the
engine state file records where; replicas from the policy or DNS publish at fixed offsets
from their HTTP port when their pool says `kv_events: true` (`kv_event_endpoints`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.errors import ModelNotFound
from gateway.policy import Endpoint, Policy
from gateway.policy.pools import PoolSpec

log = logging.getLogger(__name__)

Departure = Callable[["Replica"], None]

# Where an engine publishes its KV-cache events and serves their replay, from its HTTP
# port: the rule engine/profiles.py renders into `--kv-events-config` (and engine/manifests.py
# into named container ports), repeated here because the gateway does not import engine/.
KV_EVENTS_PORT_OFFSET = -1000
KV_REPLAY_PORT_OFFSET = -2000


def kv_event_endpoints(url: str) -> tuple[str, str] | None:
    """(events, replay) ZMQ endpoints of the engine serving `url`; None when its URL
    names no port the offsets can apply to."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    if host is None or port is None or port + KV_REPLAY_PORT_OFFSET < 1:
        return None
    host = f"[{host}]" if ":" in host else host
    return (
        f"tcp://{host}:{port + KV_EVENTS_PORT_OFFSET}",
        f"tcp://{host}:{port + KV_REPLAY_PORT_OFFSET}",
    )


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
    # The in-flight requests by tenant (only tenants with some): fair admission's count of
    # who holds the pool's slots (gateway/resilience/fair_share.py).
    by_tenant: dict[str, int] = field(default_factory=dict)
    # Where the engine publishes its KV-cache events, and serves their replay (ZMQ
    # endpoints); None: it publishes none the gateway knows of.
    kv_events: str | None = None
    kv_replay: str | None = None
    # The engine's context window in tokens, as its `/v1/models` says (vLLM's
    # `max_model_len`); None until the health monitor has read it, or if it says none.
    context_tokens: int | None = None
    context_read: bool = False  # asked since the replica last came up
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
    def __init__(
        self,
        name: str,
        spec: PoolSpec,
        departed: Departure | None = None,
        previous: Pool | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self._departed = departed
        # A policy reload builds a new pool (gateway/runtime.py): a replica the previous one
        # listed keeps its object, so its health and in-flight count carry over and the
        # requests running on it give their slot back to the object new requests count.
        self._previous = {r.url: r for r in previous.replicas} if previous else {}
        self._all: list[Replica] = []
        self._static = [self._replica(r.url, "", self._conventional(r.url)) for r in spec.replicas]
        self._from_state: list[Replica] = []
        self._from_dns: list[Replica] = []
        if previous is not None and previous.spec.discover == spec.discover:
            # The last DNS answer, until this pool's own first lookup (which may fail).
            self._from_dns = [
                self._replica(r.url, "", self._conventional(r.url)) for r in previous.discovered
            ]
        self._state_stamp: tuple[int, int] | None = None
        self._rebuild()
        if previous is not None:
            self.refresh_from_engine_state()  # now, while the previous objects can be kept
            self._previous = {}

    @property
    def replicas(self) -> list[Replica]:
        """Every listed replica, each URL once (read on every request: built on change
        only; callers must not mutate it)."""
        return self._all

    @property
    def healthy_replicas(self) -> list[Replica]:
        return [r for r in self._all if r.healthy]

    @property
    def discovered(self) -> list[Replica]:
        """The replicas DNS discovery listed (some may also be listed by another source)."""
        return list(self._from_dns)

    def serves(self, endpoint: Endpoint) -> bool:
        return endpoint in self.spec.serves

    def context_tokens(self) -> int | None:
        """The smallest context window its replicas report (a request may go to any);
        None while none has reported one."""
        known = [r.context_tokens for r in self._all if r.context_tokens]
        return min(known) if known else None

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
        fresh: list[Replica] = []
        for entry in entries:
            if entry.get("pool") != self.name:
                continue
            url = str(entry.get("url", "")).rstrip("/")
            if url:
                served = str(entry.get("served_model") or "")
                fresh.append(self._replica(url, served, _recorded_kv_events(entry)))
        if [r.url for r in fresh] != [r.url for r in self._from_state]:
            log.info("pool %s: %d replica(s) from %s", self.name, len(fresh), path)
        self._from_state = fresh
        self._rebuild()

    def adopt_discovered(self, urls: Sequence[str]) -> None:
        """The pool's DNS replicas become exactly these URLs (gateway/fleet/discovery.py)."""
        fresh = [self._replica(url, "", self._conventional(url)) for url in dict.fromkeys(urls)]
        if [r.url for r in fresh] != [r.url for r in self._from_dns]:
            log.info("pool %s: %d replica(s) from DNS", self.name, len(fresh))
        self._from_dns = fresh
        self._rebuild()

    def _conventional(self, url: str) -> tuple[str, str | None] | None:
        return kv_event_endpoints(url) if self.spec.kv_events else None

    def _replica(
        self, url: str, served_model: str, kv_events: tuple[str, str | None] | None = None
    ) -> Replica:
        """The replica already listed under this URL, by any source, or a new one."""
        replica = self._listed(url, served_model)
        if kv_events is not None and replica.kv_events is None:
            replica.kv_events, replica.kv_replay = kv_events
        return replica

    def _listed(self, url: str, served_model: str) -> Replica:
        for replica in self._all:
            if replica.url == url:
                return replica
        served_model = served_model or self.spec.served_model
        kept = self._previous.get(url)
        if kept is not None and kept.served_model == served_model:
            return kept
        return Replica(self.name, url, served_model)

    def _rebuild(self) -> None:
        before = self._all
        merged: dict[str, Replica] = {}
        for replica in (*self._static, *self._from_state, *self._from_dns):
            merged.setdefault(replica.url, replica)
        self._all = list(merged.values())
        if self._departed is not None:
            for replica in before:
                if replica.url not in merged:
                    self._departed(replica)


def _read_state_entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("cannot read engine state %s: %s", path, exc)
        return []
    replicas = data.get("replicas") if isinstance(data, dict) else None
    return [r for r in replicas if isinstance(r, dict)] if isinstance(replicas, list) else []


def _recorded_kv_events(entry: dict[str, Any]) -> tuple[str, str | None] | None:
    """The events and replay endpoints an engine state entry records (engine/state.py)."""
    events = entry.get("kv_events")
    if not isinstance(events, str) or not events:
        return None
    replay = entry.get("kv_replay")
    return events, replay if isinstance(replay, str) and replay else None


class Fleet:
    """Model aliases and the pools behind them."""

    def __init__(self, policy: Policy, previous: Fleet | None = None) -> None:
        """`previous`: the fleet of the policy this one replaces (see `Pool`)."""
        self._departure_listeners: list[Departure] = []
        before: dict[str, Pool] = previous.pools if previous else {}
        self.pools: dict[str, Pool] = {
            name: Pool(name, spec, self._departed, before.get(name))
            for name, spec in policy.pools.items()
        }
        # Fixed aliases; a routable alias (`tiering`) is resolved per request by the tiers.
        self.models = {
            alias: self.pools[m.pool] for alias, m in policy.models.items() if m.pool is not None
        }
        self.descriptions = {alias: m.description for alias, m in policy.models.items()}
        # Every pool a request for the alias may be served by: its own, or its route's tiers.
        self._reachable = {
            alias: [self.pools[m.pool]]
            if m.pool is not None
            else [self.pools[pool] for pool in policy.tiering[str(m.tiering)].tiers.values()]
            for alias, m in policy.models.items()
        }
        self.reread_engine_state()

    def context_tokens(self, alias: str) -> int | None:
        """The smallest context window the engines serving `alias` report (any tier of its
        route); None while none has, or for an alias that does not exist."""
        known = [t for pool in self._reachable.get(alias, ()) if (t := pool.context_tokens())]
        return min(known) if known else None

    def reread_engine_state(self) -> None:
        """Every pool's replicas from `engine up`'s state file, when it changed."""
        for pool in self.pools.values():
            pool.refresh_from_engine_state()

    def on_departure(self, listener: Departure) -> None:
        """Call `listener` with every replica that stops being listed by its pool."""
        self._departure_listeners.append(listener)

    def _departed(self, replica: Replica) -> None:
        log.info("replica %s (%s) left pool %s", replica.id, replica.url, replica.pool)
        for listener in self._departure_listeners:
            listener(replica)

    def pool_for(self, alias: str, endpoint: Endpoint) -> Pool:
        pool = self.models.get(alias)
        if pool is None or not pool.serves(endpoint):
            detail = "does not exist" if pool is None else f"does not serve {endpoint.path}"
            raise UnservedModel(f"The model `{alias}` {detail}.", sorted(self.descriptions))
        return pool

    def all_replicas(self) -> list[Replica]:
        return [r for pool in self.pools.values() for r in pool.replicas]


class UnservedModel(ModelNotFound):
    """A model that cannot serve the request. `problem` says why without naming other
    models, so a caller that may name only some (a tenant's) lists its own."""

    def __init__(self, problem: str, available: list[str] | None = None) -> None:
        listed = f" Available models: {', '.join(available)}." if available is not None else ""
        super().__init__(problem + listed, param="model")
        self.problem = problem
