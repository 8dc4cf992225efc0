"""`gateway trim-eval` on real tau-bench conversations: the report's shape and the
figures that must hold on any sample (validity, retention)."""

from __future__ import annotations

import json

import pytest

from gateway.cli import main
from tests.conftest import ROOT, SHARED_DATA

TRAJECTORIES = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_dev.jsonl"


def test_trim_eval_reports_every_figure_and_keeps_what_it_must(
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = ROOT / "policies" / "agent-airline.yaml"
    argv = ["trim-eval", "--trajectories", str(TRAJECTORIES), "--policy", str(policy),
            "--limit", "6", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("history_peak_ratio", "prompt_tokens_ratio", "uncached_prefill_ratio",
                "structural_validity", "state_retention", "user_retention"):  # fmt: skip
        assert key in report
        assert key in report["baseline_last_n"]
    assert report["conversations"] == 6
    assert report["structural_validity"] == 1.0
    assert report["state_retention"] == 1.0
    assert report["user_retention"] == 1.0
    assert report["tokens"] == "tiktoken o200k_base"
    assert report["prompt_tokens_ratio"] < 1.0


def test_trim_eval_names_a_bad_input_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trim-eval", "--trajectories", "/nonexistent.jsonl"]) == 2
    assert "nonexistent" in capsys.readouterr().err
