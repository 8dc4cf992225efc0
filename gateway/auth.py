"""API keys: who may call `/v1/*`.

`ApiKeyAuth` is a plain-ASGI layer just inside the edge (gateway/middleware.py), so it
guards the hot API calls answered in plain ASGI (gateway/api/calls.py) and the FastAPI
routes under /v1 (models, usage, sessions, responses) alike; /healthz, /readyz, /metrics
and /dashboard stay open for probes and scrapers. A request without a valid
`Authorization: Bearer <key>` gets 401 in OpenAI's shape, the same body whether the key
was missing, malformed or unknown.

Keys live behind the `KeyStore` protocol (`identify(token) -> Identity | None`), so
tenants and keys kept in Redis can come later without touching the edge. `FileKeyStore`
reads a file of keys (a Kubernetes Secret mounted as a file): one key per line, blank
lines and `#` comments ignored. Only SHA-256 digests are held, so a memory dump or a stray
repr shows no key; a check costs one sha256 and one dict lookup. The file is checked for
changes every `check_interval_s` by a background task, never on the request path; a
Secret update (kubelet swaps a symlink) is picked up within that interval.

Failure rules, all failing closed: a keys file set in the policy but unreadable at start
stops the gateway from starting; a file that becomes unreadable later keeps the last keys
(a rotation is a symlink swap, and a half-finished one must not lock everyone out); a
file with no keys refuses every request, because an emptied Secret must never open the
API. Neither the keys nor the Authorization header are ever logged: the request log and
spans are built from the request record, which carries no header.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import Unauthorized, error_response
from gateway.periodic import Periodic
from gateway.policy.schema import AuthSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """Who a valid key belongs to. `key_id` names the key without revealing it: the first
    12 hex digits of its SHA-256 (a tenant will join it when keys have owners)."""

    key_id: str


class KeyStore(Protocol):
    def identify(self, token: bytes) -> Identity | None:
        """The identity behind a bearer token, or None when it is no valid key."""
        ...


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
        return self._keys.get(hashlib.sha256(token).digest())

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


def open_key_store(spec: AuthSpec) -> FileKeyStore | None:
    """The key store the policy asks for; None when authentication is off."""
    if not spec.keys_file:
        return None
    return FileKeyStore(Path(spec.keys_file), spec.check_interval_s)


def _is_api(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1"


class ApiKeyAuth:
    """The ASGI layer: `/v1/*` requests pass with a valid bearer token, or get 401."""

    def __init__(self, app: ASGIApp, keys: KeyStore) -> None:
        self.app = app
        self._keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_api(scope["path"]):
            await self.app(scope, receive, send)
            return
        identity = self._identify(scope)
        state = scope.setdefault("state", {})
        if identity is None:
            record = state.get("telemetry")
            if record is not None:
                record.error_type = Unauthorized.default_code
            response = error_response(Unauthorized(), request_id=state.get("request_id"))
            await response(scope, receive, send)
            return
        state["identity"] = identity
        await self.app(scope, receive, send)

    def _identify(self, scope: Scope) -> Identity | None:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                token = token.strip()
                if scheme.lower() != b"bearer" or not token:
                    return None
                return self._keys.identify(token)
        return None
