"""`gateway route-eval`: the metrics on examples small enough to work out by hand, the grouped
held-out split, and the report's shape on a synthetic labels file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from gateway.cli import main
from gateway.offline import route_eval as route_eval_module
from gateway.offline.route_eval import (
    FORCED_LARGE,
    FORCED_SMALL,
    apgr,
    oracle_small_share_at,
    quality_sweep,
    random_small_share_at,
    route_eval,
    small_share_at,
)
from gateway.offline.route_train import train
from gateway.offline.route_train.labels import LabeledPrompt, read_labels
from gateway.offline.route_train.train import TrainConfig, grouped_folds
from tests.unit.tiering.test_learned import write_labels

FAST = TrainConfig(hash_bits=12, iterations=60, calibration_folds=0)


Floats = npt.NDArray[np.float64]


def arrays(*values: list[float]) -> list[Floats]:
    return [np.array(v, dtype=np.float64) for v in values]


def test_small_share_at_95_is_the_largest_share_keeping_95_percent_of_large() -> None:
    scores, small, large = arrays([4, 3, 2, 1], [1, 1, 0, 0], [1, 1, 1, 1])
    # Sending the two small-correct prompts costs nothing; a third drops quality to 0.75.
    assert small_share_at(scores, small, large) == 0.5
    # Small right where large is wrong is a gain that pays for a later loss.
    scores, small, large = arrays([4, 3, 2, 1], [1, 0, 1, 0], [0, 1, 1, 1])
    assert small_share_at(scores, small, large) == 0.75  # 0.75 quality >= 0.95 * 0.75


def test_a_threshold_moves_all_equal_scores_together() -> None:
    scores, small, large = arrays([2, 1, 1, 0], [1, 1, 0, 1], [1, 1, 1, 1])
    sweep = quality_sweep(scores, small, large)
    assert sweep.small_shares.tolist() == [0.0, 0.25, 0.75, 1.0]
    assert sweep.qualities.tolist() == [1.0, 1.0, 0.75, 0.75]
    assert small_share_at(scores, small, large) == 0.25


def test_random_and_oracle_shares() -> None:
    small, large = arrays([1, 1, 0, 0], [1, 1, 1, 1])
    assert random_small_share_at(small, large) == pytest.approx(0.1)  # 0.05 * 1 / (1 - 0.5)
    assert oracle_small_share_at(small, large) == 0.5
    small, large = arrays([1, 1], [1, 0])
    assert random_small_share_at(small, large) == 1.0  # small is the better one


def test_apgr_follows_routellm_quantile_sweep() -> None:
    small, large = arrays([1, 1, 0, 0], [1, 1, 1, 1])
    # Two steps: (0 large, 0.5), (0.5 large, 1.0), (1.0 large, 1.0); area 0.875.
    assert apgr(np.array([4.0, 3, 2, 1]), small, large, points=2) == pytest.approx(0.75)
    # Backwards: (0, 0.5), (0.5, 0.5), (1, 1); area 0.625.
    assert apgr(np.array([1.0, 2, 3, 4]), small, large, points=2) == pytest.approx(0.25)
    same = np.array([1.0, 1.0])
    assert apgr(np.array([1.0, 2]), same, same) is None  # no gap to recover


def test_forced_prompts_stay_on_their_tier_through_the_sweep() -> None:
    scores, small, large = arrays([9, 3, 2, -9], [0, 1, 0, 1], [1, 1, 1, 1])
    forced = np.array([FORCED_LARGE, 0, 0, FORCED_SMALL], dtype=np.float64)
    sweep = quality_sweep(scores, small, large, forced)
    # The forced-small prompt is always small; the high-scoring forced-large one never is.
    assert sweep.small_shares.tolist() == [0.25, 0.5, 0.75]
    assert sweep.qualities.tolist() == [1.0, 1.0, 0.75]


def test_grouped_folds_never_hold_a_group_on_both_sides() -> None:
    groups = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"] * 1
    for folds in (0, 2, 3):
        splits = grouped_folds(groups, folds)
        assert len(splits) == (4 if folds == 0 else folds)
        tested = np.concatenate([test for _, test in splits])
        assert sorted(tested.tolist()) == list(range(len(groups)))  # each row scored once
        for trained, test in splits:
            assert not {groups[i] for i in trained} & {groups[i] for i in test}


def groups_trained_on(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The groups of every fit from now on, in order (`fit` spied on where it is called)."""
    real_fit = train.fit
    seen: list[set[str]] = []

    def spy(
        design: train.Design, prompts: list[LabeledPrompt], config: TrainConfig
    ) -> train.Fitted:
        seen.append({p.group for p in prompts})
        return real_fit(design, prompts, config)

    monkeypatch.setattr(train, "fit", spy)
    monkeypatch.setattr(route_eval_module, "fit", spy)
    return seen


def test_held_out_scores_come_from_models_that_never_saw_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = groups_trained_on(monkeypatch)
    prompts = [
        LabeledPrompt("mmlu", g, f"question {i} about {g}", float(i % 2), 1.0)
        for i, g in enumerate(["x", "y", "z"] * 4)
    ]
    design = train.Design.of([p.prompt for p in prompts], FAST.hash_bits)
    _, _, model_of = train.held_out_logits(prompts, design, FAST)
    for prompt, k in zip(prompts, model_of, strict=True):
        assert prompt.group not in seen[k]


def test_route_eval_json_reports_each_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = write_labels(tmp_path / "labels.jsonl")
    argv = ["route-eval", "--labels", str(labels), "--folds", "2", "--part", "all", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"].startswith("grouped held-out")
    assert set(report) >= {"mmlu", "gsm8k", "prompts", "decision_p99_us"}
    for source in ("mmlu", "gsm8k"):
        figures = report[source]
        for key in ("small_share_at_95", "apgr", "random_small_share_at_95",
                    "oracle_small_share_at_95", "decision_p99_us"):  # fmt: skip
            assert key in figures
        assert 0 <= figures["small_share_at_95"] <= 1
        assert figures["decision_p99_us"] > 0


def test_the_report_part_is_scored_by_a_model_trained_on_the_design_part_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # write_labels' groups: algebra and gsm8k fall in the design part, history in the
    # report part (gateway/offline/protocol.py).
    trained_on = groups_trained_on(monkeypatch)
    labels = write_labels(tmp_path / "labels.jsonl")
    assert main(["route-eval", "--labels", str(labels), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["part"] == "both"
    assert set(report["parts"]["design"]) >= {"mmlu", "gsm8k"}
    assert report["parts"]["report"]["prompts"] == 8  # history's
    assert report["parts"]["report"]["mode"].startswith("trained on the design part")
    assert trained_on and all("history" not in groups for groups in trained_on)
    assert main(["route-eval", "--labels", str(labels)]) == 0
    table = capsys.readouterr().out
    assert "design part" in table and "report part" in table


def test_route_eval_scores_an_artifact_as_it_is(tmp_path: Path) -> None:
    labels = write_labels(tmp_path / "labels.jsonl")
    prompts = read_labels(labels)
    router = train.train_router(prompts, FAST)
    rules = {"Easy one": "small"}
    report = route_eval(prompts, router=router, fixed_tier=lambda p: rules.get(p.split(":")[0]))
    assert report["mode"].startswith("artifact")
    assert report["mmlu"]["forced_small"] > 0
    assert report["mmlu"]["forced_large"] == 0


def test_route_eval_names_a_bad_labels_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route-eval", "--labels", "/nonexistent.jsonl"]) == 2
    assert "nonexistent" in capsys.readouterr().err
