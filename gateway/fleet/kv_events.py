"""Following the engines' KV-cache events: what each replica's prefix cache really holds.

Each engine publishes its events on a PUB socket (the framing and the two encodings:
gateway/fleet/kv_event_wire.py) and keeps its recent messages for replay on a ROUTER
socket: a DEALER sends `["", first sequence number wanted]` and gets back `["", topic,
seq, payload]` for each one still buffered, then an end marker whose sequence number is
-1 (vllm/distributed/kv_events.py). An event type this gateway does not know is counted
and skipped; a frame that does not decode is counted as malformed and skipped; neither
ever stops the task that follows the replica.

`KvEventSubscriber` runs one task per replica that publishes (the fleet's replicas come
and go: it looks every half second) and keeps an `EngineView` of each: the blocks the
engine holds (stored less removed, zero after a clear), its last event. It tells the
router to forget a replica's cache when the engine says the cache is gone:
- `AllBlocksCleared` (a prefix-cache reset);
- a sequence number that went back: a restarted engine counts from 0 again;
- a reconnection after the connection dropped: the engine that answers may be a new one.
A sequence gap (the engine's send queue overflowed, or the slow start of a ZMQ
subscription) is asked of the replay socket; so is the history before the first message
this gateway saw, so that the block count starts right.

Every event also goes to `EngineChains` (gateway/fleet/engine_chains.py), which matches
the engine's blocks to conversations through their chains, without tokenizing: what
routing caps its belief with after an eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.fleet.engine_chains import EngineChains
from gateway.fleet.kv_event_wire import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    EngineView,
    EventBatch,
    KvEvent,
    MalformedFrame,
    classify,
    decode_message,
)
from gateway.fleet.replicas import Replica
from gateway.periodic import Periodic
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 0.5  # how soon a replica that joins the fleet is followed
REPLAY_WAIT_MS = 1000  # per answer of the replay socket; longer and the replay has failed
RETRY_S = 1.0  # a follower whose socket failed starts again after this long
# ZMQ dials a lost engine again this often (at first, then backing off to the max): a
# restarted engine is noticed, and forgotten, within a second of it listening again.
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 500
_END_OF_REPLAY = -1


# The router's `forget`: a replica id, and since when (monotonic) placements are kept.
Forget = Callable[[str, float | None], None]
Replicas = Callable[[], Iterable[Replica]]  # the fleet's `all_replicas`


class KvEventSubscriber:
    """Follows every replica `replicas()` lists that publishes KV-cache events; tells
    `forget` (the router's) when a replica's cache is gone. `start()`/`stop()` with its
    runtime."""

    def __init__(
        self,
        replicas: Replicas,
        forget: Forget,
        metrics: GatewayMetrics,
        chains: EngineChains | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas = replicas
        # Fed every event, so conversations' cached prefixes follow evictions.
        self._chains = chains if chains is not None else EngineChains()
        self._forget = forget
        self._metrics = metrics
        self._clock = clock
        self._context: zmq.asyncio.Context | None = None  # made with the first follower
        self._followers: dict[str, tuple[Replica, asyncio.Task[None]]] = {}
        self._leaving: set[asyncio.Task[None]] = set()  # cancelled, closing their sockets
        self.views: dict[str, EngineView] = {}
        self._loop = Periodic("kv-events", SYNC_INTERVAL_S, self._sync)

    async def start(self) -> None:
        await self._sync()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        for _replica, task in self._followers.values():
            task.cancel()
            self._leaving.add(task)
        self._followers.clear()
        if self._leaving:
            await asyncio.wait(self._leaving)
            self._leaving.clear()
        if self._context is not None:
            self._context.destroy(linger=0)  # its sockets are closed by now: this ends its thread
            self._context = None

    def sync(self) -> None:
        """Follow the replicas the fleet lists now, and only those."""
        wanted = {r.id: r for r in self._replicas() if r.kv_events}
        for replica_id, (replica, _task) in list(self._followers.items()):
            fresh = wanted.get(replica_id)
            if fresh is None or (fresh.kv_events, fresh.kv_replay) != (
                replica.kv_events,
                replica.kv_replay,
            ):
                task = self._followers.pop(replica_id)[1]
                task.cancel()
                self._leaving.add(task)
                task.add_done_callback(self._leaving.discard)
                self._forget_metrics(replica_id)
                self.views.pop(replica_id, None)
                self._chains.forget(replica_id)
        for replica_id, replica in wanted.items():
            if replica_id not in self._followers:
                self.views[replica_id] = EngineView(replica_id, since=self._clock())
                task = asyncio.create_task(self._follow(replica), name=f"kv-events {replica_id}")
                self._followers[replica_id] = (replica, task)

    async def _sync(self) -> None:
        self.sync()

    def _forget_metrics(self, replica_id: str) -> None:
        for gauge in (self._metrics.kv_blocks_held, self._metrics.kv_subscriber_up):
            with contextlib.suppress(KeyError):
                gauge.remove(replica_id)

    def _zmq(self) -> zmq.asyncio.Context:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        return self._context

    async def _follow(self, replica: Replica) -> None:
        """Until cancelled: a socket that fails is opened again after RETRY_S."""
        while True:
            try:
                await self._follow_once(replica)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kv events of %s (%s) failed", replica.id, replica.kv_events)
            self._metrics.kv_subscriber_up.labels(replica.id).set(0)
            await asyncio.sleep(RETRY_S)

    async def _follow_once(self, replica: Replica) -> None:
        assert replica.kv_events is not None
        view = self.views[replica.id]
        up = self._metrics.kv_subscriber_up.labels(replica.id)
        up.set(0)
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: the engine's name for its stream
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sub.connect(replica.kv_events)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            dropped = False  # the connection was lost since it was last made
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        dropped = True
                        up.set(0)
                    elif event == zmq.EVENT_CONNECTED:
                        up.set(1)
                        if dropped:
                            dropped = False
                            self._lost(view, "reconnect")
                if sub in ready:
                    await self._receive(replica, view, await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._zmq().socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # an IPv6 engine address (DNS discovery); IPv4 still works
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        return sock

    async def _receive(self, replica: Replica, view: EngineView, frames: list[bytes]) -> None:
        try:
            batch = decode_message(frames)
            if batch.seq < 0:
                raise MalformedFrame(f"a negative sequence number ({batch.seq})")
        except MalformedFrame as exc:
            self._metrics.kv_malformed_frames.labels(replica.id).inc()
            log.warning("kv events of %s: malformed message skipped: %s", replica.id, exc)
            return
        step = classify(view.last_seq, batch.seq)
        if step == "restart":
            self._lost(view, "restart")
            step = "first"
        if step == "first" and batch.seq > 0:
            # History from before this gateway listened: counted, not acted on (its clears
            # are older than what the router recorded since).
            for old in await self._replay(replica, 0, batch.seq):
                self._apply(replica, view, old, act=False)
        elif step == "gap":
            assert view.last_seq is not None
            self._metrics.kv_gaps.labels(replica.id).inc()
            missed = view.last_seq + 1
            for old in await self._replay(replica, missed, batch.seq):
                self._apply(replica, view, old, act=True)
        self._apply(replica, view, batch, act=True)

    def _apply(self, replica: Replica, view: EngineView, batch: EventBatch, *, act: bool) -> None:
        counted = self._metrics.kv_events
        for event in batch.events:
            counted.labels(replica.id, _EVENT_NAMES[type(event)]).inc()
        if batch.unknown:
            counted.labels(replica.id, "other").inc(batch.unknown)
        previous = view.quiet_since
        self._chains.apply(replica.id, batch, self._chains.now() if act else None)
        if view.apply(batch, self._clock() if act else None) and act:
            # The clear came with the engine's next step after it, which ran the requests
            # sent since the previous live message (or, before the first, since this
            # gateway began following: a reset made before it started reaches it with its
            # first request's step): their blocks are held again.
            self._forget_cache(view, "cleared", keep_since=previous)
        self._metrics.kv_blocks_held.labels(replica.id).set(view.blocks_held)

    def _lost(self, view: EngineView, reason: str) -> None:
        view.reset()
        self._chains.forget(view.replica)
        self._metrics.kv_blocks_held.labels(view.replica).set(0)
        self._forget_cache(view, reason)

    def _forget_cache(
        self, view: EngineView, reason: str, *, keep_since: float | None = None
    ) -> None:
        log.info("replica %s lost its prefix cache (%s): forgotten", view.replica, reason)
        self._metrics.kv_forgotten.labels(view.replica, reason).inc()
        self._forget(view.replica, keep_since)

    async def _replay(self, replica: Replica, start: int, stop: int) -> list[EventBatch]:
        """The replica's buffered messages numbered `start` to `stop - 1`, as many as it
        still has; none without a replay socket or an answer."""
        if not replica.kv_replay:
            self._metrics.kv_replays.labels(replica.id, "unavailable").inc()
            return []
        dealer = self._socket(zmq.DEALER)
        try:
            dealer.connect(replica.kv_replay)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            batches: list[EventBatch] = []
            while True:
                if not await dealer.poll(REPLAY_WAIT_MS):
                    self._metrics.kv_replays.labels(replica.id, "timeout").inc()
                    return batches
                frames = await dealer.recv_multipart()
                if frames[:1] == [b""]:
                    frames = frames[1:]  # the ROUTER's envelope delimiter
                if len(frames) == 3 and frames[1] == _END_OF_REPLAY.to_bytes(8, "big", signed=True):
                    break
                try:
                    batch = decode_message(frames)
                except MalformedFrame:
                    self._metrics.kv_malformed_frames.labels(replica.id).inc()
                    continue
                if start <= batch.seq < stop:
                    batches.append(batch)
            complete = len(batches) == stop - start
            self._metrics.kv_replays.labels(replica.id, "complete" if complete else "partial").inc()
            return batches
        finally:
            dealer.close(linger=0)


_EVENT_NAMES: dict[type[KvEvent], str] = {
    BlocksStored: "BlockStored",
    BlocksRemoved: "BlockRemoved",
    AllBlocksCleared: "AllBlocksCleared",
}
