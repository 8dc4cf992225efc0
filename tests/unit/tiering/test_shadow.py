"""Shadow mode: a candidate router scored on every request of its route after the answer,
written beside the live decision in the request log, never acted on; and `gateway
route-eval --shadow` judging the two on the requests whose small answer was checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.cli import main
from gateway.offline.route_train.labels import read_labels
from gateway.offline.route_train.ranking import auc
from gateway.offline.route_train.train import TrainConfig, train_router
from gateway.offline.shadow_eval import MIN_CHECKED, shadow_eval
from tests.fakes import Call, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways
from tests.unit.tiering.test_learned import write_labels
from tests.unit.tiering.test_tiers_app import FORMAT, completion

POLICY = """\
version: 1
telemetry: {{request_log: "{log}"}}
pools:
  small-pool: {{tier: small, served_model: s, replicas: [{{url: "http://small.test:1"}}]}}
  large-pool: {{tier: large, served_model: l, replicas: [{{url: "http://large.test:1"}}]}}
models:
  auto: {{tiering: default}}
tiering:
  default:
    tiers: {{small: small-pool, large: large-pool}}
    learned: {{artifact: "{live}", threshold: 0.5, shadow: {{artifact: "{candidate}", threshold: 0.5}}}}
"""


def artifacts(tmp_path: Path) -> tuple[Path, Path]:
    """Two routers that disagree: one reading words (it tells "Easy" from "Hard"), one not."""
    prompts = read_labels(write_labels(tmp_path / "labels.jsonl"))
    paths = []
    for words in (False, True):
        config = TrainConfig(hash_bits=12, iterations=60, calibration_folds=0, words=words)
        path = tmp_path / f"router-{words}.npz"
        train_router(prompts, config).save(path)
        paths.append(path)
    return paths[0], paths[1]


def answered(call: Call) -> Scripted:
    return Scripted(body=completion('{"label": "spam"}'))


def test_the_shadow_decides_after_the_answer_and_only_the_log_hears_of_it(
    tmp_path: Path, redis_url: str, gateways: OpenGateways
) -> None:
    live, candidate = artifacts(tmp_path)
    log = tmp_path / "requests.jsonl"
    text = POLICY.format(log=log, live=live, candidate=candidate)
    client, _ = gateways.open(parse_with_redis(text, redis_url), answered)
    plain = {"model": "auto", "messages": [{"role": "user", "content": "Easy one: 3 apples?"}]}
    first = client.post("/v1/chat/completions", json=plain)
    checked = client.post("/v1/chat/completions", json={**plain, "response_format": FORMAT})
    assert first.status_code == checked.status_code == 200
    # The live router decided the first (the shadow's choice is nowhere in the answer).
    assert first.headers["x-gateway-route-reason"].startswith("router: score")
    assert not any("shadow" in name for name in first.headers)
    metrics = client.get("/metrics").text
    decided = [line for line in metrics.splitlines()
               if line.startswith("gateway_shadow_decisions_total{")]  # fmt: skip
    assert sum(float(line.rsplit(" ", 1)[1]) for line in decided) == 2.0
    gateways.close_all()  # drains the log writer
    lines = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        shadow = line["shadow"]
        assert set(shadow) == {"tier", "score", "live_tier", "live_score"}
        assert shadow["tier"] in ("small", "large") and 0 <= shadow["score"] <= 1
    assert lines[0]["shadow"]["live_tier"] == lines[0]["tier"]
    assert lines[1]["cascade"] == "passed"  # and the checked one says how it went


def entry(candidate: float, live: float, passed: bool | None) -> dict[str, Any]:
    line: dict[str, Any] = {
        "shadow": {"tier": "small" if candidate >= 0.5 else "large", "score": candidate,
                   "live_tier": "small" if live >= 0.5 else "large", "live_score": live},
    }  # fmt: skip
    if passed is not None:
        line |= {"cascade": "passed" if passed else "escalated", "cascade_tier": "small"}
    return line


def test_auc_counts_ties_half() -> None:
    passed = np.array([1.0, 1.0, 0.0, 0.0])
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), passed) == 1.0
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), passed) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), passed) == 0.5
    assert auc(np.array([0.5, 0.5]), np.array([1.0, 1.0])) is None


def test_a_candidate_that_ranks_outcomes_better_is_called_better() -> None:
    rng = np.random.default_rng(0)
    entries = []
    for i in range(2 * MIN_CHECKED):
        passed = i % 2 == 0
        candidate = 0.7 if passed else 0.3  # separates them
        entries.append(entry(candidate, float(rng.random()), passed))
    entries.append(entry(0.9, 0.1, None))  # not checked: counts for agreement only
    report = shadow_eval(entries)
    assert report["requests_with_shadow"] == 2 * MIN_CHECKED + 1
    assert report["checked"] == 2 * MIN_CHECKED and report["passed"] == MIN_CHECKED
    assert report["candidate"]["auc"] == 1.0
    assert report["candidate"]["pass_rate_when_small"] == 1.0
    assert report["verdict"].startswith("better")
    swapped = [{**e, "shadow": {**e["shadow"], "score": e["shadow"]["live_score"],
                                "live_score": e["shadow"]["score"]}} for e in entries]  # fmt: skip
    assert shadow_eval(swapped)["verdict"].startswith("not better")
    assert shadow_eval(entries, last=10)["verdict"].startswith("too few")


def test_route_eval_shadow_reads_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [entry(0.7 if i % 2 else 0.3, 0.5, i % 2 == 1) for i in range(2 * MIN_CHECKED)]
    log.write_text("".join(orjson.dumps(line).decode() + "\n" for line in lines))
    assert main(["route-eval", "--shadow", str(log)]) == 0
    out = capsys.readouterr().out
    assert "verdict: better" in out and "200 with the small tier's answer checked" in out
    assert main(["route-eval", "--shadow", str(tmp_path / "missing.jsonl")]) == 2


def test_the_shadows_artifact_is_relative_to_the_policy_file(tmp_path: Path) -> None:
    from gateway.policy import load_policy

    policy = tmp_path / "conf" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text(POLICY.format(log="requests.jsonl", live="live.npz", candidate="../cand.npz"))
    learned = load_policy(policy).tiering["default"].learned
    assert learned is not None and learned.shadow is not None
    assert learned.artifact == str(tmp_path / "conf" / "live.npz")
    assert learned.shadow.artifact == str(tmp_path / "cand.npz")


def test_a_sampled_shadow_scores_only_its_share(
    tmp_path: Path, redis_url: str, gateways: OpenGateways
) -> None:
    live, candidate = artifacts(tmp_path)
    log = tmp_path / "requests.jsonl"
    text = POLICY.format(log=log, live=live, candidate=candidate).replace(
        "threshold: 0.5}}", "threshold: 0.5, sample_ratio: 0}}"
    )
    client, _ = gateways.open(parse_with_redis(text, redis_url), answered)
    body = {"model": "auto", "messages": [{"role": "user", "content": "Easy one?"}]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    gateways.close_all()
    (line,) = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert line["shadow"] is None
