"""Tool calls checked on the request path (the pipeline, the engine's twin): valid calls
pass untouched, repairable ones are repaired, an invalid one is asked again, escalated or
refused as the policy says, whole and streamed, and every outcome is counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway.errors import InvalidToolCall
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.request_context import RequestContext
from gateway.routing.router import RoundRobinRouter
from gateway.telemetry.metrics import GatewayMetrics
from tests.conftest import SHARED_DATA
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.approvals.conftest import chunks, completion

_TOOLS = json.loads(
    (SHARED_DATA / "agent-trajectories" / "tau_bench_airline_tools.json").read_text()
)
TOOLS = [t for t in _TOOLS if t["function"]["name"] in ("get_reservation_details", "think")]
GOOD = '{"reservation_id": "ZFA04Y"}'

POLICY = """\
pools:
  small: {served_model: s, replicas: [{url: 'http://a.test:1'}]}
  large: {served_model: l, replicas: [{url: 'http://b.test:1'}]}
models: {m: {pool: small}}
"""


def policy(tool_calls: str = "") -> str:
    return POLICY + (f"tool_calls: {tool_calls}\n" if tool_calls else "")


TEXT = None  # an answer in text, no call: (TEXT, what it says)


class Engine:
    """Answers each request with the next scripted call (name, arguments), or with text
    (TEXT, the text) cut short by `max_tokens`."""

    def __init__(self, *answers: tuple[str | None, str]) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, call: Call) -> Scripted:
        body = orjson.loads(call.body)
        self.calls.append(body)
        name, arguments = self.answers[min(len(self.calls), len(self.answers)) - 1]
        message: dict[str, Any] = {"role": "assistant", "content": arguments}
        finish = "length"
        if name is not TEXT:
            finish = "tool_calls"
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call-1", "type": "function",
                     "function": {"name": name, "arguments": arguments}}
                ],
            }  # fmt: skip
        if body.get("stream"):
            return Scripted(chunks=chunks(message, finish, True), content_type="text/event-stream")
        return Scripted(body=completion(message, finish))


def make(policy_text: str, engine: Callable[[Call], Scripted]) -> tuple[Pipeline, GatewayMetrics]:
    parsed = parse_policy(policy_text)
    metrics = GatewayMetrics()
    pipeline = Pipeline(
        parsed,
        Fleet(parsed),
        RoundRobinRouter(),
        FakeUpstream(engine),
        fingerprints=MemoryFingerprints(),
        metrics=metrics,
    )
    return pipeline, metrics


def body(stream: bool = False, **extra: Any) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Where is my reservation ZFA04Y?"}],
            "tools": TOOLS,
            "stream": stream,
            **extra,
        }
    )


async def answer(pipeline: Pipeline, stream: bool = False, **extra: Any) -> dict[str, Any]:
    """The first choice's message (a stream's put together from what the client got)."""
    served = await pipeline.handle(Endpoint.chat, body(stream, **extra), RequestContext("rid"))
    if not stream:
        message: dict[str, Any] = orjson.loads(served.body)["choices"][0]["message"]
        return message
    assert served.stream is not None
    content, calls = "", []
    async for event in served.stream.events():
        for line in bytes(event).splitlines():
            if not line.startswith(b"data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise AssertionError(chunk)
            for choice in chunk.get("choices") or ():
                delta = choice["delta"]
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or ():
                    # every call arrives whole, in one delta
                    assert call["function"]["name"] and call["id"]
                    orjson.loads(call["function"]["arguments"])
                    calls.append(call)
    return {"content": content, "tool_calls": calls}


def counted(metrics: GatewayMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "gateway_tool_calls_total", {"model": "m", "outcome": outcome}
    )
    return value or 0.0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_valid_call_passes_as_the_engine_made_it(stream: bool) -> None:
    engine = Engine(("get_reservation_details", GOOD))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, stream)
    assert message["tool_calls"][0]["function"]["arguments"] == GOOD
    assert len(engine.calls) == 1 and counted(metrics, "valid") == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "sent",
    ['```json\n{"reservation_id": "ZFA04Y"}\n```', '{"reservation_id": "ZFA04Y"'],
    ids=["code_fence", "closed_json"],
)
async def test_an_unambiguous_repair_is_made_without_asking_again(sent: str, stream: bool) -> None:
    engine = Engine(("get_reservation_details", sent))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, stream)
    assert orjson.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "reservation_id": "ZFA04Y"
    }
    assert len(engine.calls) == 1 and counted(metrics, "repaired") == 1


async def test_an_invalid_call_is_asked_again_with_what_was_wrong() -> None:
    engine = Engine(("get_reservation_details", '{"id": 5}'), ("get_reservation_details", GOOD))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline)
    assert message["tool_calls"][0]["function"]["arguments"] == GOOD
    assert len(engine.calls) == 2
    first, again = engine.calls
    assert again["messages"][: len(first["messages"])] == first["messages"]  # same prefix
    assert "'reservation_id' is a required property" in again["messages"][-1]["content"]
    assert counted(metrics, "reasked") == 1 and counted(metrics, "valid") == 1


async def test_an_undeclared_tool_is_refused_as_an_error_when_asking_again_fails() -> None:
    engine = Engine(("delete_everything", "{}"))
    pipeline, metrics = make(policy(), engine)
    with pytest.raises(InvalidToolCall, match="`delete_everything` was not declared"):
        await answer(pipeline)
    assert len(engine.calls) == 2  # once, then one re-ask: never without bound
    assert counted(metrics, "reasked") == 1 and counted(metrics, "refused") == 1


async def test_a_refusal_can_be_the_assistant_saying_why() -> None:
    engine = Engine(("get_reservation_details", "{not json"))
    pipeline, metrics = make(policy("{on_invalid: [refuse], refuse_as: message}"), engine)
    message = await answer(pipeline)
    assert not message.get("tool_calls")
    assert "not valid JSON" in message["content"]
    assert len(engine.calls) == 1 and counted(metrics, "refused") == 1


async def test_a_stream_is_refused_in_stream_and_never_shows_half_a_call() -> None:
    engine = Engine(("get_reservation_details", '{"reservation_id": 5}'))
    pipeline, metrics = make(policy(), engine)
    served = await pipeline.handle(Endpoint.chat, body(True), RequestContext("rid"))
    assert served.stream is not None
    seen = b"".join([bytes(e) async for e in served.stream.events()])
    assert b'"code":"invalid_tool_call"' in seen
    assert b"tool_calls" not in seen.split(b'"error"')[0]
    assert counted(metrics, "refused") == 1


async def test_the_policy_can_send_tools_strict_so_the_engine_constrains_them() -> None:
    engine = Engine(("get_reservation_details", GOOD))
    pipeline, _ = make(policy("{strict: [get_reservation_details]}"), engine)
    await answer(pipeline)
    sent = {t["function"]["name"]: t["function"].get("strict") for t in engine.calls[0]["tools"]}
    assert sent == {"get_reservation_details": True, "think": None}


async def test_checks_off_pass_any_call() -> None:
    engine = Engine(("delete_everything", "{"))
    pipeline, metrics = make(policy("{check: false}"), engine)
    message = await answer(pipeline)
    assert message["tool_calls"][0]["function"]["name"] == "delete_everything"
    assert counted(metrics, "valid") == 0


async def test_a_stream_with_an_invalid_call_is_settled_by_asking_again() -> None:
    """Text would have flowed; the invalid call is held, asked again unstreamed when the
    engine's answer ends, and the re-asked call finishes the stream."""
    engine = Engine(("get_reservation_details", '{"id": 5}'), ("get_reservation_details", GOOD))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, stream=True)
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [GOOD]
    assert [c.get("stream") for c in engine.calls] == [True, None]  # the re-ask is whole
    assert counted(metrics, "reasked") == 1 and counted(metrics, "valid") == 1


