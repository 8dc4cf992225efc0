"""Which session a request belongs to, and the Redis keys it lives under.

The key comes from the first source the policy lists that the request carries: the
`X-Session-Id` header, `metadata.session_id`, `user`, or `client`: the conversation id the
client sends of its own accord in `prompt_cache_key` (Codex CLI's session; Claude Code's
session from `metadata.user_id`, put there by gateway/anthropic/). Keys are namespaced per tenant
(one `default` tenant until tenants exist) and wrapped in a Redis Cluster hash tag, so all
of one session's keys share a hash slot and multi-key transactions stay legal on a cluster
(the layout: gateway/state/keys.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.policy.sessions import SessionsSpec
from gateway.state.keys import session_key
from gateway.tenants.identity import DEFAULT_TENANT

MAX_ID_LENGTH = 200
# Printable, no whitespace and no braces (they would break the hash tag). Matched whole
# (`fullmatch`): `$` would also match before a final newline, letting `s1\n` through.
_VALID = re.compile(rf"[A-Za-z0-9._:@/+=-]{{1,{MAX_ID_LENGTH}}}")


@dataclass(frozen=True)
class SessionRef:
    tenant: str
    id: str

    def key(self, part: str) -> str:
        return session_key(self.tenant, self.id, part)


def check_session_id(value: str, *, param: str) -> str:
    if not _VALID.fullmatch(value):
        raise InvalidRequest(
            "A session id is 1-200 characters of letters, digits and . _ : @ / + = -.",
            param=param,
            code="invalid_session_id",
        )
    return value


def session_for(
    spec: SessionsSpec, header: str | None, body: dict[str, Any], tenant: str = DEFAULT_TENANT
) -> SessionRef | None:
    for source in spec.key_from:
        if source == "header" and header:
            return SessionRef(tenant, check_session_id(header, param="X-Session-Id"))
        if source == "metadata":
            metadata = body.get("metadata")
            value = metadata.get("session_id") if isinstance(metadata, dict) else None
            if isinstance(value, str) and value:
                return SessionRef(tenant, check_session_id(value, param="metadata.session_id"))
        if source == "user":
            value = body.get("user")
            if isinstance(value, str) and value:
                return SessionRef(tenant, check_session_id(value, param="user"))
        if source == "client":
            # Sent whether or not anyone keeps sessions: one that is no valid session id
            # names no session (not a 400: the client did not ask for one).
            value = body.get("prompt_cache_key")
            if isinstance(value, str) and _VALID.fullmatch(value):
                return SessionRef(tenant, value)
    return None
