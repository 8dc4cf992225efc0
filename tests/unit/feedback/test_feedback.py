"""`POST /v1/feedback` and `gateway dataset export`: scores stored under the caller's tenant,
bad bodies refused in the OpenAI error shape, and the export joining each tenant's
feedback to its own requests only."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio as aioredis
from starlette.testclient import TestClient

from gateway.cli import main
from gateway.errors import StoredBytesExceeded
from gateway.feedback.store import SAMPLED, Feedback, FeedbackStore
from gateway.offline.dataset import export
from gateway.policy.sessions import StateSpec
from gateway.state.keys import feedback_key, stored_bytes_key
from gateway.state.store import StateStore
from gateway.state.stored_bytes import StoredBytes
from tests.policies import with_redis
from tests.unit.clients import TINY_POLICY
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    two_tenant_policy,
)


@pytest.fixture
def two(redis_url: str) -> Iterator[tuple[TestClient, Tenant, Tenant]]:
    a, b = new_tenants()
    client, _ = open_gateway(two_tenant_policy(redis_url, a, b))
    try:
        yield client, a, b
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)
        redis.Redis.from_url(redis_url).delete(feedback_key(a.name), feedback_key(b.name))


def served(client: TestClient, tenant: Tenant) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    answer = client.post("/v1/chat/completions", json=body, headers=tenant.headers)
    assert answer.status_code == 200
    return answer.headers["x-request-id"]


def stored(redis_url: str, tenant: str) -> list[dict[str, str]]:
    async def read() -> list[dict[str, str]]:
        store = StateStore(StateSpec(redis_url=redis_url))
        await store.open()
        try:
            assert store.redis is not None
            return await FeedbackStore(store.redis).read(tenant)
        finally:
            await store.close()

    return asyncio.run(read())


def test_feedback_is_kept_under_the_callers_tenant(
    two: tuple[TestClient, Tenant, Tenant], redis_url: str
) -> None:
    client, a, b = two
    request_id = served(client, a)
    given = {"request_id": request_id, "score": 0.25, "name": "thumbs", "comment": "too long"}
    answer = client.post("/v1/feedback", json=given, headers=a.headers)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "feedback" and body["id"]
    assert (body["request_id"], body["score"], body["name"]) == (request_id, 0.25, "thumbs")
    assert client.post("/v1/feedback", json={"request_id": request_id, "score": True},
                       headers=a.headers).json()["score"] == 1.0  # fmt: skip
    # B may send feedback naming A's request id: it is B's, and joins nothing of A's.
    foreign = client.post("/v1/feedback", json={"request_id": request_id, "score": 0},
                          headers=b.headers)  # fmt: skip
    assert foreign.status_code == 200
    mine = stored(redis_url, a.name)
    assert [(f["request_id"], f["score"], f["name"]) for f in mine] == [
        (request_id, "0.25", "thumbs"), (request_id, "1.0", "user")
    ]  # fmt: skip
    assert mine[0]["comment"] == "too long"
    assert [f["score"] for f in stored(redis_url, b.name)] == ["0.0"]
    assert client.post("/v1/feedback", json=given).status_code == 401  # no key
    metrics = client.get("/metrics").text
    assert f'gateway_feedback_total{{tenant="{a.name}"}} 2.0' in metrics
    assert f'gateway_feedback_total{{tenant="{b.name}"}} 1.0' in metrics


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        (b"[1]", None),
        (b'{"score": 1}', "request_id"),
        (b'{"request_id": "has space", "score": 1}', "request_id"),
        (b'{"request_id": "r1", "score": "5"}', "score"),
        (b'{"request_id": "r1", "score": 1e999}', None),  # not JSON to orjson: out of range
        (b'{"request_id": "r1", "score": 1, "name": ""}', "name"),
        (b'{"request_id": "r1", "score": 1, "comment": "a\\nforged line"}', "comment"),
        (b'{"request_id": "r1", "score": 1, "comment": "' + b"x" * 4001 + b'"}', "comment"),
        (b'{"request_id": "r1", "score": 1, "url": "http://x"}', "url"),
    ],
)
def test_bad_feedback_is_a_clear_400(
    two: tuple[TestClient, Tenant, Tenant], body: bytes, param: str | None
) -> None:
    client, a, _ = two
    answer = client.post(
        "/v1/feedback", content=body, headers={**a.headers, "Content-Type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_too_large_a_body_is_413(two: tuple[TestClient, Tenant, Tenant]) -> None:
    client, a, _ = two
    answer = client.post("/v1/feedback", content=b"x" * 40_000, headers=a.headers)
    assert answer.status_code == 413


def log_line(tenant: str, request_id: str, **fields: Any) -> dict[str, Any]:
    return {"request_id": request_id, "ts": 1.0, "tenant": tenant, "model": "auto",
            "tier": "small", "cascade": None, "cascade_tier": None, "route_text": None,
            **fields}  # fmt: skip


def test_the_export_joins_each_tenants_feedback_to_its_own_requests() -> None:
    entries = [
        log_line("a", "r1", cascade="passed", cascade_tier="small", route_text="q1"),
        log_line("a", "r2"),  # no label: left out
        log_line("b", "r3", cascade="escalated", cascade_tier="small"),  # no text kept
        log_line("a", "r4"),
    ]
    feedback = {
        "a": [{"request_id": "r4", "score": "0.5", "name": "user", "comment": "ok"}],
        "b": [{"request_id": "r1", "score": "0.0", "name": "user"}],  # names A's request
    }
    result = export(entries, feedback)
    rows = {row["request_id"]: row for row in result.rows}
    assert sorted(rows) == ["r1", "r3", "r4"]
    assert "feedback" not in rows["r1"]  # B's score does not label A's request
    assert rows["r4"]["feedback"] == [{"name": "user", "score": 0.5, "comment": "ok"}]
    assert rows["r1"]["route_text"] == "q1" and rows["r3"]["route_text"] is None
    assert (result.lines, result.cascade_labels, result.feedback_labels, result.with_text) == (
        4, 2, 1, 1
    )  # fmt: skip
    assert [r["request_id"] for r in export(entries, feedback, tenant="b").rows] == ["r3"]


def test_dataset_export_reads_the_log_and_the_feedback(
    two: tuple[TestClient, Tenant, Tenant], redis_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    client, a, _ = two
    request_id = served(client, a)
    client.post("/v1/feedback", json={"request_id": request_id, "score": 1}, headers=a.headers)
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps(log_line(a.name, request_id)) + "\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(with_redis(TINY_POLICY, redis_url))
    out = tmp_path / "dataset.jsonl"
    argv = ["dataset", "export", "--log", str(log), "--out", str(out), "--policy", str(policy)]
    assert main(argv) == 0
    assert "1 labelled requests of 1 log lines" in capsys.readouterr().out
    (row,) = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert row["request_id"] == request_id and row["feedback"][0]["score"] == 1.0
    # Without feedback, nothing labels that request; an embedded store is refused clearly.
    assert main([*argv[:-2], "--no-feedback"]) == 0
    assert out.read_text() == ""
    policy.write_text(TINY_POLICY)
    assert main(argv) == 2
    assert "--no-feedback" in capsys.readouterr().err
    log.write_text("not json\n")
    assert main([*argv[:-2], "--no-feedback"]) == 2


async def test_the_stream_is_trimmed_to_its_most_entries_and_its_bytes_kept_exactly(
    redis_url: str,
) -> None:
    """What a tenant's feedback holds is known to the byte, so it can count against the
    tenant's `limits.stored_bytes`: over a gigabyte was possible before (100,000 entries of
    4,000 characters, trimmed only by count)."""
    client = aioredis.Redis.from_url(redis_url)
    tenant = f"fb-{uuid.uuid4().hex[:8]}"
    key = feedback_key(tenant)
    try:
        store = FeedbackStore(client, max_entries=5)
        for i in range(12):
            comment = "é" * (i * 37)  # multi-byte characters: bytes, not characters
            await store.add(tenant, Feedback(f"req-{i}", 0.5, comment=comment or None))
        entries = await client.xrange(key) or []
        assert len(entries) == 5
        held = sum(len(k) + len(v) for _, fields in entries for k, v in (fields or {}).items())
        assert int(await client.get(f"{key}:bytes")) == held  # type: ignore[arg-type]
        # A stream kept before the count existed never counts below nothing.
        await client.set(f"{key}:bytes", 0)
        await store.add(tenant, Feedback("req-x", 1.0))
        assert int(await client.get(f"{key}:bytes")) >= 0  # type: ignore[arg-type]
    finally:
        await client.delete(key, f"{key}:bytes")
        await client.aclose()


async def test_a_stream_kept_before_its_count_is_counted_from_its_first_new_entry(
    redis_url: str,
) -> None:
    """A stream written before the byte count existed is sized at its next entry from its
    oldest and newest entries (not read whole: 100,000 entries would hold Redis), and is
    not counted as empty: its tenant's cap would otherwise miss what it already holds."""
    client = aioredis.Redis.from_url(redis_url)
    tenant = f"fb-{uuid.uuid4().hex[:8]}"
    key = feedback_key(tenant)
    try:
        entry = {"request_id": "legacy", "score": "1.0", "name": "user", "comment": "c" * 500}
        for _ in range(3 * SAMPLED):
            await client.xadd(key, entry)  # type: ignore[arg-type]
        store = FeedbackStore(client)
        await store.add(tenant, Feedback("req-new", 0.0))
        entries = await client.xrange(key) or []
        held = sum(len(k) + len(v) for _, fields in entries for k, v in (fields or {}).items())
        # Equal entries: the estimate is exact, and so is the count after the new one.
        assert int(await client.get(f"{key}:bytes")) == held  # type: ignore[arg-type]
        # Counted once: the next entry adds its own bytes only.
        await store.add(tenant, Feedback("req-next", 0.0))
        entries = await client.xrange(key) or []
        held = sum(len(k) + len(v) for _, fields in entries for k, v in (fields or {}).items())
        assert int(await client.get(f"{key}:bytes")) == held  # type: ignore[arg-type]
    finally:
        await client.delete(key, f"{key}:bytes")
        await client.aclose()


async def test_feedback_counts_against_the_tenants_stored_bytes(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    tenant = f"fb-{uuid.uuid4().hex[:8]}"
    key = feedback_key(tenant)
    stored = StoredBytes(client, ttl_s=600, cap_of=lambda _: 3000)
    try:
        store = FeedbackStore(client)
        for i in range(3):  # each about 1,050 bytes: the third passes the cap
            await store.add(tenant, Feedback(f"r{i}", 1.0, comment="x" * 1000), stored=stored)
        with pytest.raises(StoredBytesExceeded):
            await store.add(tenant, Feedback("r3", 1.0), stored=stored)
        assert await client.xlen(key) == 3
        sizes = await client.hgetall(stored_bytes_key(tenant, "bytes"))
        assert int(sizes[b"f:feedback"]) == int(await client.get(f"{key}:bytes"))  # type: ignore[arg-type]
    finally:
        await client.delete(
            key,
            f"{key}:bytes",
            stored_bytes_key(tenant, "expiry"),
            stored_bytes_key(tenant, "bytes"),
        )
        await client.aclose()
