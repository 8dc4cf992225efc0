"""The admin API: its own credential (tenant keys get 401 there, admin keys get 401 on
/v1), run-time keys created, listed and revoked, a policy reload on demand, and session
inspection across tenants."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from starlette.testclient import TestClient

from gateway.policy.reloadable import load_policy_file
from tests.unit.tenant_gateway import (
    Tenant,
    forget_tenants,
    new_tenants,
    open_gateway,
    sha256,
    two_tenant_policy,
    two_tenant_yaml,
)

FILE_ADMIN_KEY = f"sk-agw-admin-file-{uuid.uuid4().hex}"
POLICY_ADMIN_KEY = f"sk-agw-admin-policy-{uuid.uuid4().hex}"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ADMIN = bearer(POLICY_ADMIN_KEY)


@dataclass
class Admin:
    client: TestClient
    a: Tenant
    b: Tenant
    policy_path: Path
    auth: str


@pytest.fixture
def admin(redis_url: str, tmp_path: Path) -> Iterator[Admin]:
    a, b = new_tenants()
    admin_file = tmp_path / "admin-keys"
    admin_file.write_text(f"# admins\n{FILE_ADMIN_KEY}\n")
    auth = (
        f'{{key_cache_ttl_s: 0, admin_keys_file: "{admin_file}", '
        f"admin_keys: [{{sha256: {sha256(POLICY_ADMIN_KEY)}, name: ops}}]}}"
    )
    path = tmp_path / "policy.yaml"
    # No polling: only the admin call reloads, so each outcome is the test's own.
    extra = "server: {reload_interval_s: 0}\n"
    path.write_text(two_tenant_yaml(redis_url, a, b, auth=auth, extra=extra))
    policy, source = load_policy_file(path)
    client, _ = open_gateway(policy, policy_file=source)
    try:
        yield Admin(client, a, b, path, auth)
    finally:
        client.__exit__(None, None, None)
        forget_tenants(redis_url, a.name, b.name)


def test_admin_and_tenant_credentials_do_not_cross(admin: Admin) -> None:
    refused = admin.client.get("/admin/keys", headers=admin.a.headers)
    nothing = admin.client.get("/admin/keys")
    assert refused.status_code == nothing.status_code == 401
    assert refused.json() == nothing.json()
    assert refused.json()["error"]["code"] == "invalid_api_key"
    for key in (FILE_ADMIN_KEY, POLICY_ADMIN_KEY):
        assert admin.client.get("/admin/keys", headers=bearer(key)).status_code == 200
        assert admin.client.get("/v1/models", headers=bearer(key)).status_code == 401


def test_a_key_created_listed_used_and_revoked(admin: Admin) -> None:
    created = admin.client.post(
        "/admin/keys", json={"tenant": admin.b.name, "name": "ci", "roles": ["user"]}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    body = created.json()
    key, key_id = body["key"], body["id"]
    assert key.startswith("sk-agw-") and len(key) > 40
    assert body["tenant"] == admin.b.name and body["roles"] == ["user"]

    listing = admin.client.get("/admin/keys", params={"tenant": admin.b.name}, headers=ADMIN)
    assert [k["id"] for k in listing.json()["data"]] == [key_id]
    assert key not in listing.text and sha256(key) not in listing.text  # never a secret

    # the real SDK, with the new key: only tenant b's models
    sdk = openai.OpenAI(
        base_url=f"{admin.client.base_url}/v1",
        api_key=key,
        http_client=admin.client,
        max_retries=0,
    )
    assert [m.id for m in sdk.models.list()] == ["tiny"]
    reply = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content == "seen: hello"
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="large", messages=[{"role": "user", "content": "x"}])

    revoked = admin.client.delete(f"/admin/keys/{key_id}", headers=ADMIN)
    assert revoked.json() == {"id": key_id, "object": "api_key.deleted", "deleted": True}
    with pytest.raises(openai.AuthenticationError):  # key_cache_ttl_s 0: refused at once
        sdk.models.list()
    assert admin.client.delete(f"/admin/keys/{key_id}", headers=ADMIN).status_code == 404


def test_keys_are_only_made_for_tenants_of_the_policy(admin: Admin) -> None:
    for body in ({"tenant": "nobody"}, {}, {"tenant": admin.a.name, "roles": ["root"]}):
        answer = admin.client.post("/admin/keys", json=body, headers=ADMIN)
        assert answer.status_code == 400, body


def test_a_key_created_with_its_own_rate_limit_is_held_to_it(admin: Admin) -> None:
    created = admin.client.post(
        "/admin/keys",
        json={"tenant": admin.b.name, "rate_limits": {"requests_per_minute": 2}},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    assert created.json()["rate_limits"] == {"requests_per_minute": 2}
    answers = [
        admin.client.post("/v1/chat/completions", json=CHAT, headers=bearer(created.json()["key"]))
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[1].headers["x-ratelimit-remaining-requests"] == "0"
    assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
    for limits in ({}, {"requests_per_minute": 0}, {"rpm": 5}, "60"):
        refused = admin.client.post(
            "/admin/keys", json={"tenant": admin.b.name, "rate_limits": limits}, headers=ADMIN
        )
        assert refused.status_code == 400, limits
        assert refused.json()["error"]["param"].startswith("rate_limits"), refused.text


def test_sessions_are_inspected_across_tenants(admin: Admin) -> None:
    session = f"s-{uuid.uuid4().hex}"
    answer = admin.client.post(
        "/v1/chat/completions", json=CHAT, headers={**admin.a.headers, "X-Session-Id": session}
    )
    assert answer.status_code == 200
    seen = admin.client.get(f"/admin/sessions/{admin.a.name}/{session}", headers=ADMIN)
    assert seen.status_code == 200, seen.text
    assert seen.json()["tenant"] == admin.a.name
    assert [c["turn"] for c in seen.json()["data"]] == [1]
    other = admin.client.get(f"/admin/sessions/{admin.b.name}/{session}", headers=ADMIN)
    assert other.status_code == 404


def test_a_policy_reload_on_demand_reports_its_outcome(admin: Admin, redis_url: str) -> None:
    def reload() -> str:
        answer = admin.client.post("/admin/policy/reload", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        outcome: str = answer.json()["outcome"]
        return outcome

    assert reload() == "unchanged"
    text = admin.policy_path.read_text()
    admin.policy_path.write_text(
        text.replace("tiny: {pool: chat}", "tiny: {pool: chat, description: t}")
    )
    assert reload() == "applied"
    admin.policy_path.write_text(text.replace("name: bob", "name: robert"))
    assert reload() == "needs_restart"  # tenants are restart-only


def test_without_an_admin_key_the_admin_api_refuses_everyone(redis_url: str) -> None:
    a, b = new_tenants()
    client, _ = open_gateway(two_tenant_policy(redis_url, a, b))
    try:
        assert client.get("/admin/keys", headers=a.headers).status_code == 401
    finally:
        client.__exit__(None, None, None)
