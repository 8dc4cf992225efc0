"""The admin API, behind the admin credential (`auth.admin_keys_file`, `auth.admin_keys`;
checked in gateway/edge/auth.py before any route here runs): run-time API keys, a policy
reload on demand, and session inspection across tenants. Mounted only when the policy
names an admin key.

    POST   /admin/keys                          create a key for a tenant (shown once)
    GET    /admin/keys?tenant=T                 list keys (never a secret)
    DELETE /admin/keys/{key_id}                 revoke a key
    POST   /admin/policy/reload                 check the policy file now, apply it
    GET    /admin/sessions/{tenant}/{session}   a session's checkpoints, in any tenant
    GET    /admin/tenants                       every tenant's settings in effect
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.api.sessions import checkpoint_summary
from gateway.chat.inbound import json_object
from gateway.errors import InvalidRequest, NotFound
from gateway.policy.quota import RateLimitSpec
from gateway.reload import PolicyReloader
from gateway.runtime import current
from gateway.sessions.ids import SessionRef, check_session_id
from gateway.tenants.directory import Tenants
from gateway.tenants.stored_keys import ROLES, RedisKeys
from gateway.untrusted.client_text import check_label


def _options(raw: bytes) -> dict[str, Any]:
    return json_object(raw) if raw.strip() else {}


def _rate_limits(value: Any) -> RateLimitSpec | None:
    """The new key's own rate limits, validated like the policy's."""
    if value is None:
        return None
    try:
        return RateLimitSpec.model_validate(value)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in ("rate_limits", *problem["loc"]))
        raise InvalidRequest(f"`{where}`: {problem['msg']}.", param=where) from None


def build_admin_router(tenants: Tenants) -> APIRouter:
    router = APIRouter()

    def api_keys(request: Request) -> RedisKeys:
        found: RedisKeys = request.app.state.api_keys
        return found

    def known_tenant(value: Any, param: str) -> str:
        if not isinstance(value, str) or value not in tenants:
            raise InvalidRequest(
                f"`{param}` must name a tenant of the policy: {', '.join(tenants.names())}.",
                param=param,
                code="unknown_tenant",
            )
        return value

    @router.post("/admin/keys")
    async def create_key(request: Request) -> Response:
        if not tenants.required:
            raise InvalidRequest(
                "Authentication is off in this policy (no `auth.keys_file`, no `tenants`): "
                "a key would not be checked.",
                code="auth_disabled",
            )
        options = _options(await request.body())
        tenant = known_tenant(options.get("tenant"), "tenant")
        name = options.get("name", "")
        roles = options.get("roles", ["user"])
        if not isinstance(name, str) or len(name) > 128:
            raise InvalidRequest("`name` must be a string of at most 128.", param="name")
        check_label(name, param="name")  # listed, and written where keys are reported
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise InvalidRequest(f"`roles` must be a list of: {', '.join(ROLES)}.", param="roles")
        limits = _rate_limits(options.get("rate_limits"))
        key, record = await api_keys(request).create(
            tenant, name=name, roles=roles, rate_limits=limits
        )
        return json_response({**record.public(), "key": key}, 201)

    @router.get("/admin/keys")
    async def list_keys(request: Request) -> Response:
        wanted = request.query_params.get("tenant")
        names = [known_tenant(wanted, "tenant")] if wanted else tenants.names()
        store = api_keys(request)
        data = [record.public() for name in names for record in await store.of_tenant(name)]
        return json_response({"object": "list", "data": data})

    @router.delete("/admin/keys/{key_id}")
    async def revoke_key(key_id: str, request: Request) -> Response:
        record = await api_keys(request).revoke(key_id)
        if record is None:
            raise NotFound(f"No API key `{key_id}`.", param="key_id", code="key_not_found")
        return json_response({"id": key_id, "object": "api_key.deleted", "deleted": True})

    @router.post("/admin/policy/reload")
    async def reload_policy(request: Request) -> Response:
        reloader: PolicyReloader | None = request.app.state.reloader
        if reloader is None:
            raise InvalidRequest(
                "This gateway was not started from a policy file: nothing to reload.",
                code="reload_unavailable",
            )
        outcome = await reloader.check(force=True)
        return json_response({"object": "policy.reload", "outcome": outcome or "unchanged"})

    @router.get("/admin/sessions/{tenant}/{session_id}")
    async def inspect_session(tenant: str, session_id: str, request: Request) -> Response:
        session = SessionRef(
            known_tenant(tenant, "tenant"), check_session_id(session_id, param="session_id")
        )
        checkpoints = await current(request.app.state).checkpoints.load(session)
        if not checkpoints:
            raise NotFound(
                f"No session `{session.id}` of tenant `{session.tenant}`.",
                code="session_not_found",
            )
        data = [checkpoint_summary(i + 1, c) for i, c in enumerate(checkpoints)]
        body = {"object": "session", "tenant": session.tenant, "id": session.id, "data": data}
        return json_response(body)

    @router.get("/admin/tenants")
    async def list_tenants(request: Request) -> Response:
        # The running policy's (a reload rebuilds them): defaults and overrides merged.
        runtime = current(request.app.state)
        data = []
        for settings in runtime.tenants.listed():
            shown = settings.public()
            if settings.limits.stored_bytes is not None:  # what it holds, beside its cap
                shown["stored_bytes_held"] = await runtime.stored_bytes.held(settings.name)
            data.append(shown)
        return json_response({"object": "list", "data": data})

    return router
