"""Span attribute names, in one place.

The OpenTelemetry GenAI semantic conventions (`gen_ai.*`) are only published in the
SDK's unstable `_incubating` module, which may rename or drop them between releases;
the names the gateway emits are fixed here instead, as the conventions spell them.
"""

from __future__ import annotations

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHED_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # only when the policy opts in
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # only when the policy opts in
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"

# Which GenAI operation each endpoint is.
OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
    "messages": "chat",
    "count_tokens": "count_tokens",  # no GenAI operation: nothing is generated
    "compact": "compact",
}
GEN_AI_SYSTEM_VALUE = "vllm"

# HTTP and server conventions (stable).
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_ROUTE = "http.route"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# The gateway's own.
TENANT = "gateway.tenant"
REQUEST_ID = "gateway.request_id"
STREAM = "gateway.stream"
TIER = "gateway.tier"
TIER_REASON = "gateway.tier.reason"
TIER_DECIDED_BY = "gateway.tier.by"
REPLICA = "gateway.replica"
POOL = "gateway.pool"
ROUTE_REASON = "gateway.route.reason"
ROUTE_CACHED_BLOCKS = "gateway.route.cached_blocks"
ROUTE_TOTAL_BLOCKS = "gateway.route.total_blocks"
FALLBACK = "gateway.fallback"
RETRIES = "gateway.retries"
ATTEMPT = "gateway.attempt"
ATTEMPT_OUTCOME = "gateway.attempt.outcome"
TRIMMED_TOKENS = "gateway.trim.saved_tokens"
TRIM_FELL_BACK = "gateway.trim.fell_back"
SESSION_TURN = "gateway.session.turn"
DEGRADED = "gateway.degraded"
TOOL_CALLS = "gateway.tool_calls"  # what became of invalid tool calls (gateway/toolcalls/)
COST_USD = "gateway.cost_usd"
OVERHEAD_MS = "gateway.overhead_ms"

# Human approval of tool calls (gateway/approvals/): on the request's `approval` span,
# and on a decision's `approval.decide` span (gateway/telemetry/approval_spans.py).
APPROVAL_ID = "gateway.approval.id"
# `approval`: held, pending, released, denial_returned, expiry_returned;
# `approval.decide`: approved or denied (absent when the decision was refused).
APPROVAL_EVENT = "gateway.approval.event"
APPROVAL_TOOLS = "gateway.approval.tools"
APPROVAL_BY = "gateway.approval.by"  # the deciding key's id (never the key)
