"""The official `openai` SDK through the gateway to real vLLM replicas."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import Function

from tests.integration.conftest import Gateway, refused_as_invalid

pytestmark = pytest.mark.engine

WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

WEATHER_FUNCTION: Function = {  # the same, as a legacy `functions` entry
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": WEATHER_TOOL["function"]["parameters"],
}


@pytest.fixture
def client(gateway: Gateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def test_chat_completion(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    assert reply.usage.prompt_tokens > 0


def test_streaming_with_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count to ten"}],
        # vLLM merges the deltas its API server has not yet sent when it lags (a CI run saw
        # a 12,000-token answer held back whole: test_resilience.py); 64 leave more room.
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},  # vLLM-only field: passed through untouched
    )
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 2, "the answer arrives in pieces, not one block"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 64
    assert len({c.id for c in chunks}) == 1


def test_streaming_without_usage_sends_none(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)


def test_request_with_tools_and_tool_results(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=16,
    )
    assert reply.choices[0].message.role == "assistant"
    # A full tool round trip: the assistant's call and the tool's result go back in.
    history: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.dumps({"city": "Paris"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
    ]
    follow_up = client.chat.completions.create(
        model="tiny",
        messages=history,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=8,
    )
    assert follow_up.choices[0].message.tool_calls in (None, [])


def test_forced_tool_choice_reaches_the_engine(client: OpenAI) -> None:
    """vLLM constrains the output to a call of the named tool. The tiny model's random
    weights may not finish the call's JSON within max_tokens, so accept either a parsed
    call or the constrained call markup; both prove the engine applied the choice. Or,
    when the arguments it made are no JSON object, the gateway's refusal of the call."""
    try:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=40,
            temperature=0,
        )
    except openai.APIStatusError as exc:
        refused_as_invalid(exc)
        return
    message = reply.choices[0].message
    if message.tool_calls:
        call = message.tool_calls[0]
        assert call.type == "function"
        assert call.function.name == "get_weather"
    else:
        assert message.content is not None
        assert re.match(r'<tool_call>\s*\{"name": "get_weather"', message.content)


def test_legacy_functions_reach_the_engine_as_a_forced_tool(client: OpenAI) -> None:
    """`functions` / `function_call` (deprecated, still sent by older clients) are sent as
    tools, and the call comes back as `function_call` (gateway/chat/legacy_functions.py).
    As above, the random weights may leave the call's JSON unfinished: then the
    constrained markup shows the engine was asked for that function (or the call is
    refused, as above)."""
    try:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            functions=[WEATHER_FUNCTION],
            function_call={"name": "get_weather"},
            max_tokens=40,
            temperature=0,
        )
    except openai.APIStatusError as exc:
        refused_as_invalid(exc)
        return
    message = reply.choices[0].message
    assert not message.tool_calls
    if message.function_call is not None:
        assert message.function_call.name == "get_weather"
        assert reply.choices[0].finish_reason == "function_call"
    else:
        assert message.content is not None
        assert re.match(r'<tool_call>\s*\{"name": "get_weather"', message.content)


def test_response_format_json_schema_is_honoured(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Classify: I want a refund"}],
        # The object is about 8 tokens, but the grammar lets the tiny model put whitespace
        # between them: room enough that a sampled run never ends mid-object.
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "intent",
                "schema": {
                    "type": "object",
                    "properties": {"intent": {"enum": ["refund", "other"]}},
                    "required": ["intent"],
                    "additionalProperties": False,
                },
            },
        },
    )
    content = reply.choices[0].message.content
    assert content is not None
    assert json.loads(content)["intent"] in ("refund", "other")


def test_completions_endpoint(client: OpenAI) -> None:
    reply = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert reply.object == "text_completion"
    assert reply.usage is not None and reply.usage.completion_tokens == 5


def test_embeddings_endpoint(client: OpenAI) -> None:
    reply = client.embeddings.create(model="tiny-embed", input=["first text", "second text"])
    assert len(reply.data) == 2
    assert len(reply.data[0].embedding) == 128
    assert reply.data[1].index == 1


def test_list_models(client: OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert {"tiny", "tiny-embed"} <= models.keys()
    # The engines' context window as vLLM lists it (engine/profiles/cpu-tiny.yaml's
    # max_model_len), read by the gateway's health monitor from each replica.
    assert models["tiny"].model_extra == {"max_model_len": 16384}


def test_unknown_model_is_not_found(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"


def test_oversize_body_is_rejected(client: OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x" * 300_000}], max_tokens=1
        )
    assert caught.value.status_code == 413


def test_engine_validation_errors_reach_the_client(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=10**7
        )
    assert caught.value.status_code == 400


# Random text holds one of these within a few tokens: a request whose output limit is the
# engine's whole window still ends in moments.
SOON = ["e", "a", "o", " "]


def test_an_output_limit_above_the_engines_context_is_served_within_it(
    client: OpenAI, gateway: Gateway
) -> None:
    """vLLM refuses `max_tokens` above its whole context window (cpu-tiny: 16,384), a limit
    that could never bind; agents ask for such limits of engines they do not know (Claude
    Code: 32,000). The gateway sends the window instead, and says so, and counts it."""
    before = capped_count(gateway)
    hello: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
    create = client.chat.completions.with_raw_response.create
    for raw in (
        create(model="tiny", messages=hello, stop=SOON, max_tokens=32_000),
        create(model="tiny", messages=hello, stop=SOON, max_completion_tokens=32_000),
    ):
        assert raw.headers["x-gateway-max-tokens"] == "16384"
        reply = raw.parse()
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    # Within the window, nothing is changed or said.
    within = create(model="tiny", messages=hello, max_tokens=4)
    assert "x-gateway-max-tokens" not in within.headers
    assert capped_count(gateway) == before + 2


# A prompt longer than cpu-tiny's 16,384-token window: numbers are cut into short tokens.
TOO_LONG = " ".join(str(n) for n in range(30_000))


def test_a_prompt_the_engines_window_cannot_hold_is_context_length_exceeded(
    client: OpenAI,
) -> None:
    """vLLM's 400 for a prompt its window cannot hold reaches the client with OpenAI's code
    for it, which agent frameworks trim or compact on, and the engine's own message."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": TOO_LONG}], max_tokens=1
        )
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert "maximum context length is 16384 tokens" in caught.value.message


def capped_count(gateway: Gateway) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    series = 'gateway_output_limit_capped_total{model="tiny",pool="tiny-chat"} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def test_replica_that_is_down_is_routed_around(client: OpenAI, gateway: Gateway) -> None:
    for _ in range(4):
        reply = client.chat.completions.create(
            model="tiny-half-down", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        assert reply.choices


def test_no_replica_up_is_503_with_retry_after(client: OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(
            model="tiny-all-down", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "3"


def test_request_id_round_trip(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_headers={"X-Request-Id": "agent-run-7"},
    )
    assert raw.headers["x-request-id"] == "agent-run-7"
    assert raw.parse().id == "chatcmpl-agent-run-7"  # vLLM used the id we sent upstream


def test_repeated_system_prompt_is_served_from_the_prefix_cache(client: OpenAI) -> None:
    system = "You are a careful airline agent. " + " ".join(
        f"Rule {i}: be precise." for i in range(150)
    )
    cached = []
    for _ in range(3):  # two replicas: at least one sees the prompt twice
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
            max_tokens=2,
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
    assert max(cached) > 0, cached
