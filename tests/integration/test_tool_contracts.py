"""Tool-call contracts against real vLLM: the engine's own tool parser makes the calls, a
real gateway process checks them, the openai SDK and LangChain are the agents.

The tiny model's weights are random. To make it call a tool in a chosen way, vLLM's
structured outputs constrain its text to the Hermes call markup (as in test_approvals.py),
which vLLM's parser turns into real `tool_calls`: a valid call, a call to a tool the request
never declared, arguments that break the tool's schema. Left unconstrained it produces
whatever it produces; then no malformed call may ever arrive as a success."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.conftest import SHARED_DATA
from tests.integration.conftest import Engines, Gateway, running_gateway

pytestmark = pytest.mark.engine

TAU_TOOLS = json.loads(
    (SHARED_DATA / "agent-trajectories" / "tau_bench_airline_tools.json").read_text()
)
DETAILS: ChatCompletionFunctionToolParam = next(
    t for t in TAU_TOOLS if t["function"]["name"] == "get_reservation_details"
)
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Where is my reservation ZFA04Y?"}
]


def forced(name: str, arguments: str) -> dict[str, Any]:
    """The engine made to call `name` with exactly `arguments` (JSON text)."""
    markup = json.dumps({"name": name, "arguments": json.loads(arguments)})
    return {"structured_outputs": {"regex": "<tool_call>\n" + re.escape(markup) + "\n</tool_call>"}}


@pytest.fixture(scope="module")
def checking(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("tool-contracts")
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools:
  tiny-chat: {{served_model: tiny, engine_state: {engines.state_file}}}
models:
  tiny: {{pool: tiny-chat}}
  tiny-says: {{pool: tiny-chat}}
tool_calls:
  models:
    tiny-says: {{refuse_as: message}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway


def counts(gateway: Gateway, model: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(
            r'gateway_tool_calls_total\{model="([^"]+)",outcome="([^"]+)"\} (\S+)', line
        )
        if match and match.group(1) == model:
            found[match.group(2)] = float(match.group(3))
    return found


@pytest.fixture
def client(checking: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=checking.v1, api_key="unused", max_retries=0, timeout=120) as made:
        yield made


def test_a_valid_call_reaches_the_agent(client: openai.OpenAI, checking: Gateway) -> None:
    before = counts(checking, "tiny").get("valid", 0)
    answer = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[DETAILS], max_tokens=80, temperature=0,
        extra_body=forced("get_reservation_details", '{"reservation_id": "ZFA04Y"}'),
    )  # fmt: skip
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_reservation_details"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"reservation_id": "ZFA04Y"}  # type: ignore[union-attr]
    assert counts(checking, "tiny")["valid"] == before + 1


@pytest.mark.parametrize("stream", [False, True])
def test_an_undeclared_tool_is_asked_again_then_refused(
    client: openai.OpenAI, checking: Gateway, stream: bool
) -> None:
    before = counts(checking, "tiny")

    def ask() -> None:
        answer = client.chat.completions.create(
            model="tiny", messages=ASK, tools=[DETAILS], max_tokens=80, temperature=0,
            stream=stream, extra_body=forced("delete_everything", '{"all": true}'),
        )  # fmt: skip
        if stream:
            for _ in answer:
                pass

    with pytest.raises(openai.APIError) as raised:
        ask()
    assert "delete_everything" in str(raised.value)
    after = counts(checking, "tiny")
    assert after["refused"] == before.get("refused", 0) + 1
    if not stream:  # a whole answer is asked again once; a live stream is not
        assert after["reasked"] == before.get("reasked", 0) + 1


def test_a_call_that_breaks_the_schema_is_told_to_the_agent_framework(checking: Gateway) -> None:
    with httpx.Client(timeout=120) as http:
        llm = ChatOpenAI(
            base_url=checking.v1, api_key="unused", model="tiny-says", max_retries=0,
            http_client=http, max_tokens=80, temperature=0,
        )  # fmt: skip
        bound = llm.bind_tools([dict(DETAILS)]).bind(
            extra_body=forced("get_reservation_details", '{"reservation": 5}')
        )
        reply = bound.invoke([HumanMessage("Where is my reservation ZFA04Y?")])
    assert isinstance(reply, AIMessage)
    assert not reply.tool_calls  # never a malformed call as a success
    assert "'reservation_id' is a required property" in str(reply.content)
    assert counts(checking, "tiny-says")["refused"] >= 1


def test_whatever_the_random_model_calls_is_valid_or_refused(client: openai.OpenAI) -> None:
    """Unconstrained, tool_choice auto, as agents send it: every call that arrives as a
    success names a declared tool with arguments its schema accepts."""
    schema = DETAILS["function"]["parameters"]
    refusals: list[openai.APIStatusError] = []
    for seed in range(8):
        try:
            answer = client.chat.completions.create(
                model="tiny", messages=ASK, tools=[DETAILS], max_tokens=40, seed=seed,
                temperature=1.0,
            )  # fmt: skip
        except openai.APIStatusError as exc:
            refusals.append(exc)
            continue
        for call in answer.choices[0].message.tool_calls or ():
            assert call.function.name == "get_reservation_details"  # type: ignore[union-attr]
            jsonschema.validate(json.loads(call.function.arguments), schema)  # type: ignore[union-attr]
    for refusal in refusals:  # refused, never passed on: an OpenAI-shaped 502
        assert refusal.status_code == 502 and "invalid_tool_call" in refusal.response.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_reservation_details"}}],
    ids=["required", "named"],
)
def test_an_owed_call_arrives_valid_or_is_refused_never_as_text(
    client: openai.OpenAI, tool_choice: Any, stream: bool
) -> None:
    """`tool_choice` required or named, unconstrained by the request: vLLM 0.32's Hermes
    parser lets the random model write call markup whose arguments are no object (under
    `required`, text with no call at all; named, arguments like `Infinity`). Whatever
    arrives as a success is a call to the tool with arguments its schema accepts."""
    schema = DETAILS["function"]["parameters"]
    refusals: list[openai.APIError] = []
    for seed in range(3):
        try:
            made = owed_calls(client, tool_choice, stream, seed)
        except openai.APIError as exc:
            refusals.append(exc)
            continue
        assert made, "an answer that owed a call arrived without one"
        for name, arguments in made:
            assert name == "get_reservation_details"
            jsonschema.validate(json.loads(arguments), schema)
    for refusal in refusals:  # refused in an OpenAI shape, whole or in-stream
        assert "invalid_tool_call" in str(refusal) or "refused" in str(refusal), refusal


def owed_calls(
    client: openai.OpenAI, tool_choice: Any, stream: bool, seed: int
) -> list[tuple[str, str]]:
    """The (name, arguments) of each call the agent got, a stream's put together."""
    answer = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[DETAILS], max_tokens=48, seed=seed,
        temperature=1.0, tool_choice=tool_choice, stream=stream,
    )  # fmt: skip
    if not stream:
        return [
            (c.function.name, c.function.arguments)  # type: ignore[union-attr]
            for c in answer.choices[0].message.tool_calls or ()  # type: ignore[union-attr]
        ]
    calls: dict[int, tuple[str, str]] = {}
    for chunk in answer:
        for choice in chunk.choices:  # type: ignore[union-attr]
            for piece in choice.delta.tool_calls or ():
                function = piece.function
                name, arguments = calls.get(piece.index, ("", ""))
                calls[piece.index] = (
                    name + (function.name or "" if function else ""),
                    arguments + (function.arguments or "" if function else ""),
                )
    return list(calls.values())


