"""The official `anthropic` SDK through the gateway to real vLLM replicas: the Messages API
translated to the engines' Chat Completions, and checked against vLLM's own Messages API
(`/v1/messages`, `/v1/messages/count_tokens`) on the same replica: the same prompt tokens."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.integration.conftest import Engines, Gateway

pytestmark = pytest.mark.engine

WEATHER: Any = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
SYSTEM = "You are a weather assistant. " * 40  # long enough to fill KV blocks
ASK: Any = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture
def client(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def test_a_message_and_its_repeat_reads_the_engine_s_prefix_cache(
    client: anthropic.Anthropic,
) -> None:
    first = client.messages.create(model="tiny", max_tokens=8, system=SYSTEM, messages=ASK)
    assert first.type == "message" and first.role == "assistant"
    assert first.stop_reason in ("end_turn", "max_tokens")
    assert first.usage.output_tokens > 0
    again = client.messages.create(model="tiny", max_tokens=8, system=SYSTEM, messages=ASK)
    total = prompt_tokens(again.usage.model_dump())
    assert total == prompt_tokens(first.usage.model_dump())
    assert (again.usage.cache_read_input_tokens or 0) > total // 2  # the same replica, cached


def test_claude_codes_output_limit_is_served_within_the_engines_context(
    client: anthropic.Anthropic,
) -> None:
    """Claude Code asks `max_tokens: 32000`, which vLLM refuses of a 16,384-token engine;
    the gateway sends the engine's window instead (streamed too, as Claude Code asks)."""
    soon = ["e", "a", "o", " "]  # random text holds one within a few tokens
    raw = client.messages.with_raw_response.create(
        model="tiny", max_tokens=32_000, stop_sequences=soon, messages=ASK
    )
    assert raw.headers["x-gateway-max-tokens"] == "16384"
    assert raw.parse().stop_reason == "stop_sequence"
    with client.messages.stream(
        model="tiny", max_tokens=32_000, stop_sequences=soon, messages=ASK
    ) as stream:
        assert stream.response.headers["x-gateway-max-tokens"] == "16384"
        assert stream.get_final_message().stop_reason == "stop_sequence"


def test_a_prompt_the_engines_window_cannot_hold_is_told_as_anthropic_tells_it(
    client: anthropic.Anthropic,
) -> None:
    """Claude Code compacts its history when told "prompt is too long: N tokens > M
    maximum", Anthropic's words; vLLM says it otherwise, and the gateway translates."""
    too_long = " ".join(str(n) for n in range(30_000))
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(
                model="tiny",
                max_tokens=8,
                messages=[{"role": "user", "content": too_long}],
                stream=stream,
            )
        error: Any = caught.value.body
        assert error["error"]["type"] == "invalid_request_error", error
        told = re.fullmatch(
            r"prompt is too long: (\d+) tokens > 16384 maximum", error["error"]["message"]
        )
        assert told is not None and int(told[1]) > 16384, error


def test_a_streamed_forced_tool_call(client: anthropic.Anthropic) -> None:
    """vLLM constrains the call's name; the random model's arguments are often cut short
    by `max_tokens`. Whatever it does, no malformed call arrives as a success: a whole
    call, the gateway's refusal in the stream, or (the call asked again, unstreamed, and
    the engine answering in words) no call (gateway/toolcalls/stream_hold.py)."""
    names: list[str] = []
    blocks: list[str] = []
    refused: anthropic.APIStatusError | None = None
    try:
        with client.messages.stream(
            model="tiny",
            max_tokens=64,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
        ) as stream:
            for event in stream:
                names.append(event.type)
                if event.type == "content_block_start":
                    blocks.append(event.content_block.type)
            message = stream.get_final_message()
    except anthropic.APIStatusError as exc:
        refused = exc
    if refused is not None:
        assert "tool call was refused" in str(refused) and "get_weather" in str(refused)
        assert "tool_use" not in blocks  # no half a call before the refusal
        return
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert "content_block_start" in names and "message_delta" in names
    tool_uses = [block for block in message.content if block.type == "tool_use"]
    if not tool_uses:  # asked again, the engine answered in words: no call, no half call
        assert message.stop_reason != "tool_use"
        return
    assert [block.name for block in tool_uses] == ["get_weather"]
    assert isinstance(tool_uses[0].input, dict)
    assert message.stop_reason == "tool_use"


