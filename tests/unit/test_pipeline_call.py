"""`Call.but`: the pipeline's cheap replacement for `dataclasses.replace` on its steps."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.call import Call
from gateway.chat.inbound import parse_request
from gateway.policy import Endpoint, parse_policy
from gateway.request_context import RequestContext
from gateway.tenants.settings import TenantPolicies

POLICY = parse_policy(
    "pools: {p: {served_model: m, replicas: [{url: 'http://a.test:1'}]}}\nmodels: {m: {pool: p}}\n"
)


def make_call() -> Call:
    raw = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    request = parse_request(Endpoint.chat, raw)
    context = RequestContext("r1")
    return Call(request, context, TenantPolicies(POLICY).of(context.access.name))


def test_but_is_replace_without_touching_the_original() -> None:
    call = make_call()
    headers = {"x-gateway-prefix-change": "tools"}
    changed = call.but(hide_usage=True, headers=headers)
    assert changed == dataclasses.replace(call, hide_usage=True, headers=headers)
    assert changed is not call
    assert not call.hide_usage and call.headers == {}
    assert changed.request is call.request and changed.context is call.context


def test_but_refuses_a_field_a_call_does_not_have() -> None:
    with pytest.raises(AssertionError, match="routed"):
        make_call().but(routed=True)
