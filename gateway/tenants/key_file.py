"""The keys file: API keys of the `default` tenant (or admin keys) from a file.

`FileKeyStore` reads a file of keys (a Kubernetes Secret mounted as a file): one key per
line, blank lines and `#` comments ignored; its keys belong to the `default` tenant (or,
as `auth.admin_keys_file`, are admin keys). Only SHA-256 digests are held, so a memory
dump or a stray repr shows no key; a check costs one sha256 and one dict lookup. The file
is checked for changes every `check_interval_s` by a background task, never on the
request path; a Secret update (kubelet swaps a symlink) is picked up within that interval.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.lifetime.startup import StartupRefused
from gateway.periodic import Periodic
from gateway.tenants.identity import Identity, digest_of, key_id_of

log = logging.getLogger(__name__)


class KeysFileError(StartupRefused):
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
        digest = digest_of(key.encode())
        out[digest] = Identity(key_id_of(digest))
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
