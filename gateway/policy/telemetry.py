"""The policy's `telemetry` section (traces, request log, usage ledger) and model prices."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.policy.base import Strict


class TracesSpec(Strict):
    endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces); unset: "
        "no spans are made. OTEL_EXPORTER_OTLP_TRACES_ENDPOINT overrides it.",
    )
    sample_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Share of traces recorded when the client sent no sampled traceparent "
        "(a client's sampling decision is followed). OTEL_TRACES_SAMPLER_ARG overrides it.",
    )
    service_name: str = Field("agent-gateway", description="OTEL_SERVICE_NAME overrides it.")
    capture_content: bool = Field(
        False,
        description="Keep prompt and completion text: on sampled spans, and the text the "
        "tier router reads in the request log (`route_text`, what `gateway route-train "
        "--from-log` learns from). Off unless opted in (and per tenant); headers and API "
        "keys are never recorded.",
    )
    max_queue: int = Field(
        4096, ge=64, description="Spans held for export; past it new spans are dropped."
    )


class UsageSpec(Strict):
    enabled: bool = Field(True, description="Keep token and cost counters in the state store.")
    flush_interval_s: float = Field(
        1.0, gt=0, description="Counts are summed in memory and written this often."
    )
    retention_days: int = Field(400, ge=1, description="How long daily usage is kept.")


class TelemetrySpec(Strict):
    traces: TracesSpec = TracesSpec()
    request_log: str | None = Field(
        None,
        description="Append one JSON line per request here (relative to the policy file); "
        "`gateway replay` reads it back.",
    )
    usage: UsageSpec = UsageSpec()


class PriceSpec(Strict):
    """What a model's tokens cost, in US dollars per million tokens."""

    input: float = Field(ge=0, description="Per million prompt tokens not served from cache.")
    cached_input: float | None = Field(
        None,
        ge=0,
        description="Per million prompt tokens served from the prefix cache; "
        "unset: the input price.",
    )
    output: float = Field(ge=0, description="Per million completion tokens.")

    @model_validator(mode="after")
    def _cached_not_dearer(self) -> PriceSpec:
        if self.cached_input is not None and self.cached_input > self.input:
            raise ValueError("cached_input must not be above input")
        return self

    @property
    def cached(self) -> float:
        return self.input if self.cached_input is None else self.cached_input
