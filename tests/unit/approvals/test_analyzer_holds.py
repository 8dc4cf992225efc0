"""Deciding by what a call does, not by its tool's name: a SQL argument parsed by a real
SQL parser, its effect mapped by the policy to allow, deny, or hold for a person through
the approvals (real app, real Redis, the engine's twin)."""

from __future__ import annotations

import orjson
import pytest

from tests.unit.approvals.conftest import OpenHeld, engine, user

RUN_SQL = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run one SQL statement on the orders database.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
RULES = """{tools: []}
tool_calls:
  tools:
    run_sql:
      on_invalid: [refuse]
      arguments:
        - pointer: /query
          language: sql
          effects: {deletes: hold, drops_tables: deny}
"""
ASK = [user("Tidy up the orders table.")]


def sql(query: str) -> tuple[str, str]:
    return ("run_sql", orjson.dumps({"query": query}).decode())


@pytest.mark.parametrize("stream", [False, True])
def test_a_read_passes(held_gateway: OpenHeld, stream: bool) -> None:
    gw = held_gateway(engine(sql("SELECT id FROM orders LIMIT 5")), approvals=RULES)
    answer = gw.chat(ASK, tools=[RUN_SQL], stream=stream)
    assert answer.status_code == 200, answer.text
    assert "x-gateway-approval-pending" not in answer.headers
    assert '"run_sql"' in answer.text  # the call itself, passed on


def test_a_delete_is_held_for_a_person(held_gateway: OpenHeld) -> None:
    gw = held_gateway(engine(sql("DELETE FROM orders WHERE status = 'cancelled'")), approvals=RULES)
    answer = gw.chat(ASK, tools=[RUN_SQL])
    assert answer.status_code == 200, answer.text
    approval = answer.headers["x-gateway-approval-pending"]
    assert not answer.json()["choices"][0]["message"].get("tool_calls")
    stored = gw.get(f"/v1/approvals/{approval}").json()
    assert stored["tools"] == ["run_sql"] and stored["status"] == "pending"


def test_a_drop_is_denied_with_the_reason(held_gateway: OpenHeld) -> None:
    gw = held_gateway(engine(sql("SELECT 1; DROP TABLE orders")), approvals=RULES)
    answer = gw.chat(ASK, tools=[RUN_SQL])
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_tool_call"
    assert "drops_tables" in error["message"] and "/query" in error["message"]
    assert len(gw.fake.calls) == 1  # on_invalid: [refuse] for this tool: not asked again


def test_holds_need_keys_as_approvals_do() -> None:
    from gateway.policy import PolicyError, parse_policy

    with pytest.raises(PolicyError, match="approvals need API keys"):
        parse_policy(
            "pools: {p: {served_model: m, replicas: [{url: 'http://a.test:1'}]}}\n"
            "models: {m: {pool: p}}\n"
            "tool_calls: {tools: {run_sql: {arguments: [{pointer: /query, language: sql, "
            "effects: {deletes: hold}}]}}}\n"
        )
