"""Observability against real components: real vLLM replicas (one of them exporting its
own spans), Arize Phoenix as the OTLP/HTTP trace receiver, the openai SDK as the client,
Prometheus text parsed with prometheus_client's parser, and the dashboard in headless
Chromium.

One module-scoped run drives the traffic; each test checks one promise about it.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionSystemMessageParam
from prometheus_client.parser import text_string_to_metric_families

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.supervisor import Launch, down, up
from tests.browser import PageLog, chromium_page, save_screenshot
from tests.integration.conftest import Engines, Gateway, engine_paths, running_gateway
from tests.phoenix import phoenix_spans, running_phoenix

pytestmark = pytest.mark.engine

CLIENT_TRACE = secrets.token_hex(16)
CLIENT_SPAN = secrets.token_hex(8)


@dataclass(frozen=True)
class Observed:
    gateway: Gateway
    phoenix: str
    work: Path
    usage_before: dict[str, Any]
    usage_after: dict[str, Any]
    reported: dict[str, dict[str, int]]  # model -> token sums the engine reported
    traced_request_id: str


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if resp.headers.get_content_type() == "application/json" else body


def _rows(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for row in report["data"]:
        into = out.setdefault(row["model"], {"requests": 0, "input": 0, "cached": 0, "output": 0})
        into["requests"] += row["requests"]
        into["input"] += row["input_tokens"]
        into["cached"] += row["cached_input_tokens"]
        into["output"] += row["output_tokens"]
    return out


def _add(into: dict[str, dict[str, int]], model: str, usage: Any) -> None:
    sums = into.setdefault(model, {"requests": 0, "input": 0, "cached": 0, "output": 0})
    sums["requests"] += 1
    sums["input"] += usage.prompt_tokens
    sums["output"] += usage.completion_tokens
    details = usage.prompt_tokens_details
    sums["cached"] += (details.cached_tokens or 0) if details is not None else 0


def _drive(gateway: Gateway) -> tuple[dict[str, dict[str, int]], str]:
    """Agent-like traffic through the openai SDK: a session, streams, a small-tier task,
    and one request carrying the client's own trace context."""
    client = openai.OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=120)
    reported: dict[str, dict[str, int]] = {}
    system: ChatCompletionSystemMessageParam = {
        "role": "system",
        "content": "You are a careful travel agent. " * 40,
    }
    history: list[ChatCompletionMessageParam] = [system]
    traced = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[system, {"role": "user", "content": "trace me"}],
        max_tokens=8,
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    _add(reported, "tiny", traced.parse().usage)
    for turn in range(4):
        history.append({"role": "user", "content": f"turn {turn}: change my booking"})
        answer = client.chat.completions.create(
            model="tiny", messages=history, max_tokens=12, extra_headers={"X-Session-Id": "obs"}
        )
        _add(reported, "tiny", answer.usage)
        history.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    for n in range(6):
        stream = client.chat.completions.create(
            model="tiny" if n % 2 else "auto",
            messages=[system, {"role": "user", "content": f"stream {n}"}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Task": "classify"},
        )
        for chunk in stream:
            if chunk.usage is not None:
                _add(reported, "tiny" if n % 2 else "auto", chunk.usage)
    # Output that repeats the prompt (held to it by a regex: the random-weight model would
    # not copy by itself), so ngram speculative decoding finds drafts on every engine.
    for model in ("tiny", "auto", "auto"):
        answer = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "one two three four " * 60}],
            max_tokens=96,
            extra_headers={"X-Task": "classify"},
            extra_body={"structured_outputs": {"regex": "(one two three four ){12}"}},
        )
        _add(reported, model, answer.usage)
    return reported, traced.headers["x-request-id"]


@pytest.fixture(scope="module")
def observed(
    engines: Engines,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    engine_lifeline: Lifeline,
) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("observability")
    with running_phoenix(work / "phoenix") as phoenix:
        # A replica of its own that exports its spans to the same receiver.
        paths = engine_paths(work / "engines")
        profile = load_profile("cpu-tiny")
        traced_profile = profile.model_copy(
            update={
                "otlp_traces_endpoint": f"{phoenix}/v1/traces",
                "env": {
                    **profile.env,
                    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                    "OTEL_SERVICE_NAME": "vllm",
                },
            }
        )
        model = resolve_model(profile, None, paths)

        def say(message: str) -> None:
            print(message, file=sys.stderr, flush=True)

        (traced_engine,) = up(
            [Launch(traced_profile, 1, model, pool="traced")],
            paths=paths, say=say, timeout_s=600, lifeline=engine_lifeline,
        )  # fmt: skip
        try:
            small = ", ".join(f'{{url: "{u}"}}' for u in engines.urls("tiny-chat"))
            policy = work / "policy.yaml"
            policy.write_text(
                f"""\
version: 1
health: {{interval_s: 1}}
state: {{redis_url: "{redis_url}"}}
routing: {{scrape_interval_s: 0.5}}
telemetry:
  traces: {{endpoint: "{phoenix}/v1/traces", sample_ratio: 1.0}}
  request_log: "{work}/requests.jsonl"
  usage: {{flush_interval_s: 0.5}}
pools:
  small:
    tier: small
    served_model: tiny
    replicas: [{small}]
    price: {{input: 0.10, cached_input: 0.01, output: 0.40}}
  large:
    tier: large
    served_model: tiny
    replicas: [{{url: "{traced_engine.url}"}}]
    price: {{input: 3.0, cached_input: 0.30, output: 15.0}}
models:
  tiny: {{pool: large}}
  auto: {{tiering: auto}}
tiering:
  auto:
    tiers: {{small: small, large: large}}
    learned: null
    rules: [{{name: classify, when: {{task: [classify]}}, then: small}}]
    default_tier: large
"""
            )
            with running_gateway(policy, work / "gateway.log") as gateway:
                before = _get(f"{gateway.base_url}/v1/usage")
                reported, request_id = _drive(gateway)
                after = _get(f"{gateway.base_url}/v1/usage")
                yield Observed(gateway, phoenix, work, before, after, reported, request_id)
        finally:
            down(paths, say=say, lifeline=engine_lifeline)


