"""The state store: the real Redis from REDIS_URL, or an embedded one that keeps its data
across restarts."""

from __future__ import annotations

from pathlib import Path

from gateway.policy.schema import StateSpec
from gateway.state_store import StateStore


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


async def test_unreachable_store_pings_false() -> None:
    store = StateStore(StateSpec(redis_url="redis://127.0.0.1:1/0"))
    await store.open()
    try:
        assert not await store.ping()
    finally:
        await store.close()
