"""The evaluation protocol's split: fixed, group-whole, and the same everywhere."""

from __future__ import annotations

import json

from gateway.offline.protocol import conversation_group, part_of, split
from tests.conftest import SHARED_DATA


def test_the_split_is_pinned() -> None:
    # Written down before any design choice was made on it: a change here moves data
    # between the part choices look at and the part figures come from.
    assert part_of("gsm8k") == "design"
    assert part_of("algebra") == "design"
    assert part_of("history") == "report"
    assert part_of("moral_scenarios") == "report"
    assert part_of("tau-bench/airline/gpt-4o/task0") == "design"
    assert part_of("tau-bench/airline/gpt-4o/task1") == "report"


def test_a_tasks_trials_stay_together() -> None:
    path = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    parts = split(enumerate(records), lambda row: conversation_group(row[1], row[0]))
    tasks = {
        name: {conversation_group(record, i) for i, record in rows} for name, rows in parts.items()
    }
    assert tasks["design"] and tasks["report"]
    assert not tasks["design"] & tasks["report"]
    assert len(parts["design"]) + len(parts["report"]) == len(records)
    assert all(len(group.split("/")) == 4 for group in tasks["design"] | tasks["report"])


def test_a_conversation_without_an_id_is_its_own_group() -> None:
    assert conversation_group({"group": "repo-a"}, 0) == "repo-a"
    assert conversation_group({"id": "swe/astropy-1234"}, 0) == "swe/astropy-1234"
    assert conversation_group({"id": "x/task3/trial2"}, 0) == "x/task3"
    assert conversation_group({}, 4) == "line-5"