def test_usage_sums_match_the_tokens_the_engines_reported(observed: Observed) -> None:
    before, after = _rows(observed.usage_before), _rows(observed.usage_after)
    for model, sums in observed.reported.items():
        was = before.get(model, {"requests": 0, "input": 0, "cached": 0, "output": 0})
        now = after[model]
        assert {k: now[k] - was[k] for k in sums} == sums, model
    auto = next(r for r in observed.usage_after["data"] if r["model"] == "auto")
    assert "small" in auto["by_tier"]
    assert observed.usage_after["totals"]["saved_usd"]["small_tier"] > 0


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_metrics_count_the_traffic_and_carry_what_the_engines_report(observed: Observed) -> None:
    time.sleep(1.5)  # a scrape of the engines after the traffic
    text = _get(f"{observed.gateway.base_url}/metrics").decode()
    samples = _samples(text)

    def total(name: str, **labels: str) -> float:
        return sum(
            v for lbl, v in samples.get(name, []) if all(lbl.get(k) == x for k, x in labels.items())
        )

    assert total("gateway_requests_total", model="tiny", status="200") >= 8
    assert total("gateway_requests_total", model="auto", tier="small", status="200") >= 3
    assert total("gateway_prompt_tokens_total", tenant="default") > 0
    assert total("gateway_completion_tokens_total", tenant="default") > 0
    assert total("gateway_time_to_first_token_seconds_count", model="tiny") >= 3
    assert total("gateway_overhead_seconds_count", model="tiny") >= 8
    assert total("gateway_session_checkpoints_total", outcome="written") >= 4
    engines = {lbl["replica"] for lbl, _ in samples.get("gateway_engine_kv_cache_usage_ratio", [])}
    assert len(engines) == 3  # every replica scraped
    for name in (
        "gateway_engine_requests_waiting",
        "gateway_engine_requests_running",
        "gateway_engine_prefix_cache_hit_ratio",
    ):
        assert len(samples.get(name, [])) == 3, name
    # ngram speculative decoding runs on every cpu-tiny replica.
    assert samples.get("gateway_engine_spec_decode_mean_accepted_length"), text[-2000:]
    assert {v for _, v in samples["gateway_breaker_state"]} == {0}


def _wait_for_trace(phoenix: str, trace_id: str, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        spans = [s for s in phoenix_spans(phoenix) if s["trace_id"] == trace_id]
        if len(spans) >= want or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def test_one_trace_spans_the_agent_the_gateway_and_the_engine(observed: Observed) -> None:
    spans = _wait_for_trace(observed.phoenix, CLIENT_TRACE, want=8)
    by_name = {s["name"]: s for s in spans}
    root = by_name.get("chat tiny")
    assert root is not None, [s["name"] for s in spans]
    assert root["parent_id"] == CLIENT_SPAN  # the agent's span is the gateway's parent
    attrs = root["attributes"]
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "tiny"
    assert attrs["gen_ai.response.model"] == "tiny"
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert attrs["gateway.request_id"] == observed.traced_request_id
    assert attrs["gateway.tier"] == "large"
    for stage in ("hydrate", "canonicalize", "choose_tier", "choose_replica", "upstream"):
        assert by_name[stage]["parent_id"] == root["span_id"], stage
    upstream = by_name["upstream"]
    engine = [s["name"] for s in spans if s["parent_id"] == upstream["span_id"]]
    assert engine == ["llm_request"], [(s["name"], s["parent_id"]) for s in spans]


def test_the_dashboard_draws_live_traffic_in_headless_chromium(observed: Observed) -> None:
    time.sleep(1.5)  # the engines scraped after the traffic
    log = PageLog()
    with chromium_page(log) as page:
        page.goto(f"{observed.gateway.base_url}/dashboard")
        for chart in (
            "stat-requests",
            "rps-chart",
            "ttft-chart",
            "cache-chart",
            "savings",
            "tier-chart",
            "replica-table",
            "breakers",
            "spec-decoding",
        ):
            page.wait_for_selector(f'[data-testid="{chart}"][data-ready="1"]', timeout=20_000)
        save_screenshot(page, "dashboard-live")
        tiers = page.locator('[data-testid="tier-row"]').all_inner_texts()
        assert any("small" in t for t in tiers) and any("large" in t for t in tiers)
    assert not log.console_errors and not log.page_errors
    assert not log.foreign_requests()
