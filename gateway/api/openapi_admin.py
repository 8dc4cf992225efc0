"""The admin API's part of the gateway's OpenAPI document (gateway/api/openapi.py merges
it in): the /admin routes (gateway/api/admin.py), their own security scheme (an admin
key: a tenant's key gets 401 there, and an admin key gets 401 on /v1), their request and
answer schemas, and their errors in OpenAI's shape.

A policy that names no admin key mounts no admin API: every admin route then answers 401
to everyone, or 404 when the policy turns authentication off altogether.
"""

from __future__ import annotations

from typing import Any, Protocol

_JSON = "application/json"


class PathParam(Protocol):
    """Builds an OpenAPI path parameter (a string, of `pattern` when given)."""

    def __call__(
        self, name: str, description: str, pattern: str | None = None
    ) -> dict[str, Any]: ...


SCHEME = "admin"
SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An admin key (`auth.admin_keys`, `auth.admin_keys_file`); tenants' "
    "keys are refused here.",
}
_ERRORS = {
    400: "A tenant the policy does not list, a malformed body or id, or no policy file to "
    "reload (`error.code` says which).",
    401: "No valid admin key.",
    404: "No such key or session, or no admin API (a policy without authentication).",
    413: "The body is larger than `limits.max_body_bytes`.",
    503: "The state store is unreachable.",
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref(schema)}}}


def _operation(
    summary: str, answer: tuple[int, str], errors: tuple[int, ...], **extra: Any
) -> dict[str, Any]:
    status, schema = answer
    responses = {str(status): _answer("OK" if status == 200 else "Created", schema)}
    responses |= {str(code): _answer(_ERRORS[code], "Error") for code in errors}
    return {"summary": summary, "security": [{SCHEME: []}], "responses": responses, **extra}


def _list_of(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref(item)}},
    }


_STRINGS = {"type": "array", "items": {"type": "string"}}
_TENANT_FIELDS = ("object", "name", "models", "tiers", "capture_content", "limits", "trimming")
_API_KEY_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string", "description": "The first 12 hex digits of the key's SHA-256."},
    "object": {"const": "api_key"},
    "tenant": {"type": "string"},
    "name": {"type": "string"},
    "roles": {"type": "array", "items": {"enum": ["user", "approver"]}},
    "created_at": {"type": "integer"},
    "rate_limits": {
        "description": "The key's own limits; null: its tenant's `key_rate_limits`.",
        "oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/RateLimits"}],
    },
}

SCHEMAS: dict[str, Any] = {
    "ApiKeyRequest": {
        "type": "object",
        "required": ["tenant"],
        "properties": {
            "tenant": {"type": "string", "description": "A tenant of the policy."},
            "name": {"type": "string", "maxLength": 128, "description": "Who holds it."},
            "roles": {"type": "array", "items": {"enum": ["user", "approver"]}},
            "rate_limits": _ref("RateLimits"),
        },
    },
    "RateLimits": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "requests_per_minute": {"type": "integer", "minimum": 1},
            "tokens_per_minute": {"type": "integer", "minimum": 1},
        },
    },
    "ApiKey": {
        "type": "object",
        "required": list(_API_KEY_PROPERTIES),
        "properties": _API_KEY_PROPERTIES,
    },
    "ApiKeyCreated": {
        "type": "object",
        "description": "The key itself is shown here once; only its SHA-256 is kept.",
        "required": [*_API_KEY_PROPERTIES, "key"],
        "properties": {**_API_KEY_PROPERTIES, "key": {"type": "string"}},
    },
    "ApiKeyList": _list_of("ApiKey"),
    "PolicyReload": {
        "type": "object",
        "required": ["object", "outcome"],
        "properties": {
            "object": {"const": "policy.reload"},
            "outcome": {"enum": ["applied", "invalid", "needs_restart", "unchanged"]},
        },
    },
    "AdminSession": {
        "type": "object",
        "required": ["object", "tenant", "id", "data"],
        "properties": {
            "object": {"const": "session"},
            "tenant": {"type": "string"},
            "id": {"type": "string"},
            "data": {"type": "array", "items": {"type": "object", "required": ["turn"]}},
        },
    },
    "TenantSettings": {
        "type": "object",
        "description": "One tenant's settings in effect: its overrides merged over the "
        "policy's defaults.",
        "required": [*_TENANT_FIELDS, "fallbacks"],
        "properties": {
            "object": {"const": "tenant"},
            "name": {"type": "string"},
            "models": {**_STRINGS, "type": ["array", "null"], "description": "null: all."},
            "tiers": {**_STRINGS, "type": ["array", "null"], "description": "null: all."},
            "capture_content": {"type": "boolean"},
            "limits": {
                "type": "object",
                "properties": {
                    "hosted_tools": {"enum": ["drop", "refuse"]},
                    "media_url_hosts": _STRINGS,
                    "stored_bytes": {"type": ["integer", "null"], "description": "null: no cap."},
                },
                "additionalProperties": {"type": "integer"},
            },
            "trimming": {
                "type": "object",
                "required": ["enabled", "high_water_tokens", "low_water_tokens"],
                "properties": {
                    "enabled": {"type": "boolean"},
                    "high_water_tokens": {"type": "integer"},
                    "low_water_tokens": {"type": "integer"},
                },
            },
            "fallbacks": {"type": "object", "additionalProperties": _STRINGS},
            "stored_bytes_held": {
                "type": ["integer", "null"],
                "description": "Only with `limits.stored_bytes`: the bytes its stored "
                "conversations hold now (null: Redis did not answer).",
            },
        },
    },
    "TenantList": _list_of("TenantSettings"),
}


def paths(path_param: PathParam, session_pattern: str) -> dict[str, Any]:
    """`path_param` builds a path parameter as the rest of the document does;
    `session_pattern`: what a session id may be (the same as on /v1)."""
    tenant = path_param("tenant", "A tenant of the policy.")
    key_body = {"required": False, "content": {_JSON: {"schema": _ref("ApiKeyRequest")}}}
    tenant_query = {
        "name": "tenant",
        "in": "query",
        "required": False,
        "description": "Only this tenant's keys.",
        "schema": {"type": "string"},
    }
    return {
        "/admin/keys": {
            "post": _operation(
                "Create an API key for a tenant (shown once)",
                (201, "ApiKeyCreated"),
                (400, 401, 404, 413, 503),
                requestBody=key_body,
            ),
            "get": _operation(
                "List the keys created at run time (never a secret)",
                (200, "ApiKeyList"),
                (400, 401, 404, 503),
                parameters=[tenant_query],
            ),
        },
        "/admin/keys/{key_id}": {
            "delete": _operation(
                "Revoke a key",
                (200, "Deleted"),
                (401, 404, 503),
                parameters=[path_param("key_id", "A key's id, as listed.")],
            )
        },
        "/admin/policy/reload": {
            "post": _operation(
                "Check the policy file now and apply it", (200, "PolicyReload"), (400, 401, 404)
            )
        },
        "/admin/sessions/{tenant}/{session_id}": {
            "get": _operation(
                "A session's checkpoints, in any tenant",
                (200, "AdminSession"),
                (400, 401, 404, 503),
                parameters=[tenant, path_param("session_id", "A session id.", session_pattern)],
            )
        },
        "/admin/tenants": {
            "get": _operation("Every tenant's settings in effect", (200, "TenantList"), (401, 404))
        },
    }
