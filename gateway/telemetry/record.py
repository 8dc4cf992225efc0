"""What one request did, written down as it happens and read once when it ends.

The request path only stores facts and clock readings here (a few attribute writes per
stage): no span objects, no metric updates and no I/O happen while the client waits.
When the response has been sent, `Telemetry.finish` turns the record into metrics, a
log line, usage counts and, when the trace is sampled, spans.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.chat.conformance import check_shape
from gateway.chat.inbound import InboundRequest
from gateway.chat.stream import chunks_of
from gateway.tenants.identity import DEFAULT_TENANT

AttemptOutcome = Literal["ok", "failed", "released", "refused", "pending"]

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def _id(bits: int) -> int:
    """A non-zero random id (W3C forbids all-zero trace and span ids)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


def new_span_id() -> int:
    """A span id for a span the request path names before it is made."""
    return _id(64)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The request's place in a distributed trace: the client's (W3C `traceparent`) or a
    new one, and whether it is recorded."""

    trace_id: int
    parent_span_id: int | None  # the client's span, when it sent a traceparent
    sampled: bool
    flags: str = "00"

    @classmethod
    def start(cls, traceparent: str | None, sample_ratio: float) -> TraceContext:
        if traceparent:
            match = _TRACEPARENT.match(traceparent.strip().lower())
            if match and int(match[1], 16) and int(match[2], 16):
                flags = match[3]
                # Parent-based sampling: the client's decision stands.
                return cls(int(match[1], 16), int(match[2], 16), bool(int(flags, 16) & 1), flags)
        trace_id = _id(128)
        # As TraceIdRatioBased decides: on the trace id's low 64 bits, so every service
        # that samples the same trace by ratio agrees.
        sampled = (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < sample_ratio * 2**64
        return cls(trace_id, None, sampled, "01" if sampled else "00")

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{self.flags}"


@dataclass(slots=True)
class Stage:
    name: str
    start_ns: int
    end_ns: int = 0
    attributes: dict[str, Any] | None = None
    span_id: int = 0


@dataclass(slots=True)
class Attempt:
    """One try at an engine. Ends at its first byte when refused or failed; otherwise
    when its answer has been read or relayed whole."""

    replica: str
    pool: str
    span_id: int
    start_ns: int
    first_byte_ns: int = 0
    end_ns: int = 0
    status: int = 0
    outcome: AttemptOutcome = "pending"
    error: str | None = None

    def responded(self, status: int) -> None:
        self.first_byte_ns = time.perf_counter_ns()
        self.status = status

    def end(self, outcome: AttemptOutcome, error: str | None = None) -> None:
        if self.end_ns:
            return
        self.end_ns = time.perf_counter_ns()
        self.outcome = outcome
        self.error = error


_USAGE = re.compile(rb'"usage":\s*\{')
_FINISHED = re.compile(rb'"finish_reason":\s*"')


@dataclass(slots=True)
class ResultFacts:
    """What the engine said about its answer: model, usage, finish reasons."""

    response_model: str | None = None
    response_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    reply: Any = None  # the answer's message (on spans only when content is captured)
    # Chunks of a stream seen (the usage chunk aside): vLLM sends one per token of one
    # choice, so this is the completion's size when the usage chunk never came (a stream
    # cut short): what its rate limits are settled on (gateway/quota/service.py).
    chunks: int = 0

    def take(self, data: Any) -> None:
        """Take in a completion, or one chunk of a stream."""
        if not isinstance(data, dict):
            return
        if self.response_model is None and isinstance(data.get("model"), str):
            self.response_model = data["model"]
            self.response_id = data.get("id") if isinstance(data.get("id"), str) else None
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.take_usage(usage)
        for choice in data.get("choices") or ():
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if isinstance(reason, str):
                self.finish_reasons.append(reason)

    def take_usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
        self.completion_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = _int(details.get("cached_tokens"))

    def observe_event(self, event: bytes) -> bool:
        """Take in one SSE event of a chat or text completion stream, reading only the
        few that carry facts (the first, the usage chunk, finish reasons: a ChatEvent's
        parse is kept for whoever reads it next); True when the event was only the usage
        chunk that `stream_options.include_usage` adds. Raises NotAnAnswer when a chunk it
        reads has the wrong shape."""
        usage = _USAGE.search(event) is not None
        if not usage and event.startswith(b"data: {"):
            self.chunks += 1
        if not (usage or self.response_model is None or _FINISHED.search(event)):
            return False
        usage_only = False
        for chunk in chunks_of(event):
            if isinstance(chunk, dict):
                check_shape(chunk, "delta")  # NotAnAnswer: the engine's failure, a 502
                self.take(chunk)
                usage_only = usage and not chunk.get("choices")
        return usage_only


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Deferred(Protocol):
    """Work a request leaves for after its answer is sent (a shadow router's decision)."""

    def run(self) -> dict[str, Any]: ...


class RequestRecord:
    """Facts about one request, filled in by the stages that know them."""

    def __init__(
        self,
        request_id: str,
        operation: str,
        trace: TraceContext,
        *,
        tenant: str,
        method: str = "POST",
        route: str = "",
    ) -> None:
        self.start_ns = time.perf_counter_ns()
        self.wall_start_ns = time.time_ns()  # spans carry wall-clock times
        self.request_id = request_id
        self.operation = operation
        self.trace = trace
        self.span_id = _id(64)  # the gateway's root span, known before it is made
        self.tenant = tenant
        self.method = method
        self.route = route
        self.model: str | None = None
        self.stream = False
        self.session: str | None = None
        self.session_turn: int | None = None
        self.max_tokens: int | None = None
        self.temperature: float | None = None
        self.tier: str | None = None
        self.tier_by: str | None = None
        self.tier_reason: str | None = None
        # What the cascade's checks made of the first tier's answer: passed, escalated or
        # failed (None: no checks ran). With `route_text`, the label `gateway route-train
        # --from-log` learns from (gateway/offline/route_train/outcomes.py).
        self.cascade: str | None = None
        self.cascade_tier: str | None = None  # the tier whose answer was checked first
        # Whether the first answer's tool calls were valid (gateway/toolcalls/), and whose
        # answer that was: the same kind of label, for answers that call tools.
        self.tool_check: str | None = None
        self.tool_check_tier: str | None = None
        self.route_text: str | None = None  # what the tier router reads, when kept
        # A candidate router's decision on this request, made after the answer is sent
        # (gateway/tiering/shadow.py), and what it decided.
        self.shadow: Deferred | None = None
        self.shadow_result: dict[str, Any] | None = None
        self.pool: str | None = None
        self.replica: str | None = None
        self.route_reason: str | None = None
        self.blocks: tuple[int, ...] = ()
        self.route_session: str | None = None  # what routing keyed on (maybe derived)
        self.cached_blocks = 0
        # Prompt tokens the engine's KV events said it still held of this conversation's
        # previous turn at the chosen replica (routing), and whether it had evicted the rest.
        self.engine_held_tokens: int | None = None
        self.engine_evicted = False
        # The prompt tokens routing expected the chosen replica to have cached (set when
        # the request is finished: gateway/telemetry/cache_expectation.py).
        self.expected_cached_tokens: int | None = None
        self.fallback: str | None = None
        self.degraded: str | None = None
        # What became of invalid tool calls, in order: "reask: <why>", "repair: closed_json"
        # (gateway/toolcalls/checker.py).
        self.tool_calls: list[str] = []
        self.trimmed_tokens = 0
        self.trim_fell_back = False
        self.result = ResultFacts()
        # Answers read before this one that failed their checks: (pool, facts).
        self.earlier: list[tuple[str | None, ResultFacts]] = []
        self.status = 0
        self.error_type: str | None = None
        self.first_byte_ns = 0
        self.end_ns = 0
        self.stages: list[Stage] = []
        self.attempts: list[Attempt] = []
        # The prompt (and, in result.reply, the answer) only when the policy opts in to
        # capturing content and the trace is sampled.
        self.capture = False
        # Whether this request's content may be kept at all (the policy and the tenant
        # opted in), sampled or not: the request log's `route_text` needs only this.
        self.content_allowed = False
        self.input_messages: Any = None

    @classmethod
    def detached(cls) -> RequestRecord:
        """A record nobody reads: for requests made without the HTTP layer (tests)."""
        return cls("", "chat", TraceContext(1, None, False), tenant=DEFAULT_TENANT)

    # -- the request path ---------------------------------------------------------------

    def note_request(self, request: InboundRequest) -> None:
        """What the parsed request says (the model, once the policy knows it)."""
        self.model = request.model
        self.stream = request.stream
        body = request.body
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        self.max_tokens = max_tokens if isinstance(max_tokens, int) else None
        temperature = body.get("temperature")
        self.temperature = temperature if isinstance(temperature, int | float) else None
        if self.capture:
            self.input_messages = body.get("messages", body.get("prompt", body.get("input")))

    def stage(self, name: str) -> _StageTimer:
        """`with record.stage("hydrate"):` times a pipeline stage."""
        return _StageTimer(self, name)

    def attempt(self, replica: str, pool: str) -> Attempt:
        attempt = Attempt(replica, pool, _id(64), time.perf_counter_ns())
        self.attempts.append(attempt)
        return attempt

    def upstream_headers(self, attempt: Attempt) -> dict[str, str]:
        """Trace context for the engine: vLLM (with --otlp-traces-endpoint) makes its
        spans children of this attempt's, so one trace spans agent, gateway and engine."""
        trace = self.trace
        if trace.sampled:
            return {"traceparent": trace.traceparent(attempt.span_id)}
        if trace.parent_span_id is not None:  # not recorded here: pass the client's on
            return {"traceparent": trace.traceparent(trace.parent_span_id)}
        return {}

    def tool_call_outcome(self, step: str, detail: str) -> None:
        self.tool_calls.append(f"{step}: {detail[:200]}")

    def escalating(self) -> None:
        """The answer just read failed its checks; the next one is read afresh (the
        failed one is still paid for)."""
        self.earlier.append((self.pool, self.result))
        self.result = ResultFacts()

    def routed(
        self,
        replica: str,
        pool: str,
        reason: str,
        cached: int,
        engine_held: int | None = None,
        engine_evicted: bool = False,
    ) -> None:
        self.replica, self.pool, self.route_reason, self.cached_blocks = (
            replica,
            pool,
            reason,
            cached,
        )
        self.engine_held_tokens, self.engine_evicted = engine_held, engine_evicted

    # -- read at the end ----------------------------------------------------------------

    @property
    def duration_ns(self) -> int:
        return (self.end_ns or time.perf_counter_ns()) - self.start_ns

    @property
    def upstream_ns(self) -> int:
        """Time spent waiting on engines (every attempt, answers streamed included)."""
        end = self.end_ns or time.perf_counter_ns()
        return sum((a.end_ns or end) - a.start_ns for a in self.attempts)

    @property
    def overhead_ns(self) -> int:
        """Time spent in the gateway itself: the whole request less the engines' part."""
        return max(0, self.duration_ns - self.upstream_ns)

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def wall_ns(self, perf_ns: int) -> int:
        return self.wall_start_ns + (perf_ns - self.start_ns)


class _StageTimer:
    __slots__ = ("_record", "_stage")

    def __init__(self, record: RequestRecord, name: str) -> None:
        self._record = record
        self._stage = Stage(name, 0, span_id=_id(64))

    def __enter__(self) -> Stage:
        self._stage.start_ns = time.perf_counter_ns()
        return self._stage

    def __exit__(self, *exc: object) -> None:
        self._stage.end_ns = time.perf_counter_ns()
        self._record.stages.append(self._stage)
