"""The engines' KV-cache events (gateway/fleet/kv_events.py): vLLM's frames in both of its
encodings decode; malformed ones are counted and skipped; sequence gaps are replayed and
restarts and reconnections forget the replica's cache; a clear reaches the router's index
within a second. The fake engine below speaks vLLM's wire protocol (PUB frames, ROUTER
replay) on real ZMQ sockets."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from gateway.fleet.engine_chains import EngineChains
from gateway.fleet.kv_event_wire import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    EngineView,
    EventBatch,
    MalformedFrame,
    classify,
    decode_message,
)
from gateway.fleet.kv_events import KvEventSubscriber
from gateway.fleet.replicas import Fleet, Replica, kv_event_endpoints
from gateway.policy import parse_policy
from gateway.routing.index import PrefixIndex
from gateway.telemetry.metrics import GatewayMetrics

# Golden payloads, encoded once by the engine environment (.venv-engine, vLLM 0.32) with
# msgspec exactly as vLLM's publisher does (`msgspec.msgpack.Encoder().encode(batch)`):
# - the map encoding: vLLM 0.32's own `KVEventBatch(ts=1767225600.5, events=[
#   BlockStored(block_hashes=[bytes(range(32)), bytes(range(32, 64))], parent_block_hash=None,
#   token_ids=list(range(64)), block_size=32, lora_id=None, medium="GPU", lora_name=None),
#   BlockRemoved(block_hashes=[bytes(range(32))], medium="GPU"), AllBlocksCleared()],
#   data_parallel_rank=0)`;
# - the tagged arrays of vLLM before PR #42892: the same classes declared `array_like=True`
#   (fields block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium), with
#   integer hashes [111, 222], parent 99, and BlockRemoved([111], "GPU").
VLLM_032_MAP_PAYLOAD = (
    b"\x93\xcbA\xdaUn@ \x00\x00\x93\x88\xa4type\xabBl"
    b"ockStored\xacblock_hash"
    b"es\x92\xc4 \x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e"
    b"\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\xc4  "
    b"!\"#$%&'()*+,-./01234"
    b"56789:;<=>?\xb1parent_b"
    b"lock_hash\xc0\xa9token_ids"
    b"\xdc\x00@\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f\x10"
    b'\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f !"#$'
    b"%&'()*+,-./012345678"
    b"9:;<=>?\xaablock_size \xa7"
    b"lora_id\xc0\xa6medium\xa3GPU\xa9"
    b"lora_name\xc0\x83\xa4type\xacBlo"
    b"ckRemoved\xacblock_hash"
    b"es\x91\xc4 \x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e"
    b"\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\xa6me"
    b"dium\xa3GPU\x81\xa4type\xb0AllBl"
    b"ocksCleared\x00"
)
VLLM_TAGGED_ARRAY_PAYLOAD = (
    b"\x93\xcbA\xdaUn@ \x00\x00\x93\x97\xabBlockSt"
    b"ored\x92o\xcc\xdec\xdc\x00@\x00\x01\x02\x03\x04\x05\x06\x07"
    b"\x08\t\n\x0b\x0c\r\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b"
    b"\x1c\x1d\x1e\x1f !\"#$%&'()*+,-./"
    b"0123456789:;<=>? \xc0\xa3G"
    b"PU\x93\xacBlockRemoved\x91o\xa3G"
    b"PU\x91\xb0AllBlocksCleared"
    b"\x00"
)

HASH_A, HASH_B = bytes(range(32)), bytes(range(32, 64))


def frames(seq: int, payload: bytes, topic: bytes = b"kv") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload]


def test_vllm_032_map_frames_decode() -> None:
    batch = decode_message(frames(7, VLLM_032_MAP_PAYLOAD))
    assert batch == EventBatch(
        seq=7,
        ts=1767225600.5,
        events=(
            BlocksStored((HASH_A, HASH_B), None, token_count=64, block_size=32, medium="GPU"),
            BlocksRemoved((HASH_A,), medium="GPU"),
            AllBlocksCleared(),
        ),
    )


def test_tagged_array_frames_of_earlier_vllm_decode() -> None:
    batch = decode_message(frames(0, VLLM_TAGGED_ARRAY_PAYLOAD))
    assert batch.events == (
        BlocksStored((111, 222), 99, token_count=64, block_size=32, medium="GPU"),
        BlocksRemoved((111,), medium="GPU"),
        AllBlocksCleared(),
    )


def test_events_of_unknown_types_are_counted_and_skipped() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockPinned", "x": 1}, ["BlockPinned", 1], {"type": "AllBlocksCleared"}]]
    )
    batch = decode_message(frames(0, payload))
    assert batch.events == (AllBlocksCleared(),)
    assert batch.unknown == 2


def _payload(*events: object) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


@pytest.mark.parametrize(
    "message",
    [
        pytest.param([b"kv", (0).to_bytes(8, "big")], id="two frames"),
        pytest.param([b"kv", b"\x00" * 7, VLLM_032_MAP_PAYLOAD], id="short sequence number"),
        pytest.param(frames(0, b"\xc1 not msgpack"), id="not msgpack"),
        pytest.param(frames(0, msgspec.msgpack.encode({"ts": 1})), id="not an array"),
        pytest.param(frames(0, msgspec.msgpack.encode(["now", []])), id="ts not a number"),
        pytest.param(frames(0, _payload(7)), id="event neither map nor array"),
        pytest.param(frames(0, _payload({"x": 1})), id="event without a type"),
        pytest.param(
            frames(0, _payload({"type": "BlockStored", "block_hashes": [1], "block_size": 32})),
            id="stored without token ids",
        ),
        pytest.param(
            frames(0, _payload({"type": "BlockRemoved", "block_hashes": ["x"]})),
            id="hash of the wrong type",
        ),
        pytest.param(
            frames(0, _payload(["BlockStored", [1], None, [1], 0, None, "GPU"])),
            id="block size 0",
        ),
    ],
)
def test_malformed_messages_are_refused(message: list[bytes]) -> None:
    with pytest.raises(MalformedFrame):
        decode_message(message)


def test_sequence_numbers_tell_next_gap_and_restart() -> None:
    assert classify(None, 5) == "first"
    assert classify(5, 6) == "next"
    assert classify(5, 9) == "gap"
    assert classify(5, 0) == "restart"
    assert classify(0, 0) == "restart"  # a PUB socket never sends a number twice


def test_the_view_counts_the_blocks_of_the_engines_own_cache() -> None:
    view = EngineView("chat/1")
    stored = BlocksStored((1, 2, 3), None, 96, 32, "GPU")
    offloaded = BlocksStored((4,), None, 32, 32, "CPU")  # an offloading tier, not the cache
    assert not view.apply(EventBatch(0, 1.0, (stored, offloaded)), now=10.0)
    assert (view.blocks_held, view.last_seq, view.last_event_at) == (3, 0, 10.0)
    view.apply(EventBatch(1, 1.0, (BlocksRemoved((1,), "GPU"),)), now=11.0)
    assert view.blocks_held == 2
    assert view.apply(EventBatch(2, 1.0, (AllBlocksCleared(),)), now=12.0)
    assert view.blocks_held == 0
    view.apply(EventBatch(3, 1.0, (BlocksRemoved((9, 8), None),)), now=13.0)
    assert view.blocks_held == 0  # never below nothing
    view.apply(EventBatch(4, 1.0, (stored,)), now=None)  # replayed history: not heard now
    assert (view.last_seq, view.last_event_at, view.quiet_since) == (4, 13.0, 13.0)


def test_replicas_learn_where_their_engine_publishes(tmp_path: Path) -> None:
    state = tmp_path / "engine-state.json"
    entry = {"pool": "chat", "profile": "cpu-tiny", "served_model": "tiny", "port": 12000,
             "pid": 1, "log": "x", "url": "http://127.0.0.1:12000",
             "kv_events": "tcp://127.0.0.1:11000", "kv_replay": "tcp://127.0.0.1:10000"}  # fmt: skip
    plain = {**entry, "url": "http://127.0.0.1:12001", "kv_events": None, "kv_replay": None}
    state.write_text(json.dumps({"version": 1, "replicas": [entry, plain]}))
    policy = parse_policy(
        f"""\
