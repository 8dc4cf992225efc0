"""An engine's 200 whose answer has the wrong shape (`choices` a number, a string or a list
of non-objects, a message or delta that is no object, tool calls of the wrong type, a
usage that is no object or counts that are no numbers) is the engine's failure: a 502
`upstream_error` saying so, whole or through the Responses API, never a 500; a stream
already started ends with an error event instead of `[DONE]` (`error` in the Responses
API), and the turn is not kept."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.policy import parse_policy
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
state: {{redis_url: "{redis_url}"}}
pools:
  chat: {{served_model: served-tiny, replicas: [{{url: "http://a.test:1"}}]}}
models:
  tiny: {{pool: chat}}
"""
MESSAGE = {"role": "assistant", "content": "fine"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def with_message(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {**MESSAGE, **fields}, "finish_reason": "stop"}]}


WHOLE: dict[str, dict[str, Any]] = {
    "choices an integer": {"choices": 5},
    "choices a string": {"choices": "fine"},
    "choices of non-objects": {"choices": [1, 2]},
    "message a string": {"choices": [{"index": 0, "message": "fine"}]},
    "content a number": with_message(content=5),
    "tool_calls an integer": with_message(tool_calls=5),
    "tool_calls of non-objects": with_message(tool_calls=[5]),
    "function a number": with_message(tool_calls=[{**CALL, "function": 5}]),
    "arguments an object": with_message(
        tool_calls=[{**CALL, "function": {"name": "lookup", "arguments": {"id": 1}}}]
    ),
    "usage a number": {**with_message(), "usage": 5},
    "usage counts strings": {**with_message(), "usage": {"prompt_tokens": "9"}},
    "text a number": {"choices": [{"index": 0, "text": 5}]},
    "usage details a list": {
        **with_message(),
        "usage": {"prompt_tokens": 9, "prompt_tokens_details": [1]},
    },
}


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