def allowed_only(mode: str, *names: str) -> Any:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_allowed_tools_narrow_the_calls_and_keep_the_prompt_cached(
    client: openai.OpenAI,
) -> None:
    """OpenAI's `allowed_tools`, which vLLM does not take: every tau-bench tool stays in
    the prompt, so two turns allowing different tools send the engine the same prefix
    (the second is a prefix-cache hit), and a call to a tool left out never arrives."""
    tools: Any = TAU_TOOLS
    asked: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"Where is my reservation {uuid.uuid4().hex[:6]}?"}
    ]
    made = []
    for name, arguments in (("get_reservation_details", '{"reservation_id": "ZFA04Y"}'),
                            ("list_all_airports", "{}")):  # fmt: skip
        answer = client.chat.completions.create(
            model="tiny", messages=asked, tools=tools, max_tokens=80, temperature=0,
            tool_choice=allowed_only("auto", name), extra_body=forced(name, arguments),
        )  # fmt: skip
        made.append(answer)
    names = [m.choices[0].message.tool_calls[0].function.name for m in made]  # type: ignore[index,union-attr]
    assert names == ["get_reservation_details", "list_all_airports"]
    first, second = (m.usage for m in made)
    assert first is not None and second is not None
    assert first.prompt_tokens == second.prompt_tokens  # the same prompt: every tool in it
    cached = second.prompt_tokens_details.cached_tokens if second.prompt_tokens_details else 0
    assert cached and cached >= second.prompt_tokens - 32  # all but the last partial block
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model="tiny", messages=ASK, tools=tools, max_tokens=80, temperature=0,
            tool_choice=allowed_only("auto", "think"),
            extra_body=forced("get_reservation_details", '{"reservation_id": "ZFA04Y"}'),
        )  # fmt: skip
    assert raised.value.status_code == 502
    assert "`get_reservation_details` is not allowed" in raised.value.response.text


