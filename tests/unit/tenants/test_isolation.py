"""Isolation between tenants: tenant B, holding tenant A's ids, gets 404 on every endpoint
that takes an id (found by walking the app's routes, so a new endpoint cannot be
forgotten), never A's data; an X-Session-Id naming A's session starts B's own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.routing import APIRoute
from starlette.testclient import TestClient

from gateway.approvals.records import Approval, new_approval_id
from gateway.approvals.store import RedisApprovals
from tests.fakes import FakeUpstream
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    two_tenant_policy,
)

SECRET = "alpha-secret-7f3a"


@dataclass
class World:
    client: TestClient
    fake: FakeUpstream
    a: Tenant
    b: Tenant
    session: str  # A's session: two turns, one with a tool result
    response_id: str  # A's stored response
    approval_id: str  # A's held tool call, pending


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    a, b = new_tenants()
    client, fake = open_gateway(two_tenant_policy(redis_url, a, b))
    session = f"s-{uuid.uuid4().hex}"
    headers = {**a.headers, "X-Session-Id": session}
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    first = [
        {"role": "user", "content": f"{SECRET} question"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"{SECRET} tool result"},
    ]
    for messages, mode in ((first, "full"), ([{"role": "user", "content": "more"}], "delta")):
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages},
            headers={**headers, "X-Context-Mode": mode},
        )
        assert answer.status_code == 200, answer.text
    created = client.post(
        "/v1/responses", json={"model": "tiny", "input": f"{SECRET} response"}, headers=a.headers
    )
    assert created.status_code == 200, created.text
    approval_id = asyncio.run(held_call(redis_url, a.name, session))
    try:
        yield World(client, fake, a, b, session, created.json()["id"], approval_id)
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


async def held_call(redis_url: str, tenant: str, session: str) -> str:
    """A pending approval of `tenant`, as the gateway stores a held call."""
    now = time.time()
    call = {"id": "c1", "type": "function",
            "function": {"name": "cancel_reservation", "arguments": f'{{"note": "{SECRET}"}}'}}  # fmt: skip
    approval = Approval(new_approval_id(), tenant, session, "r1", "0" * 32, "tiny", [call],
                        ("cancel_reservation",), None, now, now + 600)  # fmt: skip
    client = aioredis.Redis.from_url(redis_url)
    try:
        await RedisApprovals(client, keep_s=600).add(approval)
    finally:
        await client.aclose()
    return approval.id


def id_values(world: World) -> dict[str, str]:
    """A's id for every path parameter an endpoint can take. A new endpoint with a new
    parameter fails the walk until it is named here."""
    return {
        "session_id": world.session,
        "response_id": world.response_id,
        "turn": "1",
        "handle": "m2",  # A's tool result
        "alias": "large",  # a model only A may use
        "approval_id": world.approval_id,
    }


def api_routes(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """Every FastAPI route of the app with its full path prefix, through included routers
    (FastAPI keeps an included router as one entry that holds the original)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from api_routes(inner.routes, prefix + route.include_context.prefix)
        elif isinstance(route, APIRoute):
            yield prefix, route


def id_routes(world: World) -> list[tuple[str, str]]:
    """(method, path) of every route that takes an id, filled in with A's ids."""
    values = id_values(world)
    found: list[tuple[str, str]] = []
    app: Any = world.client.app
    for prefix, route in api_routes(app.routes):
        if not route.param_convertors:
            continue
        assert (prefix + route.path).startswith("/v1/"), f"{route.path}: an id route outside /v1"
        missing = set(route.param_convertors) - set(values)
        assert not missing, f"{route.path}: teach this test A's {missing}"
        filled = route.path_format.format(**{name: values[name] for name in route.param_convertors})
        found += [(m, prefix + filled) for m in sorted(route.methods or ()) if m != "HEAD"]
    assert len(found) >= 8, found  # the walk sees the routes (a FastAPI change could hide them)
    return found


def test_a_sees_its_own_ids(world: World) -> None:
    """The control: the ids the walk uses are live for A."""
    for method, path in id_routes(world):
        if method == "GET":
            answer = world.client.get(path, headers=world.a.headers)
            assert answer.status_code == 200, (path, answer.text)


