"""Legacy `functions` / `function_call`: sent to the engine as tools, answered in the shape
the client asked in; through the real app (engine twin, real Redis) with the real `openai`
SDK, whole and streamed, and the translation itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from starlette.testclient import TestClient

from gateway.chat.legacy_functions import to_function_call, to_tools
from gateway.errors import InvalidRequest
from gateway.policy import parse_policy
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import TINY_POLICY, OpenGateways

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = {"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip


def engine(call: Call) -> Scripted:
    """Calls the first tool it is given (none given: answers in text)."""
    body = orjson.loads(call.body)
    calls = bool(body.get("tools"))
    if body.get("stream"):
        if calls:
            deltas = [
                b'{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,'
                b'"id":"call_9","type":"function","function":{"name":"get_weather",'
                b'"arguments":""}}]}}]}',
                b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
                b'{"arguments":"{\\"city\\": \\"Oslo\\"}"}}]}}]}',
                b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
            ]
        else:
            deltas = [b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}']
        chunks = [b"data: " + d + b"\n\n" for d in deltas] + [b"data: [DONE]\n\n"]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    message: dict[str, Any] = {"role": "assistant", "content": "hi"}
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    completion = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@pytest.fixture
def app(redis_url: str) -> Iterator[tuple[TestClient, FakeUpstream]]:
    gateways = OpenGateways()
    policy = parse_policy(TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n")
    yield gateways.open(policy, engine)
    gateways.close_all()


def sdk(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)


def ask_weather(client: TestClient, **fields: Any) -> Any:
    """The SDK's create, asking for the weather in Oslo with these fields."""
    messages = fields.pop("messages", [{"role": "user", "content": "Weather in Oslo?"}])
    return sdk(client).chat.completions.create(model="tiny", messages=messages, **fields)


def sent(fake: FakeUpstream) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(fake.calls[-1].body)
    return body


def test_functions_reach_the_engine_as_tools_and_the_call_comes_back_as_function_call(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    reply = ask_weather(client, functions=[WEATHER], function_call={"name": "get_weather"})
    body = sent(fake)
    assert body["tools"] == [{"type": "function", "function": WEATHER}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "functions" not in body and "function_call" not in body
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.function_call is not None
    assert choice.message.function_call.name == "get_weather"
    assert choice.message.function_call.arguments == '{"city": "Oslo"}'
    assert not choice.message.tool_calls


def test_a_streamed_call_comes_back_as_function_call_deltas(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    stream = ask_weather(client, functions=[WEATHER], stream=True)
    name, arguments, reasons = "", "", []
    for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.tool_calls
            if choice.delta.function_call is not None:
                name += choice.delta.function_call.name or ""
                arguments += choice.delta.function_call.arguments or ""
            reasons.append(choice.finish_reason)
    assert (name, arguments) == ("get_weather", '{"city": "Oslo"}')
    assert reasons[-1] == "function_call"


def test_a_legacy_history_is_sent_as_tool_calls_with_stable_ids(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"role": "function", "name": "get_weather", "content": "12 C, rain"},
    ]  # fmt: skip
    for _ in range(2):
        ask_weather(client, messages=messages, functions=[WEATHER], function_call="auto")
    first, second = (orjson.loads(c.body) for c in fake.calls[-2:])
    assert first["messages"] == second["messages"]  # the same bytes every turn
    assistant, result = first["messages"][1], first["messages"][2]
    assert assistant["tool_calls"] == [{"id": "call_fn_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]  # fmt: skip
    assert "function_call" not in assistant
    assert result == {"role": "tool", "tool_call_id": "call_fn_1", "content": "12 C, rain"}
    assert first["tool_choice"] == "auto"


def test_requests_without_legacy_fields_are_not_touched(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    # A schema with a property named "functions": the bytes look legacy, the fields are not.
    schema = {"type": "object", "properties": {"functions": {"type": "string"}}}
    tool = {"type": "function", "function": {**WEATHER, "parameters": schema}}
    assert b'"functions"' in orjson.dumps(tool)
    assert to_tools({"model": "tiny", "messages": [], "tools": [tool]}) is None
    reply = ask_weather(client, tools=[tool])
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls
    assert sent(fake)["tools"] == [tool]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"functions": {"name": "x"}}, "functions"),
        ({"functions": [{"description": "no name"}]}, "functions[0].name"),
        ({"functions": [WEATHER], "tools": []}, "functions"),
        ({"function_call": "always"}, "function_call"),
        ({"function_call": "auto", "tool_choice": "auto"}, "function_call"),
        ({"messages": [{"role": "assistant", "function_call": "x"}]}, "messages[0].function_call"),
    ],
)
def test_malformed_legacy_fields_are_a_400_naming_the_field(
    body: dict[str, Any], param: str, app: tuple[TestClient, FakeUpstream]
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        to_tools({"model": "tiny", "messages": [{"role": "user", "content": "x"}], **body})
    assert refused.value.param == param
    client, _ = app
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], **body},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_an_answer_without_calls_keeps_its_shape() -> None:
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                               "finish_reason": "stop"}]}  # fmt: skip
    assert to_function_call(completion) == completion
