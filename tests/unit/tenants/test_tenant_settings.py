"""Tenants' own settings through the real app (real Redis, the engine's twin): limits,
body size, trimming, fallbacks and tiers each take effect for their tenant only; the
settings are merged once per policy, a reload's new defaults reach every tenant that did
not override them, and `GET /admin/tenants` shows what is in effect."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.policy.reloadable import load_policy_file
from gateway.state.store import StateStore
from gateway.tenants.settings import TenantPolicies
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import parse_with_redis, with_redis
from tests.unit.tenant_gateway import Tenant, echo, forget_tenants, sha256

ADMIN_KEY = f"sk-agw-admin-{uuid.uuid4().hex}"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# Each tenant overrides one thing; `plain` none.
OVERRIDES = {
    "limited": "limits: {max_messages: 2, max_body_bytes: 600}",
    "trimmed": "trimming: {enabled: true, high_water_tokens: 300, low_water_tokens: 100}",
    "small": "tiers: [small]\n    models: [tiny, spare, auto]",
    "no_fallback": "fallbacks: {tiny: []}",
    "narrow": "models: [tiny]",  # tiny's own fallback (spare) is not this tenant's
    "plain": "",
}
POLICY = """\
version: 1
server: {{reload_interval_s: 0}}
auth: {{key_cache_ttl_s: 0, admin_keys: [{{sha256: {admin}}}]}}
pools:
  chat: {{served_model: served, tier: small, replicas: [{{url: "http://chat.test:1"}}]}}
  spare: {{served_model: served-spare, tier: small, replicas: [{{url: "http://spare.test:1"}}]}}
  big: {{served_model: served-big, tier: large, replicas: [{{url: "http://big.test:1"}}]}}
models:
  tiny: {{pool: chat, fallbacks: [spare]}}
  spare: {{pool: spare}}
  large: {{pool: big}}
  auto: {{tiering: auto}}
tiering:
  auto: {{tiers: {{small: chat, large: big}}, default_tier: large, learned: null}}
