"""A gateway with two tenants for the tenant, isolation and admin tests: real app, real
Redis, the engine replaced by its twin (it answers with what it was sent)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.policy import Policy, parse_policy
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import with_redis


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def echo(call: Call) -> Scripted:
    """Answers with every message text it was sent, so a leak would show in the answer."""
    body = orjson.loads(call.body)
    seen = " | ".join(str(m.get("content")) for m in body.get("messages", []))
    return Scripted(
        body=orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "served",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"seen: {seen}"},
                    }
                ],
                "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
            }
        )
    )


@dataclass
class Tenant:
    name: str
    key: str = field(default_factory=lambda: f"sk-agw-test-{uuid.uuid4().hex}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def two_tenant_yaml(
    redis_url: str,
    a: Tenant,
    b: Tenant,
    *,
    auth: str = "{key_cache_ttl_s: 0}",
    extra: str = "",
    a_settings: str = "",
    b_settings: str = "",
) -> str:
    """`a` may use both models, `b` only `tiny`; run-time keys are not cached. `a_settings`
    and `b_settings` are more of each tenant's settings, as a YAML flow mapping's items."""
    policy = f"""\
version: 1
auth: {auth}
pools:
  chat: {{served_model: served, replicas: [{{url: "http://a.test:1"}}]}}
  big: {{served_model: served-big, replicas: [{{url: "http://b.test:1"}}]}}
models:
  tiny: {{pool: chat}}
  large: {{pool: big}}
tenants:
  {a.name}: {{{a_settings}
    keys: [{{sha256: {sha256(a.key)}, name: alice, roles: [user, approver]}}]}}
  {b.name}: {{{b_settings}
    keys: [{{sha256: {sha256(b.key)}, name: bob}}], models: [tiny]}}
{extra}"""
    return with_redis(policy, redis_url)


def two_tenant_policy(redis_url: str, a: Tenant, b: Tenant, **options: str) -> Policy:
    return parse_policy(two_tenant_yaml(redis_url, a, b, **options))


def new_tenants() -> tuple[Tenant, Tenant]:
    suffix = uuid.uuid4().hex[:10]
    return Tenant(f"a-{suffix}"), Tenant(f"b-{suffix}")


def open_gateway(policy: Policy, **options: Any) -> tuple[TestClient, FakeUpstream]:
    fake = FakeUpstream(echo)
    app = create_app(policy, upstream=fake, store=StateStore(policy.state), **options)
    client = TestClient(app)
    client.__enter__()
    return client, fake


def forget_tenants(redis_url: str, *names: str) -> None:
    """Deletes what the tests wrote for these tenants: their run-time keys, then every key
    named after them (sessions, responses, usage rows)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for name in names:
            for key_id in client.smembers(f"agw:apikeys:tenant:{{{name}}}"):
                digest = client.hget("agw:apikeys:ids", key_id)
                if digest is not None:
                    text = digest.decode() if isinstance(digest, bytes) else digest
                    client.delete(f"agw:apikey:{{{text}}}")
                client.hdel("agw:apikeys:ids", key_id)
            for key in client.scan_iter(match=f"*{name}*"):
                client.delete(key)
            client.srem("agw:usage:tenants", name)
    finally:
        client.close()
