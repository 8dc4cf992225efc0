"""Engine answers are made to conform to OpenAI's schema without touching anything else."""

from __future__ import annotations

import orjson
import pytest

from gateway.conformance import NotAnAnswer, conform_event, conform_response


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
