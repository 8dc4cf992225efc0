"""The Anthropic Messages API through the real app (engine twin, real Redis), with the real
`anthropic` SDK: whole and streamed answers, tools and a forced tool call, the history's
tool blocks, count_tokens, usage, errors in Anthropic's shape, and each stream checked
against Anthropic's published event order and its SDK's event types."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import orjson
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from starlette.testclient import TestClient

from gateway.anthropic.convert import chat_request
from gateway.policy import parse_policy
from gateway.policy.loader import PolicyError
from tests.fakes import FakeUpstream
from tests.unit.anthropic.twin import WEATHER, engine
from tests.unit.clients import TINY_POLICY, OpenGateways


def sdk(client: TestClient) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=client)


def sent(fake: FakeUpstream) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(fake.calls[-1].body)
    return body


ASK: Any = [{"role": "user", "content": "Weather in Oslo?"}]


def test_a_whole_message_is_answered_in_anthropic_terms(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    message = sdk(client).messages.create(
        model="tiny",
        max_tokens=64,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=9f2e;"},
            {"type": "text", "text": "Be brief. "},
            {"type": "text", "text": "Be kind."},
        ],
        messages=ASK,
        stop_sequences=["END"],
        extra_body={"temperature": 0.2, "top_k": 5},  # older clients' fields: still taken
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "tiny"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Sunny today"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    # vLLM's cached tokens are Anthropic's cache reads; input_tokens is the rest
    assert message.usage.input_tokens == 8
    assert message.usage.cache_read_input_tokens == 32
    assert message.usage.output_tokens == 3
    body = sent(fake)
    assert fake.calls[-1].url.endswith("/v1/chat/completions")
    assert body["messages"] == [  # the per-request billing hash is no part of the prefix
        {"role": "system", "content": "Be brief. Be kind."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    assert body["max_tokens"] == 64 and body["stop"] == ["END"]
    assert body["temperature"] == 0.2 and body["top_k"] == 5


def test_a_forced_tool_call_comes_back_as_a_tool_use_block(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    message = sdk(client).messages.create(
        model="tiny",
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    body = sent(fake)
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"],
        "description": "The weather in a city."}}]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("call_9", "get_weather", {"city": "Oslo"})


def test_the_history_s_tool_blocks_become_chat_tool_calls_and_results(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    # as Claude Code sends it (the SDK's types have no `system` role; Claude Code's do)
    answer = client.post(
        "/v1/messages",
        json=dict(
            model="tiny",
            max_tokens=64,
            tools=[WEATHER],
            messages=[
                *ASK,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "12C"}],
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
                {"role": "system", "content": "<reminder>be brief</reminder>"},
            ],
        ),
    )
    assert answer.status_code == 200
    assert sent(fake)["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12C"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "system", "content": "<reminder>be brief</reminder>"},  # kept in its place
    ]  # fmt: skip


def test_documents_search_results_and_anthropic_s_own_tool_blocks_in_a_history(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """Text documents and search results (RAG clients send them) reach the engine as text,
    title first; the calls and results of a tool Anthropic ran (a history from its API,
    with web search) are left out, as the engine ran none; the assistant's text stays."""
    client, fake = app
    messages: Any = [
        {"role": "user", "content": [
            {"type": "document", "title": "Sky report", "context": "From 2026.",
             "source": {"type": "text", "media_type": "text/plain", "data": "The sky is green."}},
            {"type": "search_result", "source": "https://example.com/sky", "title": "Sky",
             "content": [{"type": "text", "text": "Green, mostly."}]},
            {"type": "text", "text": "What colour is the sky?"}]},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "sky colour"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "Green."}]},
        {"role": "user", "content": [
            {"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]}},
            {"type": "text", "text": "And this?"}]},
    ]  # fmt: skip
    answer = sdk(client).messages.create(model="tiny", max_tokens=8, messages=messages)
    assert answer.content[0].type == "text"
    assert sent(fake)["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "Sky report\n\nFrom 2026.\n\nThe sky is green."},
            {"type": "text", "text": "Sky\nhttps://example.com/sky\n\nGreen, mostly."},
            {"type": "text", "text": "What colour is the sky?"}]},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": [
            {"type": "text", "text": "Part one.\nPart two."},
            {"type": "text", "text": "And this?"}]},
    ]  # fmt: skip


def events_of(response: Any) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events as (name, data), each validated as the SDK's own event type."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = orjson.loads(lines["data"])
        assert data["type"] == lines["event"]
        if data["type"] not in ("ping", "error"):
            pydantic.TypeAdapter(RawMessageStreamEvent).validate_python(data)
        events.append((lines["event"], data))
    return events


def in_published_order(names: list[str]) -> bool:
    """Anthropic's documented flow: message_start; each content block as a start, deltas
    and a stop; message_delta(s); message_stop. Pings may come anywhere after the start."""
    names = [name for name in names if name != "ping"]
    if names[:1] != ["message_start"] or names[-1:] != ["message_stop"]:
        return False
    body = names[1:-1]
    while body and body[0] == "content_block_start":
        stop = body.index("content_block_stop")
        if any(name != "content_block_delta" for name in body[1:stop]):
            return False
        body = body[stop + 1 :]
    return bool(body) and all(name == "message_delta" for name in body)


