"""The gateway's one error tree, and the one place it becomes an HTTP response.

    GatewayError                      status  type
    +-- InvalidRequest                  400   invalid_request_error  (malformed JSON, bad field,
    |                                     over a policy limit: code=array_above_max_length,
    |                                     json_too_deep or max_tokens_too_large)
    +-- Unauthorized                    401   invalid_request_error  code=invalid_api_key
    +-- PermissionDenied                403   invalid_request_error  code=permission_denied
    +-- NotFound                        404   invalid_request_error  (unknown route)
    |   +-- ModelNotFound               404   invalid_request_error  code=model_not_found
    +-- MethodNotAllowed                405   invalid_request_error
    +-- RequestTimeout                  408   invalid_request_error  code=request_timeout
    |                                     (headers too slow: gateway/edge/connections.py)
    +-- Conflict                        409   invalid_request_error  (e.g. approval_already_decided)
    +-- PayloadTooLarge                 413   invalid_request_error  code=request_too_large
    +-- UpstreamError                   502   upstream_error         (engine unreachable or 5xx)
    |   +-- UpstreamTimeout             504   upstream_error         code=upstream_timeout
    |   +-- OutputCheckFailed           502   upstream_error         code=output_check_failed
    |   +-- InvalidToolCall             502   upstream_error         code=invalid_tool_call
    +-- UpstreamRejected              (4xx)   (engine's own)         engine refused the request
    |   +-- ContextLengthExceeded       400   invalid_request_error  code=context_length_exceeded
    |                                     (on the Messages API: "prompt is too long: ...")
    +-- NoHealthyReplica                503   service_unavailable    Retry-After set
    +-- StateUnavailable                503   service_unavailable    code=state_store_unavailable
    +-- Overloaded                      429   rate_limit_error       code=overloaded, Retry-After
    +-- RateLimited                     429   rate_limit_error       code=rate_limit_exceeded,
    |                                     Retry-After and x-ratelimit-* (gateway/quota/)
    +-- BudgetExceeded                  429   insufficient_quota     code=budget_exceeded
    +-- StoredBytesExceeded             429   insufficient_quota     code=stored_bytes_exceeded,
                                          Retry-After (gateway/state/stored_bytes.py)

Handlers raise these; `error_response` renders any of them in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`, or, on the Anthropic Messages API's
paths (`/v1/messages...`), in Anthropic's: `{"type": "error", "error": {"type",
"message"}}` with the type Anthropic gives that status (`anthropic_error_type`). The status
and headers are the same either way, but for `Overloaded`: Anthropic's 529. Anything
else that escapes is a bug and is rendered as a 500 without internals (gateway/app.py).
An engine's own error reply becomes one of these in gateway/upstream/engine_errors.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}

    @property
    def label(self) -> str:
        """What the request record, its metrics and spans call this error: its code, else
        its type."""
        return self.code or self.error_type

    @classmethod
    def internal(cls) -> GatewayError:
        """What a client is told of a bug: nothing internal (the bug itself is logged)."""
        return cls("The gateway hit an internal error; it has been logged.")

    def anthropic_message(self) -> str:
        """The message in the Messages API's error: the same, unless Anthropic has words of
        its own that clients act on."""
        return self.message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    """No valid API key: one message and one body whether the key was missing, malformed
    or unknown, so a caller learns nothing about which keys exist."""

    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"

    def __init__(self) -> None:
        super().__init__(
            "Missing or invalid API key: send `Authorization: Bearer <key>` (or `x-api-key: "
            "<key>`) with a key this gateway accepts.",
            headers={"WWW-Authenticate": "Bearer"},
        )


class PermissionDenied(GatewayError):
    """A valid key whose roles do not allow this (deciding an approval needs `approver`)."""

    status = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class Conflict(GatewayError):
    """The request contradicts the state it acts on (an approval decided already, a fork
    onto a session that exists)."""

    status = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class RequestTimeout(GatewayError):
    """The client did not send its request's headers in time; written by the connection
    itself (gateway/edge/connections.py), before any route is known."""

    status = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class UpstreamError(GatewayError):
    status = 502
    error_type = "upstream_error"
    default_code = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


class OutputCheckFailed(UpstreamError):
    """The engines answered, but the answer failed the checks the request must pass."""

    default_code = "output_check_failed"


class InvalidToolCall(UpstreamError):
    """The engine called a tool in a way the request's tool contract refuses (an undeclared
    tool, arguments that do not parse or break the tool's schema, or a value an analyzer
    denies), and the policy's steps ended in a refusal (gateway/toolcalls/)."""

    default_code = "invalid_tool_call"


