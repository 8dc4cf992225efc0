"""Chat Completions' `custom` tools (OpenAI's free-form tools: text input under an optional
grammar) in front of an engine that only knows functions: offered as a function of one
string, called back as `{"type": "custom", "custom": {"name", "input"}}`, whole and
streamed; a regex grammar held as the input's pattern; a history's custom calls replayed
as the function calls they were. Through the real app (engine twin, real Redis) with the
real `openai` SDK, answers checked against OpenAI's published schema."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import orjson
import pytest
from starlette.testclient import TestClient

from gateway.chat.custom_tools import custom_call_events, to_functions
from gateway.policy import parse_policy
from tests.fakes import Call, FakeUpstream, Scripted
from tests.openapi_contract import violations
from tests.unit.clients import TINY_POLICY, OpenGateways

SHELL = {"type": "custom", "custom": {"name": "shell", "description": "Runs a command.",
         "format": {"type": "grammar", "grammar": {"syntax": "regex",
                                                   "definition": "(ls|pwd)( -l)?"}}}}  # fmt: skip
NOTE = {"type": "custom", "custom": {"name": "note"}}  # free text


def lark_shell(definition: str) -> dict[str, Any]:
    grammar = {"syntax": "lark", "definition": definition}
    return {"type": "custom", "custom": {"name": "shell", "description": "Runs a command.",
            "format": {"type": "grammar", "grammar": grammar}}}  # fmt: skip


SHELL_LARK = lark_shell('start: ("ls" | "pwd") (" -l")?')
WEATHER = {"type": "function", "function": {"name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip


def engine_calling(command: str) -> Any:
    """An engine that calls `shell`, as a function of one string, with `command`."""
    arguments = orjson.dumps({"input": command}).decode()

    def engine(call: Call) -> Scripted:
        if orjson.loads(call.body).get("stream"):
            start = {"index": 0, "id": "call_7", "type": "function",
                     "function": {"name": "shell", "arguments": ""}}  # fmt: skip
            deltas = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [start]}}]},
                {"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": arguments[:9]}}]}}]},
                {"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": arguments[9:]}}]}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            ]  # fmt: skip
            chunks = [b"data: " + orjson.dumps(d) + b"\n\n" for d in deltas]
            return Scripted(chunks=[*chunks, b"data: [DONE]\n\n"], content_type="text/event-stream")
        made = {"id": "call_7", "type": "function",
                "function": {"name": "shell", "arguments": arguments}}  # fmt: skip
        completion = {
            "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                         "message": {"role": "assistant", "content": None, "refusal": None,
                                     "tool_calls": [made]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        }  # fmt: skip
        return Scripted(body=orjson.dumps(completion))

    return engine


def open_gateway(redis_url: str, command: str, steps: str = "") -> tuple[Any, Any]:
    gateways = OpenGateways()
    policy = TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n" + steps
    client, fake = gateways.open(parse_policy(policy), engine_calling(command))
    return (client, fake), gateways


@pytest.fixture
def app(redis_url: str) -> Iterator[tuple[TestClient, FakeUpstream]]:
    opened, gateways = open_gateway(redis_url, "ls -l")
    yield opened
    gateways.close_all()


def sdk(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)


def ask(client: TestClient, **fields: Any) -> Any:
    messages = fields.pop("messages", [{"role": "user", "content": "List the files."}])
    tools = fields.pop("tools", [SHELL, NOTE, WEATHER])
    return sdk(client).chat.completions.create(
        model="tiny", messages=messages, tools=tools, **fields
    )


def sent(fake: FakeUpstream) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(fake.calls[-1].body)
    return body


def test_custom_tools_are_offered_as_functions_and_called_back_as_custom(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    reply = ask(client)
    offered = {t["function"]["name"]: t for t in sent(fake)["tools"]}
    shell, note = offered["shell"], offered["note"]
    assert offered["get_weather"] == WEATHER  # function tools pass as they came
    assert (shell["type"], shell["function"]["name"]) == ("function", "shell")
    assert shell["function"]["description"] == "Runs a command."
    argument = shell["function"]["parameters"]["properties"]["input"]
    assert argument["type"] == "string"
    assert argument["pattern"] == "^(?:(ls|pwd)( -l)?)$"  # the whole input must match
    assert "(ls|pwd)( -l)?" in argument["description"]
    assert "pattern" not in note["function"]["parameters"]["properties"]["input"]
    (call,) = reply.choices[0].message.tool_calls
    assert call.type == "custom"
    assert (call.id, call.custom.name, call.custom.input) == ("call_7", "shell", "ls -l")
    assert violations("CreateChatCompletionResponse", reply.model_dump(exclude_unset=True)) == []


def test_a_streamed_custom_call_is_sent_whole_once_complete(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    calls = []
    for chunk in ask(client, stream=True):
        for choice in chunk.choices:
            calls += [c.model_dump(exclude_none=True) for c in choice.delta.tool_calls or []]
    assert calls == [{"index": 0, "id": "call_7", "type": "custom",
                      "custom": {"name": "shell", "input": "ls -l"}}]  # fmt: skip


def test_a_call_against_the_regex_grammar_never_arrives_as_a_success(redis_url: str) -> None:
    (client, fake), gateways = open_gateway(redis_url, "rm -rf /")
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            ask(client)
        assert refused.value.status_code == 502
        assert "does not match" in str(refused.value) or "pattern" in str(refused.value)
        stream = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "stream": True, "tools": [SHELL],
                  "messages": [{"role": "user", "content": "List the files."}]},
        )  # fmt: skip
        assert '"tool_calls"' not in stream.text  # no call, only the refusal
        assert "invalid_tool_call" in stream.text
        assert len(fake.calls) >= 2
    finally:
        gateways.close_all()


@pytest.mark.parametrize(("command", "passes"), [("pwd -l", True), ("rm -rf /", False)])
def test_every_call_is_held_to_its_lark_grammar(redis_url: str, command: str, passes: bool) -> None:
    (client, _), gateways = open_gateway(redis_url, command)
    try:
        if passes:
            answer = ask(client, tools=[SHELL_LARK]).choices[0].message.model_dump()
            assert answer["tool_calls"][0]["custom"] == {"name": "shell", "input": command}
            return
        with pytest.raises(openai.APIStatusError) as refused:
            ask(client, tools=[SHELL_LARK])
        assert refused.value.status_code == 502
        assert "breaks the tool's grammar at byte 0" in str(refused.value)
    finally:
        gateways.close_all()


def test_a_history_s_custom_calls_reach_the_engine_as_the_function_calls_they_were(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    messages = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_7", "type": "custom", "custom": {"name": "shell", "input": "ls -l"}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "a.txt"},
    ]  # fmt: skip
    for _ in range(2):
        ask(client, messages=messages)
    first, second = (orjson.loads(c.body) for c in fake.calls[-2:])
    assert first["messages"] == second["messages"]  # the same bytes every turn
    (call,) = first["messages"][1]["tool_calls"]
    assert call == {"id": "call_7", "type": "function",
                    "function": {"name": "shell", "arguments": '{"input":"ls -l"}'}}  # fmt: skip
    assert first["messages"][2] == messages[2]


def test_a_custom_tool_can_be_chosen_by_name_or_allowed(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    ask(client, tool_choice={"type": "custom", "custom": {"name": "shell"}})
    assert sent(fake)["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "custom", "custom": {"name": "shell"}}]}}  # fmt: skip
    ask(client, tool_choice=allowed)  # one allowed tool, required: the engine is told its name
    assert sent(fake)["tool_choice"] == {"type": "function", "function": {"name": "shell"}}


def test_malformed_custom_tools_and_calls_are_a_400_naming_where(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "custom", "custom": {}}]}, "tools[0].custom.name"),
        ({"tools": [{"type": "custom"}]}, "tools[0].custom.name"),
        ({"tool_choice": {"type": "custom", "custom": {}}}, "tool_choice.custom.name"),
        ({"tools": [lark_shell("start: undefined_rule")]},
         "tools[0].custom.format.grammar.definition"),
        (
            {"tools": [WEATHER], "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [
                    {"id": "c", "type": "custom", "custom": {"name": "shell", "input": "ls"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "a.txt"}]},
            "messages[1].tool_calls[0]",
        ),
    ]  # fmt: skip
    for fields, param in cases:
        body: dict[str, Any] = {"model": "tiny", "tools": [SHELL],
                "messages": [{"role": "user", "content": "x"}], **fields}  # fmt: skip
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400, (param, answer.text)
        assert answer.json()["error"]["param"] == param


def test_requests_without_custom_tools_are_not_rewritten() -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}
    assert to_functions(body) is None
    assert to_functions({"model": "tiny", "messages": []}) is None


async def test_an_unchecked_stream_s_custom_call_is_told_when_its_choice_finishes() -> None:
    """Without the gateway's tool-call check the engine's deltas come in pieces: the call
    is held until the next call of its choice begins or the choice finishes."""
    pieces = ['{"inp', 'ut": "pw', 'd"}']
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c0",
            "type": "function", "function": {"name": "shell", "arguments": ""}}]}}]},
        *({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": p}}]}}]} for p in pieces[:2]),
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": pieces[2][:-1]}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "c1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip

    async def source() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"

    out = [e async for e in custom_call_events(frozenset({"shell"}))(source())]
    parsed = [orjson.loads(e[6:]) for e in out if not e.startswith(b"data: [DONE]")]
    calls = [c for p in parsed for c in p["choices"][0]["delta"].get("tool_calls", [])]
    assert calls == [
        {"index": 0, "id": "c0", "type": "custom", "custom": {"name": "shell", "input": '{"input": "pwd"'}},
        {"index": 1, "id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{}"}},
    ]  # fmt: skip
    assert parsed[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1] == b"data: [DONE]\n\n"


def test_a_custom_tool_s_input_is_analyzed_as_the_policy_declares(redis_url: str) -> None:
    """Analyzers name a custom tool's input `/input`: a free-form shell tool (as coding
    agents declare one) whose command deletes is denied by what it does, grammar or not."""
    shell = {"type": "custom", "custom": {"name": "shell"}}  # free text: no grammar
    analyzed = (
        "tool_calls:\n  tools:\n    shell:\n      arguments:\n"
        "        - {pointer: /input, language: shell, effects: {deletes: deny}}\n"
    )
    for command, allowed in (("ls -l", True), ("rm -rf build", False)):
        (client, _), gateways = open_gateway(redis_url, command, analyzed)
        try:
            if allowed:
                (call,) = ask(client, tools=[shell]).choices[0].message.tool_calls
                assert call.custom.input == command
                continue
            with pytest.raises(openai.APIStatusError) as refused:
                ask(client, tools=[shell])
            assert refused.value.status_code == 502
            assert "deletes" in str(refused.value)
        finally:
            gateways.close_all()


def test_a_legacy_history_beside_custom_tools_is_translated_both_ways(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    messages = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"role": "function", "name": "get_weather", "content": "12 C"},
    ]  # fmt: skip
    reply = ask(client, messages=messages)
    (call,) = reply.choices[0].message.tool_calls
    assert (call.type, call.custom.input) == ("custom", "ls -l")
    body = sent(fake)
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_fn_1"
    assert body["messages"][2]["role"] == "tool"
    assert {t["function"]["name"] for t in body["tools"]} == {"shell", "note", "get_weather"}