@pytest.mark.parametrize("forced", [False, True])
def test_streams_follow_anthropic_s_event_order_and_the_sdk_rebuilds_the_message(
    app: tuple[TestClient, FakeUpstream], forced: bool
) -> None:
    client, fake = app
    fields: dict[str, Any] = {"tools": [WEATHER]}
    if forced:
        fields["tool_choice"] = {"type": "any"}
    request = {"model": "tiny", "max_tokens": 64, "messages": ASK, "stream": True, **fields}
    raw = client.post("/v1/messages", json=request)
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = events_of(raw)
    assert in_published_order([name for name, _ in events])
    assert sent(fake)["stream_options"] == {"include_usage": True}
    with sdk(client).messages.stream(**{k: v for k, v in request.items() if k != "stream"}) as s:
        message = s.get_final_message()
    if forced:
        assert sent(fake)["tool_choice"] == "required"
        assert message.stop_reason == "tool_use"
        (block,) = message.content
        assert block.type == "tool_use" and block.input == {"city": "Oslo"}
    else:
        assert message.stop_reason == "end_turn"
        assert [b.text for b in message.content if b.type == "text"] == ["Sunny today"]
    assert message.usage.output_tokens == 3
    assert message.usage.cache_read_input_tokens == 32
    assert message.usage.input_tokens == 8


def test_count_tokens_asks_the_engine_s_own_tokenizer(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    counted = sdk(client).messages.count_tokens(
        model="tiny", system="Be brief.", messages=ASK, tools=[WEATHER]
    )
    assert counted.input_tokens == 42
    call = fake.calls[-1]
    assert call.url.endswith("/tokenize")
    asked = orjson.loads(call.body)
    assert asked["model"] == "served-tiny" and asked["add_generation_prompt"] is True
    assert asked["messages"][0] == {"role": "system", "content": "Be brief."}
    assert asked["tools"][0]["function"]["name"] == "get_weather"


def test_tools_the_engine_cannot_run_are_left_out_and_named(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    search: Any = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    raw = sdk(client).messages.with_raw_response.create(
        model="tiny", max_tokens=8, messages=ASK, tools=[search, WEATHER]
    )
    assert raw.headers["x-gateway-tools-dropped"] == "web_search"
    assert [t["function"]["name"] for t in sent(fake)["tools"]] == ["get_weather"]


def test_a_strict_tool_is_sent_strict_and_its_input_examples_described(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """`strict` asks the engine to hold the call to the schema; `input_examples` reach the
    model in the only place a chat template shows a tool's words, its description."""
    client, fake = app
    tool: Any = {**WEATHER, "strict": True, "defer_loading": True,
                 "input_examples": [{"city": "Oslo"}, {"city": "Lima"}]}  # fmt: skip
    sdk(client).messages.create(model="tiny", max_tokens=8, messages=ASK, tools=[tool])
    (function,) = [t["function"] for t in sent(fake)["tools"]]
    assert function["strict"] is True
    assert function["description"] == (
        'The weather in a city.\n\nExamples of input:\n{"city":"Oslo"}\n{"city":"Lima"}'
    )
    bad = {**WEATHER, "input_examples": "Oslo"}
    answer = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8,
                                               "messages": ASK, "tools": [bad]})  # fmt: skip
    assert answer.status_code == 400
    assert "input_examples" in answer.json()["error"]["message"]


def test_claude_code_s_session_keeps_its_conversation_together(
    redis_url: str, gateways: OpenGateways
) -> None:
    """`metadata.user_id` names Claude Code's session: a routing key always, a session
    kept in Redis when `sessions.key_from` lists `client`."""
    policy = parse_policy(
        TINY_POLICY
        + f"state: {{redis_url: '{redis_url}'}}\nsessions: {{key_from: [header, client]}}\n"
    )
    client, fake = gateways.open(policy, engine)
    conversation = str(uuid.uuid4())
    user_id = f"user_abc123_account__session_{conversation}"
    raw = sdk(client).messages.with_raw_response.create(
        model="tiny", max_tokens=8, messages=ASK, metadata={"user_id": user_id}
    )
    session = f"claude:{conversation}"
    assert sent(fake)["prompt_cache_key"] == session
    assert raw.headers["x-gateway-session"] == session
    assert raw.headers["x-gateway-session-turn"] == "1"


@pytest.mark.parametrize(
    ("request_body", "status", "kind", "sdk_error"),
    [
        (
            {"model": "tiny", "messages": ASK},
            400,
            "invalid_request_error",
            anthropic.BadRequestError,
        ),
        (
            {"model": "nope", "max_tokens": 8, "messages": ASK},
            404,
            "not_found_error",
            anthropic.NotFoundError,
        ),
        (
            {"model": "tiny", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
            400,
            "invalid_request_error",
            anthropic.BadRequestError,
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": ASK,
                "tools": [{"name": "t", "input_schema": "no"}],
            },
            400,
            "invalid_request_error",
            anthropic.BadRequestError,
        ),
        *(  # user blocks the engine cannot be given, or that give it nothing
            (
                {
                    "model": "tiny",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": [block]}],
                },
                400,
                "invalid_request_error",
                anthropic.BadRequestError,
            )
            for block in (
                {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/"}},
                {"type": "document", "source": {"type": "url", "url": "http://169.254.169.254/"}},
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": "JVBERi0=",
                    },
                },
                {"type": "document", "source": {"type": "file", "file_id": "file_1"}},
                {"type": "text", "text": ""},
            )
        ),
    ],
)
def test_bad_requests_get_anthropic_s_error_shape_and_status(
    app: tuple[TestClient, FakeUpstream],
    request_body: dict[str, Any],
    status: int,
    kind: str,
    sdk_error: type[anthropic.APIStatusError],
) -> None:
    client, fake = app
    calls = len(fake.calls)
    raw = client.post("/v1/messages", json=request_body)
    assert raw.status_code == status
    body = raw.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert isinstance(body["error"]["message"], str) and body["request_id"]
    assert len(fake.calls) == calls  # refused before any engine was asked
    if "max_tokens" not in request_body:
        return  # the SDK itself insists on it
    with pytest.raises(sdk_error) as raised:
        sdk(client).messages.create(**request_body)
    assert raised.value.status_code == status


