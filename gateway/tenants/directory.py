"""The policy's tenants, in memory: their static keys (by digest: one dict lookup per
request) and what each may do.

Keys of `auth.keys_file` belong to the tenant `default`; `default` may be listed under
`tenants` for its settings, and when it is not it may use every model and its content
is captured as `telemetry.traces.capture_content` says. A listed tenant's content is
captured only when it opts in (`capture_content: true`). A tenant's own body-size limit
rides on its `TenantAccess`, because the body is read before the pipeline runs; its other
settings are merged per policy in gateway/tenants/settings.py.
"""

from __future__ import annotations

from gateway.policy import Policy
from gateway.tenants.identity import DEFAULT_TENANT, Identity, TenantAccess, key_id_of


class Tenants:
    def __init__(self, policy: Policy) -> None:
        # Authentication is on as soon as any key could exist for /v1.
        self.required = bool(policy.auth.keys_file) or bool(policy.tenants)
        self._access = {
            name: TenantAccess(
                name,
                frozenset(spec.models) if spec.models is not None else None,
                spec.capture_content,
                spec.limits.max_body_bytes if spec.limits is not None else None,
            )
            for name, spec in policy.tenants.items()
        }
        self._access.setdefault(DEFAULT_TENANT, TenantAccess(DEFAULT_TENANT))
        self._static = {
            bytes.fromhex(key.sha256): Identity(
                key_id_of(bytes.fromhex(key.sha256)), name, frozenset(key.roles), key.rate_limits
            )
            for name, spec in policy.tenants.items()
            for key in spec.keys
        }

    def access(self, tenant: str) -> TenantAccess | None:
        """None for a tenant the policy does not know (a run-time key of a tenant since
        removed from the policy): its keys are refused."""
        return self._access.get(tenant)

    def static_key(self, digest: bytes) -> Identity | None:
        return self._static.get(digest)

    def __contains__(self, tenant: object) -> bool:
        return tenant in self._access

    def names(self) -> list[str]:
        return sorted(self._access)
