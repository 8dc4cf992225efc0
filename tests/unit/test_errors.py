"""Every gateway error renders in OpenAI's shape with its status; engine errors are mapped."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyReplica,
    Overloaded,
    PayloadTooLarge,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    error_response,
)
from gateway.upstream.engine_errors import upstream_error_from_body


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("bad", param="messages"), 400, "invalid_request_error"),
        (ModelNotFound("no such model", param="model"), 404, "invalid_request_error"),
        (PayloadTooLarge("too big"), 413, "invalid_request_error"),
        (NoHealthyReplica("none", retry_after_s=3), 503, "service_unavailable"),
        (UpstreamError("engine failed"), 502, "upstream_error"),
        (UpstreamTimeout("slow"), 504, "upstream_error"),
        (GatewayError("bug"), 500, "server_error"),
    ],
)
def test_error_renders_openai_shape(error: GatewayError, status: int, kind: str) -> None:
    response = error_response(error, request_id="rid-1")
    assert response.status_code == status
    assert response.headers["x-request-id"] == "rid-1"
    body = orjson.loads(response.body)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind
    assert body["error"]["message"] == error.message


def test_no_healthy_replica_carries_retry_after() -> None:
    response = error_response(NoHealthyReplica("none", retry_after_s=7))
    assert response.headers["retry-after"] == "7"


def test_engine_400_keeps_status_and_message() -> None:
    raw = orjson.dumps(
        {
            "error": {
                "message": "max_tokens too large",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
        }
    )
    error = upstream_error_from_body(400, raw)
    assert isinstance(error, UpstreamRejected)
    assert error.status == 400
    assert error.message == "max_tokens too large"
    assert error.param == "max_tokens"


def test_engine_flat_error_shape_is_understood() -> None:
    raw = orjson.dumps(
        {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}
    )
    assert upstream_error_from_body(422, raw).message == "bad"


@pytest.mark.parametrize("status", [500, 503, 429])
def test_engine_failures_become_502(status: int) -> None:
    error = upstream_error_from_body(status, b"<html>oops</html>")
    assert error.status == 502
    assert "oops" in error.message


def test_on_the_messages_api_every_error_is_anthropic_s_and_overloaded_is_529() -> None:
    refused = error_response(InvalidRequest("bad", param="messages"), request_id="r1",
                             path="/v1/messages")  # fmt: skip
    assert refused.status_code == 400
    assert orjson.loads(refused.body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
        "request_id": "r1",
    }
    full = error_response(Overloaded("full", retry_after_s=2), path="/v1/messages/count_tokens")
    assert full.status_code == 529 and full.headers["retry-after"] == "2"
    assert orjson.loads(full.body)["error"]["type"] == "overloaded_error"
    assert (
        error_response(Overloaded("full", retry_after_s=2), path="/v1/chat/completions").status_code
        == 429
    )


# vLLM's refusals of a prompt its window cannot hold: this version's, then earlier ones'.
TOO_LONG = (
    "This model's maximum context length is 16384 tokens. However, your prompt contains at "
    "least 16385 input tokens, which exceeds this limit even without any output tokens. "
    "Please reduce the length of the input prompt. (parameter=input_tokens, value=16385)"
)


@pytest.mark.parametrize(
    ("message", "anthropic"),
    [
        (TOO_LONG, "prompt is too long: 16385 tokens > 16384 maximum"),
        (
            "This model's maximum context length is 16384 tokens. However, your prompt "
            "contains 90000 characters (more than 80000 characters, which is the upper bound "
            "for 16384 input tokens). Please reduce the length of the input prompt.",
            "prompt is too long: 16385 tokens > 16384 maximum",  # at least one past
        ),
        (
            "Input length (20000) exceeds model's maximum context length (16384).",
            "prompt is too long: 20000 tokens > 16384 maximum",
        ),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 "
            "tokens (1000 in the messages, 4000 in the completion). Please reduce the length "
            "of the messages or completion.",
            "input length and `max_tokens` exceed context limit: 1000 + 4000 > 4096, "
            "decrease input length or `max_tokens` and try again",
        ),
        (
            "Requested token count exceeds the model's maximum context length of 262144 "
            "tokens. You requested a total of 262462 tokens: 230462 tokens from the input "
            "messages and 32000 tokens for the completion.",
            "input length and `max_tokens` exceed context limit: 230462 + 32000 > 262144, "
            "decrease input length or `max_tokens` and try again",
        ),
    ],
)
def test_a_prompt_the_engines_window_cannot_hold_is_told_in_the_words_agents_act_on(
    message: str, anthropic: str
) -> None:
    """OpenAI's `context_length_exceeded` (Codex, the Agents SDK and LangChain compact or
    trim on it) with the engine's own message; on the Messages API, Anthropic's sentence,
    which Claude Code reads to compact its history or ask for fewer output tokens."""
    raw = orjson.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}})
    error = upstream_error_from_body(400, raw)
    openai = orjson.loads(error_response(error, path="/v1/chat/completions").body)
    assert openai == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    messages = error_response(error, path="/v1/messages")
    assert messages.status_code == 400
    assert orjson.loads(messages.body)["error"] == {
        "type": "invalid_request_error",
        "message": anthropic,
    }


def test_other_engine_400s_and_long_messages_are_not_taken_for_the_window() -> None:
    other = orjson.dumps({"error": {"message": "max_tokens must be at least 1", "code": 400}})
    assert type(upstream_error_from_body(400, other)) is UpstreamRejected
    # Read from the message's start only: a client's text echoed back is not searched.
    echoed = orjson.dumps({"error": {"message": "x" * 5000 + TOO_LONG}})
    assert type(upstream_error_from_body(400, echoed)) is UpstreamRejected
    # Only a 400 is the engine refusing the prompt.
    assert type(upstream_error_from_body(422, orjson.dumps({"message": TOO_LONG}))) is (
        UpstreamRejected
    )