def shell(syntax: str, definition: str) -> Any:
    grammar = {"syntax": syntax, "definition": definition}
    return {"type": "custom", "custom": {"name": "shell", "description": "Runs a command.",
            "format": {"type": "grammar", "grammar": grammar}}}  # fmt: skip


SHELL = shell("regex", "(ls|pwd)( -l)?")


@pytest.mark.parametrize(
    ("tool", "refusal", "stream"),
    [
        (SHELL, "does not match", False),
        (SHELL, "does not match", True),
        (shell("lark", 'start: ("ls" | "pwd") (" -l")?'), "breaks the tool's grammar", False),
    ],
)
def test_custom_tools_are_called_as_custom_and_held_to_their_grammar(
    client: openai.OpenAI, tool: Any, refusal: str, stream: bool
) -> None:
    """OpenAI's custom tools on Chat Completions, which vLLM 0.32 does not take: offered as
    a function of one string (a Lark grammar in its schema, which the engine takes), the
    engine's parser makes a real call of it, and the agent gets a custom call; an input
    outside the tool's regex or Lark grammar is refused, never sent."""
    made: list[Any] = []
    for command in ("ls -l", "rm -rf /"):
        try:
            made.append(custom_calls(client, tool, command, stream))
        except openai.APIError as error:
            made.append(error)
    assert made[0] == [{"type": "custom", "custom": {"name": "shell", "input": "ls -l"}}]
    assert isinstance(made[1], openai.APIError), made[1]
    assert refusal in str(made[1])


def custom_calls(
    client: openai.OpenAI, tool: Any, command: str, stream: bool
) -> list[dict[str, Any]]:
    """The calls the agent got, each without its id (a stream's as its deltas came)."""
    answer = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[tool], max_tokens=80, temperature=0, stream=stream,
        extra_body=forced("shell", json.dumps({"input": command})),
    )  # fmt: skip
    if not stream:
        calls = answer.choices[0].message.tool_calls or ()  # type: ignore[union-attr]
        return [c.model_dump(exclude={"id"}) for c in calls]
    return [
        piece.model_dump(exclude={"id", "index"}, exclude_none=True)
        for chunk in answer
        for choice in chunk.choices  # type: ignore[union-attr]
        for piece in choice.delta.tool_calls or ()
    ]


def test_a_custom_call_in_the_history_keeps_the_prompt_cached(client: openai.OpenAI) -> None:
    """The next turn sends the custom call back: the engine is given the function call it
    made, the same bytes each time, so a repeated turn is a prefix-cache hit."""
    history: list[Any] = [
        {"role": "user", "content": f"List the files in {uuid.uuid4().hex[:8]}."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "custom", "custom": {"name": "shell", "input": "ls -l"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
    ]  # fmt: skip
    usages = []
    for _ in range(2):
        answer = client.chat.completions.create(
            model="tiny", messages=history, tools=[SHELL], max_tokens=4, tool_choice="none"
        )
        usages.append(answer.usage)
    first, second = usages
    assert first is not None and second is not None
    assert first.prompt_tokens == second.prompt_tokens
    cached = second.prompt_tokens_details.cached_tokens if second.prompt_tokens_details else 0
    assert cached and cached >= second.prompt_tokens - 32  # all but the last partial block
