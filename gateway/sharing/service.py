"""Placements and in-flight counts shared between gateway processes through Redis.

Reads stay local: every request is routed on this process's own prefix index and load
tracker (gateway/routing/), with no Redis round trip. What is shared travels beside the
request path:

- publish: each dispatch queues its placement in memory (`placed`, no I/O); every
  `routing.sharing.flush_ms` one round writes the queue as one entry per pool to the
  pool's placement stream (XADD MAXLEN ~), and this gateway's in-flight counts per
  replica to the pool's in-flight hash, and reads the other gateways' counts back, all in
  one pipeline;
- follow: one task per pool tails the placement stream (XREAD BLOCK) from where it stood
  at start, skips this gateway's own entries and applies the others' placements to the
  router (`learn`: prefix index, recent work and session homes), for replicas this
  gateway knows.

A placement reaches the other gateways within one flush interval plus a Redis round trip.
A gateway that found no other in the in-flight hashes at its last read is alone: it
writes no placements (nobody would read them but its own follower, woken to read them
back), so a lone gateway's sharing is its in-flight field and one read per flush. A
gateway that starts later is seen at the next read; the placements of that one interval
are all it misses (its follower starts at the stream's end anyway).
It fails open: when Redis does not answer, placements wait in a bounded queue (the
oldest dropped past `max_queued`), the other gateways' in-flight counts stop counting,
`gateway_routing_sharing_up` is 0 and one log line says so; when Redis answers again the
queue is written and the followers catch up from the last entry they read (as far as the
stream's MAXLEN kept it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from redis.exceptions import RedisError

from gateway.fleet.replicas import Fleet
from gateway.periodic import Periodic
from gateway.policy.routing import SharingSpec
from gateway.sharing.inflight import PeerInflight, encode_counts
from gateway.sharing.placements import MalformedBatch, Placement, decode_batch, encode_batch
from gateway.state.keys import routing_key
from gateway.state.redis_client import RedisClient
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger(__name__)

_REDIS_DOWN = (RedisError, OSError, TimeoutError)
_CALL_TIMEOUT_S = 1.0  # a flush round or a stream read longer than this has failed
_BLOCK_MS = 500  # a follower notices a stop at least this often
_RETRY_S = 0.5  # the pause after Redis failed to answer, before asking again
_READ_COUNT = 256  # stream entries (batches) read per call


# What a flush writes of one pool: in flight per replica, and per replica per tenant.
_Counts = tuple[dict[str, int], dict[str, dict[str, int]]]

# XREAD's answer: [(stream, [(entry id, {field: value}), ...]), ...], or None on timeout.
_XreadAnswer = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


class Learner(Protocol):
    """What the follower applies placements to (gateway/routing/router.py)."""

    def learn(
        self, replica_id: str, blocks: Sequence[int], work: float, session: int | None = None
    ) -> None: ...


def new_instance_id() -> str:
    """Names this gateway process in what it publishes (a reload keeps it)."""
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class _Queued:
    pool: str
    placement: Placement
    made_at: float


class RoutingShare:
    def __init__(
        self,
        redis: RedisClient,
        spec: SharingSpec,
        fleet: Fleet,
        router: Learner,
        metrics: GatewayMetrics,
        *,
        instance: str,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance = instance
        self._own = instance.encode()  # an entry's `g` field when this gateway wrote it
        self._redis = redis
        self._spec = spec
        self._fleet = fleet
        self._router = router
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._clock = clock
        self._queue: deque[_Queued] = deque()
        self.peers = PeerInflight(instance, spec.inflight_ttl_s, clock)
        self._round = 0
        self._written: dict[str, tuple[_Counts, float]] = {}  # pool -> counts, when
        self._stale: dict[str, list[bytes]] = {}  # pool -> peers' fields to delete
        self._up: bool | None = None
        # No other gateway at the last read (not known before the first).
        self._alone = False
        self._retry_at = 0.0
        self._flusher = Periodic("routing-sharing-flush", spec.flush_ms / 1000, self.flush)
        self._followers: list[asyncio.Task[None]] = []
        self._stopping = False

    # -- the request path: no I/O ---------------------------------------------------------

    def placed(self, pool: str, placement: Placement) -> None:
        """Queue a placement this gateway made, for the next flush; alone, there is no
        one to tell."""
        if self._alone:
            self._count("alone")
            return
        if len(self._queue) >= self._spec.max_queued:
            self._queue.popleft()
            self._count("dropped")
        self._queue.append(_Queued(pool, placement, self._wall_clock()))

    def peer_inflight(self, replica_id: str) -> int:
        """Requests the other gateways had in flight at the replica when they last said."""
        return self.peers.get(replica_id)

    def peer_tenants(self, replica_id: str) -> Mapping[str, int]:
        """The same, per tenant: fair admission's view of who holds the replica."""
        return self.peers.tenants(replica_id)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        self._flusher.start()
        self._followers = [
            asyncio.create_task(self._follow(pool), name=f"routing-sharing-follow-{pool}")
            for pool in self._fleet.pools
        ]

    async def stop(self) -> None:
        """Stop following; write what is queued and this gateway's last counts once more."""
        self._stopping = True
        for task in self._followers:
            task.cancel()
        if self._followers:
            await asyncio.wait(self._followers)
        self._followers = []
        await self._flusher.stop()
        await self.flush()

    # -- publish --------------------------------------------------------------------------

    async def flush(self) -> None:
        """One round: this gateway's queued placements and in-flight counts out, the other
        gateways' counts in."""
        if self._up is False and self._clock() < self._retry_at:
            return  # Redis was down a moment ago: placements keep queueing meanwhile
        taken, self._queue = self._queue, deque()
        by_pool: dict[str, list[_Queued]] = {}
        for queued in taken:
            by_pool.setdefault(queued.pool, []).append(queued)
        self._round += 1
        now = self._clock()
        heartbeat_s = self._spec.inflight_ttl_s / 3
        ttl_ms = max(1, int(self._spec.inflight_ttl_s * 1000))
        pipe = self._redis.pipeline(transaction=False)
        for pool_name, batch in by_pool.items():
            entry = encode_batch(self.instance, batch[0].made_at, [q.placement for q in batch])
            pipe.xadd(
                routing_key(pool_name, "placements"),
                entry,  # type: ignore[arg-type]  # redis-py types fields as str keys
                maxlen=self._spec.stream_max_entries,
                approximate=True,
            )
        writes: dict[str, _Counts] = {}
        reads: list[tuple[str, int]] = []  # pool, where its HGETALL's answer will be
        for name, listed in self._fleet.pools.items():
            key = routing_key(name, "inflight")
            counts = {r.id: r.inflight for r in listed.replicas if r.inflight > 0}
            tenants = {r.id: dict(r.by_tenant) for r in listed.replicas if r.by_tenant}
            last = self._written.get(name)
            if last is None or last[0] != (counts, tenants) or now - last[1] >= heartbeat_s:
                pipe.hset(key, self.instance, encode_counts(self._round, counts, tenants))
                pipe.pexpire(key, ttl_ms)
                writes[name] = (counts, tenants)
            if stale := self._stale.pop(name, None):
                pipe.hdel(key, *stale)
            reads.append((name, len(pipe)))
            pipe.hgetall(key)
        try:
            async with asyncio.timeout(_CALL_TIMEOUT_S):
                results = await pipe.execute()
        except _REDIS_DOWN as exc:
            self._requeue(taken)
            self._written.clear()  # write again as soon as Redis answers
            self._retry_at = self._clock() + _RETRY_S
            self._down(exc)
            return
        self._set_up(True)
        self._count("published", len(taken))
        for name, written in writes.items():
            self._written[name] = (written, now)
        for name, at in reads:
            if stale := self.peers.update(name, results[at]):
                self._stale[name] = stale
        self._alone = not self.peers.any_peers()

    def _requeue(self, taken: deque[_Queued]) -> None:
        """Put back what a failed round took, ahead of what was queued meanwhile."""
        taken.extend(self._queue)
        overflow = len(taken) - self._spec.max_queued
        for _ in range(max(0, overflow)):
            taken.popleft()
        if overflow > 0:
            self._count("dropped", overflow)
        self._queue = taken

    # -- follow ---------------------------------------------------------------------------

    async def _follow(self, pool: str) -> None:
        key = routing_key(pool, "placements")
        last: bytes | None = None
        while not self._stopping:  # also ends a loop whose cancel redis-py swallowed
            try:
                async with asyncio.timeout(_CALL_TIMEOUT_S + _BLOCK_MS / 1000):
                    if last is None:  # "now": the newest entry, read once
                        newest = await self._redis.xrevrange(key, "+", "-", count=1)
                        last = cast(bytes, newest[0][0]) if newest else b"0-0"
                    answer = cast(
                        _XreadAnswer,
                        await self._redis.xread({key: last}, count=_READ_COUNT, block=_BLOCK_MS),
                    )
            except _REDIS_DOWN as exc:
                self._down(exc)
                await asyncio.sleep(_RETRY_S)
                continue
            self._set_up(True)
            for _stream, entries in answer or []:
                for entry_id, fields in entries:
                    last = entry_id
                    self._apply(pool, fields)

    def _apply(self, pool: str, fields: dict[bytes, bytes]) -> None:
        if fields.get(b"g") == self._own:
            return  # read back from the stream: not decoded (with one gateway, every entry)
        try:
            batch = decode_batch(fields)
        except MalformedBatch as exc:
            log.warning("routing sharing: a malformed entry in pool %s's stream: %s", pool, exc)
            self._count("dropped")
            return
        known = self._fleet.pools.get(pool)
        ids = {r.id for r in known.replicas} if known is not None else set()
        applied = dropped = 0
        for placement in batch.placements:
            if placement.replica in ids:
                self._router.learn(
                    placement.replica, placement.blocks, placement.work, placement.session
                )
                applied += 1
            else:  # another fleet's replica (or one this gateway has not listed yet)
                dropped += 1
        if applied:
            self._count("applied", applied)
            self._metrics.sharing_lag.observe(max(0.0, self._wall_clock() - batch.made_at))
        if dropped:
            self._count("dropped", dropped)

    # -- up or down -----------------------------------------------------------------------

    def _count(self, outcome: str, placements: int = 1) -> None:
        """`gateway_routing_placements_total{outcome}`, its child looked up once."""
        metrics = self._metrics
        metrics.child(metrics.sharing_placements, outcome).inc(placements)

    def _down(self, exc: BaseException) -> None:
        self.peers.clear()
        if self._up is not False:
            log.warning(
                "routing sharing: Redis does not answer (%r); routing on this gateway's own "
                "view until it does",
                exc,
            )
        self._up = False
        self._metrics.sharing_up.set(0)

    def _set_up(self, up: bool) -> None:
        if up and self._up is False:
            log.info("routing sharing: Redis answers again; sharing resumed")
        self._up = up
        self._metrics.sharing_up.set(1 if up else 0)
