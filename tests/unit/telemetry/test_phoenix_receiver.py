"""`make traces`' receiver, for real: spans exported with the OpenTelemetry SDK over OTLP/HTTP
reach Arize Phoenix and read back through tests/phoenix.py with their ids, parent link and
attributes, so gateway tracing tests can assert on what Phoenix shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests import phoenix
from tests.phoenix import phoenix_spans, running_phoenix, wait_for_spans


def test_otlp_http_spans_round_trip_through_phoenix(tmp_path: Path) -> None:
    # Without .venv-phoenix this fails (PhoenixNotInstalled: "`make test` builds it"): a
    # skip would let tracing go untested on a machine that never built the environment.
    with running_phoenix(tmp_path / "phoenix") as base:
        assert phoenix_spans(base) == []

        # Not the global provider: other tests (and the gateway) own that.
        provider = TracerProvider(resource=Resource.create({"service.name": "agw-test"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=10))
        )
        tracer = provider.get_tracer("tests.phoenix")
        chat = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny"}
        with tracer.start_as_current_span("chat tiny", attributes=chat) as root:
            upstream: dict[str, str | int | bool | float] = {
                "agw.replica": "tiny-chat-0",
                "gen_ai.usage.input_tokens": 12,
                "agw.cache_hit": True,
                "agw.score": 0.25,
            }
            with tracer.start_as_current_span("upstream", attributes=upstream) as child:
                pass
        provider.shutdown()

        spans = {s["name"]: s for s in wait_for_spans(base, 2)}
    assert set(spans) == {"chat tiny", "upstream"}
    got_root, got_child = spans["chat tiny"], spans["upstream"]
    trace_id = format(root.get_span_context().trace_id, "032x")
    assert got_root["trace_id"] == got_child["trace_id"] == trace_id
    assert got_root["span_id"] == format(root.get_span_context().span_id, "016x")
    assert got_child["span_id"] == format(child.get_span_context().span_id, "016x")
    assert got_root["parent_id"] is None
    assert got_child["parent_id"] == got_root["span_id"]

    assert got_root["attributes"]["gen_ai.operation.name"] == "chat"
    assert got_root["attributes"]["gen_ai.request.model"] == "tiny"
    assert got_root["kind"] == "LLM"  # Phoenix maps gen_ai.* onto its LLM view
    assert got_child["attributes"] | upstream == got_child["attributes"]


def test_missing_environment_says_make_test_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(phoenix, "PHOENIX", tmp_path / ".venv-phoenix" / "bin" / "phoenix")
    with (
        pytest.raises(phoenix.PhoenixNotInstalled, match="`make test` builds it"),
        running_phoenix(tmp_path),
    ):
        pass
