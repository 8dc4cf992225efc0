"""The learned tier router: the shipped artifact loads offline and scores, `route-train`
writes one that loads, the difficulty head reads only its features, and labels and
artifacts that don't fit are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cli import main
from gateway.offline.route_train.labels import LabelError, read_labels
from gateway.offline.route_train.train import (
    ADVANTAGE_NO_WORDS,
    DIFFICULTY,
    Design,
    TrainConfig,
    fit,
    fit_head,
    train_router,
)
from gateway.tiering.features import (
    DIFFICULTY_NAMES,
    HEAD_CHARS,
    NUMERIC_NAMES,
    TAIL_CHARS,
    extract,
)
from gateway.tiering.learned import ArtifactError, LearnedRouter


def write_labels(path: Path) -> Path:
    """Two MMLU subjects and GSM8K; an "Easy one" the small tier gets right, a "Hard one"
    only the large tier does, whatever the subject."""
    rows = []
    for i in range(24):
        easy = i % 3 != 0
        kind = "Easy one" if easy else "Hard one"
        source, subject = [("mmlu", "algebra"), ("mmlu", "history"), ("gsm8k", None)][i % 3]
        row: dict[str, object] = {
            "source": source,
            "prompt": f"{kind}: item {i} with {i * 7} apples?\nA. 1\nB. 2",
        }
        if subject:
            row["subject"] = subject
        row |= {"small_correct": easy, "large_correct": True}
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_shipped_artifact_loads_offline_and_scores_in_range() -> None:
    router = LearnedRouter.load()
    assert router.version and router.trained_on
    for prompt in ("What is 2 + 2?", "Prove the Riemann hypothesis." * 200, ""):
        assert 0.0 <= router.score(prompt) <= 1.0


def test_route_train_writes_an_artifact_that_loads(tmp_path: Path) -> None:
    labels = write_labels(tmp_path / "labels.jsonl")
    out = tmp_path / "router.npz"
    # The two kinds differ only in a word: a router for in-domain labels reads words.
    assert main(["route-train", "--labels", str(labels), "--out", str(out), "--words"]) == 0
    router = LearnedRouter.load(out)
    assert "labels.jsonl" in router.trained_on
    assert router.reads_words
    easy = router.score("Easy one: item 99 with 3 apples?\nA. 1\nB. 2")
    hard = router.score("Hard one: item 99 with 3 apples?\nA. 1\nB. 2")
    assert easy > hard


def test_the_difficulty_head_weighs_only_how_much_work_a_question_asks(tmp_path: Path) -> None:
    prompts = read_labels(write_labels(tmp_path / "labels.jsonl"))
    config = TrainConfig(hash_bits=12, iterations=60, calibration_folds=0)
    design = Design.of([p.prompt for p in prompts], config.hash_bits)
    difficulty = fit_head(design, prompts, DIFFICULTY, config)
    assert not difficulty.hashed.any()  # no words: it knows no subject
    others = [i for i, name in enumerate(NUMERIC_NAMES) if name not in DIFFICULTY_NAMES]
    assert not difficulty.numeric[others].any()
    # The router is the advantage head plus a share of it, stored as one linear model.
    advantage = fit_head(design, prompts, ADVANTAGE_NO_WORDS, config)
    both = fit(design, prompts, config)
    expected = advantage.logits(design) + config.difficulty_weight * difficulty.logits(design)
    assert both.logits(design) == pytest.approx(expected)


def test_by_default_the_router_reads_no_words(tmp_path: Path) -> None:
    # Words describe a subject and did not carry to subjects no choice looked at.
    prompts = read_labels(write_labels(tmp_path / "labels.jsonl"))
    router = train_router(prompts, TrainConfig(hash_bits=12, iterations=60, calibration_folds=0))
    assert not router.reads_words
    assert not router.hashed_weights.any()
    assert "no words" in router.notes["heads"]
    assert not LearnedRouter.load().reads_words  # the shipped artifact too
    easy, hard = (f"{kind} one: item 99 with 3 apples?" for kind in ("Easy", "Hard"))
    assert router.score(easy) == router.score(hard)


def test_an_artifact_for_other_features_is_refused(tmp_path: Path) -> None:
    router = train_router(read_labels(write_labels(tmp_path / "l.jsonl")), TrainConfig(12))
    path = tmp_path / "router.npz"
    router.save(path)
    with np.load(path) as arrays:
        contents = {k: arrays[k] for k in arrays.files}
    meta = json.loads(str(contents["meta"]))
    contents["meta"] = np.array(json.dumps(meta | {"features_version": -1}))
    np.savez(path, **contents)
    with pytest.raises(ArtifactError, match="features version -1"):
        LearnedRouter.load(path)
    with pytest.raises(ArtifactError, match="not a router artifact"):
        LearnedRouter.load(tmp_path / "l.jsonl")


def test_labels_take_booleans_or_scores_and_name_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text(
        '{"source": "mmlu", "subject": "law", "prompt": "p", "small_correct": true,'
        ' "large_correct": false}\n'
        '{"source": "chat", "prompt": "q", "small_score": 0.25, "large_score": 0.75}\n',
        encoding="utf-8",
    )
    law, chat = read_labels(path)
    assert (law.group, law.small_ok, law.large_ok, law.small_advantage) == ("law", 1, 0, 1)
    assert (chat.group, chat.small_advantage) == ("chat", 0.25)  # the source is the group
    path.write_text(path.read_text() + '{"source": "chat", "prompt": "r"}\n', encoding="utf-8")
    with pytest.raises(LabelError, match=r"labels.jsonl:3: needs `small_correct`"):
        read_labels(path)


def test_only_the_ends_of_a_long_prompt_are_read() -> None:
    head, middle, tail = "a" * HEAD_CHARS, " noise" * 5000, "b" * TAIL_CHARS
    long, short = extract(head + middle + tail, 12), extract(head + "\n" + tail, 12)
    assert long.slots.tolist() == short.slots.tolist()


def test_options_and_pairs_hash_apart_from_question_words() -> None:
    question = extract("How many apples\nA. apples\nB. pears\nAnswer:", 18)
    assert len(question.slots) == 3 + 2 + 2  # words, pairs, option words
    assert float(question.values @ question.values) == pytest.approx(1.0)
