"""The app in front of one engine twin that answers every chat the same: for the tests
that show a request refused before any engine is asked, and one within bounds passed on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
pools:
  chat:
    served_model: served-tiny
    serves: [chat, completions, embeddings]
    replicas: [{url: "http://a.test:1"}]
models:
  tiny: {pool: chat}
"""
COMPLETION = (
    b'{"id":"c1","object":"chat.completion","created":1,"model":"served-tiny",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
)


@pytest.fixture
def gateway(redis_url: str) -> Iterator[tuple[TestClient, FakeUpstream]]:
    """The app (model `tiny`) and the engine twin that records what it was asked."""

    def answered(call: Call) -> Scripted:
        return Scripted(body=COMPLETION)

    gateways = OpenGateways()
    yield gateways.open(parse_with_redis(POLICY, redis_url), answered)
    gateways.close_all()
