"""Entity schemas (a policy's `trimming.state_tools.*.schema`) are applied to tool results
a client sends: with the bounded validator, so a backtracking pattern costs linear time
and a result too costly to check is not taken for a snapshot (it is sent whole)."""

from __future__ import annotations

import orjson

from gateway.policy.sessions import StateToolSpec
from gateway.trimming.conversation import ToolResult, snapshot_of
from tests.unit.deadline import deadline

ORDER = StateToolSpec.model_validate(
    {
        "entity": "order",
        "id_field": "id",
        "schema": {
            "type": "object",
            "properties": {"note": {"type": "string", "pattern": "^(a+)+b$"}},
            "required": ["id"],
        },
    }
)
CALL = ToolResult(index=3, name="get_order", arguments="{}")


def test_a_backtracking_entity_pattern_checks_a_result_in_linear_time() -> None:
    content = orjson.dumps({"id": 7, "note": "a" * 10_000 + "c"}).decode()
    with deadline():  # Python's `re` would never finish
        assert snapshot_of(CALL, content, {"get_order": ORDER}) == (None, True)  # sent whole
    good = orjson.dumps({"id": 7, "note": "aab"}).decode()
    snapshot, failed = snapshot_of(CALL, good, {"get_order": ORDER})
    assert snapshot is not None and snapshot.entity == "order:7" and not failed


def test_a_result_too_costly_to_check_is_not_a_snapshot() -> None:
    content = orjson.dumps({"id": 7, "deep": _deep(60)})
    assert snapshot_of(CALL, content.decode(), {"get_order": ORDER}) == (None, True)


def _deep(levels: int) -> object:
    value: object = {}
    for _ in range(levels):
        value = {"d": value}
    return value
