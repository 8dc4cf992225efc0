"""Inbound bodies: bad JSON and missing or mistyped fields are 400s naming the field."""

from __future__ import annotations

import orjson
import pytest

from gateway.chat.inbound import parse_request
from gateway.errors import InvalidRequest
from gateway.policy import Endpoint
from gateway.prompt.blocks import prompt_bytes

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def bad(endpoint: Endpoint, raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(endpoint, raw)
    return caught.value


def test_valid_chat_request_is_parsed_and_raw_bytes_kept() -> None:
    raw = orjson.dumps(
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "x_custom": 1}
    )
    request = parse_request(Endpoint.chat, raw)
    assert request.model == "tiny"
    assert request.stream is True
    assert request.body_for("tiny") is raw  # nothing to change: bytes untouched


def test_model_rewrite_keeps_every_other_field() -> None:
    raw = orjson.dumps(
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "seed": 3}
    )
    sent = orjson.loads(parse_request(Endpoint.chat, raw).body_for("served-name"))
    assert sent["model"] == "served-name"
    assert sent["seed"] == 3
    assert sent["tools"][0]["function"]["name"] == "f"


def test_output_tokens_above_the_engines_context_are_brought_down_to_it() -> None:
    """An output limit above the engine's whole context window can never bind, and vLLM
    refuses it (Claude Code asks 32,000 of a 16,384-token engine): it is sent as the window,
    the rest of the body as it was; a limit within the window, or none, leaves the bytes."""
    raw = orjson.dumps({**CHAT, "max_tokens": 32000, "max_completion_tokens": 9000, "seed": 3})
    request = parse_request(Endpoint.chat, raw)
    assert request.output_capped(16384) == {"max_tokens": 16384}
    assert request.output_capped(8192) == {"max_tokens": 8192, "max_completion_tokens": 8192}
    sent = orjson.loads(request.body_for("tiny", request.output_capped(16384)))
    assert sent == {**orjson.loads(raw), "max_tokens": 16384}
    assert request.output_capped(None) == {} and request.output_capped(32000) == {}
    assert request.body_for("tiny", request.output_capped(32000)) is raw
    # Only integers: what else a client sends is the engine's to refuse, as it was.
    odd = parse_request(Endpoint.chat, orjson.dumps({**CHAT, "max_tokens": True}))
    assert odd.output_capped(1) == {}
    legacy = parse_request(Endpoint.completions, b'{"model": "m", "prompt": "p", "max_tokens": 99}')
    assert legacy.output_capped(50) == {"max_tokens": 50}


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        (b'{"messages": []}', "model", "missing_required_parameter"),
        (b'{"model": 5, "messages": []}', "model", "invalid_type"),
        (b'{"model": "m"}', "messages", "missing_required_parameter"),
        (b'{"model": "m", "messages": "hi"}', "messages", "invalid_type"),
        (b'{"model": "m", "messages": []}', "messages", "empty_array"),
        (
            b'{"model": "m", "messages": [{"content": "x"}]}',
            "messages[0].role",
            "missing_required_parameter",
        ),
        (b'{"model": "m", "messages": [{"role": "wizard"}]}', "messages[0].role", "invalid_value"),
        # An assistant's calls are read by the gateway too (sessions, trimming): found by
        # the OpenAPI fuzzer as a 500 in a session's trimming.
        (
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": 5}]}',
            "messages[0].tool_calls",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}, '
            b'{"role": "assistant", "tool_calls": [{"function": {}}, 0]}]}',
            "messages[1].tool_calls[1]",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}',
            "messages[0].tool_calls[0].function",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}',
            "stream",
            "invalid_type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "tools": [{"type": "function"}]}',
            "tools[0].function",
            "missing_required_parameter",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "stream_options": {"include_usage": true}}',
            "stream_options",
            "invalid_value",
        ),
    ],
)
def test_chat_rejections_name_the_field(raw: bytes, param: str | None, code: str) -> None:
    error = bad(Endpoint.chat, raw)
    assert error.status == 400
    assert error.param == param
    assert error.code == code


def test_completions_need_prompt() -> None:
    assert bad(Endpoint.completions, b'{"model": "m"}').param == "prompt"


def test_embeddings_need_input_and_cannot_stream() -> None:
    assert bad(Endpoint.embeddings, b'{"model": "m"}').param == "input"
    assert (
        bad(Endpoint.embeddings, b'{"model": "m", "input": "x", "stream": true}').param == "stream"
    )


@pytest.mark.parametrize("first", ["system", "user"])
def test_the_engine_body_reuses_the_serialised_messages(first: str) -> None:
    """Once prefix hashing serialised the messages, the engine's body is spliced from
    those bytes: the same JSON as serialising the body again, every field kept."""
    raw = orjson.dumps(
        {
            "model": "auto",
            "messages": [
                {"role": first, "content": 'You book flights. é \u2028 "quoted"'},
                {"role": "user", "content": "Change my flight", "name": "ana"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "temperature": 0,
            "metadata": {"model": "auto"},  # a nested `model` is never touched
        }
    )
    request = parse_request(Endpoint.chat, raw)
    plain = orjson.loads(request.body_for("served"))
    assert request.messages_json == orjson.dumps(request.body["messages"])
    spliced = request.body_for("served")
    assert orjson.loads(spliced) == plain
    assert plain == {**orjson.loads(raw), "model": "served"}


def test_prompt_bytes_cut_from_the_serialised_messages_match_serialising_them() -> None:
    system = {"role": "system", "content": "sys"}
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\n"}]
    for messages in ([system], [system, *turns], turns, [turns[0]], []):
        body = {"model": "m", "messages": messages}
        assert prompt_bytes(body, None, orjson.dumps(messages)) == prompt_bytes(body)