async def test_a_stream_refused_as_a_message_finishes_as_text() -> None:
    engine = Engine(("nope", "{}"))
    pipeline, metrics = make(policy("{refuse_as: message}"), engine)
    served = await pipeline.handle(Endpoint.chat, body(True), RequestContext("rid"))
    assert served.stream is not None
    seen = b"".join([bytes(e) async for e in served.stream.events()])
    assert b"`nope` was not declared" in seen and b'"finish_reason":"stop"' in seen
    assert b'"tool_calls":[' not in seen
    assert counted(metrics, "refused") == 1 and len(engine.calls) == 2


async def test_an_invalid_call_of_the_small_tier_is_escalated_to_the_large_one() -> None:
    tiered = """\
pools:
  small: {tier: small, served_model: s, replicas: [{url: 'http://a.test:1'}]}
  large: {tier: large, served_model: l, replicas: [{url: 'http://b.test:1'}]}
models: {m: {tiering: t}}
tiering:
  t:
    tiers: {small: small, large: large}
    rules: [{name: lookups, when: {task: [lookup]}, then: small}]
tool_calls: {on_invalid: [escalate, refuse]}
"""
    small, large = (
        Engine(("get_reservation_details", "{}")),
        Engine(("get_reservation_details", GOOD)),
    )

    def engine(call: Call) -> Scripted:
        return (small if "a.test" in call.url else large)(call)

    pipeline, metrics = make(tiered, engine)
    served = await pipeline.handle(Endpoint.chat, body(), RequestContext("rid", task="lookup"))
    message = orjson.loads(served.body)["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == GOOD
    assert (len(small.calls), len(large.calls)) == (1, 1)
    assert served.headers["X-Gateway-Tier"] == "large"
    assert counted(metrics, "escalated") == 1 and counted(metrics, "valid") == 1


async def test_several_choices_with_tools_are_refused_up_front() -> None:
    """Only one choice's calls are judged: `n` > 1 would pass the others unchecked."""
    from gateway.errors import InvalidRequest

    engine = Engine(("get_reservation_details", GOOD))
    pipeline, _ = make(policy(), engine)
    request = {**orjson.loads(body()), "n": 2}
    with pytest.raises(InvalidRequest, match="`n` must be 1"):
        await pipeline.handle(Endpoint.chat, orjson.dumps(request), RequestContext("rid"))
    assert engine.calls == []


# What vLLM 0.32's Hermes parser lets the tiny model write under `tool_choice: "required"`:
# the markup of calls whose arguments are no object, cut short by `max_tokens`, so the
# parser extracts no call and the answer is text.
MARKUP = '<tool_call>{"name": "get_reservation_details", "arguments": 3272e333}</tool_call><tool'
NAMED = {"type": "function", "function": {"name": "get_reservation_details"}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
async def test_an_answer_that_owes_a_call_and_makes_none_is_asked_again(
    tool_choice: Any, stream: bool
) -> None:
    """`tool_choice` required or named: an answer in text is no success; it is asked
    again with what was wrong, and the call of the second answer is what the client gets
    (a stream's text has flowed; the call finishes it)."""
    engine = Engine((TEXT, MARKUP), ("get_reservation_details", GOOD))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, stream, tool_choice=tool_choice)
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [GOOD]
    assert len(engine.calls) == 2
    told = engine.calls[1]["messages"][-1]["content"]
    assert told.startswith("That answer was rejected: `tool_choice` asked for a call to ")
    assert told.split("; ")[1].startswith("the answer made none")
    assert counted(metrics, "reasked") == 1 and counted(metrics, "valid") == 1
    problems = metrics.registry.get_sample_value(
        "gateway_tool_call_problems_total", {"model": "m", "problem": "no_tool_call"}
    )
    assert problems == 1


async def test_an_answer_that_never_makes_the_owed_call_is_refused() -> None:
    engine = Engine((TEXT, MARKUP))
    pipeline, metrics = make(policy(), engine)
    with pytest.raises(InvalidToolCall, match="asked for a call to `get_reservation_details`"):
        await answer(pipeline, tool_choice=NAMED)
    assert len(engine.calls) == 2 and counted(metrics, "refused") == 1


async def test_a_call_to_another_tool_than_the_named_one_is_not_the_owed_call() -> None:
    engine = Engine(("think", '{"thought": "hm"}'), ("get_reservation_details", GOOD))
    pipeline, _ = make(policy(), engine)
    message = await answer(pipeline, tool_choice=NAMED)
    assert message["tool_calls"][0]["function"]["name"] == "get_reservation_details"
    assert "the answer made `think`" in engine.calls[1]["messages"][-1]["content"]


async def test_a_stream_that_owes_a_call_is_refused_in_stream_when_the_policy_says_so() -> None:
    engine = Engine((TEXT, MARKUP))
    pipeline, metrics = make(policy("{on_invalid: [refuse], refuse_as: message}"), engine)
    served = await pipeline.handle(
        Endpoint.chat, body(True, tool_choice="required"), RequestContext("rid")
    )
    assert served.stream is not None
    seen = b"".join([bytes(e) async for e in served.stream.events()])
    assert b"nothing was run: `tool_choice` asked for a call" in seen
    assert b'"finish_reason":"stop"' in seen and b'"tool_calls":[' not in seen
    assert counted(metrics, "refused") == 1 and len(engine.calls) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_text_answer_under_auto_owes_nothing(stream: bool) -> None:
    engine = Engine((TEXT, "Your reservation is ZFA04Y."))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, stream, tool_choice="auto")
    assert message["content"] == "Your reservation is ZFA04Y." and not message.get("tool_calls")
    assert len(engine.calls) == 1 and counted(metrics, "refused") == 0


