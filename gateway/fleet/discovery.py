"""Engine replicas found in DNS: a pool's `discover: {dns: ..., port: ...}`.

In Kubernetes, each engine pool is a StatefulSet behind a headless Service
(`clusterIP: None`), whose DNS name answers one A (or AAAA) record per ready pod. Every
`interval_s` the name is resolved again and the pool's discovered replicas become exactly
the addresses answered, as `http://<ip>:<port>` (IPv6 bracketed). A replica that stays in
the answer keeps its object, so health, in-flight count, breaker and routing state
survive every refresh; one that leaves is forgotten by the router (gateway/fleet/replicas.py).

Why pods, not the Service's ClusterIP: cache-affinity routing must send a request to the
engine that holds its prefix in its KV cache. A ClusterIP is one address that kube-proxy
balances over the pods behind the gateway's back, per connection: the gateway would pick
"the replica holding this prefix" and the kernel would hand the request to any pod,
destroying prefix-cache hits, session affinity, per-replica breakers and health, and the
load the gateway reads from each engine's /metrics. So the gateway needs every pod's own
address, and the headless Service publishes exactly the ready ones.

What each kind of answer does, and why:
- Addresses: adopted at once, also when fewer than before. Pods leave the answer when they
  stop being ready or start terminating (a rolling update, a scale-down): that is the
  signal to stop sending them work.
- A failed lookup (timeout, server failure, no resolver): the last known set is kept,
  counted in `gateway_discovery_failures{reason="error"}`. A DNS outage says nothing
  about the engines, and the health checks still take dead ones out of the rotation.
- No such name, or no addresses (NXDOMAIN/NODATA): CoreDNS answers that for a headless
  Service with no ready pod, so it can be true; but one such answer can also be a DNS
  server restarting before it has synced. The set is emptied only after
  `empty_after_rounds` such answers in a row (3 by default: 15 s at the default
  interval), counted with `reason="empty"` each time. Keeping stale addresses forever
  would be wrong too: a pod IP that has gone can be given to another workload, which
  would then receive prompts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Sequence
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.fleet.replicas import Fleet, Pool
from gateway.periodic import Periodic
from gateway.policy.pools import DnsDiscoverySpec

log = logging.getLogger(__name__)


class NameNotFound(Exception):
    """The DNS answered: this name has no address (NXDOMAIN, or NODATA)."""


class LookupFailed(Exception):
    """No answer could be had (timeout, server failure, no resolver reachable)."""


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[str]:
        """The host's addresses (IPv4 and IPv6, as text); raises NameNotFound or
        LookupFailed."""
        ...


# getaddrinfo's "the name has no address" answers; every other error is a failed lookup.
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class SystemResolver:
    """The operating system's resolver (resolv.conf, /etc/hosts), through the event loop's
    getaddrinfo, which runs in a worker thread."""

    async def resolve(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except socket.gaierror as exc:
            if exc.errno in _NO_ADDRESS:
                raise NameNotFound(f"{host}: {exc.strerror}") from exc
            raise LookupFailed(f"{host}: {exc.strerror}") from exc
        except OSError as exc:
            raise LookupFailed(f"{host}: {exc}") from exc
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


def replica_urls(
    addresses: Sequence[str], *, scheme: str, port: int, family: Literal["auto", "ipv4", "ipv6"]
) -> list[str]:
    """Base URLs for the addresses of the wanted family, sorted (a stable order for logs)."""
    parsed = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            continue  # link-local with a zone (fe80::1%eth0): never a pod's address
        parsed.append(address)
    v4 = [a for a in parsed if a.version == 4]
    v6 = [a for a in parsed if a.version == 6]
    if family == "ipv4":
        chosen: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = list(v4)
    elif family == "ipv6":
        chosen = list(v6)
    else:  # one family: a dual-stack pod answers A and AAAA, and must be one replica
        chosen = list(v4) if v4 else list(v6)
    hosts = sorted({f"[{a}]" if a.version == 6 else str(a) for a in chosen})
    return [f"{scheme}://{host}:{port}" for host in hosts]


class DiscoveryMetrics:
    """Built once per app: the counters outlive any one set of watchers."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "gateway_discovery_failures",
            "DNS discovery rounds that changed nothing, by pool and reason: error (the "
            "lookup failed; the last known replicas are kept) or empty (no such name or no "
            "address; the replicas are dropped after empty_after_rounds in a row).",
            ["pool", "reason"],
            registry=registry,
        )
        self.replicas = Gauge(
            "gateway_discovered_replicas",
            "Replicas a pool currently has from DNS discovery.",
            ["pool"],
            registry=registry,
        )


class DnsWatcher:
    """Keeps one pool's discovered replicas equal to what its DNS name answers."""

    def __init__(
        self, pool: Pool, spec: DnsDiscoverySpec, resolver: Resolver, metrics: DiscoveryMetrics
    ) -> None:
        self._pool = pool
        self._spec = spec
        self._resolver = resolver
        self._metrics = metrics
        self._empty_rounds = 0
        self._failing = False  # in a streak of failed rounds: logged once, not every round
        self._loop = Periodic(f"discovery-{pool.name}", spec.interval_s, self.refresh)

    async def refresh(self) -> None:
        """One round: resolve the name and adopt the answer (see the module docstring)."""
        spec = self._spec
        try:
            addresses = await asyncio.wait_for(
                self._resolver.resolve(spec.dns, spec.port), spec.timeout_s
            )
        except NameNotFound as exc:
            self._no_address(str(exc))
            return
        except (LookupFailed, TimeoutError) as exc:
            self._failed("error", f"lookup failed, keeping the last known replicas: {exc!r}")
            return
        urls = replica_urls(addresses, scheme=spec.scheme, port=spec.port, family=spec.family)
        if not urls:
            self._no_address(f"{spec.dns}: no {spec.family} address in {addresses}")
            return
        if self._failing:
            log.info("pool %s: %s resolves again", self._pool.name, spec.dns)
        self._failing = False
        self._empty_rounds = 0
        self._adopt(urls)

    def _no_address(self, reason: str) -> None:
        self._empty_rounds += 1
        rounds, limit = self._empty_rounds, self._spec.empty_after_rounds
        self._failed("empty", f"no address ({rounds} of {limit} rounds): {reason}")
        if rounds >= limit and self._pool.discovered:
            log.warning("pool %s: %s has no address: its replicas leave", self._pool.name, reason)
            self._adopt([])

    def _failed(self, reason: str, message: str) -> None:
        self._metrics.failures.labels(self._pool.name, reason).inc()
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "pool %s: discovery of %s: %s", self._pool.name, self._spec.dns, message)
        self._failing = True

    def _adopt(self, urls: list[str]) -> None:
        self._pool.adopt_discovered(urls)
        self._metrics.replicas.labels(self._pool.name).set(len(urls))

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()


class Discovery:
    """The DNS watchers of every pool that has `discover:`; none when no pool has."""

    def __init__(self, fleet: Fleet, resolver: Resolver, metrics: DiscoveryMetrics) -> None:
        self._watchers = [
            DnsWatcher(pool, pool.spec.discover, resolver, metrics)
            for pool in fleet.pools.values()
            if pool.spec.discover is not None
        ]

    async def refresh_all(self) -> None:
        """One round for every pool, together: before serving, to know the replicas."""
        await asyncio.gather(*(w.refresh() for w in self._watchers))

    def start(self) -> None:
        for watcher in self._watchers:
            watcher.start()

    async def stop(self) -> None:
        for watcher in self._watchers:
            await watcher.stop()
