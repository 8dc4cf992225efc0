"""The policy's `approvals:` section: validated at load, naming the path of a mistake."""

from __future__ import annotations

import pytest

from gateway.policy import PolicyError, parse_policy
from tests.unit.tenant_gateway import sha256

BASE = f"""\
version: 1
pools:
  chat: {{served_model: served, replicas: [{{url: "http://a.test:1"}}]}}
models:
  tiny: {{pool: chat}}
tenants:
  acme: {{keys: [{{sha256: {sha256("sk-agw-k")}, roles: [user, approver]}}]}}
"""


def problems_of(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    return str(caught.value)


def test_tools_globally_per_model_and_per_tenant() -> None:
    policy = parse_policy(
        BASE
        + "approvals:\n  tools: [cancel_reservation]\n  models: {tiny: [book_reservation]}\n"
        + "  tenants: {acme: [send_certificate], default: []}\n  ttl_s: 600\n"
    )
    assert policy.approvals.enabled
    assert policy.approvals.models["tiny"] == ("book_reservation",)


def test_approvals_are_off_by_default() -> None:
    assert not parse_policy(BASE).approvals.enabled


def test_unknown_models_and_tenants_are_named() -> None:
    text = problems_of(
        BASE + "approvals:\n  models: {huge: [cancel_reservation]}\n  tenants: {nobody: [x]}\n"
    )
    assert "approvals.models.huge: model 'huge' is not defined (expected one of: tiny)" in text
    assert "approvals.tenants.nobody: tenant 'nobody' is not defined" in text


def test_approvals_without_keys_are_refused() -> None:
    no_auth = BASE.split("tenants:")[0]
    text = problems_of(no_auth + "approvals: {tools: [cancel_reservation]}\n")
    assert "approvals: approvals need API keys" in text


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ("Waiting on {tools}.", "must name {approval_id}"),
        ("{approval_id} {who}", "unknown placeholder(s) ['who']"),
        ("{approval_id", "not a valid template"),
    ],
)
def test_a_message_template_is_checked(message: str, why: str) -> None:
    text = problems_of(BASE + f"approvals: {{tools: [x], message: '{message}'}}\n")
    assert "approvals.message" in text and why in text


def test_a_tool_name_is_checked() -> None:
    assert "approvals.tools[0]" in problems_of(BASE + "approvals: {tools: ['rm -rf']}\n")
