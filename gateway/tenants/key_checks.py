"""The two key checks at the edge (gateway/edge/auth.py): tenant keys for /v1 and admin keys
for /admin. They share no key: an admin key is refused on /v1 unless it is also listed as
a tenant's key, and a tenant's key is refused on /admin.

A tenant key is looked up, in order: the policy's static keys and the `default` tenant's
keys file (both in memory: a dict lookup), then the keys created at run time (Redis,
behind `CachedKeys`). A run-time key whose tenant the policy no longer lists is refused.
"""

from __future__ import annotations

from pathlib import Path

from gateway.policy import Policy
from gateway.state.redis_client import RedisClient
from gateway.tenants.directory import Tenants
from gateway.tenants.identity import Identity, TenantAccess, digest_of, key_id_of
from gateway.tenants.key_file import FileKeyStore
from gateway.tenants.stored_keys import CachedKeys, RedisKeys

ADMIN = frozenset({"admin"})


class _WatchedFile:
    """A key check that may read a keys file, watched for changes while the app runs."""

    _file: FileKeyStore | None

    def start(self) -> None:
        if self._file is not None:
            self._file.start()

    async def stop(self) -> None:
        if self._file is not None:
            await self._file.stop()


class TenantKeys(_WatchedFile):
    def __init__(self, tenants: Tenants, file: FileKeyStore | None, cache_ttl_s: float) -> None:
        self.tenants = tenants
        self._file = file
        self._cache_ttl_s = cache_ttl_s
        self._runtime: CachedKeys | None = None

    def attach(self, redis: RedisClient) -> None:
        """Run-time keys are read once the state store is open (the app's lifespan)."""
        self._runtime = CachedKeys(RedisKeys(redis), self._cache_ttl_s)

    async def identify(self, token: bytes) -> tuple[Identity, TenantAccess] | None:
        """The key's owner and its tenant's access, or None when the key is no valid key.
        Raises StateUnavailable when only Redis could tell and Redis is unreachable."""
        digest = digest_of(token)
        identity = self.tenants.static_key(digest)
        if identity is None and self._file is not None:
            identity = self._file.identify_digest(digest)
        if identity is None and self._runtime is not None:
            identity = await self._runtime.identify(digest)
        if identity is None:
            return None
        access = self.tenants.access(identity.tenant)
        return (identity, access) if access is not None else None


class AdminKeys(_WatchedFile):
    def __init__(self, digests: set[bytes], file: FileKeyStore | None) -> None:
        self._static = {d: Identity(key_id_of(d), roles=ADMIN) for d in digests}
        self._file = file

    def identify(self, token: bytes) -> Identity | None:
        digest = digest_of(token)
        found = self._static.get(digest)
        if found is None and self._file is not None:
            from_file = self._file.identify_digest(digest)
            found = Identity(from_file.key_id, roles=ADMIN) if from_file is not None else None
        return found


def tenant_keys(policy: Policy) -> TenantKeys | None:
    """The /v1 key check the policy asks for; None when authentication is off. Files are
    read now: the first request is already guarded (an unreadable file stops start-up)."""
    tenants = Tenants(policy)
    if not tenants.required:
        return None
    auth = policy.auth
    file = FileKeyStore(Path(auth.keys_file), auth.check_interval_s) if auth.keys_file else None
    return TenantKeys(tenants, file, auth.key_cache_ttl_s)


def admin_keys(policy: Policy) -> AdminKeys | None:
    """The /admin key check; None when the policy names no admin key (no admin API)."""
    auth = policy.auth
    if not auth.admin_keys_file and not auth.admin_keys:
        return None
    file = (
        FileKeyStore(Path(auth.admin_keys_file), auth.check_interval_s)
        if auth.admin_keys_file
        else None
    )
    return AdminKeys({bytes.fromhex(k.sha256) for k in auth.admin_keys}, file)
