"""Labels the gateway stores and writes into listings, audit entries and log lines (a
run-time key's name, a session id, a request id, a policy key's name; a reviewer's
reason: tests/unit/approvals/test_decisions.py) never carry a control character: CR, LF,
tab, escape, DEL, C1 and the Unicode line and paragraph separators are refused with a
400 naming the field (a load error in a policy), never stored as they came."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from starlette.testclient import TestClient

from gateway.errors import InvalidRequest
from gateway.policy import PolicyError, load_policy, parse_policy
from gateway.sessions.ids import check_session_id
from gateway.tenants.cli import add_keys_parser
from gateway.tenants.stored_keys import RedisKeys
from gateway.untrusted.client_text import check_label, control_character
from tests.policies import parse_with_redis
from tests.unit.asgi_calls import call
from tests.unit.tenant_gateway import (
    forget_tenants,
    new_tenants,
    open_gateway,
    sha256,
    two_tenant_yaml,
)

CONTROLS = ["a\r\nb", "a\nb", "a\rb", "a\tb", "a\x00b", "\x1b[31mred", "a\x7fb", "a\x85b",
            "a\x9bb", "a\u2028b", "a\u2029b", "ends\n"]  # fmt: skip
FINE = ["", "ci runner", "Zoë's laptop", "équipe — nuit", "東京", "🚀 deploy", "a" * 128]
ADMIN_KEY = f"sk-admin-{uuid.uuid4().hex}"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_control_characters_are_found_and_shown_escaped() -> None:
    assert [control_character(t) for t in ("a\nb", "\x1b", "x\u2028", "\x85")] == [
        "\\n",
        "\\x1b",
        "\\u2028",
        "\\x85",
    ]
    for text in FINE:
        assert control_character(text) is None
        assert check_label(text, param="name") == text
    with pytest.raises(InvalidRequest) as refused:
        check_label("a\r\nb", param="name")
    assert refused.value.param == "name" and "\\r" in refused.value.message


@pytest.fixture
def admin_client(redis_url: str) -> Iterator[tuple[TestClient, str]]:
    a, b = new_tenants()
    auth = f"{{key_cache_ttl_s: 0, admin_keys: [{{sha256: {sha256(ADMIN_KEY)}}}]}}"
    client, _ = open_gateway(parse_policy(two_tenant_yaml(redis_url, a, b, auth=auth)))
    try:
        yield client, a.name
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


@pytest.mark.parametrize("name", CONTROLS, ids=repr)
def test_a_run_time_key_name_with_a_control_character_is_400_and_not_stored(
    admin_client: tuple[TestClient, str], name: str
) -> None:
    client, tenant = admin_client
    answer = client.post("/admin/keys", json={"tenant": tenant, "name": name}, headers=ADMIN)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "name")
    listing = client.get("/admin/keys", params={"tenant": tenant}, headers=ADMIN)
    assert listing.json()["data"] == []


@pytest.mark.parametrize("name", FINE, ids=repr)
def test_any_other_run_time_key_name_is_kept_as_sent(
    admin_client: tuple[TestClient, str], name: str
) -> None:
    client, tenant = admin_client
    answer = client.post("/admin/keys", json={"tenant": tenant, "name": name}, headers=ADMIN)
    assert answer.status_code == 201, answer.text
    listing = client.get("/admin/keys", params={"tenant": tenant}, headers=ADMIN)
    assert [k["name"] for k in listing.json()["data"]] == [name]


async def test_the_key_store_itself_refuses_a_name_with_a_control_character(
    redis: aioredis.Redis,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    with pytest.raises(ValueError, match="control"):
        await RedisKeys(redis).create(tenant, name="ops\r\nroot")
    assert await RedisKeys(redis).of_tenant(tenant) == []


@pytest.mark.parametrize("name", ["ops\nroot", "a\u2028b", "\x1b[2J"], ids=repr)
def test_gateway_keys_create_refuses_a_name_with_a_control_character(name: str) -> None:
    parser = argparse.ArgumentParser()
    add_keys_parser(parser.add_subparsers(dest="command"), "policy.yaml")
    assert parser.parse_args(["keys", "create", "--tenant", "t", "--name", "Zoë"]).name == "Zoë"
    with pytest.raises(SystemExit):
        parser.parse_args(["keys", "create", "--tenant", "t", "--name", name])


@pytest.mark.parametrize("session_id", ["s1\n", "s1\r\n", "s\u20281", "s\t1"], ids=repr)
def test_a_session_id_with_a_control_character_is_no_session_id(session_id: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_session_id(session_id, param="session_id")
    assert refused.value.code == "invalid_session_id"


def test_a_body_session_id_with_a_trailing_newline_is_400(redis_url: str) -> None:
    policy = parse_with_redis(
        """\
version: 1
sessions: {key_from: [metadata, header]}
pools: {chat: {served_model: served, replicas: [{url: "http://a.test:1"}]}}
models: {tiny: {pool: chat}}
""",
        redis_url,
    )
    client, fake = open_gateway(policy)
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"session_id": "trip-42\n"}}  # fmt: skip
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_session_id"
        assert fake.calls == []
        path = client.get("/v1/sessions/trip-42%0A/checkpoints")
        assert path.status_code == 400 and path.json()["error"]["code"] == "invalid_session_id"
    finally:
        client.__exit__(None, None, None)


def test_a_request_id_with_a_trailing_newline_is_replaced_not_echoed(redis_url: str) -> None:
    policy = parse_with_redis(
        """\
version: 1
pools: {chat: {served_model: served, replicas: [{url: "http://a.test:1"}]}}
models: {tiny: {pool: chat}}
""",
        redis_url,
    )
    client, _ = open_gateway(policy)
    try:
        forged = call(client, "GET", "/v1/models", headers=((b"x-request-id", b"req-1\n"),))
        assert forged.status == 200
        assert forged.headers["x-request-id"] != "req-1\n"
        assert len(forged.headers["x-request-id"]) == 32  # one of the gateway's own
        kept = call(client, "GET", "/v1/models", headers=((b"x-request-id", b"req-1"),))
        assert kept.headers["x-request-id"] == "req-1"
    finally:
        client.__exit__(None, None, None)


def test_a_policy_key_name_with_a_control_character_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(f"""\
version: 1
pools: {{chat: {{served_model: served, replicas: [{{url: "http://a.test:1"}}]}}}}
models: {{tiny: {{pool: chat}}}}
tenants:
  acme:
    keys: [{{sha256: {"0" * 64}, name: "ops\\r\\nroot"}}]
auth:
  admin_keys: [{{sha256: {"1" * 64}, name: "\\u2028"}}]
""")
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    text = str(refused.value)
    assert "tenants.acme.keys[0].name" in text and "auth.admin_keys[0].name" in text