version: 1
pools:
  chat: {{served_model: tiny, engine_state: "{state}"}}
  static:
    served_model: tiny
    kv_events: true
    replicas: [{{url: "http://10.0.0.5:8000"}}, {{url: "http://[fd00::5]:8000"}}]
models: {{tiny: {{pool: chat}}, other: {{pool: static}}}}
"""
    )
    fleet = Fleet(policy)
    published = {r.url: (r.kv_events, r.kv_replay) for r in fleet.all_replicas()}
    assert published == {
        "http://127.0.0.1:12000": ("tcp://127.0.0.1:11000", "tcp://127.0.0.1:10000"),
        "http://127.0.0.1:12001": (None, None),
        "http://10.0.0.5:8000": ("tcp://10.0.0.5:7000", "tcp://10.0.0.5:6000"),
        "http://[fd00::5]:8000": ("tcp://[fd00::5]:7000", "tcp://[fd00::5]:6000"),
    }


def test_the_gateway_and_the_engine_profiles_agree_on_the_ports() -> None:
    from engine.profiles import kv_events_endpoints, load_profile

    assert kv_event_endpoints("http://127.0.0.1:12345") == kv_events_endpoints("127.0.0.1", 12345)
    args = load_profile("cpu-tiny").serve_args(port=12345)
    config = json.loads(args[args.index("--kv-events-config") + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:11345",
        "replay_endpoint": "tcp://*:10345",
        "topic": "kv",
    }


# --- following a fake engine over real ZMQ sockets -------------------------------------


def stored(*hashes: int, medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": list(range(32 * len(hashes))), "block_size": 32, "lora_id": None,
            "medium": medium, "lora_name": None}  # fmt: skip


def removed(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


class FakeEngine:
    """vLLM's ZmqEventPublisher on real sockets: events on a PUB (an XPUB, which also
    tells the test when the subscription has arrived), and the replay protocol on a
    ROUTER, answered from the buffer of everything published."""

    def __init__(self, context: zmq.asyncio.Context, events: str, replay: str) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(events)
        self.events = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(replay)
        self.replay = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._serving = asyncio.create_task(self._serve_replay())

    async def subscribed(self) -> None:
        message = await asyncio.wait_for(self.pub.recv(), 5)
        assert message[:1] == b"\x01"  # a subscription (b"\x00" would be its end)

    async def publish(self, seq: int, *events: object, skip: bool = False) -> None:
        """Buffer the step for replay; send it too unless `skip` (a message lost)."""
        payload = _payload(*events)
        self.buffer.append((seq, payload))
        if not skip:
            await self.pub.send_multipart(frames(seq, payload))

    async def send_raw(self, message: list[bytes]) -> None:
        await self.pub.send_multipart(message)

    async def _serve_replay(self) -> None:
        while True:
            client, _empty, start_bytes = await self.router.recv_multipart()
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests.append(start)
            for seq, payload in self.buffer:
                if seq >= start:
                    await self.router.send_multipart([client, b"", *frames(seq, payload)])
            await self.router.send_multipart([client, b"", b"", END_OF_REPLAY, b""])

    async def close(self) -> None:
        self._serving.cancel()
        await asyncio.gather(self._serving, return_exceptions=True)
        self.pub.close(linger=0)
        self.router.close(linger=0)


class Following:
    """One replica served by a fake engine, the router's index holding its blocks 1-3,
    and a subscriber following it."""

    def __init__(self, engine: FakeEngine, *, replay: bool = True) -> None:
        self.engine = engine
        self.replica = Replica("chat", "http://127.0.0.1:9", "tiny", kv_events=engine.events,
                               kv_replay=engine.replay if replay else None)  # fmt: skip
        self.index = PrefixIndex(100)
        self.index.record(self.replica.id, [1, 2, 3])
        self.metrics = GatewayMetrics()
        self.listed = [self.replica]  # what the fleet lists
        self.kept_since: list[float | None] = []  # what each forget was told to keep
        self.chains = EngineChains()
        self.subscriber = KvEventSubscriber(
            lambda: self.listed, self._forget, self.metrics, self.chains
        )

    def _forget(self, replica: str, keep_since: float | None) -> None:
        self.kept_since.append(keep_since)
        self.index.forget(replica)

    @property
    def view(self) -> EngineView:
        return self.subscriber.views[self.replica.id]

    def remembered(self) -> int:
        return self.index.match(self.replica.id, [1, 2, 3])

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"replica": self.replica.id, **labels})
        return value or 0.0


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def engine(context: zmq.asyncio.Context) -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(context, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    yield engine
    await engine.close()


@pytest.fixture
async def following(engine: FakeEngine) -> AsyncIterator[Following]:
    following = Following(engine)
    await following.subscriber.start()
    await engine.subscribed()
    yield following
    await following.subscriber.stop()


async def until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within_s}s")
        await asyncio.sleep(0.005)


async def test_a_clear_reaches_the_routers_index_within_a_second(following: Following) -> None:
    engine = following.engine
    await engine.publish(0, stored(1, 2, 3))
    await until(lambda: following.view.blocks_held == 3)
    assert following.remembered() == 3  # stores change nothing the router recorded
    stored_at = following.view.last_event_at
    await engine.publish(1, CLEARED)
    await until(lambda: following.remembered() == 0, within_s=1.0)
    assert following.view.blocks_held == 0
    assert following.metric("gateway_engine_kv_forgotten_total", reason="cleared") == 1
    assert following.metric("gateway_engine_kv_events_total", type="BlockStored") == 1
    assert following.metric("gateway_engine_kv_events_total", type="AllBlocksCleared") == 1
    assert following.metric("gateway_engine_kv_subscriber_up") == 1
    # The router keeps what was sent after the message before the clear arrived: those
    # requests ran in the step that published the clear, after it.
    assert following.kept_since == [stored_at]


async def test_an_eviction_reaches_the_conversation_it_belongs_to(following: Following) -> None:
    engine, chains = following.engine, following.chains
    conversation = ("default", "conv-1", following.replica.id)
    sent = chains.now()
    await engine.publish(0, stored(1, 2, 3))
    await until(lambda: following.view.blocks_held == 3)
    chains.answered(conversation, sent, 100, 1)  # 3 whole blocks of 32 tokens, and 4 over
    held = chains.held(conversation)
    assert held is not None and (held.tokens, held.whole) == (96, True)
    await engine.publish(1, removed(3))
    await until(lambda: following.view.blocks_held == 2)
    held = chains.held(conversation)
    assert held is not None and (held.tokens, held.whole) == (64, False)
    await engine.publish(2, CLEARED)
    await until(lambda: following.view.blocks_held == 0)
    held = chains.held(conversation)
    assert held is not None and held.tokens == 0


async def test_a_gap_is_filled_from_the_replay_socket(following: Following) -> None:
    engine = following.engine
    await engine.publish(0, stored(1))
    await engine.publish(1, stored(2, 3), skip=True)
    await engine.publish(2, CLEARED, skip=True)
    await engine.publish(3, stored(4))
    await until(lambda: following.view.last_seq == 3)
    assert engine.replay_requests == [1]
    assert following.view.blocks_held == 1  # 1, then 2 and 3, all cleared, then 4
    assert following.remembered() == 0  # the missed clear counts like a live one
    assert following.metric("gateway_engine_kv_gaps_total") == 1
    assert following.metric("gateway_engine_kv_replays_total", outcome="complete") == 1


async def test_a_gap_without_a_replay_socket_is_counted(engine: FakeEngine) -> None:
    following = Following(engine, replay=False)
    await following.subscriber.start()
    try:
        await engine.subscribed()
        await engine.publish(0, stored(1))
        await engine.publish(1, stored(2), skip=True)
        await engine.publish(2, stored(3))
        await until(lambda: following.view.last_seq == 2)
        assert following.view.blocks_held == 2
        assert following.metric("gateway_engine_kv_gaps_total") == 1
        assert following.metric("gateway_engine_kv_replays_total", outcome="unavailable") == 1
    finally:
        await following.subscriber.stop()


async def test_a_restarted_engine_is_forgotten(following: Following) -> None:
    engine = following.engine
    for seq in range(3):
        await engine.publish(seq, stored(10 + seq))
    await until(lambda: following.view.blocks_held == 3)
    engine.buffer.clear()  # a new engine process: a new buffer, numbers from 0 again
    await engine.publish(0, stored(20))
    await until(lambda: following.remembered() == 0, within_s=1.0)
    assert following.view.blocks_held == 1
    assert following.metric("gateway_engine_kv_forgotten_total", reason="restart") == 1


async def test_a_malformed_message_is_counted_and_the_follower_goes_on(
    following: Following,
) -> None:
    engine = following.engine
    await engine.send_raw(frames(0, b"\xc1 garbage"))
    await engine.send_raw([b"kv", b"short"])
    await engine.publish(0, stored(1, 2))
    await until(lambda: following.view.blocks_held == 2)
    assert following.metric("gateway_engine_kv_malformed_frames_total") == 2


async def test_a_reconnection_forgets_the_replica(
    following: Following, context: zmq.asyncio.Context
) -> None:
    old = following.engine
    await old.publish(0, stored(1))
    await until(lambda: following.view.blocks_held == 1)
    await old.close()  # the engine goes away ...
    await until(lambda: following.metric("gateway_engine_kv_subscriber_up") == 0)
    assert following.remembered() == 3
    new = FakeEngine(context, old.events, old.replay)  # ... and one comes back, empty
    try:
        await until(lambda: following.remembered() == 0)
        assert following.metric("gateway_engine_kv_forgotten_total", reason="reconnect") == 1
        assert following.metric("gateway_engine_kv_subscriber_up") == 1
        await new.subscribed()
        await new.publish(0, stored(5))
        await until(lambda: following.view.blocks_held == 1)
        assert following.metric("gateway_engine_kv_forgotten_total", reason="restart") == 0
    finally:
        await new.close()


async def test_history_from_before_the_first_message_is_replayed_not_acted_on(
    engine: FakeEngine,
) -> None:
    await engine.publish(0, stored(1, 2), skip=True)
    await engine.publish(1, CLEARED, skip=True)  # older than what the router recorded since
    await engine.publish(2, stored(3, 4, 5), skip=True)
    following = Following(engine)
    await following.subscriber.start()
    try:
        await engine.subscribed()
        await engine.publish(3, removed(3))
        await until(lambda: following.view.last_seq == 3)
        assert engine.replay_requests == [0]
        assert following.view.blocks_held == 2
        assert following.remembered() == 3
        assert following.metric("gateway_engine_kv_gaps_total") == 0
    finally:
        await following.subscriber.stop()


async def test_a_reset_from_before_the_gateway_started_keeps_what_it_sent_since(
    engine: FakeEngine,
) -> None:
    """vLLM publishes a clear with its next step, so a reset made before this gateway began
    following reaches it with the step of its first requests: what was sent since it began
    following is held again (the request logs showed the first turns predicted at 0)."""
    await engine.publish(0, stored(1, 2), skip=True)  # history: replayed, not a live message
    following = Following(engine)
    await following.subscriber.start()
    try:
        await engine.subscribed()
        began = following.view.since
        await engine.publish(1, CLEARED, stored(7))
        await until(lambda: following.kept_since != [])
        assert following.kept_since == [began]
        assert following.view.last_event_at is not None and following.view.last_event_at >= began
        assert following.view.blocks_held == 1
    finally:
        await following.subscriber.stop()


async def test_replicas_that_leave_are_no_longer_followed(following: Following) -> None:
    engine = following.engine
    await engine.publish(0, stored(1))
    await until(lambda: following.view.blocks_held == 1)
    following.listed.clear()
    following.subscriber.sync()
    assert following.subscriber.views == {}
    assert following.metric("gateway_engine_kv_blocks") == 0  # its gauges are gone
    message = await asyncio.wait_for(engine.pub.recv(), 5)
    assert message[:1] == b"\x00"  # its subscription ended: the socket was closed
