"""Tenants' prompts and the engines' shared prefix cache (gateway/tenants/cache_scope.py).

The oracle this closes: tenant B sent tenant A's prompt and read `cached_blocks=5/5` in
`X-Gateway-Route` (and the engine's own `cached_tokens`), so B could test whether A had
sent a text. Isolated tenants get a `cache_salt` of their own at the engine and their own
keyspace in the router's index; shared tenants (or a group of them) share both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.policy import PolicyError, parse_policy
from gateway.prompt.blocks import chain_hashes
from gateway.tenants.cache_scope import CacheScope, scope_of
from tests.fakes import FakeUpstream
from tests.policies import parse_with_redis
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    two_tenant_yaml,
)

# Long enough for several 512-byte blocks (the default `routing.block_bytes`).
SECRET_PROMPT = "Tenant A's confidential playbook: " + "refund policy clause; " * 120


def _ask(client: TestClient, tenant: Tenant, **extra: object) -> tuple[str, dict[str, object]]:
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": SECRET_PROMPT},
            {"role": "user", "content": "hi"},
        ],
        **extra,
    }
    response = client.post("/v1/chat/completions", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.headers["X-Gateway-Route"], body


def _sent(fake: FakeUpstream) -> dict[str, object]:
    body: dict[str, object] = orjson.loads(fake.calls[-1].body)
    return body


@pytest.fixture
def tenants(redis_url: str) -> Iterator[tuple[Tenant, Tenant]]:
    a, b = new_tenants()
    yield a, b
    forget_tenants(redis_url, a.name, b.name)


@contextmanager
def _gateway(
    redis_url: str, a: Tenant, b: Tenant, a_settings: str = "", b_settings: str = ""
) -> Iterator[tuple[TestClient, FakeUpstream]]:
    yaml = two_tenant_yaml(redis_url, a, b, a_settings=a_settings, b_settings=b_settings)
    client, fake = open_gateway(parse_policy(yaml))
    try:
        yield client, fake
    finally:
        client.__exit__(None, None, None)


def test_another_tenant_sending_the_same_prompt_sees_nothing_cached(
    redis_url: str, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    with _gateway(redis_url, a, b) as (client, fake):
        first, _ = _ask(client, a)
        again, _ = _ask(client, a)
        assert "cached_blocks=0/" in first
        assert "cached_blocks=0/" not in again  # A's own prefix is found again
        salt_a = _sent(fake)["cache_salt"]
        probe, _ = _ask(client, b)
        assert "cached_blocks=0/" in probe  # B learns nothing about A's prompt
        salt_b = _sent(fake)["cache_salt"]
    # And the engine keeps the two apart too: each tenant has a salt of its own.
    assert isinstance(salt_a, str) and isinstance(salt_b, str)
    assert salt_a != salt_b


def test_a_client_salt_is_folded_into_its_tenants_never_sent_as_is(
    redis_url: str, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    with _gateway(redis_url, a, b) as (client, fake):
        _ask(client, a)
        own = _sent(fake)["cache_salt"]
        _ask(client, b, cache_salt=own)  # B tries A's salt ...
        assert _sent(fake)["cache_salt"] not in (own, None)  # ... and lands in its own scope
        _ask(client, a, cache_salt="user-42")
        per_user = _sent(fake)["cache_salt"]
        assert per_user not in (own, "user-42")
        bad = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "cache_salt": 5},
            headers=a.headers,
        )
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "cache_salt"


def test_tenants_that_share_see_each_others_prefix(
    redis_url: str, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    group = "prefix_cache_group: acme,"
    with _gateway(redis_url, a, b, group, group) as (client, fake):
        _ask(client, a)
        salt_a = _sent(fake)["cache_salt"]
        shared, _ = _ask(client, b)
        salt_b = _sent(fake)["cache_salt"]
    assert "cached_blocks=0/" not in shared
    assert salt_a == salt_b is not None


def test_shared_without_a_group_is_the_engines_common_cache(
    redis_url: str, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    shared = "prefix_cache: shared,"
    with _gateway(redis_url, a, b, shared, shared) as (client, fake):
        _ask(client, a)
        assert "cache_salt" not in _sent(fake)
        hit, _ = _ask(client, b)
    assert "cached_blocks=0/" not in hit


def test_one_tenant_alone_is_shared_and_its_bytes_pass_unchanged(redis_url: str) -> None:
    policy = parse_with_redis(
        """\
version: 1
pools: {chat: {served_model: tiny, replicas: [{url: "http://a.test:1"}]}}
models: {tiny: {pool: chat}}
""",
        redis_url,
    )
    client, fake = open_gateway(policy)
    raw = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
    try:
        response = client.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    finally:
        client.__exit__(None, None, None)
    assert response.status_code == 200
    assert fake.calls[-1].body == raw


def test_admin_tenants_shows_each_tenants_cache_scope(redis_url: str) -> None:
    policy = parse_with_redis(
        """\
version: 1
pools: {chat: {served_model: tiny, replicas: [{url: "http://a.test:1"}]}}
models: {tiny: {pool: chat}}
tenants:
  solo: {}
  one: {prefix_cache_group: acme}
  open: {prefix_cache: shared}
""",
        redis_url,
    )
    from gateway.tenants.settings import TenantPolicies

    shown = {t.name: t.public() for t in TenantPolicies(policy).listed()}
    assert shown["solo"]["prefix_cache"] == "isolated"
    assert shown["default"]["prefix_cache"] == "isolated"  # more than one tenant exists
    assert (shown["one"]["prefix_cache"], shown["one"]["prefix_cache_group"]) == ("shared", "acme")
    assert (shown["open"]["prefix_cache"], shown["open"]["prefix_cache_group"]) == ("shared", None)


def test_a_group_for_an_isolated_tenant_is_a_load_error() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            """\
version: 1
pools: {chat: {served_model: tiny, replicas: [{url: "http://a.test:1"}]}}
models: {tiny: {pool: chat}}
tenants:
  t: {prefix_cache: isolated, prefix_cache_group: acme}
"""
        )
    assert "prefix_cache_group" in str(caught.value)


def test_scopes_derive_distinct_salts_and_block_keyspaces() -> None:
    isolated = scope_of("a", None, None, multi_tenant=True)
    other = scope_of("b", None, None, multi_tenant=True)
    alone = scope_of("a", None, None, multi_tenant=False)
    assert isolated == CacheScope(tenant="a")
    assert alone == CacheScope()
    salts = {isolated.salted(None), other.salted(None), isolated.salted("x"), alone.salted("x")}
    assert len(salts) == 4
    assert alone.salted(None).salt is None
    data = b"p" * 4096
    seeded = chain_hashes(data, 512, isolated.salted(None).seed)
    assert not set(seeded) & set(chain_hashes(data, 512))
    assert not set(seeded) & set(chain_hashes(data, 512, other.salted(None).seed))