STREAMED: dict[str, dict[str, Any]] = {
    "choices an integer": {"choices": 5},
    "choices of non-objects": {"choices": [1]},
    "delta a number": {"choices": [{"index": 0, "delta": 5}]},
    "content a number": delta(content=5),
    "tool_calls of non-objects": delta(tool_calls=[5]),
    "tool call index a string": delta(tool_calls=[{"index": "x", "function": {"name": "f"}}]),
    "usage a number": {"choices": [], "usage": 5},
}


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def engine(whole: dict[str, Any], streamed: dict[str, Any], first: bool) -> Any:
    """Answers whole with `whole`; streams a good first chunk then `streamed` (or `streamed`
    first), then a good end."""

    def answer(call: Call) -> Scripted:
        if not orjson.loads(call.body).get("stream"):
            return Scripted(body=orjson.dumps({"id": "c", "object": "chat.completion", **whole}))
        good = {"id": "c", "object": "chat.completion.chunk", "model": "served-tiny"}
        chunks = [event({**good, **delta(role="assistant", content="fi")}), event(streamed)]
        if first:
            chunks.reverse()
        chunks += [
            event({**good, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            b"data: [DONE]\n\n",
        ]
        return Scripted(chunks=chunks, content_type="text/event-stream")

    return answer


@pytest.fixture
def gateways() -> Iterator[OpenGateways]:
    opened = OpenGateways()
    yield opened
    opened.close_all()


def open_gateway(
    gateways: OpenGateways,
    redis_url: str,
    whole: dict[str, Any] | None = None,
    streamed: dict[str, Any] | None = None,
    *,
    first: bool = False,
) -> tuple[TestClient, FakeUpstream]:
    script = engine(whole or with_message(), streamed or delta(content="ne"), first)
    return gateways.open(parse_policy(POLICY.format(redis_url=redis_url)), script)


def is_engine_error(error: dict[str, Any]) -> bool:
    return error["type"] == "upstream_error" and "engine" in error["message"]


@pytest.mark.parametrize("shape", list(WHOLE))
@pytest.mark.parametrize("session", [False, True], ids=["plain", "session"])
def test_a_whole_answer_of_the_wrong_shape_is_a_502_naming_the_engine(
    gateways: OpenGateways, redis_url: str, shape: str, session: bool
) -> None:
    client, _ = open_gateway(gateways, redis_url, WHOLE[shape])
    headers = {"X-Session-Id": f"s-{uuid.uuid4().hex}"} if session else {}
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        headers=headers,
    )
    assert answer.status_code == 502, answer.text
    assert is_engine_error(answer.json()["error"]), answer.text
    if session:  # the failed turn is not kept
        listing = client.get(f"/v1/sessions/{headers['X-Session-Id']}/checkpoints")
        assert listing.status_code == 404


@pytest.mark.parametrize("shape", list(WHOLE))
def test_the_responses_api_answers_a_whole_answer_of_the_wrong_shape_with_a_502(
    gateways: OpenGateways, redis_url: str, shape: str
) -> None:
    client, _ = open_gateway(gateways, redis_url, WHOLE[shape])
    answer = client.post("/v1/responses", json={"model": "tiny", "input": "hi"})
    assert answer.status_code == 502, answer.text
    assert is_engine_error(answer.json()["error"])


def stream_events(client: TestClient, path: str, body: dict[str, Any], **headers: str) -> bytes:
    with client.stream("POST", path, json={**body, "stream": True}, headers=headers) as response:
        assert response.status_code == 200
        return b"".join(response.iter_raw())


def ends_with_engine_error(raw: bytes) -> bool:
    last = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    error = orjson.loads(last.removeprefix(b"data: "))["error"]
    return b"[DONE]" not in raw and is_engine_error(error)


@pytest.mark.parametrize("shape", list(STREAMED))
def test_a_first_stream_chunk_of_the_wrong_shape_ends_the_stream_with_an_error_event(
    gateways: OpenGateways, redis_url: str, shape: str
) -> None:
    client, fake = open_gateway(gateways, redis_url, streamed=STREAMED[shape], first=True)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    raw = stream_events(client, "/v1/chat/completions", chat)
    assert ends_with_engine_error(raw), raw
    assert fake.responses[0].aborted


@pytest.mark.parametrize("shape", list(STREAMED))
def test_a_kept_turn_s_stream_chunk_of_the_wrong_shape_ends_it_with_an_error_and_no_turn(
    gateways: OpenGateways, redis_url: str, shape: str
) -> None:
    client, _ = open_gateway(gateways, redis_url, streamed=STREAMED[shape])
    session = f"s-{uuid.uuid4().hex}"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    raw = stream_events(client, "/v1/chat/completions", chat, **{"X-Session-Id": session})
    assert ends_with_engine_error(raw), raw
    assert client.get(f"/v1/sessions/{session}/checkpoints").status_code == 404


@pytest.mark.parametrize("shape", list(STREAMED))
@pytest.mark.parametrize("store", [True, False], ids=["stored", "not-stored"])
def test_a_responses_stream_chunk_of_the_wrong_shape_ends_it_with_an_error_event(
    gateways: OpenGateways, redis_url: str, shape: str, store: bool
) -> None:
    client, _ = open_gateway(gateways, redis_url, streamed=STREAMED[shape])
    raw = stream_events(client, "/v1/responses", {"model": "tiny", "input": "hi", "store": store})
    events = [
        orjson.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")
    ]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "error" and "response.completed" not in kinds, kinds
    assert "engine" in events[-1]["message"]


def test_well_shaped_answers_still_pass_byte_for_byte(
    gateways: OpenGateways, redis_url: str
) -> None:
    client, fake = open_gateway(gateways, redis_url)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    whole = client.post("/v1/chat/completions", json=chat)
    assert whole.status_code == 200 and whole.content == fake.responses[0]._script.body
    raw = stream_events(client, "/v1/chat/completions", chat)
    assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
