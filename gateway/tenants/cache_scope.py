"""Which tenants share the engines' prefix cache: each request's cache scope.

vLLM's prefix cache is one pool per engine: a request whose prompt starts like an earlier
one reuses its KV blocks and reports them in `usage.prompt_tokens_details.cached_tokens`
(and starts sooner). Across tenants that is a side channel: tenant B can learn, block by
block, whether tenant A sent a given text. vLLM keeps caches apart by a per-request
`cache_salt`, mixed into the hash of the prompt's first block, so requests of different
salts never share a block.

A scope is the set of requests allowed to share: one tenant (`isolated`), a named group of
tenants that trust each other (`shared` with `prefix_cache_group`), or everyone who shares
without a group (`shared`: the engines' one common cache, no salt at all). The scope
decides two things, both derived here and nowhere else:

- the `cache_salt` the engine is sent (None for the common cache), and
- the seed mixed into the gateway's own prefix block ids (gateway/prompt/blocks.py), so
  the router's index, its `X-Gateway-Route: cached_blocks=` report, tier stickiness and
  implicit conversation keys only ever reflect traffic of the same scope.

A client may send its own `cache_salt` (vLLM's per-user isolation inside one tenant): it
is folded into its scope's, never used as is, so no client can pick a salt that lands in
another scope. Salts are hashes of public names: they need not be secret, because clients
cannot reach the engines and whatever they send is folded in first.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest

MAX_CLIENT_SALT = 256  # vLLM sets no bound; a salt is an id, not a payload


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Whom a tenant's prompts share cached blocks with: itself (`tenant` set), a group, or
    every tenant that shares without a group (neither set)."""

    tenant: str | None = None
    group: str | None = None

    @property
    def label(self) -> str | None:
        if self.tenant is not None:
            return f"tenant:{self.tenant}"
        return f"group:{self.group}" if self.group is not None else None

    def public(self) -> dict[str, str | None]:
        """As `GET /admin/tenants` shows it."""
        mode = "isolated" if self.tenant is not None else "shared"
        return {"prefix_cache": mode, "prefix_cache_group": self.group}

    def salted(self, client_salt: str | None) -> SaltedScope:
        """The scope a request lands in, its own `cache_salt` folded in."""
        label = self.label
        if client_salt is None:
            return _derive(label)
        inner = f"client:{client_salt}"
        return _derive(inner if label is None else f"{label}|{inner}")


@dataclass(frozen=True, slots=True)
class SaltedScope:
    salt: str | None  # sent to the engine as `cache_salt`; None: the common cache
    seed: int  # added to prefix block ids; 0 for the common cache


COMMON = SaltedScope(None, 0)
SHARED = CacheScope()


@functools.lru_cache(maxsize=4096)  # per request otherwise: a tenant's scope is one label
def _derive(label: str | None) -> SaltedScope:
    if label is None:
        return COMMON
    digest = hashlib.sha256(b"agent-gateway/cache-scope/" + label.encode()).digest()
    return SaltedScope(digest[:16].hex(), int.from_bytes(digest[16:24], "little"))


def scope_of(
    tenant: str, prefix_cache: str | None, group: str | None, *, multi_tenant: bool
) -> CacheScope:
    """A tenant's scope: `prefix_cache` as the policy sets it, else isolated when the
    policy has more than one tenant (nobody opted into sharing) and shared when it has one
    (there is nobody to hide from, and isolation would cost hit rate for nothing)."""
    if group is not None:  # a group is a choice to share (the policy refuses it isolated)
        return CacheScope(group=group)
    mode = prefix_cache or ("isolated" if multi_tenant else "shared")
    return CacheScope(tenant=tenant) if mode == "isolated" else SHARED


def client_salt(body: dict[str, Any]) -> str | None:
    """The request's own `cache_salt`, checked; None when it sets none."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt or len(salt) > MAX_CLIENT_SALT:
        raise InvalidRequest(
            f"`cache_salt` must be a non-empty string of at most {MAX_CLIENT_SALT} characters.",
            param="cache_salt",
            code="invalid_value",
        )
    return salt