def test_every_endpoint_with_an_id_is_404_for_another_tenant(world: World) -> None:
    routes = id_routes(world)
    assert {p.split("/")[2] for _, p in routes} >= {"sessions", "responses", "models", "approvals"}
    for method, path in routes:
        body: dict[str, Any] | None = {} if method == "POST" else None
        answer = world.client.request(method, path, json=body, headers=world.b.headers)
        assert answer.status_code == 404, (method, path, answer.text)
        assert SECRET not in answer.text and world.a.name not in answer.text
    # and nothing of A's was touched: its session and response are still there, unforked
    listing = world.client.get(f"/v1/sessions/{world.session}/checkpoints", headers=world.a.headers)
    assert [c["turn"] for c in listing.json()["data"]] == [1, 2]
    kept = world.client.get(f"/v1/responses/{world.response_id}", headers=world.a.headers)
    assert kept.status_code == 200
    held = world.client.get(f"/v1/approvals/{world.approval_id}", headers=world.a.headers)
    assert held.json()["status"] == "pending"  # B's decision attempt was 404, not a decision
    assert world.client.get("/v1/approvals", headers=world.b.headers).json()["data"] == []


def test_a_foreign_previous_response_id_is_404(world: World) -> None:
    before = len(world.fake.calls)
    answer = world.client.post(
        "/v1/responses",
        json={"model": "tiny", "input": "go on", "previous_response_id": world.response_id},
        headers=world.b.headers,
    )
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "response_not_found"
    assert SECRET not in answer.text
    assert len(world.fake.calls) == before  # the engine never saw A's conversation


def test_a_foreign_session_id_starts_a_fresh_session_of_the_caller(world: World) -> None:
    answer = world.client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "b speaking"}]},
        headers={**world.b.headers, "X-Session-Id": world.session, "X-Context-Mode": "delta"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-gateway-session-turn"] == "1"  # B's first turn, not A's third
    sent = orjson.loads(world.fake.calls[-1].body)["messages"]
    assert sent == [{"role": "user", "content": "b speaking"}]
    assert SECRET not in answer.text
    own = world.client.get(f"/v1/sessions/{world.session}/checkpoints", headers=world.b.headers)
    assert [c["turn"] for c in own.json()["data"]] == [1]
    theirs = world.client.get(f"/v1/sessions/{world.session}/checkpoints", headers=world.a.headers)
    assert [c["turn"] for c in theirs.json()["data"]] == [1, 2]


def test_usage_is_only_the_callers(world: World) -> None:
    by_session = world.client.get(
        "/v1/usage", params={"session": world.session}, headers=world.b.headers
    )
    assert by_session.status_code == 404
    assert (
        world.client.get(
            "/v1/usage", params={"session": world.session}, headers=world.a.headers
        ).status_code
        == 200
    )
    for params in ({}, {"tenant": world.a.name}):
        rows = world.client.get("/v1/usage", params=params, headers=world.b.headers).json()
        assert world.a.name not in orjson.dumps(rows).decode()
    mine = world.client.get("/v1/usage", headers=world.a.headers).json()
    assert {row["tenant"] for row in mine["data"]} == {world.a.name}


def test_a_model_the_tenant_may_not_use_is_answered_as_one_that_does_not_exist(
    world: World,
) -> None:
    def ask(model: str) -> Any:
        return world.client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers=world.b.headers,
        )

    forbidden, missing = ask("large"), ask("nope")
    assert forbidden.status_code == missing.status_code == 404
    assert forbidden.json()["error"]["code"] == "model_not_found"
    assert forbidden.json()["error"]["message"] == missing.json()["error"]["message"].replace(
        "`nope`", "`large`"
    )
    assert "large" not in missing.text  # no error lists a model the tenant cannot see
    models = world.client.get("/v1/models", headers=world.b.headers).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    everything = world.client.get("/v1/models", headers=world.a.headers).json()
    assert [m["id"] for m in everything["data"]] == ["large", "tiny"]


def test_session_state_lives_under_the_tenants_tag(world: World, redis_url: str) -> None:
    """Checkpoints, the prefix fingerprint and the stored response are A's keys; B's use of
    the same session id writes keys under B's tag."""
    world.client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "b"}]},
        headers={**world.b.headers, "X-Session-Id": world.session},
    )
    store = redis.Redis.from_url(redis_url)
    try:
        for tenant in (world.a.name, world.b.name):
            tag = f"{{{tenant}/{world.session}}}"
            assert store.exists(f"agw:{tag}:turns", f"agw:{tag}:prefix") == 2
        assert store.exists(f"agw:response:{{{world.a.name}/{world.response_id}}}")
        assert not store.exists(f"agw:response:{{{world.b.name}/{world.response_id}}}")
    finally:
        store.close()