def test_other_methods_and_broken_json_get_anthropic_errors_too(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    wrong = client.get("/v1/messages")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    broken = client.post("/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["type"] == "error"
    unknown = client.post("/v1/messages/batches", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_a_model_s_defaults_fill_what_the_request_leaves_out(
    redis_url: str, gateways: OpenGateways
) -> None:
    """`models.<alias>.defaults`: for clients that cannot be configured (Claude Code sends
    no `stop`, no `temperature`); what the request sends wins."""
    policy = parse_policy(
        TINY_POLICY.replace(
            "tiny: {pool: chat}", "tiny: {pool: chat, defaults: {stop: ['\\n'], temperature: 0.3}}"
        )
        + f"state: {{redis_url: '{redis_url}'}}\n"
    )
    client, fake = gateways.open(policy, engine)
    sdk(client).messages.create(model="tiny", max_tokens=8, messages=ASK, stop_sequences=["X"])
    assert sent(fake)["stop"] == ["X"] and sent(fake)["temperature"] == 0.3
    with pytest.raises(PolicyError, match="cannot set messages"):
        parse_policy(
            TINY_POLICY.replace(
                "tiny: {pool: chat}", "tiny: {pool: chat, defaults: {messages: []}}"
            )
        )


@pytest.mark.parametrize(
    ("metadata", "header", "conversation"),
    [
        (
            {"user_id": '{"device_id":"d1","account_uuid":"","session_id":"b9e1d13c-3bf2"}'},
            None,
            "claude:b9e1d13c-3bf2",
        ),  # Claude Code 2.1
        (
            {"user_id": "user_9f_account_a1_session_8d0e9f5c-1c1a"},
            None,
            "claude:8d0e9f5c-1c1a",
        ),  # earlier versions
        ({"user_id": "alice"}, None, None),  # a user, not a conversation
        ({"user_id": '{"session_id": "no spaces allowed"}'}, None, None),
        (None, "b9e1d13c-3bf2-43b6", "claude:b9e1d13c-3bf2-43b6"),  # X-Claude-Code-Session-Id
        (
            {"user_id": "user_9f_account_a1_session_8d0e9f5c-1c1a"},
            "b9e1d13c-3bf2",
            "claude:b9e1d13c-3bf2",
        ),  # the header wins
        (None, "not a {session}", None),
    ],
)
def test_claude_code_s_session_is_read_from_its_header_or_metadata(
    metadata: Any, header: str | None, conversation: str | None
) -> None:
    request = {"model": "m", "max_tokens": 1, "messages": ASK, "metadata": metadata}
    assert chat_request(request, header).conversation == conversation


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_that_breaks_its_schema_never_reaches_the_client_as_a_tool_use(
    app: tuple[TestClient, FakeUpstream], stream: bool
) -> None:
    """The engine calls get_weather with a city name where the declared schema wants an
    integer: asked again once, then refused in Anthropic's error shape (gateway/toolcalls/)."""
    client, fake = app
    strict_weather = {**WEATHER, "input_schema": {
        "type": "object", "properties": {"city": {"type": "integer"}}, "required": ["city"]}}  # fmt: skip
    request = {"model": "tiny", "max_tokens": 64, "messages": ASK, "tools": [strict_weather],
               "tool_choice": {"type": "any"}, "stream": stream}  # fmt: skip
    answer = client.post("/v1/messages", json=request)
    assert len(fake.calls) == 2  # the request, then one re-ask
    if not stream:
        assert answer.status_code == 502
        error = answer.json()
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "city: 'Oslo' is not of type 'integer'" in error["error"]["message"]
        return
    events = events_of(answer)
    assert events[-1][0] == "error" and "tool call was refused" in str(events[-1][1])
    starts = [data for name, data in events if name == "content_block_start"]
    assert all(block["content_block"]["type"] != "tool_use" for block in starts)
