"""Rate limits and budgets in the policy: what loads, and each mistake named at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy import PolicyError, load_policy, parse_policy
from gateway.tenants.directory import Tenants
from tests.unit.quota.models import TWO_MODELS

BASE = TWO_MODELS + "tenants:\n  acme:\n"
KEY = "a" * 64


def problems(tenant_yaml: str, tmp_path: Path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(BASE + tenant_yaml)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    return str(caught.value)


def test_limits_budgets_and_a_key_s_own_limits_load() -> None:
    policy = parse_policy(
        BASE
        + f"""\
    rate_limits: {{requests_per_minute: 600, tokens_per_minute: 200000}}
    key_rate_limits: {{requests_per_minute: 60}}
    budget: {{usd_per_day: 25, tokens_per_month: 50000000, on_exceeded: downgrade, downgrade_to: tiny}}
    keys: [{{sha256: {KEY}, rate_limits: {{tokens_per_minute: 1000}}}}]
quota: {{on_store_outage: fail_closed}}
"""
    )
    acme = policy.tenants["acme"]
    assert acme.rate_limits is not None and acme.rate_limits.tokens_per_minute == 200_000
    assert acme.budget is not None and acme.budget.downgrade_to == "tiny"
    assert policy.quota.on_store_outage == "fail_closed"
    identity = Tenants(policy).static_key(bytes.fromhex(KEY))
    assert identity is not None and identity.rate_limits is not None
    assert identity.rate_limits.tokens_per_minute == 1000
    assert parse_policy(BASE + "    models: [tiny]\n").quota.on_store_outage == "fail_open"


def test_a_downgrade_to_an_undefined_model_is_named_with_its_line(tmp_path: Path) -> None:
    message = problems(
        "    budget: {tokens_per_day: 10, on_exceeded: downgrade, downgrade_to: nano}\n", tmp_path
    )
    assert ":10: tenants.acme.budget.downgrade_to: model 'nano' is not defined" in message


def test_a_downgrade_to_a_model_the_tenant_may_not_use_is_refused(tmp_path: Path) -> None:
    message = problems(
        "    models: [large]\n"
        "    budget: {tokens_per_day: 10, on_exceeded: downgrade, downgrade_to: tiny}\n",
        tmp_path,
    )
    assert "tenants.acme.budget.downgrade_to: model 'tiny' is not one of this tenant's" in message


@pytest.mark.parametrize(
    ("tenant_yaml", "expected"),
    [
        ("    budget: {tokens_per_day: 10, on_exceeded: downgrade}\n", "needs downgrade_to"),
        (
            "    budget: {tokens_per_day: 10, downgrade_to: tiny}\n",
            "only with on_exceeded: downgrade",
        ),
        ("    budget: {on_exceeded: reject}\n", "give at least one of tokens_per_day"),
        ("    budget: {usd_per_day: 0}\n", "greater than 0"),
        ("    rate_limits: {}\n", "give requests_per_minute, tokens_per_minute or both"),
        ("    key_rate_limits: {requests_per_minute: 0}\n", "greater than or equal to 1"),
        ("    rate_limits: {requests_per_second: 5}\n", "unknown key"),
    ],
)
def test_each_mistake_is_refused(tenant_yaml: str, expected: str, tmp_path: Path) -> None:
    assert expected in problems(tenant_yaml, tmp_path)
