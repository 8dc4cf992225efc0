"""API keys: who may call `/v1/*` and `/admin/*`.

`ApiKeyAuth` is a plain-ASGI layer just inside the edge (gateway/middleware.py), so it
guards the hot API calls answered in plain ASGI (gateway/api/calls.py) and the FastAPI
routes under /v1 (models, usage, sessions, responses) and /admin alike; /healthz, /readyz,
/metrics and /dashboard stay open for probes and scrapers. A request without a valid
`Authorization: Bearer <key>` gets 401 in OpenAI's shape, the same body and headers
whether the key was missing, malformed, unknown or another tenant's: a caller learns
nothing about which keys or tenants exist.

A valid /v1 key puts its `Identity` (tenant, key id, roles) and its tenant's
`TenantAccess` in the ASGI scope's state (`identity`, `tenant`); the request record takes
the tenant, and everything a tenant owns is namespaced by it. The key checks themselves
live in gateway/keys/ (tenants' static keys, run-time keys in Redis, admin keys).

`FileKeyStore` reads a file of keys (a Kubernetes Secret mounted as a file): one key per
line, blank lines and `#` comments ignored; its keys belong to the `default` tenant (or,
as `auth.admin_keys_file`, are admin keys). Only SHA-256 digests are held, so a memory
dump or a stray repr shows no key; a check costs one sha256 and one dict lookup. The file
is checked for changes every `check_interval_s` by a background task, never on the
request path; a Secret update (kubelet swaps a symlink) is picked up within that interval.

Failure rules, all failing closed: a keys file set in the policy but unreadable at start
stops the gateway from starting; a file that becomes unreadable later keeps the last keys
(a rotation is a symlink swap, and a half-finished one must not lock everyone out); a
file with no keys refuses every request, because an emptied Secret must never open the
API; a key only Redis could vouch for while Redis is unreachable gets 503. Neither the keys
nor the Authorization header are ever logged: the request log and spans are built from
the request record, which carries no header.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError, Unauthorized, error_response
from gateway.keys.identity import Identity, TenantAccess, digest_of
from gateway.periodic import Periodic

log = logging.getLogger(__name__)


class KeyStore(Protocol):
    async def identify(self, token: bytes) -> tuple[Identity, TenantAccess] | None:
        """The owner of a bearer token and its tenant's access, or None when it is no
        valid key."""
        ...


class AdminKeyStore(Protocol):
    def identify(self, token: bytes) -> Identity | None: ...


class KeysFileError(Exception):
    """The keys file named in the policy cannot be read at start-up."""


def parse_keys(text: str) -> dict[bytes, Identity]:
    """Digest -> identity for every key in the file's text."""
    out: dict[bytes, Identity] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        key = raw.strip()
        if not key or key.startswith("#"):
            continue
        if any(c.isspace() for c in key):  # not a bearer token; the line is not echoed
            log.warning("keys file line %d holds whitespace inside a key: ignored", number)
            continue
        digest = hashlib.sha256(key.encode()).digest()
        out[digest] = Identity(digest.hex()[:12])
    return out


class FileKeyStore:
    def __init__(self, path: Path, check_interval_s: float) -> None:
        self._path = path
        self._stamp: tuple[int, int, int, int] | None = None
        try:
            self._keys = self._read()
        except OSError as exc:
            raise KeysFileError(f"cannot read the API keys file {path}: {exc.strerror}") from exc
        self._loop = Periodic("api-keys", check_interval_s, self._check)

    def identify(self, token: bytes) -> Identity | None:
        return self._keys.get(digest_of(token))

    def identify_digest(self, digest: bytes) -> Identity | None:
        return self._keys.get(digest)

    def __len__(self) -> int:
        return len(self._keys)

    def reload_if_changed(self) -> bool:
        """Re-read the file if it changed since the last read; True when keys were read."""
        try:
            if self._stamp_of() == self._stamp:
                return False
            keys = self._read()
        except OSError as exc:
            log.warning(
                "cannot read the API keys file %s (%s): keeping the last keys",
                self._path,
                exc.strerror,
            )
            return False
        self._keys = keys
        log.info("API keys file %s re-read: %d key(s)", self._path, len(keys))
        return True

    def _read(self) -> dict[bytes, Identity]:
        stamp = self._stamp_of()
        keys = parse_keys(self._path.read_text(encoding="utf-8"))
        self._stamp = stamp
        if not keys:
            log.warning("API keys file %s holds no key: every /v1 request is refused", self._path)
        return keys

    def _stamp_of(self) -> tuple[int, int, int, int]:
        # stat follows the Secret volume's symlinks: a rotation changes the inode.
        stat = self._path.stat()
        return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)

    async def _check(self) -> None:
        self.reload_if_changed()

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()


def _is_api(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1"


def _is_admin(path: str) -> bool:
    return path.startswith("/admin/") or path == "/admin"


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            raw: bytes = value
            scheme, _, token = raw.partition(b" ")
            token = token.strip()
            if scheme.lower() != b"bearer" or not token:
                return None
            return token
    return None


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
            state["tenant"] = access
            record = state.get("telemetry")
            if record is not None:
                record.tenant = identity.tenant
                record.capture = record.capture and access.capture_content
        await self.app(scope, receive, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, error: GatewayError
    ) -> None:
        state = scope.setdefault("state", {})
        record = state.get("telemetry")
        if record is not None:
            record.error_type = error.code or error.error_type
        response = error_response(error, request_id=state.get("request_id"))
        await response(scope, receive, send)