class NoHealthyReplica(GatewayError):
    status = 503
    error_type = "service_unavailable"
    default_code = "no_healthy_replica"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class StateUnavailable(GatewayError):
    """Redis (sessions, keys, quota, approvals, stored responses) cannot be reached."""

    status = 503
    error_type = "service_unavailable"
    default_code = "state_store_unavailable"


class Overloaded(GatewayError):
    """Every replica is at capacity: the request is shed instead of queued on a drowning
    engine."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class RateLimited(GatewayError):
    """A tenant's or a key's rate limit has no room for the request (gateway/quota/)."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class BudgetExceeded(GatewayError):
    """The tenant's budget for the day or month is spent (gateway/quota/)."""

    status = 429
    error_type = "insufficient_quota"
    default_code = "budget_exceeded"


class StoredBytesExceeded(GatewayError):
    """The tenant's stored conversations hold `limits.stored_bytes` (gateway/state/
    stored_bytes.py): nothing more is stored until some expire or are deleted."""

    status = 429
    error_type = "insufficient_quota"
    default_code = "stored_bytes_exceeded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        # Hours away, as a budget's end is: the SDKs' quick retries would only add load.
        headers = {"Retry-After": str(retry_after_s), "x-should-retry": "false"}
        super().__init__(message, headers=headers)


class UpstreamRejected(GatewayError):
    """The engine answered 4xx: the request is the client's to fix, so its status is kept."""

    error_type = "invalid_request_error"

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.status = status  # type: ignore[misc]


class ContextLengthExceeded(UpstreamRejected):
    """The engine refused a prompt its context window cannot hold (vLLM's 400, its own
    message kept), told in the words agents act on: OpenAI's code `context_length_exceeded`,
    and on the Messages API Anthropic's own sentences, which Claude Code reads to compact its
    history ("prompt is too long: N tokens > M maximum") or to ask for fewer output tokens
    ("input length and `max_tokens` exceed context limit: I + O > M"). `input_tokens` is a
    lower bound where the engine stopped counting (it counts one past the window, or only
    characters)."""

    default_code = "context_length_exceeded"

    def __init__(
        self, message: str, *, limit: int, input_tokens: int, output_tokens: int | None = None
    ) -> None:
        super().__init__(400, message, param="messages")
        self.limit = limit
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens

    @property
    def output_did_not_fit(self) -> bool:
        """The prompt fits the window; with the output it asked for, it does not."""
        return bool(self.output_tokens) and self.input_tokens <= self.limit

    @property
    def needed(self) -> int:
        """The tokens the request needed at least: its prompt, plus its output where that
        is what did not fit."""
        if self.output_did_not_fit:
            return self.input_tokens + (self.output_tokens or 0)
        return self.input_tokens

    def anthropic_message(self) -> str:
        if self.output_did_not_fit:
            return (
                "input length and `max_tokens` exceed context limit: "
                f"{self.input_tokens} + {self.output_tokens} > {self.limit}, decrease input "
                "length or `max_tokens` and try again"
            )
        return f"prompt is too long: {self.input_tokens} tokens > {self.limit} maximum"


ANTHROPIC_PREFIX = "/v1/messages"  # the Anthropic Messages API's paths (gateway/anthropic/)

# The error type Anthropic's API gives each status (its SDKs raise by status, and show type
# and message); any other status is an `api_error`.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error")


def anthropic_error_body(
    error: GatewayError, request_id: str | None = None, status: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "error",
        "error": {
            "type": anthropic_error_type(status or error.status),
            "message": error.anthropic_message(),
        },
    }
    if request_id:
        body["request_id"] = request_id
    return body


def forget_frames(error: BaseException) -> None:
    """Drops the tracebacks of an error that has been answered, and of the errors it was
    raised from. A traceback holds every frame the error passed through, with their
    locals (the request's body among them); any reference cycle through the error (a
    retry library's stored outcome holds it, and its frames hold that outcome) would keep
    them all alive until a full garbage collection."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def error_response(
    error: GatewayError, *, request_id: str | None = None, path: str | None = None
) -> Response:
    """`path`: the request's; the Messages API's get Anthropic's error shape."""
    headers = dict(error.headers)
    if request_id:
        headers["X-Request-Id"] = request_id
    anthropic = path is not None and path.startswith(ANTHROPIC_PREFIX)
    status = error.status
    if anthropic and isinstance(error, Overloaded):
        status = 529  # Anthropic's "overloaded" (its clients back off and retry on it)
    return Response(
        orjson.dumps(
            anthropic_error_body(error, request_id, status) if anthropic else error.body()
        ),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