def test_counts_and_prompts_match_vllm_s_own_messages_api(
    client: anthropic.Anthropic, engines: Engines
) -> None:
    """The translation puts the same prompt before the engine as vLLM's own Messages API
    does: equal token counts, for count_tokens and for a generated answer. (With tools the
    gateway's canonical tool schemas, keys sorted, may differ from the client's by a token;
    there the count must equal what the gateway then sends.)"""
    replica = engines.urls("tiny-chat")[0]
    history: Any = [
        *ASK,
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12C, rain"}]},
    ]  # fmt: skip
    request: dict[str, Any] = {"model": "tiny", "system": SYSTEM, "messages": history}
    ours = client.messages.count_tokens(**request)
    with httpx.Client(base_url=replica, timeout=60) as engine:
        theirs = engine.post("/v1/messages/count_tokens", json=request)
        assert theirs.status_code == 200, theirs.text
        assert ours.input_tokens == theirs.json()["input_tokens"]
        native = engine.post("/v1/messages", json={**request, "max_tokens": 4})
        assert native.status_code == 200, native.text
    answered = client.messages.create(**request, max_tokens=4)
    assert prompt_tokens(answered.usage.model_dump()) == prompt_tokens(native.json()["usage"])
    with_tools = client.messages.count_tokens(**request, tools=[WEATHER])
    assert with_tools.input_tokens > ours.input_tokens
    answered = client.messages.create(**request, tools=[WEATHER], max_tokens=4)
    assert prompt_tokens(answered.usage.model_dump()) == with_tools.input_tokens


def test_context_edits_shrink_the_prompt_the_engine_reads(client: anthropic.Anthropic) -> None:
    """Claude Code's tool-result clearing (`clear_tool_uses_20250919` as it sends it, with
    `clear_thinking_20251015`): the engine reads the edited history, as vLLM's own counts
    show, and `count_tokens` reports both counts."""
    history: Any = [{"role": "user", "content": "Weather in three cities?"}]
    for i, city in enumerate(("Oslo", "Bergen", "Tromso")):
        history += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Next city.", "signature": ""},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather",
                 "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"{city}: " + "rain, 12C. " * 60}]},
        ]  # fmt: skip
    edits: Any = {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
         "keep": {"type": "tool_uses", "value": 1},
         "clear_at_least": {"type": "input_tokens", "value": 100}},
    ]}  # fmt: skip
    request: dict[str, Any] = {"model": "tiny", "messages": history, "tools": [WEATHER]}
    whole = client.messages.create(**request, max_tokens=4)
    # thinking on, all of it kept: the engine takes each assistant message's `reasoning`
    thinking: Any = {"type": "adaptive"}
    edited = client.beta.messages.create(
        **request, max_tokens=4, context_management=edits, thinking=thinking,
        betas=["context-management-2025-06-27"],
    )  # fmt: skip
    assert edited.context_management is not None
    (applied,) = edited.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 2
    read_whole = prompt_tokens(whole.usage.model_dump())
    read_edited = prompt_tokens(edited.usage.model_dump())
    assert read_edited < read_whole - 200  # two results of about 150 tokens each, gone
    counted = client.beta.messages.count_tokens(
        **request, context_management=edits, thinking=thinking,
        betas=["context-management-2025-06-27"],
    )  # fmt: skip
    assert counted.input_tokens == read_edited
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == read_whole


def test_compaction_shrinks_the_prompt_and_its_next_turn_reads_it_from_the_cache(
    client: anthropic.Anthropic,
) -> None:
    """`compact_20260112` on the gateway's trimming: the engine reads the compacted
    conversation, and the next turn, which sends the compaction block back, reads that
    conversation from the engine's prefix cache."""
    history: Any = [{"role": "user", "content": "Weather in eight cities?"}]
    for i in range(8):
        history += [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather",
                 "input": {"city": f"city {i}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"city {i}: " + "rain, 12C. " * 40}]},
        ]  # fmt: skip
    request: dict[str, Any] = {"model": "tiny", "system": SYSTEM, "tools": [WEATHER]}
    edits: Any = {"edits": [{"type": "compact_20260112",
                             "trigger": {"type": "input_tokens", "value": 1000}}]}  # fmt: skip
    betas = ["compact-2026-01-12"]
    whole = client.messages.create(**request, messages=history, max_tokens=4)
    compacted = client.beta.messages.create(
        **request, messages=history, max_tokens=4, context_management=edits, betas=betas
    )
    assert compacted.content[0].type == "compaction"
    read = prompt_tokens(compacted.usage.model_dump())
    assert read < prompt_tokens(whole.usage.model_dump()) * 0.7
    answer: Any = {"role": "assistant", "content": [
        b.model_dump(exclude_none=True) for b in compacted.content]}  # fmt: skip
    turn = [*history, answer, {"role": "user", "content": "And tomorrow?"}]
    following = client.beta.messages.create(
        **request, messages=turn, max_tokens=4, context_management=edits, betas=betas
    )
    assert following.content[0].type != "compaction"  # under the trigger again
    assert (following.usage.cache_read_input_tokens or 0) >= read // 2


def prompt_tokens(usage: dict[str, Any]) -> int:
    """Anthropic's three input counts add up to the prompt."""
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(usage.get(part) or 0 for part in parts)


def test_errors_come_in_anthropic_s_shape(client: anthropic.Anthropic, gateway: Gateway) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert missing.value.status_code == 404
    raw = httpx.post(f"{gateway.base_url}/v1/messages", json={"model": "tiny", "messages": ASK})
    assert raw.status_code == 400
    assert raw.json()["type"] == "error"
    assert raw.json()["error"]["type"] == "invalid_request_error"
