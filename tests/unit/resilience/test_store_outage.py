"""A session store outage, per policy: fail open (served unsaved, X-Gateway-Degraded) or
fail closed (503, or an error event in place of [DONE]); nothing half-kept either way."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from starlette.responses import Response, StreamingResponse

from gateway.api.inference import render
from gateway.errors import GatewayError, StateUnavailable
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, Policy, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.request_context import RequestContext
from gateway.routing.router import RoundRobinRouter
from gateway.sessions.checkpoints import Checkpoint, Stored
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import MemoryCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.telemetry.metrics import GatewayMetrics
from tests.fakes import Call, FakeUpstream, Scripted

POLICY = """\
version: 1
sessions: {{on_store_outage: {mode}}}
pools:
  main: {{served_model: m, replicas: [{{url: "http://a.test:1"}}]}}
models:
  main: {{pool: main}}
"""
OK = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "fine"}}],
})  # fmt: skip
CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'


class Outage(MemoryCheckpoints):
    """Redis gone: for reads (`reads=True`) or only for the write of the turn."""

    def __init__(self, *, reads: bool) -> None:
        super().__init__()
        self._reads = reads

    async def load(self, session: SessionRef) -> list[Checkpoint]:
        if self._reads:
            raise StateUnavailable("The session store is unreachable (ConnectionError).")
        return await super().load(session)

    async def load_stored(self, session: SessionRef) -> Stored:
        if self._reads:
            raise StateUnavailable("The session store is unreachable (ConnectionError).")
        return await super().load_stored(session)

    async def append(self, *args: Any, **kwargs: Any) -> int:
        raise StateUnavailable("The session store is unreachable (ConnectionError).")


def engine(call: Call) -> Scripted:
    if orjson.loads(call.body).get("stream"):
        return Scripted(chunks=[CHUNK, b"data: [DONE]\n\n"], content_type="text/event-stream")
    return Scripted(body=OK)


def pipeline(mode: str, *, reads: bool) -> Pipeline:
    policy: Policy = parse_policy(POLICY.format(mode=mode))
    return Pipeline(
        policy, Fleet(policy), RoundRobinRouter(), FakeUpstream(engine),
        fingerprints=MemoryFingerprints(), metrics=GatewayMetrics(),
        sessions=SessionTurns(Outage(reads=reads), None),
    )  # fmt: skip


def ask(stream: bool = False) -> bytes:
    body = {"model": "main", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return orjson.dumps(body)


CONTEXT = RequestContext("r", session_id="s1")


@pytest.mark.parametrize("reads", [True, False])
async def test_fail_open_serves_the_turn_unsaved_and_says_so(reads: bool) -> None:
    response = render(
        await pipeline("fail_open", reads=reads).handle(Endpoint.chat, ask(), CONTEXT)
    )
    assert response.status_code == 200
    assert response.headers["x-gateway-degraded"] == "checkpoint"
    assert response.headers["x-gateway-session-turn"] == "unsaved"
    assert orjson.loads(bytes(response.body))["choices"][0]["message"]["content"] == "fine"


@pytest.mark.parametrize("reads", [True, False])
async def test_fail_closed_refuses_with_503(reads: bool) -> None:
    with pytest.raises(GatewayError) as refused:
        await pipeline("fail_closed", reads=reads).handle(Endpoint.chat, ask(), CONTEXT)
    assert refused.value.status == 503


async def test_fail_closed_stream_ends_with_an_error_event_not_done() -> None:
    response = render(
        await pipeline("fail_closed", reads=False).handle(Endpoint.chat, ask(stream=True), CONTEXT)
    )
    assert isinstance(response, StreamingResponse)
    events = [event async for event in response.body_iterator]
    text = b"".join(e if isinstance(e, bytes) else str(e).encode() for e in events)
    assert b"[DONE]" not in text
    assert b"unreachable" in text


async def test_without_a_session_an_outage_changes_nothing() -> None:
    response = render(
        await pipeline("fail_closed", reads=True).handle(Endpoint.chat, ask(), RequestContext("r"))
    )
    assert isinstance(response, Response)
    assert response.status_code == 200
    assert "x-gateway-degraded" not in response.headers
