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
    upstream_error_from_body,
)


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
