"""The stream relay never holds an event back, and always gives the replica back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import cast

import pytest
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Message, Scope

from gateway.api.inference import render
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.request_context import RequestContext
from gateway.routing.router import RoundRobinRouter
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import MemoryCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.telemetry.metrics import GatewayMetrics
from tests.fakes import Call, FakeUpstream, Scripted

POLICY = parse_policy(
    "pools: {p: {served_model: m, replicas: [{url: 'http://a.test:1'}]}}\nmodels: {m: {pool: p}}\n"
)
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true}'


def make_pipeline(fleet: Fleet, upstream: FakeUpstream) -> Pipeline:
    return Pipeline(
        POLICY,
        fleet,
        RoundRobinRouter(),
        upstream,
        fingerprints=MemoryFingerprints(),
        metrics=GatewayMetrics(),
    )


class GatedUpstream(FakeUpstream):
    """An engine whose next chunk is released by the test, one at a time."""

    def __init__(self) -> None:
        super().__init__(lambda call: Scripted())
        self.gate: asyncio.Queue[bytes] = asyncio.Queue()

    async def post(self, url, body, headers, *, connect_timeout_s):  # type: ignore[no-untyped-def]
        response = await super().post(url, body, headers, connect_timeout_s=connect_timeout_s)
        gate = self.gate

        async def next_chunk() -> bytes:
            return await gate.get()

        response.next_chunk = next_chunk  # type: ignore[method-assign]
        return response


async def test_each_event_is_forwarded_before_the_next_one_exists() -> None:
    upstream = GatedUpstream()
    fleet = Fleet(POLICY)
    pipeline = make_pipeline(fleet, upstream)
    response = render(await pipeline.handle(Endpoint.chat, BODY, RequestContext("rid")))
    assert isinstance(response, StreamingResponse)
    events = cast(AsyncGenerator[bytes, None], response.body_iterator)

    await upstream.gate.put(b"data: 1\n\n")
    assert await asyncio.wait_for(events.__anext__(), 1) == b"data: 1\n\n"
    await upstream.gate.put(b"data: 2\n\ndata: [DO")
    assert await asyncio.wait_for(events.__anext__(), 1) == b"data: 2\n\n"
    await upstream.gate.put(b"NE]\n\n")
    assert await asyncio.wait_for(events.__anext__(), 1) == b"data: [DONE]\n\n"
    await upstream.gate.put(b"")
    with pytest.raises(StopAsyncIteration):
        await events.__anext__()
    assert fleet.pools["p"].replicas[0].inflight == 0


async def test_events_one_read_completed_go_out_in_one_write() -> None:
    """Several events in one read of the engine's body are one write to the client (the
    same bytes, no later); a converter reading events still gets them one at a time."""
    upstream = GatedUpstream()
    fleet = Fleet(POLICY)
    pipeline = make_pipeline(fleet, upstream)
    served = await pipeline.handle(Endpoint.chat, BODY, RequestContext("rid"))
    response = render(served)
    assert isinstance(response, StreamingResponse)
    writes = cast(AsyncGenerator[bytes, None], response.body_iterator)
    await upstream.gate.put(b"data: 1\n\ndata: 2\n\ndata: 3")
    assert await asyncio.wait_for(writes.__anext__(), 1) == b"data: 1\n\ndata: 2\n\n"
    await upstream.gate.put(b"\n\ndata: [DONE]\n\n")
    assert await asyncio.wait_for(writes.__anext__(), 1) == b"data: 3\n\ndata: [DONE]\n\n"
    await upstream.gate.put(b"")
    with pytest.raises(StopAsyncIteration):
        await writes.__anext__()

    upstream = GatedUpstream()
    served = await make_pipeline(Fleet(POLICY), upstream).handle(
        Endpoint.chat, BODY, RequestContext("rid")
    )
    assert served.stream is not None
    events = served.stream.events()
    for chunk in (b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n", b""):
        await upstream.gate.put(chunk)
    assert [event async for event in events] == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b"data: [DONE]\n\n",
    ]


async def test_client_going_away_aborts_the_engine_request() -> None:
    upstream = GatedUpstream()
    fleet = Fleet(POLICY)
    pipeline = make_pipeline(fleet, upstream)
    response = render(await pipeline.handle(Endpoint.chat, BODY, RequestContext("rid")))
    assert isinstance(response, StreamingResponse)
    events = cast(AsyncGenerator[bytes, None], response.body_iterator)
    await upstream.gate.put(b"data: 1\n\n")
    assert await events.__anext__() == b"data: 1\n\n"
    await events.aclose()  # what Starlette does when the client disconnects
    assert upstream.responses[0].aborted
    assert fleet.pools["p"].replicas[0].inflight == 0


def test_fake_is_scripted_per_call() -> None:
    fake = FakeUpstream(lambda call: Scripted(status=201 if call.url.endswith("x") else 200))
    assert asyncio.run(fake.post("http://h/x", b"", {}, connect_timeout_s=1)).status == 201
    assert isinstance(fake.calls[0], Call)


async def test_response_cancelled_before_its_first_byte_still_frees_the_replica() -> None:
    upstream = GatedUpstream()
    fleet = Fleet(POLICY)
    pipeline = make_pipeline(fleet, upstream)
    response = render(await pipeline.handle(Endpoint.chat, BODY, RequestContext("rid")))
    assert fleet.pools["p"].replicas[0].inflight == 1

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        raise OSError("client went away")  # before the status line could be written

    scope: Scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        await response(scope, receive, send)
    assert fleet.pools["p"].replicas[0].inflight == 0
    assert upstream.responses[0].aborted


async def test_a_session_turn_is_checkpointed_before_done_is_forwarded() -> None:
    upstream = FakeUpstream(
        lambda call: Scripted(
            chunks=[
                b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
                b"data: [DONE]\n\n",
            ],
            content_type="text/event-stream",
        )
    )
    store = MemoryCheckpoints()
    pipeline = Pipeline(
        POLICY,
        Fleet(POLICY),
        RoundRobinRouter(),
        upstream,
        fingerprints=MemoryFingerprints(),
        metrics=GatewayMetrics(),
        sessions=SessionTurns(store),
    )
    forwarded: list[bytes] = []
    seen_at_checkpoint: list[list[bytes]] = []
    append = store.append

    async def recording_append(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen_at_checkpoint.append(list(forwarded))
        return await append(*args, **kwargs)

    store.append = recording_append  # type: ignore[method-assign]
    response = render(
        await pipeline.handle(Endpoint.chat, BODY, RequestContext("r", session_id="s"))
    )
    async for event in cast(StreamingResponse, response).body_iterator:
        forwarded.append(event.encode() if isinstance(event, str) else bytes(event))
    assert forwarded[-1] == b"data: [DONE]\n\n"
    assert seen_at_checkpoint == [forwarded[:1]]  # the content was out, [DONE] was not
    assert store.turns[SessionRef("default", "s")][0].reply == {
        "role": "assistant",
        "content": "hi",
    }
