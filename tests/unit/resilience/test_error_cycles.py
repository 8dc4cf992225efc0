"""An answered error keeps nothing of its request alive: the request's body is freed by
reference counting when the answer is sent, not at the collector's next full pass.

An error's traceback holds every frame it passed through, locals included; a reference
cycle through it (a local still holding the error, a retry library's stored outcome)
kept a 50,000-token prompt per failed request until the collector ran: an error storm
against a dead replica grew the process by 700 MB once the young generation's threshold
was raised (docs/decisions.md, "The gateway's overhead")."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gateway.chat.inbound import InboundRequest
from gateway.policy import parse_policy
from tests.fakes import FakeUpstream, Scripted
from tests.unit.clients import TINY_POLICY, OpenGateways

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 50_000}]}


@pytest.fixture
def gateway(redis_url: str) -> Iterator[tuple[TestClient, FakeUpstream]]:
    gateways = OpenGateways()
    policy = parse_policy(TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n")
    yield gateways.open(policy, lambda call: Scripted(connect_refused=True))
    gateways.close_all()


def _requests_alive() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, InboundRequest))


def test_failed_requests_are_freed_without_the_collector(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = gateway
    gc.collect()
    gc.disable()
    try:
        before = _requests_alive()
        # The first goes through the retries (the replica refuses, leaves the rotation);
        # the later ones find no healthy replica at once.
        for _ in range(5):
            answer = client.post("/v1/chat/completions", json=BODY)
            assert answer.status_code == 503, answer.text
            assert _requests_alive() == before
    finally:
        gc.enable()
    assert fake.calls  # the engine was tried
