"""Every `X-Gateway-*` response header: what the gateway tells a client about how its
request was served. The names are a contract with clients (agent frameworks and people
debugging them read them), so they live in one table, the way gateway/state/keys.py holds
every Redis key; a module that writes one uses its constant here.

OpenAI's own headers (`x-ratelimit-*`, Retry-After: gateway/quota/headers.py) and
`x-request-id` keep their OpenAI names and are not listed here.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Where the request went.
TIER = "X-Gateway-Tier"
ROUTE_REASON = "X-Gateway-Route-Reason"
REPLICA = "X-Gateway-Replica"
ROUTE = "X-Gateway-Route"
ATTEMPTS = "X-Gateway-Attempts"
FALLBACK = "X-Gateway-Fallback"
# The session turn it was, and what could not be kept.
SESSION = "X-Gateway-Session"
SESSION_TURN = "X-Gateway-Session-Turn"
DEGRADED = "X-Gateway-Degraded"
PREFIX_CHANGE = "X-Gateway-Prefix-Change"
# What of the request the engine was not sent.
TOOLS_DROPPED = "X-Gateway-Tools-Dropped"
MAX_TOKENS = "X-Gateway-Max-Tokens"
# Limits and approvals.
BUDGET = "X-Gateway-Budget"
APPROVAL_PENDING = "X-Gateway-Approval-Pending"
APPROVAL_RELEASED = "X-Gateway-Approval-Released"
APPROVAL_DENIED = "X-Gateway-Approval-Denied"
APPROVAL_EXPIRED = "X-Gateway-Approval-Expired"
# The request's trace, on every API call (written by the edge).
TRACE_ID = "X-Gateway-Trace-Id"

MEANINGS: dict[str, str] = {
    TIER: "the tier that answered (its pool's tier for an explicit model)",
    ROUTE_REASON: "why that tier: explicit model, rule:<name>, cascade, router score, session",
    REPLICA: "the replica that answered (the gateway's id for it, never its address)",
    ROUTE: "why that replica: the routing reason and cached_blocks=<n>/<total>",
    ATTEMPTS: "how many tries it took, when more than one",
    FALLBACK: "the fallback model that answered, or `cache` for a kept identical answer",
    SESSION: "the session the turn belongs to",
    SESSION_TURN: "the turn's number in its session, or `unsaved` when it was not kept",
    DEGRADED: "`checkpoint`: the session store was unreachable, the turn served unsaved; "
    "`stored_bytes`: the tenant's stored conversations hold its `limits.stored_bytes`, the "
    "turn served unsaved",
    PREFIX_CHANGE: "which parts of the prompt prefix changed since the session's last turn",
    TOOLS_DROPPED: "tools the engine cannot run (hosted or provider-defined), left out",
    MAX_TOKENS: "the engine's context window, sent as the output-token limit in place of a "
    "larger one the request asked for",
    BUDGET: "`downgraded`: served over budget by the policy's downgrade model",
    APPROVAL_PENDING: "the approval a held tool call waits for",
    APPROVAL_RELEASED: "the approval whose approved tool call this answer releases",
    APPROVAL_DENIED: "the approval whose denial this answer returns",
    APPROVAL_EXPIRED: "the approval whose expiry this answer returns",
    TRACE_ID: "the W3C trace id of the request's spans",
}

# What the edge writes into raw ASGI headers (lower case, bytes).
TRACE_ID_ASGI = TRACE_ID.lower().encode("ascii")


def turn_kept(turn_number: int | None, why: str | None = None) -> dict[str, str]:
    """The headers that tell the client which turn of its session was kept, or that none
    was, and why (`checkpoint`, the default: the store was down, or the answer was not the
    engine's new one; `stored_bytes`: the tenant is at its cap)."""
    if turn_number:
        return {SESSION_TURN: str(turn_number)}
    return {SESSION_TURN: "unsaved", DEGRADED: why or "checkpoint"}


_HEADER_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


def tools_dropped(names: tuple[str, ...], request_id: str) -> dict[str, str]:
    """The header naming the tools a request offered that the engine cannot run, and a log
    line saying so (the Responses and Messages APIs leave them out)."""
    if not names:
        return {}
    value = listed(names)
    log.info("request %s: tools the engine cannot run left out: %s", request_id, value)
    return {TOOLS_DROPPED: value}


def listed(names: tuple[str, ...] | list[str]) -> str:
    """Names a client chose, as one header value: comma-separated, each cut to 64
    characters and anything but letters, digits and `._-:` replaced by `?` (a client's
    text never writes a header of its own)."""
    return ",".join("".join(c if c in _HEADER_SAFE else "?" for c in n[:64]) for n in names)
