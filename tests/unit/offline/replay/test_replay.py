"""`gateway replay` on a small trace whose figures are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main as gateway_main
from gateway.offline.replay.run import ReplayConfig, oracle_hit_rate, replay
from gateway.offline.replay.sim import Tally, percentile
from gateway.offline.replay.traces import TraceError, read_trace
from gateway.policy.routing import RoutingSpec
from gateway.routing.build import build_router
from gateway.routing.router import RoundRobinRouter

# Two replicas of 4 blocks each. Block ids as in Mooncake: equal leading ids = shared prefix.
ROWS = [
    {"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 2048, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 2000, "input_length": 1024, "output_length": 1, "hash_ids": [7, 8]},
    {"timestamp": 3000, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 5]},
]
CONFIG = ReplayConfig(replicas=2, cache_blocks=4)


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_round_robin_figures_match_the_hand_count(trace_file: Path) -> None:
    trace = list(read_trace(trace_file, block_tokens=512))
    tally = replay(trace, lambda clock: RoundRobinRouter(), CONFIG)
    # r0: [1,2,3] miss; r1: [1,2,3,4] miss; r0: [7,8] miss (evicts 1); r1: [1,2,5] hits 1,2.
    assert tally.hit_blocks == 2
    assert tally.total_blocks == 12
    # Prefill work per replica in the one window: r0 = 4 + 3, r1 = 5 + 2: perfectly even.
    assert tally.imbalance_p95() == 1.0


def test_the_window_a_trace_ends_in_is_not_an_imbalance_figure() -> None:
    """Two full 60 s windows, then the trace's last 2 s: one request alone there would be
    a ratio of 2.0, the p95 of three windows."""
    tally = Tally(replicas=2, window_s=60.0)
    for at in (0.0, 30.0, 60.0, 90.0):
        tally.add(at, int(at // 30) % 2, hits=0, blocks=1, ttft=0.0)
    tally.add(121.0, 0, hits=0, blocks=9, ttft=0.0)
    assert tally.imbalance_p95() == 1.0
    alone = Tally(replicas=2, window_s=60.0)  # the only window counts, partial or not
    alone.add(5.0, 0, hits=0, blocks=1, ttft=0.0)
    assert alone.imbalance_p95() == 2.0


def test_oracle_pools_all_memory(trace_file: Path) -> None:
    trace = list(read_trace(trace_file, block_tokens=512))
    # One cache of 8 blocks: request 2 hits 1,2,3 and request 4 hits 1,2.
    assert oracle_hit_rate(trace, 8) == pytest.approx(5 / 12)


def test_gateway_router_follows_the_prefix(trace_file: Path) -> None:
    trace = list(read_trace(trace_file, block_tokens=512))
    spec = RoutingSpec(index_blocks_per_replica=4)
    tally = replay(trace, lambda clock: build_router(spec, clock), CONFIG)
    # Request 2 goes where [1,2,3] is (3 hits); request 4 finds [1,2] there as well.
    assert tally.hit_blocks == 5
    assert tally.hit_rate == pytest.approx(5 / 12)


def test_gateway_log_format_is_read(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(
        json.dumps({"ts": 12.5, "blocks": [9, 10], "session": "s", "prompt_tokens": 300}) + "\n"
    )
    (request,) = read_trace(path, block_tokens=128)
    assert (request.at_s, request.blocks, request.input_tokens, request.session) == (
        12.5,
        (9, 10),
        300,
        "s",
    )
    assert request.output_tokens == 1


def test_bad_trace_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(TraceError, match=r"bad.jsonl:2"):
        list(read_trace(path, block_tokens=512))


def test_percentile_is_nearest_rank() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    assert percentile([], 0.5) == 0.0


def test_replay_command_prints_one_json_object(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        gateway_main(
            [
                "replay",
                "--trace",
                str(trace_file),
                "--replicas",
                "2",
                "--cache-blocks",
                "4",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    for key in ("hit_rate", "oracle_hit_rate", "imbalance_p95", "ttft_p50_s", "ttft_p95_s"):
        assert isinstance(result[key], float)
    assert set(result["round_robin"]) >= {"hit_rate", "imbalance_p95"}
    assert result["round_robin"]["hit_rate"] == pytest.approx(2 / 12, abs=1e-4)
    assert result["oracle_hit_rate"] == pytest.approx(5 / 12, abs=1e-4)
    assert "sglang_cache_aware" in result
    assert result["service_model"]["prefill_tokens_per_s"] == 10_000.0


def test_replay_command_reports_a_missing_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert gateway_main(["replay", "--trace", "/no/such/trace.jsonl"]) == 2
    assert "No such file" in capsys.readouterr().err
