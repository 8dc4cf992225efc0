"""Tiered routing against real vLLM `cpu-tiny` replicas, with the openai SDK.

The tiny model's unconstrained text is noise, so it can never meet a JSON schema by
chance; vLLM's structured outputs make the same model answer within the schema. A tier
whose pool does not ask for structured outputs is therefore the cascade's failing small
model, and one that does is its passing one: the escalation is proven end to end.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.supervisor import Launch, down, up
from gateway.cli import main
from gateway.offline.route_train.outcomes import read_log
from gateway.state.keys import session_tier_key
from gateway.tiering.learned import SHIPPED, LearnedRouter
from tests.conftest import ROOT
from tests.integration.conftest import Engines, Gateway, engine_paths, running_gateway

pytestmark = pytest.mark.engine

SHIPPED_ARTIFACT = ROOT / "gateway" / "tiering" / SHIPPED


class Label(BaseModel):
    label: Literal["spam", "ham"]


LABEL_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "label", "strict": True, "schema": Label.model_json_schema()},
}
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Is 'WIN A PRIZE NOW' spam or ham?"}
]


@pytest.fixture(scope="module")
def tiered(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("tiered")
    replicas = ", ".join(f'{{url: "{url}"}}' for url in engines.urls("tiny-chat"))
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
telemetry:
  request_log: "{work / "requests.jsonl"}"
  traces: {{capture_content: true}}
pools:
  small-unconstrained: {{tier: small, served_model: tiny, structured_outputs: false,
                        replicas: [{replicas}]}}
  small: {{tier: small, served_model: tiny, replicas: [{replicas}]}}
  large: {{tier: large, served_model: tiny, replicas: [{replicas}]}}
models:
  tiny: {{pool: large}}
  auto: {{tiering: default}}
  auto-unconstrained: {{tiering: unconstrained}}
tiering:
  default:
    tiers: {{small: small, large: large}}
    rules:
      - {{name: classify, when: {{task: [classify]}}, then: small}}
      - {{name: short-answers, when: {{max_tokens_at_most: 2}}, then: small}}
    learned: {{threshold: 0.5}}
  unconstrained:
    tiers: {{small: small-unconstrained, large: large}}
    learned: {{threshold: 0.5, shadow: {{artifact: "{SHIPPED_ARTIFACT}"}}}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway


_CLIENTS: dict[str, openai.OpenAI] = {}


def sdk(gateway: Gateway) -> openai.OpenAI:
    """One client per gateway, closed with the module (an unclosed one's sockets would
    warn whenever the collector happens to run, in whichever test that is)."""
    client = _CLIENTS.get(gateway.v1)
    if client is None:
        client = openai.OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=120)
        _CLIENTS[gateway.v1] = client
    return client


@pytest.fixture(scope="module", autouse=True)
def _closed_clients() -> Iterator[None]:
    yield
    for client in _CLIENTS.values():
        client.close()
    _CLIENTS.clear()


def ask_label(gateway: Gateway, model: str) -> tuple[str, str, Label]:
    """The tier, the reason, and the answer validated against the schema."""
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model=model,
        messages=MESSAGES,
        response_format=LABEL_FORMAT,
        max_tokens=40,
        temperature=0,
    )
    content = raw.parse().choices[0].message.content
    assert content is not None
    label = Label.model_validate_json(content)
    return raw.headers["x-gateway-tier"], raw.headers["x-gateway-route-reason"], label


def test_an_unconstrained_small_answer_fails_the_schema_and_escalates(tiered: Gateway) -> None:
    tier, reason, _ = ask_label(tiered, "auto-unconstrained")
    assert tier == "large"
    assert reason == "cascade: small failed response_format, escalated to large"


def test_a_constrained_small_answer_passes_and_is_not_escalated(tiered: Gateway) -> None:
    tier, reason, _ = ask_label(tiered, "auto")
    assert tier == "small"
    assert reason == "cascade: verifiable (response_format)"


def test_the_sdk_parse_helper_gets_a_valid_answer_through_the_cascade(tiered: Gateway) -> None:
    parsed = sdk(tiered).chat.completions.parse(
        model="auto-unconstrained",
        messages=MESSAGES,
        response_format=Label,
        max_tokens=40,
        temperature=0,
    )
    assert parsed.choices[0].message.parsed is not None


def test_a_streamed_cascade_reaches_the_client_as_one_valid_stream(tiered: Gateway) -> None:
    client = sdk(tiered)
    with client.chat.completions.with_streaming_response.create(
        model="auto-unconstrained",
        messages=MESSAGES,
        response_format=LABEL_FORMAT,
        max_tokens=40,
        temperature=0,
        stream=True,
    ) as response:
        assert response.headers["x-gateway-tier"] == "large"
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
        )
    Label.model_validate(json.loads(text))


def test_the_request_log_teaches_the_router_what_the_cascade_learned(
    tiered: Gateway, tmp_path: Path
) -> None:
    """Real vLLM: the unconstrained small answer fails its check and the constrained one
    passes; the request log says so beside the text the router reads (content capture on),
    with the shadow router's decision on the route that has one, and `gateway route-train
    --from-log` learns from those lines."""
    asked = {"auto": "Is 'free money inside' spam or ham?",
             "auto-unconstrained": "Is 'lunch at noon?' spam or ham?"}  # fmt: skip
    for model, question in asked.items():
        sdk(tiered).chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}],
            response_format=LABEL_FORMAT, max_tokens=40, temperature=0,
        )  # fmt: skip
    log = tiered.policy.parent / "requests.jsonl"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # written by the log's own thread
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        mine = {
            line["route_text"]: line for line in lines if line.get("route_text") in asked.values()
        }
        if len(mine) == 2:
            break
        time.sleep(0.1)
    passed, escalated = mine[asked["auto"]], mine[asked["auto-unconstrained"]]
    assert (passed["cascade"], passed["cascade_tier"]) == ("passed", "small")
    assert (escalated["cascade"], escalated["tier"]) == ("escalated", "large")
    assert passed["shadow"] is None  # no shadow on that route
    assert set(escalated["shadow"]) == {"tier", "score", "live_tier", "live_score"}
    labelled = tmp_path / "requests.jsonl"
    labelled.write_text("".join(json.dumps(line) + "\n" for line in (passed, escalated) * 3))
    assert [p.small_ok for p in read_log(labelled, "small").prompts[:2]] == [1.0, 0.0]
    out = tmp_path / "router.npz"
    argv = ["route-train", "--from-log", str(labelled), "--tier", "small", "--out", str(out)]
    assert main(argv) == 0
    assert LearnedRouter.load(out).reads_words


def test_rules_and_the_learned_router_explain_themselves(tiered: Gateway) -> None:
    client = sdk(tiered)
    ruled = client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=4,
        extra_headers={"X-Task": "classify"},
    )  # fmt: skip
    assert (ruled.headers["x-gateway-tier"], ruled.headers["x-gateway-route-reason"]) == (
        "small",
        "rule:classify",
    )
    short = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=MESSAGES,
        max_tokens=2,
    )
    assert short.headers["x-gateway-route-reason"] == "rule:short-answers"
    scored = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=MESSAGES,
        max_tokens=4,
    )
    assert scored.headers["x-gateway-tier"] in ("small", "large")
    assert scored.headers["x-gateway-route-reason"].startswith("router: score ")
    explicit = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=4,
    )
    assert explicit.headers["x-gateway-route-reason"] == "explicit model"


CANDIDATES = (
    "Is 'WIN A PRIZE NOW' spam or ham?",
    "Plan a three-city rail trip through Europe within a budget of 2,000 euros.",
    "A store sells pens at $3 each and notebooks at twice that. Tom buys 4 pens and 3 "
    "notebooks and pays with a $50 bill. How much change does he get?",
    "Translate 'good morning' into French.",
    "Prove that the square root of 2 is irrational.",
)


@pytest.fixture(scope="module")
def sticky(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, str, str]]:
    """A gateway whose threshold sits between the shipped router's scores of two prompts,
    with a margin wider than their gap: a session on the large tier must stay there."""
    router = LearnedRouter.load()
    ranked = sorted(CANDIDATES, key=router.score)
    hard, easy = ranked[0], ranked[-1]
    low, high = router.score(hard), router.score(easy)
    assert high > low
    work = tmp_path_factory.mktemp("sticky")
    replicas = ", ".join(f'{{url: "{url}"}}' for url in engines.urls("tiny-chat"))
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools:
  small: {{tier: small, served_model: tiny, replicas: [{replicas}]}}
  large: {{tier: large, served_model: tiny, replicas: [{replicas}]}}
models:
  auto: {{tiering: sticky}}
tiering:
  sticky:
    tiers: {{small: small, large: large}}
    learned: {{threshold: {(low + high) / 2}}}
    stickiness: {{margin: {high - low}, cache_weight: 0}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway, hard, easy


def test_a_session_does_not_bounce_between_tiers(
    sticky: tuple[Gateway, str, str], redis_url: str
) -> None:
    gateway, hard, easy = sticky
    client = sdk(gateway)
    session = f"tier-{uuid.uuid4().hex}"

    def ask(question: str, session_id: str | None) -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": question}],
            max_tokens=4,
            extra_headers={"X-Session-Id": session_id} if session_id else None,
        )
        return raw.headers["x-gateway-tier"], raw.headers["x-gateway-route-reason"]

    tier, reason = ask(hard, session)
    assert tier == "large"
    assert reason.startswith("router: score ")
    tier, reason = ask(easy, session)  # past the threshold, not past the margin
    assert tier == "large"
    assert reason.startswith("session: stays on large")
    tier, reason = ask(easy, None)  # the same prompt outside a session moves
    assert tier == "small"
    assert reason.startswith("router: score ")
    # The session's tier lives in Redis, for every gateway replica to see.
    with redis.Redis.from_url(redis_url) as store:
        stored = store.get(session_tier_key("default", session, "sticky"))
    assert stored == b"large"


@pytest.fixture(scope="module")
def short_window(
    engines: Engines,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    engine_lifeline: Lifeline,
) -> Iterator[Gateway]:
    """A small tier whose engine holds 2,048 tokens (a `cpu-tiny` replica started with a
    shorter window) under a large tier of the suite's 16,384-token replicas."""
    work = tmp_path_factory.mktemp("short-window")
    paths = engine_paths(work)
    chat = load_profile("cpu-tiny")
    short = chat.model_copy(update={"max_model_len": 2048, "pool": "tiny-short"})
    (record,) = up(
        [Launch(short, 1, resolve_model(chat, None, paths))],
        paths=paths, timeout_s=900, lifeline=engine_lifeline, say=lambda _: None,
    )  # fmt: skip
    large = ", ".join(f'{{url: "{url}"}}' for url in engines.urls("tiny-chat"))
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools:
  small: {{tier: small, served_model: tiny, replicas: [{{url: "{record.url}"}}]}}
  large: {{tier: large, served_model: tiny, replicas: [{large}]}}
models:
  windowed: {{tiering: windowed}}
tiering:
  windowed:
    tiers: {{small: small, large: large}}
    rules:
      - {{name: classify, when: {{task: [classify]}}, then: small}}
    learned: null
"""
    )
    try:
        with running_gateway(policy, work / "gateway.log") as gateway:
            yield gateway
    finally:
        down(paths, say=lambda _: None, lifeline=engine_lifeline)


def test_a_prompt_past_the_small_engines_window_moves_up_and_its_conversation_stays(
    short_window: Gateway,
) -> None:
    """Real vLLM refuses the prompt past its 2,048-token window; the gateway sends it to
    the tier whose engines hold 16,384, and the conversation's next, longer turn goes
    there directly; a short call of the same session still goes to the small tier."""
    session = {"X-Task": "classify", "X-Session-Id": f"window-{uuid.uuid4().hex[:8]}"}
    client = sdk(short_window)
    long_text = " ".join(f"word{i % 97}" for i in range(1500))  # 5,406 tokens
    turns: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Label the mail."},
        {"role": "user", "content": long_text},
    ]

    def ask(messages: list[ChatCompletionMessageParam]) -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="windowed", messages=messages, max_tokens=4, temperature=0,
            extra_headers=session,
        )  # fmt: skip
        return raw.headers["x-gateway-tier"], raw.headers["x-gateway-route-reason"]

    assert ask(turns) == ("large", "window: small holds 2048 tokens, not the prompt; large 16384")
    grown: list[ChatCompletionMessageParam] = [
        *turns,
        {"role": "assistant", "content": "spam"},
        {"role": "user", "content": long_text},
    ]
    tier, reason = ask(grown)
    assert tier == "large"
    assert reason.startswith("session: about "), reason
    assert reason.endswith("past small's 2048 (an earlier turn did not fit); large 16384")
    short: list[ChatCompletionMessageParam] = [turns[0], {"role": "user", "content": "spam?"}]
    assert ask(short) == ("small", "rule:classify")
