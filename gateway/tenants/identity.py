"""Who a key belongs to, and what that key's tenant may do; read by the request path from
the ASGI scope's state, where the API-key check (gateway/edge/auth.py) puts both."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.policy.quota import RateLimitSpec

# The tenant of a gateway without tenants, and of the keys file's keys.
DEFAULT_TENANT = "default"
KEY_PREFIX = "sk-agw-"
USER = frozenset({"user"})


@dataclass(frozen=True, slots=True)
class Identity:
    """A valid key's owner. `key_id` names the key without revealing it: the first 12 hex
    digits of its SHA-256 (what `gateway keys list` shows and `revoke` takes)."""

    key_id: str
    tenant: str = DEFAULT_TENANT
    roles: frozenset[str] = USER
    # The key's own rate limits (gateway/quota/); None: its tenant's key_rate_limits.
    rate_limits: RateLimitSpec | None = None


@dataclass(frozen=True, slots=True)
class TenantAccess:
    """What one tenant may do. `models` None: every alias of the policy."""

    name: str
    models: frozenset[str] | None = None
    # May this tenant's prompts and answers go on spans (when telemetry captures content)?
    capture_content: bool = True
    # The tenant's own `limits.max_body_bytes`; None: the policy's (read before the body).
    max_body_bytes: int | None = None

    def allows(self, alias: str) -> bool:
        return self.models is None or alias in self.models

    def visible(self, aliases: Iterable[str]) -> list[str]:
        return sorted(a for a in aliases if self.allows(a))


# Everyone, when authentication is off: the `default` tenant, every model.
OPEN_ACCESS = TenantAccess(DEFAULT_TENANT)


def access_of(state: Mapping[str, Any]) -> TenantAccess:
    """The caller's tenant, from the ASGI scope's state (`scope["state"]`)."""
    access = state.get("access")
    return access if isinstance(access, TenantAccess) else OPEN_ACCESS


def identity_of(state: Mapping[str, Any]) -> Identity | None:
    """The caller's key, from the ASGI scope's state; None when authentication is off."""
    identity = state.get("identity")
    return identity if isinstance(identity, Identity) else None


def digest_of(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def key_id_of(digest: bytes) -> str:
    """A key's public id (in logs, `/admin/keys`, metrics): the first 12 hex digits of its
    SHA-256, the same for a key from a file, the policy or Redis."""
    return digest.hex()[:12]


def new_key() -> str:
    """A new API key: 32 random bytes, URL-safe base64, behind a recognisable prefix (so
    secret scanners and the log redaction find it)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)
