"""API keys: who may call `/v1/*` and `/admin/*`.

`ApiKeyAuth` is a plain-ASGI layer just inside the edge (gateway/edge/middleware.py), so it
guards the hot API calls answered in plain ASGI (gateway/api/inference.py) and the FastAPI
routes under /v1 (models, usage, sessions, responses) and /admin alike; /healthz, /readyz,
/metrics and /dashboard stay open for probes and scrapers. A request without a valid
`Authorization: Bearer <key>` gets 401 in OpenAI's shape, the same body and headers
whether the key was missing, malformed, unknown or another tenant's: a caller learns
nothing about which keys or tenants exist.

A valid /v1 key puts its `Identity` (tenant, key id, roles) and its tenant's
`TenantAccess` in the ASGI scope's state (`identity`, `tenant`); the request record takes
the tenant, and everything a tenant owns is namespaced by it. The key checks themselves
live in gateway/tenants/ (tenants' static keys, run-time keys in Redis, admin keys).

The keys file is read by `FileKeyStore` (gateway/tenants/key_file.py).

Failure rules, all failing closed: a keys file set in the policy but unreadable at start
stops the gateway from starting; a file that becomes unreadable later keeps the last keys
(a rotation is a symlink swap, and a half-finished one must not lock everyone out); a
file with no keys refuses every request, because an emptied Secret must never open the
API; a key only Redis could vouch for while Redis is unreachable gets 503. Neither the keys
nor the Authorization header are ever logged: the request log and spans are built from
the request record, which carries no header.
"""

from __future__ import annotations

import logging
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError, Unauthorized, error_response
from gateway.tenants.identity import Identity, TenantAccess

log = logging.getLogger(__name__)


class KeyStore(Protocol):
    async def identify(self, token: bytes) -> tuple[Identity, TenantAccess] | None:
        """The owner of a bearer token and its tenant's access, or None when it is no
        valid key."""
        ...


class AdminKeyStore(Protocol):
    def identify(self, token: bytes) -> Identity | None: ...


def _is_api(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1"


def _is_admin(path: str) -> bool:
    return path.startswith("/admin/") or path == "/admin"


def _bearer(scope: Scope) -> bytes | None:
    """The key: `Authorization: Bearer <key>` (OpenAI's clients, Claude Code with
    ANTHROPIC_AUTH_TOKEN), else `x-api-key: <key>` (Anthropic's SDKs)."""
    api_key: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            raw: bytes = value
            scheme, _, token = raw.partition(b" ")
            token = token.strip()
            if scheme.lower() != b"bearer" or not token:
                return None
            return token
        if name == b"x-api-key":
            api_key = value.strip() or None
    return api_key


class ApiKeyAuth:
    """The ASGI layer: `/v1/*` requests pass with a valid tenant key (when `keys` is set:
    authentication on), `/admin/*` requests with a valid admin key (none without
    `admin`); anything else gets 401."""

    def __init__(
        self, app: ASGIApp, keys: KeyStore | None, admin: AdminKeyStore | None = None
    ) -> None:
        self.app = app
        self._keys = keys
        self._admin = admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if _is_admin(path):
            token = _bearer(scope)
            admin = self._admin.identify(token) if self._admin is not None and token else None
            if admin is None:
                await self._refuse(scope, receive, send, Unauthorized())
                return
            scope.setdefault("state", {})["admin"] = admin
        elif self._keys is not None and _is_api(path):
            token = _bearer(scope)
            try:
                found = await self._keys.identify(token) if token else None
            except GatewayError as exc:  # only Redis could tell, and it cannot now: 503
                await self._refuse(scope, receive, send, exc)
                return
            if found is None:
                await self._refuse(scope, receive, send, Unauthorized())
                return
            identity, access = found
            state = scope.setdefault("state", {})
            state["identity"] = identity
            state["access"] = access  # the caller's TenantAccess (`access_of`)
            record = state.get("telemetry")
            if record is not None:
                record.tenant = identity.tenant
                record.capture = record.capture and access.capture_content
                record.content_allowed = record.content_allowed and access.capture_content
        await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, error: GatewayError
    ) -> None:
        state = scope.setdefault("state", {})
        record = state.get("telemetry")
        if record is not None:
            record.error_type = error.code or error.error_type
        response = error_response(error, request_id=state.get("request_id"), path=scope["path"])
        await response(scope, receive, send)
