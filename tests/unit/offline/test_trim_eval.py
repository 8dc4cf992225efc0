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
            "--limit", "6", "--part", "all", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("history_peak_ratio", "prompt_tokens_ratio", "uncached_prefill_ratio",
                "structural_validity", "state_retention", "user_retention",
                "recent_output_retention"):  # fmt: skip
        assert key in report
        assert key in report["baseline_last_n"]
    assert report["conversations"] == 6
    assert report["part"] == "all"
    assert report["structural_validity"] == 1.0
    assert report["state_retention"] == 1.0
    assert report["user_retention"] == 1.0
    assert report["tokens"] == "tiktoken o200k_base"
    assert report["prompt_tokens_ratio"] < 1.0


def test_trim_eval_reports_the_design_and_report_parts_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The first 12 conversations are tasks 0-2 (4 trials each): task 0 and 2 fall in the
    # design part, task 1 in the report part (gateway/offline/protocol.py).
    argv = ["trim-eval", "--trajectories", str(TRAJECTORIES), "--limit", "12"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "design: 8 conversations" in table
    assert "report: 4 conversations" in table
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["part"] == "both"
    assert report["parts"]["design"]["conversations"] == 8
    assert report["parts"]["report"]["conversations"] == 4
    assert main([*argv, "--part", "report", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["conversations"] == 4


def test_trim_eval_names_a_bad_input_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trim-eval", "--trajectories", "/nonexistent.jsonl"]) == 2
    assert "nonexistent" in capsys.readouterr().err


def test_the_generated_coding_histories_are_valid_conversations_with_real_outputs() -> None:
    from gateway.trimming.conversation import problems
    from tests.bench.coding_histories import STDLIB, Agent

    record = Agent("json", 0).run()
    messages = record["messages"]
    assert problems(messages, to_send=False) == []
    assert record["group"] == "stdlib/json"
    views = [m["content"] for m in messages if m["role"] == "tool" and "cat -n" in m["content"]]
    assert views  # real file text, as `cat -n` shows it
    first_line = views[0].splitlines()[1].split("\t", 1)[1]
    assert any(first_line in p.read_text() for p in (STDLIB / "json").glob("*.py"))


def test_a_user_message_in_content_parts_counts_as_kept_when_every_part_is() -> None:
    from gateway.offline.trim_eval import Evaluation
    from gateway.policy.sessions import TrimmingSpec
    from gateway.trimming.tokens import token_counter

    parts = [{"type": "text", "text": "Fix the parser."}, {"type": "text", "text": "Thanks."}]
    messages = [
        {"role": "system", "content": "You fix code."},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": "On it."},
    ]
    spec = TrimmingSpec(enabled=True, high_water_tokens=800, low_water_tokens=150)
    report = Evaluation(spec, token_counter(None), window=12).run([{"messages": messages}])
    assert report["user_retention"] == 1.0


def test_recent_output_retention_counts_the_last_three_outputs_sent_whole() -> None:
    """A short window keeps what the agent just read; compaction at small watermarks folds
    it away. State tools' snapshots are not counted (state retention covers them)."""
    from gateway.offline.trim_eval import Evaluation
    from gateway.policy.sessions import StateToolSpec, TrimmingSpec
    from gateway.trimming.tokens import token_counter

    messages: list[dict[str, object]] = [{"role": "system", "content": "You fix code."},
                                         {"role": "user", "content": "Fix it."}]  # fmt: skip
    for step in range(6):
        messages += [
            {"role": "assistant", "tool_calls": [{"id": f"c{step}", "type": "function",
             "function": {"name": "view", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": f"file {step} " * 300},
            {"role": "assistant", "tool_calls": [{"id": f"s{step}", "type": "function",
             "function": {"name": "get_user", "arguments": '{"user_id": "u1"}'}}]},
            {"role": "tool", "tool_call_id": f"s{step}", "content": '{"name": "Ann"}'},
        ]  # fmt: skip
    messages.append({"role": "assistant", "content": "Done."})
    spec = TrimmingSpec(enabled=True, high_water_tokens=800, low_water_tokens=150,
                        state_tools={"get_user": StateToolSpec(entity="user",
                                                               id_argument="user_id")})  # fmt: skip
    report = Evaluation(spec, token_counter(None), window=40).run([{"messages": messages}])
    assert report["baseline_last_n"]["recent_output_retention"] == 1.0
    assert 0 < report["recent_output_retention"] < 1.0
    none_declared = Evaluation(spec, token_counter(None), window=40).run(
        [{"messages": [*messages[:3], {"role": "assistant", "content": "Hi."}]}]
    )
    assert none_declared["recent_output_retention"] is None  # no tool output yet: nothing to keep
