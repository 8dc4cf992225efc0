"""The state store: the real Redis from REDIS_URL, or an embedded one that keeps its data
across restarts; the key layout that lets it be a Redis Cluster (the cluster itself:
tests/integration/test_redis_cluster.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from gateway.policy.sessions import StateSpec
from gateway.prompt.prefix_watch import RedisFingerprints
from gateway.resilience.response_cache import RedisResponseCache
from gateway.responses.records import RedisResponseRecords
from gateway.sessions.ids import SessionRef
from gateway.state import store as store_module
from gateway.state.keys import answer_key, response_key, session_key, session_tier_key
from gateway.state.redis_client import ClusterUnavailable
from gateway.state.store import StateStore
from gateway.telemetry.usage import MemoryUsageLedger, UsageBook, UsageKey, UsageNotWritten
from gateway.tiering.stickiness import RedisSessionTiers
from tests.lifetimes import kill_and_wait_gone, started_parent


async def test_redis_url_store_talks_to_real_redis(redis_url: str) -> None:
    store = StateStore(StateSpec(redis_url=redis_url))
    await store.open()
    try:
        assert await store.ping()
        assert store.redis is not None
        await store.redis.set("agw:test:ping", "1", ex=10)
        assert await store.redis.get("agw:test:ping") == b"1"
    finally:
        await store.close()


async def test_embedded_store_is_durable_across_restarts(tmp_path: Path) -> None:
    spec = StateSpec(embedded_dir=str(tmp_path / "state"))
    first = StateStore(spec)
    await first.open()
    assert first.redis is not None
    await first.redis.set("session:1", "kept")
    await first.close()  # stops the embedded server

    second = StateStore(spec)
    await second.open()
    try:
        assert second.redis is not None
        assert await second.redis.get("session:1") == b"kept"
        assert "embedded" in second.description
    finally:
        await second.close()


KILLED_GATEWAY = """
import asyncio, sys
from gateway.policy.sessions import StateSpec
from gateway.state import store as store_module
from gateway.state.store import StateStore

async def main() -> None:
    store = StateStore(StateSpec(embedded_dir=sys.argv[1]))
    await store.open()
    await store.redis.set("session:1", "written before the kill")
    print(store._embedded._process.pid, flush=True)
    await asyncio.sleep(3600)  # until it is killed

asyncio.run(main())
"""


def test_the_embedded_server_dies_with_its_gateway_even_by_sigkill(tmp_path: Path) -> None:
    """A gateway killed by SIGKILL (or the OOM killer) runs no cleanup: its redis-server
    gets SIGTERM from the kernel, flushes the append-only file and exits, so nothing holds
    the state directory and what was written is there for the next gateway."""
    directory = tmp_path / "state"
    gateway, server = started_parent(KILLED_GATEWAY, str(directory))
    kill_and_wait_gone(gateway, server, timeout_s=10)

    async def reopened() -> None:
        store = StateStore(StateSpec(embedded_dir=str(directory)))
        await store.open()
        try:
            assert store.redis is not None
            assert await store.redis.get("session:1") == b"written before the kill"
        finally:
            await store.close()

    asyncio.run(reopened())


async def test_a_second_gateway_on_a_served_state_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two redis-servers on one directory would both write its append-only file."""
    monkeypatch.setattr(store_module, "_CLAIM_TRIES", 3)  # not the 5 s a dying server gets
    spec = StateSpec(embedded_dir=str(tmp_path / "state"))
    first = StateStore(spec)
    await first.open()
    try:
        with pytest.raises(RuntimeError, match="is in use by another gateway"):
            await StateStore(spec).open()
        assert first.redis is not None and await first.redis.ping()
    finally:
        await first.close()


async def test_unreachable_store_pings_false() -> None:
    store = StateStore(StateSpec(redis_url="redis://127.0.0.1:1/0"))
    await store.open()
    try:
        assert not await store.ping()
    finally:
        await store.close()


# --- Redis Cluster: key layout and the cluster client's settings ---------------------------


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first `{` and the next `}`, when
    that is not empty; else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


