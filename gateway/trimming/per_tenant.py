"""The trimmers of one policy: the top-level `trimming`'s, and one per tenant whose
merged settings differ from it (`tenants.<name>.trimming`), sharing one token counter
(loaded once, and only when some trimmer is on)."""

from __future__ import annotations

from gateway.policy.sessions import TrimmingSpec
from gateway.tenants.settings import TenantPolicies
from gateway.trimming.tokens import TokenCounter, token_counter
from gateway.trimming.trim import Trimmer


def policy_trimmers(
    default: TrimmingSpec, tenants: TenantPolicies
) -> tuple[Trimmer | None, dict[str, Trimmer | None]]:
    """The default trimmer (None: off), and the tenants' own (None: off for that tenant)."""
    specs = {s.name: s.trimming for s in tenants.listed() if s.trimming is not default}
    counter: TokenCounter | None = None
    if default.enabled or any(spec.enabled for spec in specs.values()):
        counter = token_counter(default.tokenizer)

    def trimmer(spec: TrimmingSpec) -> Trimmer | None:
        return Trimmer(spec, counter) if spec.enabled and counter is not None else None

    return trimmer(default), {name: trimmer(spec) for name, spec in specs.items()}
