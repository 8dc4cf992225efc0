"""The Responses API's `custom` tools (OpenAI's free-form tools: text input under an
optional grammar, such as an `apply_patch` tool) in front of an engine that only knows
functions: offered as a function of one string, called back as a `custom_tool_call`, whole
and streamed, and a history's custom calls and outputs replayed to the engine. Through the
real app (engine twin, real Redis), answers checked against OpenAI's published schema; and
a LangGraph agent running LangChain's `custom_tool` through it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI, custom_tool

from gateway.policy import parse_policy
from tests.agent_graphs import tool_agent
from tests.fakes import Call, FakeUpstream, Scripted
from tests.grammars import APPLY_PATCH_LARK, PATCH
from tests.openapi_contract import violations
from tests.unit.clients import TINY_POLICY, OpenGateways

APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_LARK}}  # fmt: skip


def engine(call: Call) -> Scripted:
    """Calls apply_patch, as a function of one string, with PATCH."""
    body = orjson.loads(call.body)
    arguments = orjson.dumps({"input": PATCH}).decode()
    if body.get("stream"):
        start = {"index": 0, "id": "call_3", "type": "function",
                 "function": {"name": "apply_patch", "arguments": ""}}  # fmt: skip
        deltas = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [start]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": arguments[:20]}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": arguments[20:]}}]}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]  # fmt: skip
        chunks = [b"data: " + orjson.dumps(d) + b"\n\n" for d in deltas] + [b"data: [DONE]\n\n"]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    call_made = {"id": "call_3", "type": "function",
                 "function": {"name": "apply_patch", "arguments": arguments}}  # fmt: skip
    completion = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None, "tool_calls": [call_made]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@pytest.fixture
def opened(redis_url: str) -> Iterator[tuple[Any, FakeUpstream]]:
    gateways = OpenGateways()
    policy = TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n"
    yield gateways.open(parse_policy(policy), engine)
    gateways.close_all()


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "add hi.txt", "tools": [APPLY_PATCH], **fields}


def test_a_custom_tool_is_offered_as_a_function_and_called_back_as_custom(
    opened: tuple[Any, FakeUpstream],
) -> None:
    client, fake = opened
    answer = client.post("/v1/responses", json=request())
    assert answer.status_code == 200, answer.text
    assert "x-gateway-tools-dropped" not in answer.headers
    (offered,) = orjson.loads(fake.calls[-1].body)["tools"]
    function = offered["function"]
    assert (function["name"], function["description"]) == ("apply_patch", "Edit files.")
    assert function["parameters"]["required"] == ["input"]
    # the grammar in the string's schema, where the tool-call check applies it
    grammar = function["parameters"]["properties"]["input"]["x-grammar"]
    assert grammar == {"syntax": "lark", "definition": APPLY_PATCH_LARK}
    body = answer.json()
    assert violations("Response", body) == []
    (item,) = body["output"]
    assert (item["type"], item["name"], item["input"], item["call_id"]) == (
        "custom_tool_call", "apply_patch", PATCH, "call_3")  # fmt: skip


def test_a_streamed_custom_call_tells_its_input_whole(opened: tuple[Any, FakeUpstream]) -> None:
    client, _ = opened
    answer = client.post("/v1/responses", json=request(stream=True))
    events = [
        orjson.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")
    ]
    for event in events:
        assert violations("ResponseStreamEvent", event) == [], event["type"]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds  # JSON, not the input
    (delta,) = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert delta["delta"] == done["input"] == PATCH
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    assert (added["type"], added["name"], added["input"]) == ("custom_tool_call", "apply_patch", "")
    (item,) = events[-1]["response"]["output"]
    assert (item["type"], item["input"]) == ("custom_tool_call", PATCH)


def test_a_history_s_custom_calls_reach_the_engine_as_the_function_calls_they_were(
    opened: tuple[Any, FakeUpstream],
) -> None:
    client, fake = opened
    history = [
        {"type": "message", "role": "user", "content": "add hi.txt"},
        {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done."},
    ]
    answer = client.post("/v1/responses", json=request(input=history))
    assert answer.status_code == 200, answer.text
    messages = orjson.loads(fake.calls[-1].body)["messages"]
    call = messages[-2]["tool_calls"][0]
    assert call["function"] == {
        "name": "apply_patch",
        "arguments": orjson.dumps({"input": PATCH}).decode(),
    }
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_3", "content": "Done."}


def test_a_custom_tool_can_be_chosen_by_name(opened: tuple[Any, FakeUpstream]) -> None:
    client, fake = opened
    choice = {"type": "custom", "name": "apply_patch"}
    assert client.post("/v1/responses", json=request(tool_choice=choice)).status_code == 200
    sent = orjson.loads(fake.calls[-1].body)["tool_choice"]
    assert sent == {"type": "function", "function": {"name": "apply_patch"}}


def test_a_langgraph_agent_runs_a_custom_tool_and_continues(redis_url: str) -> None:
    """LangChain's `custom_tool` in a LangGraph agent over the Responses API: the agent gets
    the custom call, runs the tool with its free-form input, and sends the output back,
    which reaches the engine as the tool's result after the call it answers."""

    def engine_then_text(call: Call) -> Scripted:
        messages = orjson.loads(call.body)["messages"]
        if messages[-1]["role"] != "tool":
            return engine(call)
        completion = {
            "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Patched."}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        }  # fmt: skip
        return Scripted(body=orjson.dumps(completion))

    ran: list[str] = []

    @custom_tool
    def apply_patch(patch: str) -> str:
        """Edit files."""
        ran.append(patch)
        return "Done."

    gateways = OpenGateways()
    policy = TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n"
    client, fake = gateways.open(parse_policy(policy), engine_then_text)
    try:
        model = ChatOpenAI(
            model="tiny", base_url="http://testserver/v1", api_key="x",
            http_client=client, use_responses_api=True, output_version="responses/v1",
        )  # fmt: skip
        agent = tool_agent(model.bind_tools([apply_patch]), [apply_patch])
        state = agent.invoke({"messages": [HumanMessage("add hi.txt")]})
    finally:
        gateways.close_all()
    assert ran == [PATCH]
    final = state["messages"][-1]
    assert isinstance(final, AIMessage) and "Patched." in str(final.content)
    last = orjson.loads(fake.calls[-1].body)["messages"]
    call = last[-2]["tool_calls"][0]
    assert call["function"]["arguments"] == orjson.dumps({"input": PATCH}).decode()
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == call["id"]
    assert last[-1]["content"] == "Done."