SESSION = "s-1.a@b/c:d+e=f"  # every character a checked session id may hold


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        (session_key("acme", SESSION, "turns"), f"acme/{SESSION}"),
        (SessionRef("acme", SESSION).key("blobs"), f"acme/{SESSION}"),
        (SessionRef("acme", SESSION).key("usage"), f"acme/{SESSION}"),
        (session_tier_key("acme", SESSION, "auto"), f"acme/{SESSION}"),
        (response_key("acme", "resp_1"), "acme/resp_1"),
        (answer_key("acme", "ab12"), "acme/ab12"),
    ],
)
def test_every_key_builder_tags_the_entity_id(key: str, tag: str) -> None:
    assert hash_tag(key) == tag


def test_a_session_s_keys_share_one_slot() -> None:
    keys = [session_key("default", SESSION, p) for p in ("turns", "blobs", "usage", "prefix")]
    keys.append(session_tier_key("default", SESSION, "auto"))
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_braces_in_an_id_cannot_break_the_tag() -> None:
    # Unchecked ids (a raw X-Session-Id header used only for tier stickiness) may hold them.
    odd = ["a}b", "a{b", "a%7Db", "{}", "%"]
    keys = [session_tier_key("default", s, "auto") for s in odd]
    assert len(set(keys)) == len(odd)  # still one key per id
    for session, key in zip(odd, keys, strict=True):
        tag = hash_tag(key)
        assert tag.startswith("default/") and "{" not in tag and "}" not in tag
        prefix = session_key("default", session, "prefix")
        assert key_slot(key.encode()) == key_slot(prefix.encode())


async def test_each_store_writes_under_its_builder_s_key(redis: aioredis.Redis) -> None:
    session = f"s-{uuid.uuid4().hex}"
    await RedisFingerprints(redis, ttl_s=60).swap(session, "fp")
    await RedisSessionTiers(redis).put("auto", session, "small", 60)
    await RedisResponseRecords(redis, ttl_s=60).put(f"resp_{session}", {"x": 1})
    await RedisResponseCache(redis, ttl_s=60).put(f"hash-{session}", b"answer")
    assert await redis.get(session_key("default", session, "prefix")) == b"fp"
    assert await redis.get(session_tier_key("default", session, "auto")) == b"small"
    assert await redis.exists(response_key("default", f"resp_{session}")) == 1
    assert await redis.get(answer_key("default", f"hash-{session}")) == b"answer"


def test_cluster_mode_needs_a_node_and_database_0() -> None:
    assert StateSpec(redis_url="redis://r:6379/0", cluster=True).cluster
    with pytest.raises(ValidationError, match="needs redis_url"):
        StateSpec(cluster=True)
    with pytest.raises(ValidationError, match="only database 0"):
        StateSpec(redis_url="redis://r:6379/9", cluster=True)
    with pytest.raises(ValidationError, match="a node's redis:// or rediss:// URL"):
        StateSpec(redis_url="unix:///run/redis.sock", cluster=True)


async def test_cluster_mode_opens_redis_py_s_cluster_client() -> None:
    # Nothing listens there: the client connects lazily, so the store opens and pings false.
    spec = StateSpec(redis_url="redis://127.0.0.1:1/0", cluster=True, max_connections=7)
    store = StateStore(spec)
    await store.open()
    try:
        assert isinstance(store.redis, RedisCluster)
        assert "cluster" in store.description
        assert not await store.ping()
        with pytest.raises(ClusterUnavailable):  # a RedisError: the stores' outage path
            await store.redis.get("agw:x")
    finally:
        await store.close()


class _HalfDownLedger(MemoryUsageLedger):
    """A ledger whose first write reaches it only for rows of model `up`, as when one
    cluster node is down."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def add(
        self,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        if not self.down:
            return await super().add(rows, sessions)
        await super().add({k: v for k, v in rows.items() if k[2] == "up"}, {})
        raise UsageNotWritten(
            "one node down",
            rows={k: v for k, v in rows.items() if k[2] != "up"},
            sessions=sessions,
        )


async def test_only_the_unwritten_part_of_a_batch_is_sent_again() -> None:
    ledger = _HalfDownLedger()
    book = UsageBook(ledger)
    up, down = ("2026-11-30", "t", "up", "large"), ("2026-11-30", "t", "down", "large")
    session = SessionRef("default", "s")
    book.add(up, session, {"requests": 1})
    book.add(down, None, {"requests": 1})
    with pytest.raises(UsageNotWritten):
        await book.flush()
    ledger.down = False
    await book.flush()
    assert ledger.rows == {up: {"requests": 1}, down: {"requests": 1}}  # never twice
    assert ledger.sessions == {session: {"requests": 1}}