tenants:
{tenants}"""


def engine(call: Call) -> Scripted:
    """Echoes what it was sent; the `chat` pool fails whatever asks it to."""
    if call.url.startswith("http://chat.test") and b"please fail" in call.body:
        return Scripted(status=500, body=b'{"error": {"message": "boom"}}')
    return echo(call)


@dataclass
class Gateway:
    client: TestClient
    fake: FakeUpstream
    tenants: dict[str, Tenant]
    path: Path

    def chat(self, tenant: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
        headers = {**self.tenants[tenant].headers, **extra.pop("headers", {})}
        body = {"model": extra.pop("model", "tiny"), "messages": messages, **extra}
        return self.client.post("/v1/chat/completions", json=body, headers=headers)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.fixture
def gateway(redis_url: str, tmp_path: Path) -> Iterator[Gateway]:
    suffix = uuid.uuid4().hex[:8]
    tenants = {role: Tenant(f"{role.replace('_', '-')}-{suffix}") for role in OVERRIDES}
    entries = "".join(
        f"  {tenants[role].name}:\n    keys: [{{sha256: {sha256(tenants[role].key)}}}]\n"
        + (f"    {override}\n" if override else "")
        for role, override in OVERRIDES.items()
    )
    path = tmp_path / "policy.yaml"
    text = POLICY.format(admin=sha256(ADMIN_KEY), tenants=entries)
    path.write_text(with_redis(text, redis_url))
    policy, source = load_policy_file(path)
    fake = FakeUpstream(engine)
    app = create_app(policy, upstream=fake, store=StateStore(policy.state), policy_file=source)
    client = TestClient(app)
    client.__enter__()
    try:
        yield Gateway(client, fake, tenants, path)
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, *(t.name for t in tenants.values()))


def test_a_tenants_limits_replace_the_defaults_for_it_alone(gateway: Gateway) -> None:
    three = [user("a"), {"role": "assistant", "content": "b"}, user("c")]
    refused = gateway.chat("limited", three)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("array_above_max_length", "messages")
    assert "maximum length 2" in error["message"]
    assert gateway.chat("plain", three).status_code == 200
    responses = {"model": "tiny", "input": three}
    limited = gateway.client.post(
        "/v1/responses", json=responses, headers=gateway.tenants["limited"].headers
    )
    assert limited.status_code == 400
    assert limited.json()["error"]["param"] == "input"


def test_a_tenants_body_size_limit_is_checked_before_the_body_is_read(gateway: Gateway) -> None:
    long = [user("x" * 700)]
    assert gateway.chat("limited", long).status_code == 413
    assert gateway.chat("plain", long).status_code == 200
    # The routes behind FastAPI hold the tenant to its limit too.
    fork = b"{" + b" " * 700 + b"}"
    for tenant, too_large in (("limited", True), ("plain", False)):
        headers = gateway.tenants[tenant].headers
        answer = gateway.client.post("/v1/sessions/s1/fork", content=fork, headers=headers)
        assert (answer.status_code == 413) is too_large


def test_a_tenant_that_turns_trimming_on_gets_compacted_contexts(gateway: Gateway) -> None:
    big = "flight HAT001 departs 06:00, economy $120; " * 40
    call = {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    sent: dict[str, str] = {}
    for tenant in ("trimmed", "plain"):
        session = {"X-Session-Id": f"trim-{uuid.uuid4().hex}"}
        history: list[dict[str, Any]] = []
        for turn in range(3):
            history += [
                user(f"Search day {turn}"),
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "x", "content": big},
            ]
            answer = gateway.chat(tenant, history, headers=session)
            assert answer.status_code == 200, answer.text
            history.append(answer.json()["choices"][0]["message"])
        sent[tenant] = gateway.fake.calls[-1].body.decode()
    assert "Earlier turns, compacted" in sent["trimmed"]
    assert "Earlier turns, compacted" not in sent["plain"]  # trimming is off by default


def test_fallbacks_are_the_tenants_own_and_only_models_it_may_use(gateway: Gateway) -> None:
    failing = [user("please fail")]
    served = gateway.chat("plain", failing)
    assert served.status_code == 200
    assert served.headers["x-gateway-fallback"] == "spare"
    for tenant in ("no_fallback", "narrow"):  # `tiny: []`; spare is not narrow's model
        before = len(gateway.fake.calls)
        answer = gateway.chat(tenant, failing)
        assert answer.status_code in (502, 503)  # the engine failed, or left the rotation
        assert "x-gateway-fallback" not in answer.headers
        assert not any("spare.test" in c.url for c in gateway.fake.calls[before:])


def test_a_tier_the_tenant_may_not_use_moves_to_one_it_may(gateway: Gateway) -> None:
    asked = [user("hello")]
    plain = gateway.chat("plain", asked, model="auto")
    assert plain.headers["x-gateway-tier"] == "large"
    small = gateway.chat("small", asked, model="auto")
    assert small.status_code == 200
    assert small.headers["x-gateway-tier"] == "small"
    assert "tier large not allowed for the tenant" in small.headers["x-gateway-route-reason"]
    assert gateway.fake.calls[-1].url.startswith("http://chat.test")
    assert gateway.chat("small", asked, model="large").status_code == 404  # not its model


def test_the_admin_api_lists_the_settings_in_effect_and_a_reload_updates_them(
    gateway: Gateway,
) -> None:
    def settings() -> dict[str, dict[str, Any]]:
        answer = gateway.client.get("/admin/tenants", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        return {entry["name"]: entry for entry in answer.json()["data"]}

    names = {role: tenant.name for role, tenant in gateway.tenants.items()}
    listed = settings()
    assert listed["default"]["limits"]["max_messages"] == 2048
    limited = listed[names["limited"]]
    assert (limited["limits"]["max_messages"], limited["limits"]["max_tools"]) == (2, 256)
    assert listed[names["trimmed"]]["trimming"] == {
        "enabled": True,
        "high_water_tokens": 300,
        "low_water_tokens": 100,
    }
    small = listed[names["small"]]
    assert (small["tiers"], small["models"]) == (["small"], ["auto", "spare", "tiny"])
    assert listed[names["plain"]]["fallbacks"] == {"tiny": ["spare"]}
    assert listed[names["no_fallback"]]["fallbacks"] == {}
    assert listed[names["narrow"]]["fallbacks"] == {}
    as_tenant = gateway.client.get("/admin/tenants", headers=gateway.tenants["plain"].headers)
    assert as_tenant.status_code == 401

    text = gateway.path.read_text()
    gateway.path.write_text(text.replace("version: 1\n", "version: 1\nlimits: {max_tools: 5}\n"))
    reload = gateway.client.post("/admin/policy/reload", headers=ADMIN)
    assert reload.json()["outcome"] == "applied"
    limited = settings()[names["limited"]]
    assert (limited["limits"]["max_messages"], limited["limits"]["max_tools"]) == (2, 5)


def test_a_tenant_without_an_entry_gets_the_policys_own_sections() -> None:
    text = POLICY.format(admin=sha256("k"), tenants="  team:\n    models: [tiny]\n")
    policy = parse_with_redis(text, "redis://x")
    tenants = TenantPolicies(policy)
    default = tenants.of("default")
    assert default.limits is policy.limits
    assert default.trimming is policy.trimming
    assert default.tier_clamps == {}
    assert dict(default.fallbacks) == {a: m.fallbacks for a, m in policy.models.items()}
    team = tenants.of("team")
    assert team.limits is policy.limits  # nothing overridden: the same objects
    assert dict(team.fallbacks) == {"tiny": ()}
    assert [s.name for s in tenants.listed()] == ["default", "team"]
    assert orjson.dumps(team.public())  # what the admin API answers is JSON
