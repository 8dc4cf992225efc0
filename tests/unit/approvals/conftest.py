"""A gateway that holds tau-bench's destructive airline tools for approval: real app, real
Redis, the engine's twin answering a `cancel_reservation` call (streamed when asked).

Tenant `acme` has an agent's key (`user`) and a reviewer's (`user`, `approver`); tenant
`rival` an approver key of its own. Tenant names are new per test and removed after it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.approvals.records import Approval, new_approval_id
from gateway.policy import parse_policy
from gateway.state.store import StateStore
from tests.conftest import SHARED_DATA
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.tenant_gateway import forget_tenants, sha256

_TOOLS = json.loads(
    (SHARED_DATA / "agent-trajectories" / "tau_bench_airline_tools.json").read_text()
)
TOOLS = {tool["function"]["name"]: tool for tool in _TOOLS}
AIRLINE = [TOOLS["cancel_reservation"], TOOLS["get_reservation_details"]]
CANCEL = ("cancel_reservation", '{"reservation_id": "ZFA04Y"}')
LOOKUP = ("get_reservation_details", '{"reservation_id": "ZFA04Y"}')


def key() -> str:
    return f"sk-agw-test-{uuid.uuid4().hex}"


@dataclass
class Keys:
    agent: str = field(default_factory=key)
    reviewer: str = field(default_factory=key)
    rival: str = field(default_factory=key)

    @staticmethod
    def bearer(value: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {value}"}


def policy_yaml(
    redis_url: str, acme: str, rival: str, keys: Keys, approvals: str, sample_ratio: float = 1
) -> str:
    return f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
auth: {{key_cache_ttl_s: 0}}
telemetry: {{traces: {{sample_ratio: {sample_ratio}}}, usage: {{enabled: false}}}}
pools:
  chat: {{served_model: served, replicas: [{{url: "http://a.test:1"}}]}}
models:
  tiny: {{pool: chat}}
tenants:
  {acme}:
    keys:
      - {{sha256: {sha256(keys.agent)}, name: agent}}
      - {{sha256: {sha256(keys.reviewer)}, name: reviewer, roles: [user, approver]}}
  {rival}:
    keys: [{{sha256: {sha256(keys.rival)}, name: rival, roles: [user, approver]}}]
approvals: {approvals}
"""


def completion(message: dict[str, Any], finish: str) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-engine",
            "object": "chat.completion",
            "created": 1,
            "model": "served",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }
    )


def chunks(message: dict[str, Any], finish: str, usage: bool) -> list[bytes]:
    head = {"id": "chatcmpl-engine", "object": "chat.completion.chunk", "created": 1}
    head["model"] = "served"

    def event(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    if message.get("content"):
        events.append(event({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        start = {"index": i, "id": call["id"], "type": "function"}
        events.append(event({"tool_calls": [{**start, "function": {"name": function["name"]}}]}))
        arguments = function["arguments"]
        for part in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
            events.append(event({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
    events.append(event({}, finish))
    if usage:
        tokens = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
        events.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": tokens}) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


def engine(*calls: tuple[str, str]) -> Callable[[Call], Scripted]:
    """An engine that answers a conversation ending with a tool result in words, and any
    other with `calls` (a cancellation by default)."""
    made = calls or (CANCEL,)

    def answer(call: Call) -> Scripted:
        body = orjson.loads(call.body)
        if body["messages"][-1]["role"] == "tool" or not body.get("tools"):
            message: dict[str, Any] = {"role": "assistant", "content": "Done."}
            finish = "stop"
        else:
            tool_calls = [
                {"id": f"chatcmpl-tool-{i}", "type": "function",
                 "function": {"name": name, "arguments": arguments}}
                for i, (name, arguments) in enumerate(made)
            ]  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
            finish = "tool_calls"
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Scripted(chunks=chunks(message, finish, usage), content_type="text/event-stream")
        return Scripted(body=completion(message, finish))

    return answer


@dataclass
class Held:
    """A gateway that holds calls, and who may talk to it."""

    client: TestClient
    fake: FakeUpstream
    keys: Keys
    acme: str
    rival: str
    spans: InMemorySpanExporter

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        key: str | None = None,
        session: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        **body: Any,
    ) -> Any:
        headers = Keys.bearer(key or self.keys.agent)
        if session is not None:
            headers["X-Session-Id"] = session
        request = {"model": "tiny", "messages": messages, "tools": tools or AIRLINE, **body}
        return self.client.post("/v1/chat/completions", json=request, headers=headers)

    def decide(
        self,
        approval: str,
        decision: str,
        *,
        key: str | None = None,
        traceparent: str | None = None,
        **extra: Any,
    ) -> Any:
        headers = Keys.bearer(key or self.keys.reviewer)
        if traceparent is not None:
            headers["traceparent"] = traceparent
        return self.client.post(
            f"/v1/approvals/{approval}", json={"decision": decision, **extra}, headers=headers
        )

    def get(self, path: str, *, key: str | None = None, **params: Any) -> Any:
        return self.client.get(path, params=params, headers=Keys.bearer(key or self.keys.agent))


OpenHeld = Callable[..., Held]


@pytest.fixture
async def tenant(redis: aioredis.Redis) -> AsyncIterator[str]:
    """A tenant name of this test's own; its keys are removed after it."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    async for key in redis.scan_iter(match=f"*{name}*"):
        await redis.delete(key)


@pytest.fixture
def held_gateway(redis_url: str) -> Iterator[OpenHeld]:
    opened: list[Held] = []

    def open_one(
        script: Callable[[Call], Scripted] | None = None,
        approvals: str = "{tools: [cancel_reservation, book_reservation]}",
        sample_ratio: float = 1,
    ) -> Held:
        suffix = uuid.uuid4().hex[:10]
        acme, rival, keys = f"acme-{suffix}", f"rival-{suffix}", Keys()
        policy = parse_policy(policy_yaml(redis_url, acme, rival, keys, approvals, sample_ratio))
        spans = InMemorySpanExporter()
        fake = FakeUpstream(script or engine())
        app = create_app(
            policy,
            upstream=fake,
            store=StateStore(policy.state),
            span_processor=SimpleSpanProcessor(spans),
        )
        client = TestClient(app)
        client.__enter__()
        opened.append(Held(client, fake, keys, acme, rival, spans))
        return opened[-1]

    yield open_one
    for held in opened:
        held.client.__exit__(None, None, None)
        forget_tenants(redis_url, held.acme, held.rival)


def pending_approval(
    tenant: str, *, session: str | None = "s1", at: float | None = None, ttl_s: float = 60
) -> Approval:
    """An approval as the gateway stores a held `cancel_reservation` call."""
    now = time.time() if at is None else at
    function = {"name": "cancel_reservation", "arguments": '{"reservation_id": "X"}'}
    return Approval(
        id=new_approval_id(),
        tenant=tenant,
        session=session,
        request_id="r1",
        trace_id="ab" * 16,
        model="tiny",
        tool_calls=[{"id": "c1", "type": "function", "function": function}],
        guarded=("cancel_reservation",),
        content="Cancelling now.",
        created_at=now,
        expires_at=now + ttl_s,
    )


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a stream's body (without [DONE])."""
    found = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            found.append(orjson.loads(line[6:]))
    return found
