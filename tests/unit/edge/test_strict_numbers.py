"""Every number a client sends in a path, a query or a header (and an operator on the
command line) is ASCII digits or it is not a number: `²`, `①`, `١٢` and `１` are refused
with the answer a wrong number gets (400, or 404 where the API answers 404 for a turn or a
tool result that does not exist), never a 500; absurdly long digit strings too."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.tenants.cli import add_keys_parser
from gateway.untrusted.client_text import HUGE, ascii_number
from tests.unit.asgi_calls import call
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    two_tenant_policy,
)

NOT_ASCII = ["%C2%B2", "①", "%E2%91%A0", "١", "%D9%A1", "１", "%EF%BC%91", "+1", "%201", "1_0"]
LONG = "9" * 5000  # int() refuses past 4,300 digits


@dataclass
class World:
    client: TestClient
    a: Tenant
    session: str  # two turns, the first with a tool result (`m2`)


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    a, b = new_tenants()
    client, _ = open_gateway(two_tenant_policy(redis_url, a, b))
    session = f"s-{uuid.uuid4().hex}"
    call_ = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": None, "tool_calls": [call_]},
        {"role": "tool", "tool_call_id": "c1", "content": "tool result"},
    ]
    for _ in range(2):
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages},
            headers={**a.headers, "X-Session-Id": session},
        )
        assert answer.status_code == 200, answer.text
    try:
        yield World(client, a, session)
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


def test_only_ascii_digits_are_a_number() -> None:
    assert [ascii_number(t) for t in ("0", "7", "0012", "123456789012345678")] == [
        0,
        7,
        12,
        123456789012345678,
    ]
    for text in ("", "²", "①", "١٢", "１２", " 1", "1 ", "+1", "-1", "1_0", "1.0", "0x1"):
        assert ascii_number(text) is None, text
    assert ascii_number(LONG) == HUGE  # read as too big, at no cost
    assert ascii_number("0" * 40 + "5") == 5


@pytest.mark.parametrize("turn", [*NOT_ASCII, "0", "3", LONG])
def test_a_checkpoint_number_that_is_not_one_of_the_session_s_turns_is_404(
    world: World, turn: str
) -> None:
    answer = world.client.get(
        f"/v1/sessions/{world.session}/checkpoints/{turn}", headers=world.a.headers
    )
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "checkpoint_not_found"
    ok = world.client.get(f"/v1/sessions/{world.session}/checkpoints/2", headers=world.a.headers)
    assert ok.status_code == 200


@pytest.mark.parametrize("number", [*NOT_ASCII, LONG])
def test_an_artifact_handle_with_a_number_that_is_not_ascii_is_404(
    world: World, number: str
) -> None:
    answer = world.client.get(
        f"/v1/sessions/{world.session}/artifacts/m{number}", headers=world.a.headers
    )
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "artifact_not_found"
    ok = world.client.get(f"/v1/sessions/{world.session}/artifacts/m2", headers=world.a.headers)
    assert ok.status_code == 200


@pytest.mark.parametrize("limit", ["²", "①", "١٠", "１０", " 5", "0", "101", LONG])
def test_an_approvals_limit_that_is_not_an_ascii_number_in_range_is_400(
    world: World, limit: str
) -> None:
    answer = world.client.get("/v1/approvals", params={"limit": limit}, headers=world.a.headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "limit"
    assert world.client.get("/v1/approvals?limit=05", headers=world.a.headers).status_code == 200


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/responses", "/v1/sessions/x/fork"], ids=str
)
@pytest.mark.parametrize(("declared", "status"), [(b"\xb2", 400), (b"\xb9", 400), (b"1 0", 400),
                                                  (LONG.encode(), 413)])  # fmt: skip
def test_a_content_length_that_is_not_ascii_digits_is_400_and_a_huge_one_413(
    world: World, path: str, declared: bytes, status: int
) -> None:
    """`\\xb2` is `²` once a header is read as Latin-1, and `"²".isdigit()` is True."""
    body = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    key = world.a.headers["Authorization"].encode()
    answered = call(
        world.client,
        "POST",
        path,
        headers=((b"authorization", key), (b"content-length", declared)),
        body=body,
    )
    assert answered.status == status, bytes(answered.body)
    error = orjson.loads(bytes(answered.body))["error"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("value", ["١٢", "１２", "²", "+5", " 5", "5_0", LONG])
def test_gateway_keys_create_takes_only_ascii_numbers(value: str) -> None:
    parser = argparse.ArgumentParser()
    add_keys_parser(parser.add_subparsers(dest="command"), "policy.yaml")
    assert parser.parse_args(["keys", "create", "--tenant", "t", "--rpm", "12"]).rpm == 12
    for option in ("--rpm", "--tpm"):
        with pytest.raises(SystemExit):
            parser.parse_args(["keys", "create", "--tenant", "t", option, value])
