"""Benchmark: where the gateway's own time goes on one request, step by step.

    .venv/bin/python -m tests.bench.hot_path [--requests N] [--body tau|long50k] [--stream]
        [--out F]
    (make bench-hot-path: the tau-bench body whole, then streamed; about 2 minutes)

`make bench` measures the gateway from outside, beside a bare proxy; a sampling profiler
(py-spy) says which lines are busy but not what a step costs, and cProfile charges every
Python call so much that it misranks them (a call-heavy step looked 1.8x its real cost).
This benchmark times the steps themselves, inside one process:

- the gateway's ASGI app, built by `create_app` from the `make bench` policy
  (tests/bench/overhead/targets.py: defaults on, traces sampled at 0.1 to a local sink,
  sharing through the local Redis), with the collector tuned as `gateway serve` tunes it;
- the same mock engine in its own process (tests/bench/overhead/mock_upstream.py, 0 ms);
- requests handed to the app directly, as an ASGI server would (no HTTP server, no load
  generator), one at a time: the step timings of concurrent requests would include each
  other's turns on the event loop.

Two passes over the same body: a plain one (wall and CPU time per request, nothing
patched) and a probed one, in which each step in `PROBES` is wrapped by a timer
(perf_counter_ns, about 1 us per probe). The steps at level 0 are disjoint and together
with "other" make up the whole request; the indented ones are parts of the step above
them. "the engine" is the upstream exchange (sending the body, the mock's turn, reading
the answer's head) and, streamed, the wait for each next chunk: what the gateway waits
for, not what it does. Steps a request did not take (a whole answer has no stream relay)
are left out of the table.

Prints a table of microseconds per request and writes JSON (.run/bench/hot-path.json);
`--plain-only` runs the plain pass alone, for a build whose classes cannot take probes (a
mypyc-compiled request path: docs/benchmarks/overhead.md).
A benchmark, not a test. Figures move with the machine (1.5x day to day): compare runs
made in one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from gateway.app import create_app
from gateway.cli.serve import GC_YOUNG_THRESHOLD
from gateway.policy.loader import parse_policy
from tests.bench.overhead.bodies import long_body, tau_body
from tests.bench.overhead.targets import ALIAS, gateway_policy, start_mock
from tests.bench.report import write_report
from tests.bench.telemetry_overhead import otlp_sink

ROOT = Path(__file__).resolve().parents[2]
PATH = "/v1/chat/completions"
WARM_UP = 200
SPEC = "2.3"  # what uvicorn says it speaks: Starlette then streams with a disconnect watcher


@dataclass(frozen=True)
class Probe:
    label: str
    module: str
    attribute: str  # "function" or "Class.method", looked up where the caller finds it
    parent: str  # the label of the probe whose time includes this one's


WHOLE = "whole request (ASGI app)"
ENGINE = "the engine (upstream exchange)"
ENGINE_CHUNKS = "the engine (next stream chunk)"
STREAM = "stream the response"
EDGE = "edge (request id, record)"
API = "API call (body read, context)"
PIPELINE = "pipeline (its glue)"
PARSE = "parse: validate, limits"
CANONICALIZE = "canonicalize"
ROUTE_REQUEST = "route request (blocks, conversation)"
DISPATCH = "dispatch"
READ = "read the answer"
FINISH = "telemetry finish (after the last byte)"
# In request order, each under the step that calls it. A function imported by name into
# another module is patched in that module, where its caller looks it up. What a step
# spends outside its children is its own time ("own"); the own times add up to the whole.
# fmt: off
PROBES = (
    Probe(EDGE, "gateway.edge.middleware", "EdgeMiddleware.__call__", WHOLE),
    Probe("telemetry record started", "gateway.telemetry.service", "Telemetry.start", EDGE),
    Probe(API, "gateway.api.inference", "ApiCalls.__call__", EDGE),
    Probe("read the body", "gateway.api.inference", "read_body", API),
    Probe("parse the body (orjson)", "gateway.api.inference", "json_object", API),
    Probe("legacy `functions` check", "gateway.api.inference", "to_tools", API),
    Probe(PIPELINE, "gateway.pipeline", "Pipeline.handle", API),
    Probe(PARSE, "gateway.pipeline", "Pipeline._parse", PIPELINE),
    Probe("depth check", "gateway.chat.inbound", "check_depth", PARSE),
    Probe("admit (quota)", "gateway.pipeline", "Pipeline._admit", PIPELINE),
    Probe("continue session", "gateway.pipeline", "Pipeline._continue_session", PIPELINE),
    Probe(CANONICALIZE, "gateway.pipeline", "Pipeline._canonicalize", PIPELINE),
    Probe("canonical tools", "gateway.prompt.steps", "PrefixSteps.canonicalize", CANONICALIZE),
    Probe(ROUTE_REQUEST, "gateway.prompt.steps", "PrefixSteps.route_request", CANONICALIZE),
    Probe("block hashing", "gateway.prompt.blocks", "chain_hashes", ROUTE_REQUEST),
    Probe("choose tier", "gateway.pipeline", "Pipeline._choose_tier", PIPELINE),
    Probe(DISPATCH, "gateway.resilience.dispatcher", "Dispatcher.send", PIPELINE),
    Probe("admission", "gateway.resilience.admission", "Admission.admitted", DISPATCH),
    Probe("replica choice", "gateway.routing.router", "CacheAwareRouter.choose", DISPATCH),
    Probe("placement recorded", "gateway.routing.router", "CacheAwareRouter.dispatched",
          DISPATCH),
    Probe(ENGINE, "gateway.upstream.http1", "Http1Upstream.post", DISPATCH),
    Probe("route recorded", "gateway.pipeline", "Pipeline._note_routing", PIPELINE),
    Probe(READ, "gateway.pipeline", "Pipeline._read_answer", PIPELINE),
    Probe("conform the completion", "gateway.delivery.whole", "conform_completion", READ),
    Probe("tool calls judged", "gateway.tool_call_steps", "ToolCallSteps.settle", PIPELINE),
    Probe("deliver", "gateway.pipeline", "Pipeline._deliver", PIPELINE),
    Probe("render the response", "gateway.api.inference", "render", API),
    Probe("send the response", "starlette.responses", "Response.__call__", API),
    Probe(STREAM, "gateway.api.inference", "EventStreamResponse.__call__", API),
    Probe(ENGINE_CHUNKS, "gateway.upstream.http1", "_Response.next_chunk", STREAM),
    Probe("tool-call deltas looked for", "gateway.toolcalls.stream_hold",
          "ToolCallHold.untouched", STREAM),
    Probe("events observed", "gateway.delivery.events", "EventSteps.observe", STREAM),
    Probe(FINISH, "gateway.telemetry.service", "Telemetry.finish", EDGE),
    Probe("cached tokens expected", "gateway.telemetry.cache_expectation",
          "CacheExpectation.observe", FINISH),
    Probe("spend priced", "gateway.telemetry.prices", "Prices.spend", FINISH),
    Probe("metrics", "gateway.telemetry.service", "Telemetry._count", FINISH),
    Probe("live stats", "gateway.telemetry.live", "LiveStats.add", FINISH),
    Probe("usage ledger", "gateway.telemetry.usage", "UsageBook.add", FINISH),
    Probe("spans (sampled requests)", "gateway.telemetry.spans", "SpanWriter.write", FINISH),
)
# fmt: on


def resolve(probe: Probe) -> tuple[Any, str, Callable[..., Any]]:
    """The object holding the step, the attribute's name, and the step itself."""
    owner: Any = importlib.import_module(probe.module)
    *path, name = probe.attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    step = getattr(owner, name)
    if not callable(step):
        raise TypeError(f"{probe.module}:{probe.attribute} is not callable")
    return owner, name, step


