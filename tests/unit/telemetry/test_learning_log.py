"""The request log as a learning source: the cascade's outcome on every checked request,
and the text the tier router reads only where content may be kept; `gateway route-train
--from-log` learns from those lines."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.cli import main
from gateway.offline.route_train.labels import LabeledPrompt, LabelError
from gateway.offline.route_train.outcomes import (
    IN_DOMAIN,
    outcomes_of,
    read_log,
    select_learner,
    train_from_outcomes,
)
from gateway.offline.route_train.train import TrainConfig
from gateway.tiering.learned import LearnedRouter
from tests.fakes import Call, Scripted
from tests.unit.telemetry.conftest import OpenTraced
from tests.unit.tiering.test_tiers_app import completion

LABEL = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]}},
         "required": ["label"]}  # fmt: skip
FORMAT = {"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL}}


def small_fails_on_hard(call: Call) -> Scripted:
    """The small tier answers `hard` prompts with noise; every other answer is valid."""
    body = orjson.loads(call.body)
    hard = "hard" in body["messages"][-1]["content"]
    small = call.url.startswith("http://s.test")
    return Scripted(body=completion("noise{" if small and hard else '{"label": "spam"}'))


def ask(client: object, model: str, text: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "response_format": FORMAT}  # fmt: skip
    assert client.post("/v1/chat/completions", json=body).status_code == 200  # type: ignore[attr-defined]


def logged(traced: OpenTraced, *, capture: bool) -> list[dict[str, object]]:
    # Traces unsampled (ratio 0): keeping the router's text does not depend on sampling.
    gw = traced(small_fails_on_hard, ratio=0.0, capture=capture)
    ask(gw.client, f"{gw.alias}-auto", "an easy one " + "x" * 3000)
    ask(gw.client, f"{gw.alias}-auto", "a hard one")
    ask(gw.client, gw.alias, "no tiers, no checks")
    gw.client.__exit__(None, None, None)  # drains the log writer
    return [orjson.loads(line) for line in Path(gw.log).read_text().splitlines()]


def test_checked_requests_log_their_outcome_and_the_routers_text(traced: OpenTraced) -> None:
    easy, hard, plain = logged(traced, capture=True)
    assert (easy["cascade"], easy["cascade_tier"], easy["tier"]) == ("passed", "small", "small")
    assert (hard["cascade"], hard["cascade_tier"], hard["tier"]) == ("escalated", "small", "large")
    assert hard["route_text"] == "a hard one"
    # Only what the router reads of a long message: its first 2 KB and last 512 characters.
    assert str(easy["route_text"]).startswith("an easy one")
    assert len(str(easy["route_text"])) == 2048 + 1 + 512
    assert plain["cascade"] is None and plain["route_text"] is None  # an explicit model


def test_without_content_capture_the_log_keeps_outcomes_but_no_text(traced: OpenTraced) -> None:
    easy, hard, _ = logged(traced, capture=False)
    assert (easy["cascade"], hard["cascade"]) == ("passed", "escalated")
    assert easy["route_text"] is None and hard["route_text"] is None
    assert outcomes_of([easy, hard]).prompts == []


def test_route_train_learns_from_the_log(
    traced: OpenTraced, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = logged(traced, capture=True)
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(orjson.dumps(line).decode() + "\n" for line in lines * 4))
    outcomes = read_log(log, tier="small")
    assert [p.small_ok for p in outcomes.prompts[:2]] == [1.0, 0.0]
    assert outcomes.skipped == 4  # the explicit model's lines
    assert read_log(log, tier="large").prompts == []
    out = tmp_path / "router.npz"
    argv = ["route-train", "--from-log", str(log), "--tier", "small", "--out", str(out)]
    assert main(argv) == 0
    assert "8 labelled answers" in capsys.readouterr().err
    router = LearnedRouter.load(out)
    assert router.reads_words  # learned from the traffic it will route
    assert router.score("an easy one") > router.score("a hard one")


def test_nothing_to_learn_is_a_clear_error(tmp_path: Path) -> None:
    line = {"route_text": "q", "cascade": "passed", "cascade_tier": "small", "model": "auto"}
    with pytest.raises(LabelError, match="all 1 labelled answers passed"):
        train_from_outcomes(outcomes_of([line]).prompts)
    log = tmp_path / "requests.jsonl"
    log.write_text('{"route_text": "q"}\nnot json\n')
    with pytest.raises(LabelError, match=r"requests.jsonl:2: not JSON"):
        read_log(log)
    assert main(["route-train", "--from-log", str(log), "--out", str(tmp_path / "r.npz")]) == 2


def tool_answer(call: Call) -> Scripted:
    """Calls `lookup` (declared) when asked nicely, else `rm_rf` (never declared)."""
    body = orjson.loads(call.body)
    name = "lookup" if "nicely" in body["messages"][-1]["content"] else "rm_rf"
    made = {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return Scripted(body=orjson.dumps({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None, "tool_calls": [made]}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }))  # fmt: skip


def test_the_first_answers_tool_calls_are_a_label_too(traced: OpenTraced) -> None:
    gw = traced(tool_answer, ratio=0.0, capture=True)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    for text in ("please look it up nicely", "look it up"):
        body = {"model": f"{gw.alias}-auto", "messages": [{"role": "user", "content": text}],
                "tools": [tool]}  # fmt: skip
        gw.client.post("/v1/chat/completions", json=body)
    gw.client.__exit__(None, None, None)
    valid, invalid = [orjson.loads(line) for line in Path(gw.log).read_text().splitlines()]
    assert (valid["tool_check"], valid["tool_check_tier"]) == ("valid", "large")
    assert (invalid["tool_check"], invalid["tool_check_tier"]) == ("invalid", "large")
    examples = outcomes_of([valid, invalid], "large").prompts
    assert [(p.prompt, p.small_ok) for p in examples] == [
        ("please look it up nicely", 1.0), ("look it up", 0.0)
    ]  # fmt: skip
    assert outcomes_of([valid, invalid], "small").prompts == []


def test_feedback_is_a_label_only_with_a_pass_mark() -> None:
    row = {"route_text": "q", "tier": "small", "model": "auto",
           "feedback": [{"name": "user", "score": 0.2}, {"name": "user", "score": 1.0}]}  # fmt: skip
    assert outcomes_of([row], "small").prompts == []
    (passed,) = outcomes_of([row], "small", feedback_pass=0.5).prompts
    assert passed.small_ok == 1.0  # mean 0.6
    (failed,) = outcomes_of([row], "small", feedback_pass=0.7).prompts
    assert failed.small_ok == 0.0
    # A check's outcome wins over feedback on the same line.
    checked = {**row, "cascade": "escalated", "cascade_tier": "small"}
    assert outcomes_of([checked], "small", feedback_pass=0.5).prompts[0].small_ok == 0.0


def _outcome(text: str, passed: bool) -> LabeledPrompt:
    return LabeledPrompt("traffic", "auto", text, 1.0 if passed else 0.0, 1.0)


def test_a_routes_outcomes_choose_its_learner() -> None:
    """Held-out ranking on the route's own outcomes decides: here only the words tell
    a passing prompt from a failing one (same length, same counts), so a learner that
    reads them wins even when listed last, and the router says why it was chosen."""
    topics = ["invoice", "refund", "address", "password", "delivery", "warranty"]
    prompts = [
        _outcome(f"please {verb} my {topics[i % 6]} request number {i % 7}", verb == "format")
        for i in range(120)
        for verb in ("format", "derive")
    ]
    counts_first = [("counts only", TrainConfig()), ("words", IN_DOMAIN)]
    chosen = select_learner(prompts, counts_first)
    assert chosen.name == "words"
    assert (chosen.aucs["words"] or 0) > 0.95 > (chosen.aucs["counts only"] or 0)
    twins = [("first", TrainConfig()), ("second", TrainConfig())]
    assert select_learner(prompts, twins).name == "first"  # a tie keeps the first listed
    router = train_from_outcomes(prompts)
    assert router.reads_words
    assert router.notes["learner"].startswith("words, light penalty (cross-validated AUC: ")
    fixed = train_from_outcomes(prompts, TrainConfig())
    assert "learner" not in fixed.notes and not fixed.reads_words
