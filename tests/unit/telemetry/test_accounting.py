"""Token economics and what is counted per request: cost and savings from counted tokens,
`GET /v1/usage` against real Redis, Prometheus metrics parsed with prometheus_client's
parser, and the request log line (`gateway replay`'s input)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.offline.replay.traces import read_trace
from gateway.policy import parse_policy
from gateway.policy.telemetry import PriceSpec
from gateway.telemetry.prices import Prices
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.usage import (
    MemoryUsageLedger,
    UsageBook,
    day_of,
    usage_report,
)
from tests.fakes import Call, Scripted
from tests.unit.telemetry.conftest import POLICY, OpenTraced, completion


def _stream(prompt: int, cached: int, output: int) -> list[bytes]:
    head = b'{"id":"c","object":"chat.completion.chunk","model":"served-small","choices":'
    return [
        b"data: " + head + b'[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        b"data: "
        + head
        + b'[{"index":0,"delta":{"content":"intent: b"},"finish_reason":"stop"}]}\n\n',
        b"data: " + head + b'[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":%d}}}\n\n' % (prompt, output, cached),
        b"data: [DONE]\n\n",
    ]


def _policy_prices() -> Prices:
    policy = parse_policy(
        POLICY.format(redis_url="redis://x", ratio=0, capture="false", alias="m", log="l")
    )
    return Prices(policy)


def _record(model: str, pool: str, prompt: int, cached: int, output: int) -> RequestRecord:
    record = RequestRecord.detached()
    record.model, record.pool = model, pool
    record.result.prompt_tokens = prompt
    record.result.cached_tokens = cached
    record.result.completion_tokens = output
    return record


def test_cost_and_savings_come_from_counted_tokens_at_the_policys_prices() -> None:
    prices = _policy_prices()
    # 1M prompt tokens of which 600k cached, 100k out, on the large pool ($3 / $0.3 / $15).
    spend = prices.spend(_record("m", "large", 1_000_000, 600_000, 100_000))
    assert spend.cost_nusd == round((0.4 * 3.0 + 0.6 * 0.3 + 0.1 * 15.0) * 1e9)
    assert spend.saved_cache_nusd == round(0.6 * (3.0 - 0.3) * 1e9)
    assert spend.saved_small_tier_nusd == 0  # a fixed model: nothing to compare with
    # The routable alias answered by its small tier: saved what the large tier would cost.
    record = _record("m-auto", "small", 1_000_000, 0, 100_000)
    record.trimmed_tokens = 200_000
    spend = prices.spend(record)
    assert spend.cost_nusd == round((1.0 * 0.10 + 0.1 * 0.40) * 1e9)
    assert spend.saved_small_tier_nusd == round((1.0 * 3.0 + 0.1 * 15.0 - 0.14) * 1e9)
    assert spend.small_tier_tokens == 1_100_000
    assert spend.saved_trimming_nusd == round(0.2 * 0.10 * 1e9)


def test_a_cached_price_above_the_input_price_is_refused() -> None:
    with pytest.raises(ValueError, match="cached_input"):
        PriceSpec(input=1.0, cached_input=2.0, output=1.0)


async def test_counts_outlive_a_ledger_outage() -> None:
    ledger = MemoryUsageLedger()
    book = UsageBook(ledger)
    key = ("2026-11-30", "default", "m", "large")
    book.add(key, None, {"requests": 1, "input_tokens": 10})
    ledger.fail = True
    with pytest.raises(Exception, match="down"):
        await book.flush()
    book.add(key, None, {"requests": 1, "input_tokens": 5})
    ledger.fail = False
    await book.flush()
    assert ledger.rows[key] == {"requests": 2, "input_tokens": 15}
    report = usage_report(ledger.rows, dt.date(2026, 11, 30), dt.date(2026, 11, 30))
    assert report["totals"]["input_tokens"] == 15


def _usage(gw_client: Any, **params: str) -> dict[str, Any]:
    response = gw_client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def test_usage_sums_match_the_tokens_the_engine_reported(traced: OpenTraced) -> None:
    def engine(call: Call) -> Scripted:
        body = orjson.loads(call.body)
        if body.get("stream"):
            return Scripted(chunks=_stream(40, 16, 3), content_type="text/event-stream")
        return Scripted(body=completion(100, 60, 20))

    gw = traced(engine)
    chat = {"model": gw.alias, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        gw.client.post("/v1/chat/completions", json=chat, headers={"X-Session-Id": f"u-{gw.alias}"})
    auto = {**chat, "model": f"{gw.alias}-auto", "stream": True}
    streamed = gw.client.post("/v1/chat/completions", json=auto, headers={"X-Task": "classify"})
    assert streamed.headers["x-gateway-tier"] == "small"
    # The client did not ask for usage: the gateway did, counted it and kept it to itself.
    assert b'"usage"' not in streamed.content
    sent = orjson.loads(gw.fake.calls[-1].body)
    assert sent["stream_options"] == {"include_usage": True}

    report = _usage(gw.client)
    rows = {r["model"]: r for r in report["data"] if r["model"].startswith(gw.alias)}
    fixed, routed = rows[gw.alias], rows[f"{gw.alias}-auto"]
    assert (fixed["requests"], fixed["input_tokens"], fixed["output_tokens"]) == (3, 300, 60)
    assert fixed["cached_input_tokens"] == 180
    assert fixed["cache_hit_ratio"] == 0.6
    assert fixed["input_output_ratio"] == 5.0
    assert fixed["cost_usd"] == pytest.approx(3 * (40 * 3.0 + 60 * 0.3 + 20 * 15.0) / 1e6)
    assert fixed["saved_usd"]["cache"] == pytest.approx(3 * 60 * 2.7 / 1e6)
    assert fixed["day"] == dt.datetime.now(dt.UTC).date().isoformat()
    assert routed["by_tier"]["small"]["input_tokens"] == 40
    assert routed["saved_usd"]["small_tier"] > 0
    assert routed["saved_tokens"]["small_tier"] == 43

    session = _usage(gw.client, session=f"u-{gw.alias}")
    assert (session["requests"], session["input_tokens"]) == (3, 300)


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"start": "yesterday"}, "invalid_date"),
        ({"start": "2026-11-30", "end": "2026-11-01"}, "invalid_date"),
        ({"start": "2020-01-01", "end": "2026-01-01"}, "invalid_date"),
    ],
)
def test_bad_usage_queries_get_a_clear_400(
    traced: OpenTraced, params: dict[str, str], code: str
) -> None:
    gw = traced()
    response = gw.client.get("/v1/usage", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


def test_unknown_session_usage_is_404(traced: OpenTraced) -> None:
    gw = traced()
    assert gw.client.get("/v1/usage", params={"session": "nobody-here"}).status_code == 404


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_parse_and_count_requests_tokens_latency_and_replicas(traced: OpenTraced) -> None:
    gw = traced()
    chat = {"model": gw.alias, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        gw.client.post("/v1/chat/completions", json=chat)
    gw.client.post("/v1/chat/completions", json={"model": gw.alias})  # 400: no messages
    gw.client.post("/v1/chat/completions", json={**chat, "model": "no-such-model-x"})  # 404
    samples = _samples(gw.client.get("/metrics").text)
    a = gw.alias

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("gateway_requests_total", model=a, tier="large", status="200") == 2
    # Refused before the model was known, or naming no model of the policy: never a label
    # of their own (clients cannot grow the metrics' cardinality).
    assert value("gateway_requests_total", model="unknown", tier="none", status="400") >= 1
    assert value("gateway_requests_total", model="unknown", tier="none", status="404") >= 1
    assert not any("no-such-model-x" in str(labels) for _, labels in samples)
    assert value("gateway_prompt_tokens_total", tenant="default", model=a, tier="large") == 200
    assert (
        value("gateway_cached_prompt_tokens_total", tenant="default", model=a, tier="large") == 120
    )
    assert value("gateway_completion_tokens_total", tenant="default", model=a, tier="large") == 40
    assert value(
        "gateway_cost_usd_total", tenant="default", model=a, tier="large"
    ) == pytest.approx(2 * (40 * 3.0 + 60 * 0.3 + 20 * 15.0) / 1e6)
    assert value("gateway_savings_usd_total", tenant="default", model=a, source="cache") > 0
    assert value("gateway_request_duration_seconds_count", model=a, tier="large") == 2
    assert value("gateway_overhead_seconds_count", model=a) == 2
    replicas = [k for k in samples if k[0] == "gateway_breaker_state"]
    assert len(replicas) == 3 and all(samples[k] == 0 for k in replicas)
    assert any(k[0] == "gateway_replica_inflight" for k in samples)


def test_the_cache_prediction_error_is_counted_against_what_the_engine_reported(
    traced: OpenTraced,
) -> None:
    """Routing expected 0 cached tokens of the first request and all 100 of the second
    (the same prompt, the same session, the same replica); the engine said 60 both times:
    |0 - 60| + |100 - 60| over 200 prompt tokens."""
    gw = traced()
    chat = {"model": gw.alias, "messages": [{"role": "user", "content": "rules " * 200}]}
    for _ in range(2):
        gw.client.post("/v1/chat/completions", json=chat, headers={"X-Session-Id": f"p-{gw.alias}"})
    samples = _samples(gw.client.get("/metrics").text)
    errors = {k: v for k, v in samples.items() if k[0].startswith("gateway_cache_prediction_")}
    assert sum(v for k, v in errors.items() if "abs_error" in k[0] and "total" in k[0]) == 100
    assert sum(v for k, v in errors.items() if "prompt_tokens_total" in k[0]) == 200


def test_the_request_log_has_one_line_per_request_that_replay_reads(traced: OpenTraced) -> None:
    gw = traced()
    chat = {
        "model": gw.alias,
        "messages": [
            {"role": "system", "content": "rules " * 300},
            {"role": "user", "content": "x"},
        ],
    }
    response = gw.client.post(
        "/v1/chat/completions", json=chat, headers={"X-Session-Id": f"log-{gw.alias}"}
    )
    gw.client.post("/v1/chat/completions", json={"model": gw.alias})  # refused: still a line
    gw.client.__exit__(None, None, None)  # drains the log writer
    lines = [orjson.loads(line) for line in Path(gw.log).read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["request_id"] == response.headers["x-request-id"]
    assert first["trace_id"] == response.headers["x-gateway-trace-id"]
    assert first["tenant"] == "default" and first["model"] == gw.alias
    assert first["tier"] == "large" and first["status"] == 200
    assert first["replica"] == response.headers["x-gateway-replica"]
    assert (first["prompt_tokens"], first["cached_tokens"], first["output_tokens"]) == (100, 60, 20)
    assert first["duration_ms"] >= first["overhead_ms"] >= 0
    assert first["reason"] and first["blocks"]
    assert first["expected_cached_tokens"] == 0  # nothing was held anywhere yet
    assert lines[1]["status"] == 400 and lines[1]["error"]
    trace = list(read_trace(Path(gw.log), block_tokens=128))
    assert len(trace) == 1 and trace[0].session == f"log-{gw.alias}"


def test_dashboard_data_shows_traffic(traced: OpenTraced) -> None:
    gw = traced()
    chat = {"model": gw.alias, "messages": [{"role": "user", "content": "hi"}]}
    gw.client.post("/v1/chat/completions", json=chat)
    data = gw.client.get("/dashboard/data").json()
    assert data["totals"]["requests"] == 1
    assert data["totals"]["cache_hit_ratio"] == 0.6
    assert data["tiers"] == {"large": 1}
    assert sum(r["requests"] for r in data["replicas"]) == 1
    assert {r["breaker"] for r in data["replicas"]} == {"closed"}
    page = gw.client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_an_escalated_answer_is_paid_for_as_well(traced: OpenTraced) -> None:
    def engine(call: Call) -> Scripted:
        small = orjson.loads(call.body)["model"] == "served-small"
        content = "not json at all" if small else '{"label": "spam"}'
        payload = orjson.loads(completion(100, 0, 20))
        payload["choices"][0]["message"]["content"] = content
        return Scripted(body=orjson.dumps(payload))

    gw = traced(engine)
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["spam", "ham"]}},
        "required": ["label"],
        "additionalProperties": False,
    }
    response = gw.client.post(
        "/v1/chat/completions",
        json={
            "model": f"{gw.alias}-auto",
            "messages": [{"role": "user", "content": "spam?"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "label", "schema": schema},
            },
        },
    )
    assert response.status_code == 200
    assert response.headers["x-gateway-tier"] == "large"
    assert len(gw.fake.calls) == 2  # small first, then large
    (row,) = [r for r in _usage(gw.client)["data"] if r["model"] == f"{gw.alias}-auto"]
    # Both answers' tokens were processed and both are paid for.
    assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (1, 200, 40)
    small, large = 100 * 0.10 + 20 * 0.40, 100 * 3.0 + 20 * 15.0
    assert row["cost_usd"] == pytest.approx((small + large) / 1e6)
    assert row["saved_usd"]["small_tier"] == 0


@pytest.mark.parametrize(
    ("wall", "day"),
    [
        (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), "1970-01-01"),
        (dt.datetime(2026, 12, 1, 0, 0, 0, tzinfo=dt.UTC), "2026-12-01"),
        (dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), "2026-12-31"),
        (dt.datetime(2028, 2, 29, 12, tzinfo=dt.UTC), "2028-02-29"),
    ],
)
def test_usage_rows_are_kept_by_utc_day(wall: dt.datetime, day: str) -> None:
    ns = int(wall.timestamp()) * 1_000_000_000 + wall.microsecond * 1000
    assert day_of(ns) == day
    assert day_of(ns + 999) == day  # nanoseconds never round into the next day