class Timings:
    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def add(self, label: str, ns: int) -> None:
        self.ns[label] = self.ns.get(label, 0) + ns
        self.calls[label] = self.calls.get(label, 0) + 1

    def clear(self) -> None:
        self.ns.clear()
        self.calls.clear()


def _timed(step: Callable[..., Any], label: str, timings: Timings) -> Callable[..., Any]:
    clock = time.perf_counter_ns
    if inspect.iscoroutinefunction(step):

        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await step(*args, **kwargs)
            finally:
                timings.add(label, clock() - start)

        return timed_async

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return step(*args, **kwargs)
        finally:
            timings.add(label, clock() - start)

    return timed


@contextmanager
def probed(timings: Timings) -> Iterator[None]:
    """Every probe's step wrapped by a timer, and put back after."""
    patched = []
    try:
        for probe in PROBES:
            owner, name, step = resolve(probe)
            setattr(owner, name, _timed(step, probe.label, timings))
            patched.append((owner, name, step))
        yield
    finally:
        for owner, name, step in reversed(patched):
            setattr(owner, name, step)


Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def one_request(
    app: Asgi, body: bytes, state: dict[str, Any], timings: Timings | None = None
) -> None:
    """A POST as an ASGI server hands it to the app; the answer must be a 200."""
    headers = [(b"host", b"bench"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": SPEC}, "http_version": "1.1",
        "method": "POST",
        "scheme": "http", "path": PATH, "raw_path": PATH.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080), "state": dict(state),
    }  # fmt: skip
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError("unreachable")

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    start = time.perf_counter_ns()
    await app(scope, receive, send)
    if timings is not None:
        timings.add(WHOLE, time.perf_counter_ns() - start)
    if status != [200]:
        raise RuntimeError(f"the gateway answered {status}")


