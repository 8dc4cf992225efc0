"""The request log as a learning source: the cascade's outcome on every checked request,
and the text the tier router reads only where content may be kept; `gateway route-train
--from-log` learns from those lines."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.cli import main
from gateway.offline.route_train.labels import LabelError
from gateway.offline.route_train.outcomes import outcomes_of, read_log, train_from_outcomes
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
    assert "8 checked answers" in capsys.readouterr().err
    router = LearnedRouter.load(out)
    assert router.reads_words  # learned from the traffic it will route
    assert router.score("an easy one") > router.score("a hard one")


def test_nothing_to_learn_is_a_clear_error(tmp_path: Path) -> None:
    line = {"route_text": "q", "cascade": "passed", "cascade_tier": "small", "model": "auto"}
    with pytest.raises(LabelError, match="all 1 checked answers passed"):
        train_from_outcomes(outcomes_of([line]).prompts)
    log = tmp_path / "requests.jsonl"
    log.write_text('{"route_text": "q"}\nnot json\n')
    with pytest.raises(LabelError, match=r"requests.jsonl:2: not JSON"):
        read_log(log)
    assert main(["route-train", "--from-log", str(log), "--out", str(tmp_path / "r.npz")]) == 2
