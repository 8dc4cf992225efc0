"""A conversation the agent names itself (`prompt_cache_key`) keeps its replica, without any
header of ours; through the real app (engine twin, real Redis)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.policy import parse_policy
from gateway.prompt.blocks import client_conversation
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
pools:
  chat:
    served_model: served-tiny
    replicas: [{url: "http://a.test:1"}, {url: "http://b.test:1"}]
models:
  tiny: {pool: chat}
"""


def engine(call: Call) -> Scripted:
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@pytest.fixture
def app(redis_url: str) -> Iterator[tuple[TestClient, FakeUpstream]]:
    gateways = OpenGateways()
    yield gateways.open(parse_policy(POLICY + f"state: {{redis_url: '{redis_url}'}}\n"), engine)
    gateways.close_all()


def test_requests_naming_one_prompt_cache_key_stay_on_one_replica(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    replicas, reasons = set(), set()
    for n in range(8):  # different first messages: eight implicit conversations otherwise
        body = {"model": "tiny", "prompt_cache_key": "codex-session-42",
                "messages": [{"role": "user", "content": f"task {n}"}]}  # fmt: skip
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200
        replicas.add(answer.headers["x-gateway-replica"])
        reasons.add(answer.headers["x-gateway-route"].split(";")[0])
    assert len(replicas) == 1
    assert reasons == {"session"}


def test_the_responses_api_passes_the_key_on(app: tuple[TestClient, FakeUpstream]) -> None:
    client, fake = app
    body = {"model": "tiny", "input": "hi", "store": False, "prompt_cache_key": "thread-7"}
    assert client.post("/v1/responses", json=body).status_code == 200
    assert orjson.loads(fake.calls[-1].body)["prompt_cache_key"] == "thread-7"


def test_only_a_short_string_is_a_key() -> None:
    assert client_conversation({"prompt_cache_key": "abc"}) == "pck:abc"
    for value in ("", "x" * 201, 42, None):
        assert client_conversation({"prompt_cache_key": value}) is None