def only(mode: str, *names: str) -> dict[str, Any]:
    """OpenAI's `allowed_tools` choice."""
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


async def test_allowed_tools_keep_every_tool_in_the_prompt_and_hold_calls_to_the_allowed() -> None:
    """The engine gets every declared tool (the prompt's prefix stays the same turn after
    turn) and `auto`; a call to a tool left out is invalid and asked again."""
    engine = Engine(("get_reservation_details", GOOD), ("think", '{"thought": "ok"}'))
    pipeline, metrics = make(policy(), engine)
    message = await answer(pipeline, tool_choice=only("auto", "think"))
    assert message["tool_calls"][0]["function"]["name"] == "think"
    first, again = engine.calls
    assert first["tools"] == TOOLS and first["tool_choice"] == "auto"
    told = again["messages"][-1]["content"]
    assert "`get_reservation_details` is not allowed by this request's `tool_choice`" in told
    problems = metrics.registry.get_sample_value(
        "gateway_tool_call_problems_total", {"model": "m", "problem": "tool_not_allowed"}
    )
    assert problems == 1


@pytest.mark.parametrize(
    ("names", "sent"),
    [
        (("think",), {"type": "function", "function": {"name": "think"}}),
        (("think", "get_reservation_details"), "required"),
    ],
    ids=["one", "two"],
)
async def test_allowed_tools_required_owes_a_call_and_is_sent_as_vllm_takes_it(
    names: tuple[str, ...], sent: Any
) -> None:
    engine = Engine((TEXT, MARKUP), ("think", '{"thought": "ok"}'))
    pipeline, _ = make(policy(), engine)
    message = await answer(pipeline, stream=True, tool_choice=only("required", *names))
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["think"]
    assert engine.calls[0]["tool_choice"] == sent and engine.calls[0]["tools"] == TOOLS


async def test_an_allowed_tools_choice_naming_an_undeclared_tool_is_a_400() -> None:
    from gateway.errors import InvalidRequest

    engine = Engine(("think", "{}"))
    pipeline, _ = make(policy(), engine)
    request = body(tool_choice=only("auto", "drop_tables"))
    with pytest.raises(InvalidRequest, match="`drop_tables` is not among the request's `tools`"):
        await pipeline.handle(Endpoint.chat, request, RequestContext("rid"))
    assert engine.calls == []
