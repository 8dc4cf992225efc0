"""No write overwrites or loses a caller's other data: every endpoint that writes under an
id (in its path, its body or a header) is called with an id the caller also owns
elsewhere, and everything else the caller had is still there, whole, afterwards. The
write routes with an id in their path are found by walking the app, so a new one fails
`test_every_write_route_with_an_id_is_covered_here` until it has a test here."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from starlette.testclient import TestClient

from gateway.approvals.records import Approval, new_approval_id
from gateway.approvals.store import RedisApprovals
from tests.fakes import FakeUpstream
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    sha256,
    two_tenant_policy,
)
from tests.unit.tenants.test_isolation import api_routes

ADMIN_KEY = f"sk-admin-{uuid.uuid4().hex}"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# (method, path) of each write route with an id in its path, and the test that covers it.
COVERED = {
    ("POST", "/v1/sessions/{session_id}/fork"): "test_a_fork_never_writes_over_another_session",
    ("DELETE", "/v1/sessions/{session_id}"): "test_deleting_a_session_leaves_its_forks_and_the_rest",
    ("DELETE", "/v1/responses/{response_id}"): "test_deleting_a_response_leaves_its_session_and_the_rest",
    ("POST", "/v1/responses/{response_id}/cancel"): "test_cancelling_a_response_changes_nothing",
    ("POST", "/v1/approvals/{approval_id}"): "test_a_decision_decides_that_approval_only_and_once",
    ("DELETE", "/admin/keys/{key_id}"): "test_keys_with_one_name_are_two_keys_and_revoking_one_keeps_the_other",
}  # fmt: skip


@dataclass
class World:
    client: TestClient
    fake: FakeUpstream
    a: Tenant
    redis_url: str
    first: str  # A's session of two turns
    second: str  # A's session of three turns
    responses: list[str]  # A's responses, each continuing the one before

    def chat(self, session: str, text: str) -> Any:
        return self.client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": text}]},
            headers={**self.a.headers, "X-Session-Id": session, "X-Context-Mode": "delta"},
        )

    def turns(self, session: str) -> list[str]:
        """Each turn's request id: the same list means the same turns."""
        listing = self.client.get(f"/v1/sessions/{session}/checkpoints", headers=self.a.headers)
        if listing.status_code == 404:
            return []
        return [c["request_id"] for c in listing.json()["data"]]

    def respond(self, text: str, previous: str | None = None, **extra: Any) -> Any:
        body = {"model": "tiny", "input": text, **extra}
        if previous is not None:
            body["previous_response_id"] = previous
        return self.client.post("/v1/responses", json=body, headers=self.a.headers)

    def everything(self) -> dict[str, Any]:
        """What A has that the tests below must find unchanged."""
        return {
            "first": self.turns(self.first),
            "second": self.turns(self.second),
            "responses": [
                self.client.get(f"/v1/responses/{r}", headers=self.a.headers).json()
                for r in self.responses
            ],
        }


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    a, b = new_tenants()
    auth = f"{{key_cache_ttl_s: 0, admin_keys: [{{sha256: {sha256(ADMIN_KEY)}}}]}}"
    client, fake = open_gateway(two_tenant_policy(redis_url, a, b, auth=auth))
    world = World(client, fake, a, redis_url, f"s-{uuid.uuid4().hex}", f"s-{uuid.uuid4().hex}", [])
    for session, turns in ((world.first, 2), (world.second, 3)):
        for n in range(turns):
            assert world.chat(session, f"{session} turn {n}").status_code == 200
    previous = None
    for text in ("one", "two", "three"):
        previous = world.respond(text, previous).json()["id"]
        world.responses.append(previous)
    try:
        yield world
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


def session_keys(world: World) -> set[bytes]:
    store = redis.Redis.from_url(world.redis_url)
    try:
        return set(store.scan_iter(match=f"agw:{{{world.a.name}/*}}:turns"))
    finally:
        store.close()


def test_every_write_route_with_an_id_is_covered_here(world: World) -> None:
    app: Any = world.client.app
    found = {
        (method, prefix + route.path)
        for prefix, route in api_routes(app.routes)
        if route.param_convertors
        for method in route.methods or ()
        if method not in ("GET", "HEAD")
    }
    assert found == set(COVERED), found ^ set(COVERED)
    assert all(name in globals() for name in COVERED.values())