async def measure(
    engine_url: str, sink: str, body: bytes, requests: int, *, probes: bool = True
) -> dict[str, Any]:
    policy = parse_policy(gateway_policy(engine_url, sink, "redis://127.0.0.1:6379/0"))
    app = create_app(policy)
    async with app.router.lifespan_context(app) as state:
        lifespan_state = dict(state or {})
        for _ in range(WARM_UP):
            await one_request(app, body, lifespan_state)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(requests):
            await one_request(app, body, lifespan_state)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        plain = {
            "wall_us_per_request": round(wall / requests * 1e6, 1),
            "cpu_us_per_request": round(cpu / requests * 1e6, 1),
        }
        if not probes:
            return {**plain, "steps": [], "gateway_own_us": None}
        timings = Timings()
        with probed(timings):
            for _ in range(WARM_UP):
                await one_request(app, body, lifespan_state, timings)
            timings.clear()
            for _ in range(requests):
                await one_request(app, body, lifespan_state, timings)
    rows = steps(timings, requests)
    return {**plain, "steps": rows, "gateway_own_us": round(gateway_own_us(rows), 1)}


def steps(timings: Timings, requests: int) -> list[dict[str, Any]]:
    """Each step's inclusive and own microseconds per request, in request order."""
    inclusive = {label: ns / requests / 1000 for label, ns in timings.ns.items()}
    children: dict[str, float] = {}
    for probe in PROBES:
        children[probe.parent] = children.get(probe.parent, 0.0) + inclusive.get(probe.label, 0.0)
    depth = {WHOLE: 0}
    tree: list[tuple[str, str | None]] = [(WHOLE, None)]
    for probe in PROBES:
        depth[probe.label] = depth[probe.parent] + 1
        tree.append((probe.label, probe.parent))
    rows: list[dict[str, Any]] = []
    for label, parent in tree:
        total = inclusive.get(label, 0.0)
        rows.append({
            "step": label,
            "parent": parent,
            "depth": depth[label],
            "us": round(total, 1),
            "own_us": round(total - children.get(label, 0.0), 1),
            "calls": round(timings.calls.get(label, 0) / requests, 2),
        })  # fmt: skip
    return rows


def gateway_own_us(rows: list[dict[str, Any]]) -> float:
    """The whole request less the engine's exchange: what the gateway itself spends."""
    by_step = {row["step"]: row["us"] for row in rows}
    return float(by_step[WHOLE] - by_step[ENGINE] - by_step[ENGINE_CHUNKS])


def print_table(result: dict[str, Any]) -> None:
    rows = result["steps"]
    own_total = result["gateway_own_us"]
    print(f"{'step':<48} {'inclusive':>9} {'own':>7} {'of own':>7} {'calls':>6}")
    for row in rows:
        if not row["calls"]:
            continue  # a step this request did not take
        name = ("  " * row["depth"]) + row["step"]
        waits = row["step"] in (ENGINE, ENGINE_CHUNKS)
        share = "" if waits else f"{row['own_us'] / own_total:7.1%}"
        print(f"{name:<48} {row['us']:>9.1f} {row['own_us']:>7.1f} {share:>7} "
              f"{row['calls']:>6.2f}")  # fmt: skip
    print(f"the gateway's own time (whole less the engine): {own_total:.1f} us per request")
    print(f"plain pass: {result['wall_us_per_request']:.1f} us wall and "
          f"{result['cpu_us_per_request']:.1f} us CPU per request")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--body", choices=("tau", "long50k"), default="tau")
    parser.add_argument("--stream", action="store_true", help="ask for the answer streamed")
    parser.add_argument("--out", default=str(ROOT / ".run/bench/hot-path.json"))
    parser.add_argument(
        "--plain-only",
        action="store_true",
        help="the plain pass alone (no step table): for builds whose classes cannot be "
        "patched with probes, such as a mypyc-compiled request path",
    )
    args = parser.parse_args()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])  # as `gateway serve`
    request = tau_body() if args.body == "tau" else long_body()
    request["model"] = ALIAS
    if args.stream:
        request["stream"] = True
    body = orjson.dumps(request)
    answer = "streamed" if args.stream else "whole"
    print(f"hot path: {args.body} body ({len(body):,} bytes), answer {answer}, "
          f"{args.requests} requests a pass")  # fmt: skip
    with ExitStack() as stack:
        sink = stack.enter_context(otlp_sink())
        mock = start_mock(0.0, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        stack.callback(mock.process.stop)
        result = uvloop.run(
            measure(mock.url, sink, body, args.requests, probes=not args.plain_only)
        )
    if args.plain_only:
        print(f"plain pass: {result['wall_us_per_request']:.1f} us wall and "
              f"{result['cpu_us_per_request']:.1f} us CPU per request")  # fmt: skip
    else:
        print_table(result)
    write_report(
        {
            "benchmark": "hot_path",
            "date": time.strftime("%Y-%m-%d"),
            "body": args.body,
            "stream": args.stream,
            "body_bytes": len(body),
            "requests_per_pass": args.requests,
            "unit": "microseconds per request, one request at a time, in process",
            **result,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
