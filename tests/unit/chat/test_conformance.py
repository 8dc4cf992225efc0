"""Engine answers are made to conform to OpenAI's schema without touching anything else, and
an answer whose fields have the wrong shape is the engine's failure (a 502 naming the field)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.chat.conformance import NotAnAnswer, check_shape, conform_event, conform_response


def test_forbidden_nulls_are_dropped_and_meaningful_nulls_kept() -> None:
    raw = orjson.dumps(
        {
            "id": "x",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "annotations": None,
                        "function_call": None,
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens_details": None,
                "prompt_tokens_details": {"cached_tokens": 0, "multimodal_tokens": None},
            },
        }
    )
    body = orjson.loads(conform_response(raw))
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "refusal": None}
    assert body["choices"][0]["logprobs"] is None
    assert body["usage"] == {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}


def test_conforming_answer_is_returned_byte_for_byte() -> None:
    raw = b'{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}],  "usage":{"prompt_tokens":1}}'
    assert conform_response(raw) is raw


def test_logprobs_get_the_required_refusal_key() -> None:
    raw = orjson.dumps(
        {
            "choices": [
                {"message": {"role": "assistant", "content": "a"}, "logprobs": {"content": []}}
            ]
        }
    )
    assert orjson.loads(conform_response(raw))["choices"][0]["logprobs"] == {
        "content": [],
        "refusal": None,
    }


def test_stream_event_with_logprobs_is_fixed_and_keeps_its_framing() -> None:
    event = b'data: {"choices":[{"delta":{"content":"a"},"logprobs":{"content":[]}}]}\r\n\r\n'
    fixed = conform_event(event)
    assert fixed.endswith(b"\r\n\r\n")
    assert orjson.loads(fixed[6:])["choices"][0]["logprobs"]["refusal"] is None


def test_other_events_pass_untouched() -> None:
    for event in (b"data: [DONE]\n\n", b": ping\n\n", b'data: {"choices":[{"delta":{}}]}\n\n'):
        assert conform_event(event) is event


def test_non_json_answers_pass_untouched() -> None:
    with pytest.raises(NotAnAnswer):
        conform_response(b"not json")
    with pytest.raises(NotAnAnswer):
        conform_response(b"[1, 2]")


@pytest.mark.parametrize(
    ("data", "part"),
    [
        ({"object": "list", "data": [{"embedding": [0.1]}], "usage": {"prompt_tokens": 3,
          "total_tokens": 3}}, "message"),
        ({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}, "message"),
        ({"choices": [{"index": 0, "message": {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f",
          "arguments": "{}"}}]}}], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
          "total_tokens": 11, "prompt_tokens_details": {"cached_tokens": 0},
          "completion_tokens_details": None}}, "message"),
        ({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function":
          {"arguments": "{"}}]}, "finish_reason": None}]}, "delta"),
        ({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}, "delta"),
        ({"error": {"message": "boom"}}, "delta"),
    ],
)  # fmt: skip
def test_every_kind_of_answer_vllm_sends_has_the_right_shape(
    data: dict[str, Any], part: str
) -> None:
    check_shape(data, part)  # raises nothing


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"choices": 5}, "`choices`"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"arguments": {}}}]}}]},
         "`choices[0].message.tool_calls[0].function.arguments`"),
        ({"usage": {"completion_tokens": True}}, "`usage.completion_tokens`"),
    ],
)  # fmt: skip
def test_a_wrong_shape_is_named_in_the_502(data: dict[str, Any], named: str) -> None:
    with pytest.raises(NotAnAnswer) as caught:
        check_shape(data, "message")
    error = caught.value.upstream_error()
    assert (error.status, error.error_type) == (502, "upstream_error")
    assert named in error.message and "engine" in error.message
