"""`limits.stored_bytes` with two real `gateway serve` processes on one Redis: what one
stores counts at the other, and a gateway that has not yet written for a full tenant
stores exactly the turn that tells it so, then serves the tenant's turns unsaved and
refuses its delta turns, as the first does.

The engine is the fault harness's fake process (tests/fault/fault_upstream.py): the claim
is about Redis and the count, not the engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.state.keys import stored_bytes_key
from tests.integration.conftest import Gateway
from tests.unit.gateway_pair import gateway_pair

CAP = 4000


@pytest.fixture
def tenant() -> tuple[str, str]:
    return f"held-{uuid.uuid4().hex[:10]}", f"sk-agw-test-{uuid.uuid4().hex}"


@pytest.fixture
def gateways(
    redis_url: str, tmp_path: Path, tenant: tuple[str, str]
) -> Iterator[tuple[Gateway, Gateway]]:
    name, key = tenant
    settings = f"limits: {{stored_bytes: {CAP}}}"
    with gateway_pair(redis_url, tmp_path, name, key, settings) as started:
        yield started.gateways


def turn(gateway: Gateway, key: str, session: str, *, delta: bool = False) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}
    if delta:
        headers["X-Context-Mode"] = "delta"
    body = {"model": "main", "messages": [{"role": "user", "content": "x" * 300}]}
    return httpx.post(f"{gateway.v1}/chat/completions", json=body, headers=headers, timeout=30)


def test_the_count_is_shared_and_each_gateway_learns_it_from_its_own_write(
    gateways: tuple[Gateway, Gateway], tenant: tuple[str, str], redis_url: str
) -> None:
    first, second = gateways
    name, key = tenant
    kept = 0
    while (answer := turn(first, key, "a")).headers["x-gateway-session-turn"] != "unsaved":
        assert answer.status_code == 200
        kept += 1
        assert kept < 50
    assert answer.headers["x-gateway-degraded"] == "stored_bytes"
    # The second gateway has not written for the tenant: its first turn is stored, and the
    # total that write brings back tells it the tenant is full.
    assert turn(second, key, "b").headers["x-gateway-session-turn"] == "1"
    after = turn(second, key, "b")
    assert after.status_code == 200 and after.headers["x-gateway-session-turn"] == "unsaved"
    for gateway in (first, second):
        refused = turn(gateway, key, "b", delta=True)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "stored_bytes_exceeded"
    client = redis.Redis.from_url(redis_url)
    try:
        sizes = client.hgetall(stored_bytes_key(name, "bytes"))
        assert set(sizes) == {b"s:a", b"s:b", b"total"}
        assert int(sizes[b"total"]) == int(sizes[b"s:a"]) + int(sizes[b"s:b"]) >= CAP
    finally:
        client.close()
