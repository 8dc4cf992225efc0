"""`limits.stored_bytes` through the real app and the real Redis (engine twin): a tenant's
session turns are stored until its conversations hold the cap; then a turn whose client
sent its whole history is served unsaved and told so, and whatever only the store could
serve or that asks to be stored (a delta-mode turn, a stored response, a fork, feedback)
gets 429 in its API's shape before any engine is asked. Requests that store nothing,
reads of what is stored, and the other tenant are served as before."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
import redis
from starlette.testclient import TestClient

from gateway.state.keys import stored_bytes_key
from tests.fakes import FakeUpstream
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    two_tenant_policy,
)

CAP = 3000


@dataclass
class Stack:
    client: TestClient
    engine: FakeUpstream
    capped: Tenant  # `limits: {stored_bytes: CAP}`
    free: Tenant  # no cap

    def turn(
        self, tenant: Tenant, session: str | None, text: str = "hello", *, delta: bool = False
    ) -> dict[str, Any]:
        headers = {**tenant.headers, **({"X-Session-Id": session} if session else {})}
        if delta:
            headers["X-Context-Mode"] = "delta"
        answer = self.client.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": "tiny", "messages": [{"role": "user", "content": text}]},
        )
        return {"status": answer.status_code, "headers": answer.headers, "body": answer.json()}

    def fill(self, session: str) -> int:
        """Session turns of the capped tenant until one is not kept; the turns stored."""
        for stored in range(50):
            answer = self.turn(self.capped, session, "x" * 200)
            assert answer["status"] == 200
            if answer["headers"]["x-gateway-session-turn"] == "unsaved":
                assert answer["headers"]["x-gateway-degraded"] == "stored_bytes"
                return stored
        raise AssertionError("never full")


ADMIN_KEY = f"sk-agw-admin-{uuid.uuid4().hex}"


@pytest.fixture
def stack(redis_url: str) -> Iterator[Stack]:
    capped, free = new_tenants()
    admin = hashlib.sha256(ADMIN_KEY.encode()).hexdigest()
    policy = two_tenant_policy(
        redis_url,
        capped,
        free,
        a_settings=f"limits: {{stored_bytes: {CAP}}},",
        auth=f"{{key_cache_ttl_s: 0, admin_keys: [{{sha256: {admin}}}]}}",
    )
    client, engine = open_gateway(policy)
    yield Stack(client, engine, capped, free)
    client.__exit__(None, None, None)
    forget_tenants(redis_url, capped.name, free.name)


def test_turns_are_stored_until_the_cap_then_served_unsaved_and_delta_refused(
    stack: Stack, redis_url: str
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    stored = stack.fill(session)
    assert stored >= 2
    # A whole-history turn is served, not kept, and says so (fill saw it); a delta turn
    # needs the store to continue: refused, before the engine.
    calls = len(stack.engine.calls)
    refused = stack.turn(stack.capped, session, delta=True)
    assert refused["status"] == 429 and len(stack.engine.calls) == calls
    error = refused["body"]["error"]
    assert error["type"] == "insufficient_quota" and error["code"] == "stored_bytes_exceeded"
    assert "limits.stored_bytes" in error["message"]
    headers = refused["headers"]
    assert int(headers["retry-after"]) > 0 and headers["x-should-retry"] == "false"
    # A new session is served unsaved too; without a session nothing changes.
    fresh = stack.turn(stack.capped, f"s-{uuid.uuid4().hex[:8]}")
    assert fresh["status"] == 200 and fresh["headers"]["x-gateway-session-turn"] == "unsaved"
    plain = stack.turn(stack.capped, None)
    assert plain["status"] == 200 and "x-gateway-degraded" not in plain["headers"]
    turns = stack.client.get(f"/v1/sessions/{session}/checkpoints", headers=stack.capped.headers)
    assert turns.status_code == 200 and len(turns.json()["data"]) == stored
    # The count is what the session holds: its turns (no tool sets, no snapshot here).
    held = redis.Redis.from_url(redis_url)
    try:
        total = int(held.hget(stored_bytes_key(stack.capped.name, "bytes"), "total") or 0)
        turns_key = f"agw:{{{stack.capped.name}/{session}}}:turns"
        assert total == sum(len(t) for t in held.lrange(turns_key, 0, -1)) >= CAP
        assert not held.exists(stored_bytes_key(stack.free.name, "bytes"))
    finally:
        held.close()
    metrics = stack.client.get("/metrics").text
    assert f'gateway_tenant_stored_bytes{{tenant="{stack.capped.name}"}} {float(total)}' in metrics
    assert 'gateway_session_checkpoints_total{outcome="over_cap"} 2.0' in metrics
    # The admin API shows what each capped tenant holds beside its cap.
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    shown = {t["name"]: t for t in stack.client.get("/admin/tenants", headers=admin).json()["data"]}
    assert shown[stack.capped.name]["limits"]["stored_bytes"] == CAP
    assert shown[stack.capped.name]["stored_bytes_held"] == total
    assert "stored_bytes_held" not in shown[stack.free.name]
    # Deleting the session gives its bytes back: the tenant's turns are kept again at once.
    deleted = stack.client.delete(f"/v1/sessions/{session}", headers=stack.capped.headers)
    assert deleted.status_code == 200
    assert stack.turn(stack.capped, session)["headers"]["x-gateway-session-turn"] == "1"


def test_the_other_tenant_is_served_whatever_the_first_stored(stack: Stack) -> None:
    stack.fill(f"s-{uuid.uuid4().hex[:8]}")
    for _ in range(3):
        assert stack.turn(stack.free, f"s-{uuid.uuid4().hex[:8]}", "x" * 2000)["status"] == 200


def test_a_fork_and_feedback_are_refused_once_full(stack: Stack) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    stack.fill(session)
    forked = stack.client.post(
        f"/v1/sessions/{session}/fork", headers=stack.capped.headers, json={"turn": 1}
    )
    assert forked.status_code == 429 and forked.json()["error"]["code"] == "stored_bytes_exceeded"
    feedback = stack.client.post(
        "/v1/feedback", headers=stack.capped.headers, json={"request_id": "r1", "score": 1}
    )
    assert feedback.status_code == 429
    assert feedback.json()["error"]["code"] == "stored_bytes_exceeded"
    given = stack.client.post(
        "/v1/feedback", headers=stack.free.headers, json={"request_id": "r1", "score": 1}
    )
    assert given.status_code == 200


def test_the_sdks_are_served_unsaved_or_see_a_quota_error_they_do_not_retry(
    stack: Stack,
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    stack.fill(session)
    calls = len(stack.engine.calls)
    # Both SDKs as an agent would hold them: retrying as they do by default.
    client = {
        "api_key": stack.capped.key,
        "http_client": stack.client,
        "max_retries": 2,
        "default_headers": {"X-Session-Id": session},
    }
    sdk = openai.OpenAI(base_url="http://testserver/v1", **client)  # type: ignore[arg-type]
    served = sdk.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}]
    )
    assert served.headers["x-gateway-session-turn"] == "unsaved"
    with pytest.raises(openai.RateLimitError) as refused:
        sdk.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Context-Mode": "delta"},
        )
    assert refused.value.code == "stored_bytes_exceeded"
    # The Responses API stores a response by default: refused; `store: false` is served.
    with pytest.raises(openai.RateLimitError):
        sdk.responses.create(model="tiny", input="hi")
    assert sdk.responses.create(model="tiny", input="hi", store=False).status == "completed"
    # The Messages API: served unsaved; in delta mode refused, in its own shape.
    claude = anthropic.Anthropic(base_url="http://testserver", **client)  # type: ignore[arg-type]
    message = claude.messages.with_raw_response.create(
        model="tiny", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.headers["x-gateway-session-turn"] == "unsaved"
    with pytest.raises(anthropic.RateLimitError) as shaped:
        claude.messages.create(
            model="tiny",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Context-Mode": "delta"},
        )
    error = shaped.value.body["error"]  # type: ignore[index]
    assert error["type"] == "rate_limit_error" and "limits.stored_bytes" in error["message"]
    assert len(stack.engine.calls) == calls + 3  # the three served, no retries


def test_a_stored_response_is_counted_until_it_is_deleted(stack: Stack, redis_url: str) -> None:
    created = stack.client.post(
        "/v1/responses", headers=stack.capped.headers, json={"model": "tiny", "input": "hi"}
    )
    assert created.status_code == 200
    response_id = created.json()["id"]
    held = redis.Redis.from_url(redis_url)
    try:
        sizes = held.hgetall(stored_bytes_key(stack.capped.name, "bytes"))
        record = held.strlen(f"agw:response:{{{stack.capped.name}/{response_id}}}")
        assert int(sizes[f"r:{response_id}".encode()]) == record > 0
        # its turn: the session the response started, under the response's id
        assert int(sizes[f"s:{response_id}".encode()]) > 0
        deleted = stack.client.delete(f"/v1/responses/{response_id}", headers=stack.capped.headers)
        assert deleted.status_code == 200
        assert f"r:{response_id}".encode() not in held.hgetall(
            stored_bytes_key(stack.capped.name, "bytes")
        )
    finally:
        held.close()


def test_stored_responses_count_without_sessions_too(redis_url: str) -> None:
    capped, free = new_tenants()
    policy = two_tenant_policy(
        redis_url,
        capped,
        free,
        a_settings=f"limits: {{stored_bytes: {CAP}}},",
        extra="sessions: {enabled: false}\n",
    )
    client, engine = open_gateway(policy)
    try:
        statuses = [
            client.post(
                "/v1/responses", headers=capped.headers, json={"model": "tiny", "input": "hi"}
            ).status_code
            for _ in range(12)
        ]
        assert statuses[0] == 200 and statuses[-1] == 429
        assert statuses.index(429) == len(engine.calls)  # refused before the engine
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, capped.name, free.name)
