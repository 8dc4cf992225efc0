"""`gateway tools-eval` on real tau-bench calls and BFCL's function docs: every seeded fault
is caught or repaired as its kind expects, clean calls pass untouched, the analyzers
classify the fixed snippets as expected, and the report says when they do not.

No test asserts a wall-clock figure: the timing is checked for shape only."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.offline import tools_eval as evaluation
from gateway.offline.tools_eval import (
    CAUGHT_AS,
    REPAIRED_BY,
    SEEDERS,
    FaultKind,
    RealCall,
    bfcl_tool,
    example_call,
    expected_outcome,
    load_tau_bench,
    tools_eval,
    verdict_of,
)
from gateway.toolcalls.contract import build_contract
from tests.conftest import SHARED_DATA


def _timing_only(missed: list[str]) -> bool:
    return all(" p99 " in line for line in missed)


def test_a_slice_meets_every_target_but_time_and_reports_both_datasets() -> None:
    report = tools_eval(SHARED_DATA, seed=0, limit=20)
    assert set(report) >= {"tau_bench", "bfcl", "analyzers", "targets", "missed", "seed"}
    for name in ("tau_bench", "bfcl"):
        figures = report[name]
        assert set(figures) >= {"source", "role", "clean", "faults", "timing"}
        assert figures["clean"]["calls"] == 20
        assert figures["clean"]["false_positives"] == 0
        assert set(figures["faults"]) == set(SEEDERS)
        for kind, fault in figures["faults"].items():
            assert fault["seeded"] > 0, kind
            assert fault["rate"] == 1.0, (name, kind, fault["misses"])
        timing = figures["timing"]
        assert timing["repetitions"] >= 3
        assert 0 < timing["p50_us"] <= timing["p99_us"]
    assert report["analyzers"]["rate"] == 1.0, report["analyzers"]["mismatches"]
    assert report["analyzers"]["snippets"] >= 18
    assert 0 < report["analyzers"]["hold_rate"] < 1
    assert 0 < report["analyzers"]["deny_rate"] < 1
    assert _timing_only(report["missed"])


def _call_every_fault_applies_to() -> RealCall:
    calls = load_tau_bench(SHARED_DATA, limit=0).calls
    return next(
        real
        for real in calls
        if all(seeder(real, random.Random(0)) is not None for seeder in SEEDERS.values())
    )


@pytest.mark.parametrize("kind", list(SEEDERS))
def test_a_seeded_fault_in_a_real_tau_call_is_caught_or_repaired(kind: FaultKind) -> None:
    real = _call_every_fault_applies_to()
    seeded = SEEDERS[kind](real, random.Random(0))
    assert seeded is not None
    assert seeded.call != real.call
    as_expected, did = expected_outcome(
        kind, build_contract(seeded.tools), seeded.call, real.arguments
    )
    assert as_expected, did
    if kind in CAUGHT_AS:
        assert did["problem"] == CAUGHT_AS[kind]
    else:
        assert did["problem"] is None
        assert REPAIRED_BY[kind] in did["repairs"]


def test_extra_field_is_allowed_unless_the_schema_says_additional_properties_false() -> None:
    real = _call_every_fault_applies_to()
    seeded = SEEDERS["extra_field"](real, random.Random(0))
    assert seeded is not None
    # As the tools were declared, an extra property is allowed: the fault needs the copy.
    _, _, issue, _ = build_contract(real.tools).check(0, seeded.call)
    assert issue is None
    _, _, clean_issue, _ = build_contract(seeded.tools).check(0, real.call)
    assert clean_issue is None


def test_bfcl_types_are_mapped_and_the_built_call_is_valid() -> None:
    doc = {
        "name": "plan",
        "parameters": {
            "type": "dict",
            "properties": {
                "budget": {"type": "float"},
                "legs": {"type": "tuple", "items": {"type": "dict"}},
                "note": {"type": "any"},
                "mode": {"type": "string", "enum": ["car", "train"]},
                "count": {"type": "integer"},
            },
            "required": ["budget", "legs", "note", "mode", "count"],
        },
    }
    tool = bfcl_tool(doc)
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object"
    assert parameters["properties"]["budget"] == {"type": "number"}
    assert parameters["properties"]["legs"] == {"type": "array", "items": {"type": "object"}}
    assert parameters["properties"]["note"] == {}
    real = example_call([tool], tool)
    assert real.arguments == {"budget": 1.5, "legs": [], "note": "x", "mode": "car", "count": 1}
    _, made, issue, _ = build_contract([tool]).check(0, real.call)
    assert issue is None and made == []


def test_a_checker_that_stops_repairing_is_reported_as_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.toolcalls.contract.closed", lambda text: None)
    report = tools_eval(SHARED_DATA, seed=0, limit=5)
    fault = report["tau_bench"]["faults"]["truncated_json"]
    assert fault["rate"] == 0.0
    assert fault["misses"][0]["problem"] == "invalid_json"
    assert any("tau_bench: truncated_json" in line for line in report["missed"])
    assert any("bfcl: truncated_json" in line for line in report["missed"])


def test_an_analyzer_mismatch_is_listed() -> None:
    wrong = (evaluation.Snippet("shell", "ls -la", frozenset({"deletes"})),)
    result = evaluation.evaluate_analyzers(wrong)
    assert result["rate"] == 0.0
    mismatch = result["mismatches"][0]
    assert mismatch["expected"] == ["deletes"] and mismatch["got"] != ["deletes"]


def test_the_example_policy_takes_the_strictest_verdict() -> None:
    assert verdict_of(["reads"]) == "allow"
    assert verdict_of([]) == "allow"
    assert verdict_of(["reads", "deletes"]) == "hold"
    assert verdict_of(["drops_tables", "network"]) == "deny"
    assert verdict_of(["unparsable"]) == "deny"


def test_the_cli_runs_it_writes_the_json_and_exits_by_the_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench" / "tools-eval.json"
    status = main(["tools-eval", "--limit", "5", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == (1 if report["missed"] else 0)
    assert _timing_only(report["missed"])
    assert report["tau_bench"]["clean"]["calls"] == 5
    captured = capsys.readouterr()
    assert "truncated_json" in captured.out and "false positives" in captured.out
    assert "tools-eval: bfcl" in captured.err


def test_the_cli_names_a_missing_data_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tools-eval", "--data", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    assert "tau_bench_airline_dev.jsonl" in capsys.readouterr().err
