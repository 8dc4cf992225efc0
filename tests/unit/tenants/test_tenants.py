"""Tenants and their keys: the policy's tenants validated at load, keys mapped to their
tenant (static keys, the `default` tenant's keys file, run-time keys in Redis behind a
TTL cache), the `gateway keys` command, and content captured only where a tenant opts in."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from gateway.cli import main
from gateway.errors import StateUnavailable
from gateway.policy import PolicyError, parse_policy
from gateway.resilience.response_cache import RedisResponseCache
from gateway.telemetry import names
from gateway.tenants.directory import Tenants
from gateway.tenants.key_checks import TenantKeys
from gateway.tenants.key_file import FileKeyStore
from gateway.tenants.stored_keys import CachedKeys, RedisKeys
from tests.unit.tenant_gateway import (
    forget_tenants,
    new_tenants,
    open_gateway,
    sha256,
    two_tenant_policy,
    two_tenant_yaml,
)

BASE = """\
version: 1
pools:
  chat: {served_model: served, replicas: [{url: "http://a.test:1"}]}
models:
  tiny: {pool: chat}
"""
DIGEST = sha256("sk-agw-one")


def problems_of(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    return str(caught.value)


def test_a_tenant_naming_an_unknown_model_is_an_error_naming_the_path() -> None:
    text = problems_of(BASE + "tenants:\n  team-a:\n    models: [tiny, nope]\n")
    assert "tenants.team-a.models[1]: model 'nope' is not defined (expected one of: tiny)" in text


def test_one_key_digest_for_two_tenants_is_rejected() -> None:
    text = problems_of(
        BASE
        + f"tenants:\n  a: {{keys: [{{sha256: {DIGEST}}}]}}\n  b: {{keys: [{{sha256: {DIGEST}}}]}}\n"
    )
    assert "tenants.b.keys[0].sha256: this key digest is already a key of tenants.a" in text


@pytest.mark.parametrize(
    "tenants",
    [
        "  a: {keys: [{sha256: sk-agw-plaintext}]}",  # a key itself, not its digest
        f"  a: {{keys: [{{sha256: {DIGEST.upper()}}}]}}",
        f"  a: {{keys: [{{sha256: {DIGEST}, roles: [root]}}]}}",
        "  a/b: {}",  # a tenant name is a Redis key part
    ],
)
def test_keys_are_digests_and_tenant_names_are_plain(tenants: str) -> None:
    problems_of(BASE + "tenants:\n" + tenants + "\n")


async def test_keys_map_to_their_tenants(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-agw-from-file\n")
    policy = parse_policy(
        BASE
        + f'auth: {{keys_file: "{keys_file}"}}\n'
        + f"tenants:\n  a:\n    keys: [{{sha256: {DIGEST}, roles: [user, approver]}}]\n"
        + "    models: [tiny]\n"
    )
    keys = TenantKeys(Tenants(policy), FileKeyStore(keys_file, 1.0), cache_ttl_s=5)
    static = await keys.identify(b"sk-agw-one")
    assert static is not None
    identity, access = static
    assert (identity.tenant, identity.roles, access.models) == (
        "a",
        frozenset({"user", "approver"}),
        frozenset({"tiny"}),
    )
    from_file = await keys.identify(b"sk-agw-from-file")
    assert from_file is not None and from_file[0].tenant == "default"
    assert from_file[1].models is None  # `default`, not listed: every model
    assert await keys.identify(b"sk-agw-nobody") is None


async def test_run_time_keys_are_cached_found_or_not_for_the_ttl(
    redis: aioredis.Redis, redis_url: str
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    now = [1000.0]
    store = RedisKeys(redis)
    cached = CachedKeys(store, ttl_s=5, clock=lambda: now[0])
    try:
        key, record = await store.create(tenant, name="ci", roles=["approver"])
        assert record.roles == ("approver",)
        digest = bytes.fromhex(sha256(key))
        missing = bytes.fromhex(sha256("sk-agw-not-yet"))
        found = await cached.identify(digest)
        assert found is not None and found.tenant == tenant and found.key_id == record.key_id
        assert await cached.identify(missing) is None
        assert await store.revoke(record.key_id) == record
        assert await store.of_tenant(tenant) == []
        now[0] += 4.9  # within the TTL the revoked key still passes on this replica
        assert await cached.identify(digest) == found
        now[0] += 0.2
        assert await cached.identify(digest) is None
    finally:
        forget_tenants(redis_url, tenant)


async def test_a_run_time_key_of_a_tenant_not_in_the_policy_is_refused(
    redis: aioredis.Redis, redis_url: str
) -> None:
    a, b = new_tenants()
    gone = f"gone-{uuid.uuid4().hex[:10]}"
    keys = TenantKeys(Tenants(two_tenant_policy(redis_url, a, b)), None, cache_ttl_s=0)
    keys.attach(redis)
    try:
        kept, _ = await RedisKeys(redis).create(a.name)
        dropped, _ = await RedisKeys(redis).create(gone)
        assert (await keys.identify(kept.encode())) is not None
        assert await keys.identify(dropped.encode()) is None
    finally:
        forget_tenants(redis_url, a.name, gone)


def test_the_keys_command_creates_lists_and_revokes(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = new_tenants()
    policy = tmp_path / "policy.yaml"
    policy.write_text(two_tenant_yaml(redis_url, a, b))
    try:
        assert (
            main(["keys", "create", "--tenant", b.name, "--name", "ci", "--policy", str(policy)])
            == 0
        )
        out, err = capsys.readouterr()
        key = out.strip()
        assert key.startswith("sk-agw-") and "\n" not in key  # stdout: the key alone
        assert key not in err and b.name in err
        assert main(["keys", "list", "--tenant", b.name, "--policy", str(policy)]) == 0
        listing, _ = capsys.readouterr()
        key_id = sha256(key)[:12]
        assert key_id in listing and "ci" in listing and key not in listing

        client, _ = open_gateway(two_tenant_policy(redis_url, a, b))
        try:
            headers = {"Authorization": f"Bearer {key}"}
            assert client.get("/v1/models", headers=headers).status_code == 200
            assert main(["keys", "revoke", key_id, "--policy", str(policy)]) == 0
            assert client.get("/v1/models", headers=headers).status_code == 401
        finally:
            client.__exit__(None, None, None)
        assert main(["keys", "revoke", key_id, "--policy", str(policy)]) == 1
        assert main(["keys", "create", "--tenant", "nobody", "--policy", str(policy)]) == 1
    finally:
        forget_tenants(redis_url, a.name, b.name)


def test_a_bad_key_and_no_key_get_the_very_same_401(redis_url: str) -> None:
    a, b = new_tenants()
    client, fake = open_gateway(two_tenant_policy(redis_url, a, b))
    try:
        answers = [
            client.get("/v1/models", headers=headers)
            for headers in ({}, {"Authorization": "Bearer sk-agw-guess"}, {"Authorization": a.key})
        ]
        assert {r.status_code for r in answers} == {401}
        assert len({r.content for r in answers}) == 1
        volatile = {"x-request-id"}
        assert (
            len({tuple((k, v) for k, v in r.headers.items() if k not in volatile) for r in answers})
            == 1
        )
        assert fake.calls == []
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


@pytest.fixture
def capturing(redis_url: str) -> Iterator[tuple[TestClient, InMemorySpanExporter, list[str]]]:
    a, b = new_tenants()
    text = two_tenant_yaml(
        redis_url,
        a,
        b,
        extra="telemetry: {traces: {sample_ratio: 1.0, capture_content: true}}\n",
        a_settings="capture_content: true,",
    )
    spans = InMemorySpanExporter()
    client, _ = open_gateway(parse_policy(text), span_processor=SimpleSpanProcessor(spans))
    try:
        yield client, spans, [a.key, b.key, a.name, b.name]
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


def test_content_is_captured_only_for_a_tenant_that_opts_in(
    capturing: tuple[TestClient, InMemorySpanExporter, list[str]],
) -> None:
    client, spans, (a_key, b_key, a_name, b_name) = capturing
    for key, text in ((a_key, "from a"), (b_key, "from b")):
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": text}]},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answer.status_code == 200
    roots = [s for s in spans.get_finished_spans() if s.attributes and names.TENANT in s.attributes]
    by_tenant = {s.attributes[names.TENANT]: s.attributes for s in roots if s.attributes}
    assert "from a" in str(by_tenant[a_name].get(names.GEN_AI_INPUT_MESSAGES))
    assert names.GEN_AI_INPUT_MESSAGES not in by_tenant[b_name]
    assert names.GEN_AI_OUTPUT_MESSAGES not in by_tenant[b_name]


async def test_kept_answers_are_per_tenant(redis: aioredis.Redis) -> None:
    cache = RedisResponseCache(redis, ttl_s=60)
    request_hash = uuid.uuid4().hex
    await cache.put(request_hash, b"answer", tenant="t-one")
    try:
        assert await cache.get(request_hash, tenant="t-one") == b"answer"
        assert await cache.get(request_hash, tenant="t-two") is None
        assert await cache.get(request_hash) is None
    finally:
        await redis.delete(f"agw:answer:{{t-one/{request_hash}}}")


async def test_a_run_time_key_is_not_passed_when_redis_cannot_vouch_for_it() -> None:
    """Fail closed, and honestly: 503 (the store is down), never a pass or a false 401."""
    unreachable = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        with pytest.raises(StateUnavailable):
            await CachedKeys(RedisKeys(unreachable), ttl_s=5).identify(b"\0" * 32)
    finally:
        await unreachable.aclose()