def test_a_fork_never_writes_over_another_session(world: World) -> None:
    before = world.everything()
    for target in (world.second, world.responses[0]):  # a session, and a Responses session
        refused = world.client.post(
            f"/v1/sessions/{world.first}/fork",
            json={"turn": 1, "session_id": target},
            headers=world.a.headers,
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "session_exists"
    forks = [
        world.client.post(f"/v1/sessions/{world.first}/fork", json={"turn": 1}, headers=world.a.headers)
        for _ in range(2)
    ]  # fmt: skip
    assert [f.status_code for f in forks] == [201, 201]
    ids = [f.json()["id"] for f in forks]
    assert ids[0] != ids[1]
    assert world.turns(ids[0]) == world.turns(ids[1]) == before["first"][:1]
    assert world.everything() == before
    continued = world.respond("go on", world.responses[-1])
    assert continued.status_code == 200  # the Responses session forked onto is whole


def test_deleting_a_session_leaves_its_forks_and_the_rest(world: World) -> None:
    fork = world.client.post(
        f"/v1/sessions/{world.second}/fork", json={"turn": 2}, headers=world.a.headers
    ).json()["id"]
    before = world.everything()
    deleted = world.client.delete(f"/v1/sessions/{world.second}", headers=world.a.headers)
    assert deleted.status_code == 200
    assert world.turns(fork) == before["second"][:2]
    after = world.everything()
    assert after["second"] == []
    assert {k: v for k, v in after.items() if k != "second"} == {
        k: v for k, v in before.items() if k != "second"
    }


def test_continuing_an_earlier_response_branches_without_touching_its_session(
    world: World,
) -> None:
    before = world.everything()
    branches = [world.respond(f"branch {n}", world.responses[0]) for n in range(2)]
    assert [b.status_code for b in branches] == [200, 200]
    assert world.everything() == before  # the conversation's own session is unchanged
    again = [world.respond("and", b.json()["id"]) for b in branches]
    assert [a.status_code for a in again] == [200, 200]  # two branches, each its own
    assert world.everything() == before


def test_continuing_the_latest_response_appends_and_keeps_every_earlier_turn(
    world: World,
) -> None:
    before = world.everything()
    latest = world.respond("four", world.responses[-1])
    assert latest.status_code == 200
    assert world.everything() == before
    session_of = world.client.get(f"/v1/responses/{latest.json()['id']}", headers=world.a.headers)
    assert session_of.status_code == 200


def test_a_response_not_stored_writes_no_branch(world: World) -> None:
    before, keys = world.everything(), session_keys(world)
    answer = world.respond("not kept", world.responses[0], store=False)
    assert answer.status_code == 200
    assert session_keys(world) == keys  # continuing an earlier response wrote nothing
    assert world.everything() == before


def test_a_chat_turn_on_an_existing_session_appends_and_replaces_nothing(world: World) -> None:
    before = world.everything()
    assert world.chat(world.second, "one more").status_code == 200
    after = world.turns(world.second)
    assert after[:3] == before["second"] and len(after) == 4
    assert world.everything()["first"] == before["first"]


def test_deleting_a_response_leaves_its_session_and_the_rest(world: World) -> None:
    before = world.everything()
    gone = world.client.delete(f"/v1/responses/{world.responses[1]}", headers=world.a.headers)
    assert gone.status_code == 200
    assert world.respond("x", world.responses[1]).status_code == 404
    kept = world.client.get(f"/v1/responses/{world.responses[2]}", headers=world.a.headers)
    assert kept.json() == before["responses"][2]
    assert world.respond("go on", world.responses[2]).status_code == 200  # its session is whole
    after = world.everything()
    assert (after["first"], after["second"]) == (before["first"], before["second"])


def test_cancelling_a_response_changes_nothing(world: World) -> None:
    """Every response here is answered in the foreground: a stored one is complete, and a
    cancel is refused without touching it or its session."""
    before = world.everything()
    for response in world.responses:
        refused = world.client.post(f"/v1/responses/{response}/cancel", headers=world.a.headers)
        assert refused.status_code == 400, refused.text
    assert world.everything() == before
    items = world.client.get(
        f"/v1/responses/{world.responses[2]}/input_items", headers=world.a.headers
    )
    assert [i["content"][0]["text"] for i in items.json()["data"]][::2] == ["three", "two", "one"]


async def pending(world: World, session: str) -> str:
    now = time.time()
    function = {"name": "cancel_reservation", "arguments": '{"reservation_id": "X"}'}
    approval = Approval(new_approval_id(), world.a.name, session, "r1", "0" * 32, "tiny",
                        [{"id": "c1", "type": "function", "function": function}],
                        ("cancel_reservation",), None, now, now + 600)  # fmt: skip
    client = aioredis.Redis.from_url(world.redis_url)
    try:
        await RedisApprovals(client, keep_s=600).add(approval)
    finally:
        await client.aclose()
    return approval.id


def test_a_decision_decides_that_approval_only_and_once(world: World) -> None:
    mine = [asyncio.run(pending(world, s)) for s in (world.first, world.second)]

    def status(approval: str) -> str:
        answer = world.client.get(f"/v1/approvals/{approval}", headers=world.a.headers)
        return str(answer.json()["status"])

    decide = world.client.post(
        f"/v1/approvals/{mine[0]}", json={"decision": "deny"}, headers=world.a.headers
    )
    assert decide.status_code == 200
    assert [status(a) for a in mine] == ["denied", "pending"]
    again = world.client.post(
        f"/v1/approvals/{mine[0]}", json={"decision": "approve"}, headers=world.a.headers
    )
    assert again.status_code == 409
    assert [status(a) for a in mine] == ["denied", "pending"]


def test_keys_with_one_name_are_two_keys_and_revoking_one_keeps_the_other(world: World) -> None:
    made = [
        world.client.post(
            "/admin/keys", json={"tenant": world.a.name, "name": "ci"}, headers=ADMIN
        ).json()
        for _ in range(2)
    ]
    assert made[0]["id"] != made[1]["id"]
    for key in made:
        models = world.client.get("/v1/models", headers={"Authorization": f"Bearer {key['key']}"})
        assert models.status_code == 200
    assert world.client.delete(f"/admin/keys/{made[0]['id']}", headers=ADMIN).status_code == 200
    revoked, kept = (
        world.client.get("/v1/models", headers={"Authorization": f"Bearer {key['key']}"})
        for key in made
    )
    assert (revoked.status_code, kept.status_code) == (401, 200)
    listing = world.client.get("/admin/keys", params={"tenant": world.a.name}, headers=ADMIN)
    assert [k["id"] for k in listing.json()["data"]] == [made[1]["id"]]
    assert world.client.get("/v1/models", headers=world.a.headers).status_code == 200
