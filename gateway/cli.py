"""`gateway` command line: serve, and check or export the policy schema.

gateway serve [--policy FILE] [--host H] [--port P] [--workers N]
gateway policy check FILE [FILE ...] [--against RUNNING]
gateway policy schema [--out FILE]
gateway policy reference [--out FILE]
gateway replay --trace FILE [--replicas N] [--cache-blocks M] [--policy FILE] [--json]
    [--gateways K[,K...] [--balancer random|round_robin] [--sharing none|placements[,...]]
     [--batch-ms B] [--lag-ms L] [--seed S]]
gateway trim-eval --trajectories FILE [--policy FILE] [--tokenizer FILE] [--part P] [--json]
gateway route-train --labels FILE --out FILE [--words] [--seed N]
gateway route-train --from-log FILE [--tier T] [--feedback-pass X] --out FILE
gateway route-eval --labels FILE [--policy FILE] [--artifact FILE] [--folds K] [--part P] [--json]
gateway route-eval --shadow LOG [--tier T] [--last N] [--json]
gateway tools-eval [--data DIR] [--out FILE] [--seed N] [--limit N]
gateway dataset export --log FILE --out FILE [--tenant T] [--no-feedback] [--policy FILE]
gateway keys create --tenant T [--name N] [--role approver] [--policy FILE]
gateway keys list --tenant T [--policy FILE]
gateway keys revoke KEY_ID [--policy FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.policy import Policy, PolicyError, load_policy
from gateway.policy.reloadable import load_policy_file, needs_restart
from gateway.policy.schema import RoutingSpec
from gateway.tenants.cli import add_keys_parser

DEFAULT_POLICY = "policies/default.yaml"
# Allocations between two collections of the youngest generation (gc.set_threshold)
# in a serving process; measured in make bench (docs/benchmarks/overhead.md).
GC_YOUNG_THRESHOLD = 20_000


def _policy_path(explicit: str | None) -> str:
    return explicit or os.environ.get("GATEWAY_POLICY") or DEFAULT_POLICY


def _serve(args: argparse.Namespace) -> int:
    from gateway.edge.workers import worker_identity

    if args.workers < 1:
        print("gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers > 1 and worker_identity() is None:
        return _supervise(args)
    return _serve_process(args)


def _supervise(args: argparse.Namespace) -> int:
    """`--workers N`: start N `gateway serve` workers on one port (gateway/edge/workers.py)."""
    from gateway.edge.workers import Supervisor, check_port_free

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    path = _policy_path(args.policy)
    try:
        policy, _ = load_policy_file(path)  # an invalid policy stops here, not in N workers
    except PolicyError as exc:
        print(f"gateway: invalid policy\n{exc}", file=sys.stderr)
        return 2
    host = args.host or policy.server.host
    port = args.port or policy.server.port
    try:
        check_port_free(host, port)
    except OSError as exc:
        print(f"gateway: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"gateway: {args.workers} workers on http://{host}:{port}/v1", flush=True)
    worker_argv = ["serve", "--policy", path, "--host", host, "--port", str(port),
                   "--log-level", args.log_level, "--drain-s", str(args.drain_s)]  # fmt: skip
    if args.access_log:
        worker_argv.append("--access-log")
    # The workers drain for --drain-s; past that and a margin they are killed.
    status = Supervisor(worker_argv, args.workers, stop_timeout_s=args.drain_s + 10).run()
    _say_stopped()
    return status


def _serve_process(args: argparse.Namespace) -> int:
    """One serving process: the whole gateway, or one worker of `--workers N`."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from gateway.app import create_app
    from gateway.edge.connections import protocol_for, raise_descriptor_limit
    from gateway.edge.workers import (
        die_with_supervisor,
        shared_port_socket,
        tagged_log_config,
        worker_identity,
    )
    from gateway.telemetry.redaction import install_log_redaction, redacting_log_config

    worker = worker_identity()
    if worker is not None:
        die_with_supervisor()
    tag = f"[{worker.name}] " if worker else ""
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"{tag}%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()  # no credential in a log line (gateway/telemetry/redaction.py)
    path = _policy_path(args.policy)
    try:
        policy, source = load_policy_file(path)
    except PolicyError as exc:
        print(f"gateway: invalid policy\n{exc}", file=sys.stderr)
        return 2
    host = args.host or policy.server.host
    port = args.port or policy.server.port
    # The file is watched while serving: a changed policy is validated, then applied
    # or rejected with the running one kept (gateway/reload.py); SIGHUP checks at once.
    app = create_app(policy, policy_file=source, reload_on_sighup=True)
    interval = policy.server.reload_interval_s
    watching = f"re-read every {interval:g} s and on SIGHUP" if interval else "re-read on SIGHUP"
    print(
        f"{tag}gateway: serving {len(policy.models)} model(s) from {path} ({watching}) "
        f"on http://{host}:{port}/v1",
        flush=True,
    )
    raise_descriptor_limit(policy.server)
    # The collector's youngest generation is examined every 700 allocations by default:
    # several times per request here (a 25 KB chat body alone parses into ~250
    # containers), each time walking what the requests in flight still hold and
    # promoting it towards the full collections. Reference counting frees nearly all of
    # a request's objects; the collector only finds cycles, so it can wait longer.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    log_config = redacting_log_config(LOGGING_CONFIG)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # Header deadline, keep-alive idle limit, connection cap: gateway/edge/connections.py.
        http=protocol_for(policy.server),
        log_level=args.log_level,
        log_config=tagged_log_config(log_config, worker) if worker else log_config,
        access_log=args.access_log,
        timeout_graceful_shutdown=args.drain_s,
        # Nothing in the gateway reads the client's address, so uvicorn's X-Forwarded-For
        # rewriting (a header walk per request, on by default) would be work for nothing;
        # the access log, when on, names the peer that connected.
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    # A worker binds the shared port itself (SO_REUSEPORT); one process lets uvicorn bind.
    sockets = [shared_port_socket(host, port)] if worker else None
    try:
        # uvicorn stops gracefully on SIGINT or SIGTERM, then raises the signal again; both
        # end here, after the drain and the lifespan shutdown, as one line, not a traceback.
        signal.signal(signal.SIGTERM, _interrupt)
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets or ():
            sock.close()
    if not server.started:
        return 3  # as uvicorn.run: the app or the socket did not start
    _say_stopped()
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _say_stopped() -> None:
    try:
        print("gateway: stopped", flush=True)
    except BrokenPipeError:
        # Whoever read stdout is gone (`make run | tee`): the flush at exit must not raise too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _check(args: argparse.Namespace) -> int:
    running: Policy | None = None
    if args.against:
        try:
            running = load_policy_file(args.against)[0]
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            return 2
    failed = 0
    for path in args.files:
        try:
            policy = load_policy_file(path)[0]  # the loader a running gateway reloads with
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        summary = f"{len(policy.models)} models, {len(policy.pools)} pools"
        restart = needs_restart(running, policy) if running is not None else []
        if restart:
            print(f"{path}: valid ({summary}), but needs a restart: {', '.join(restart)}")
            failed += 1
        else:
            print(f"{path}: ok ({summary})")
    return 1 if failed else 0


def _schema(args: argparse.Namespace) -> int:
    from gateway.policy.json_schema import policy_json_schema

    return _write(policy_json_schema(), args.out)


def _reference(args: argparse.Namespace) -> int:
    from gateway.policy.reference import render

    return _write(render(), args.out)


def _write(text: str, out: str | None) -> int:
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gateway.offline.replay.fleet import FleetConfig, parse_counts, parse_sharings
    from gateway.offline.replay.report import scale_out_table
    from gateway.offline.replay.run import ReplayConfig, evaluate, evaluate_scale_out
    from gateway.offline.replay.traces import TraceError, read_trace

    try:
        routing = load_policy(args.policy).routing if args.policy else RoutingSpec()
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    config = ReplayConfig(
        replicas=args.replicas,
        cache_blocks=args.cache_blocks,
        block_tokens=args.block_tokens,
        prefill_tps=args.prefill_tps,
        decode_tps=args.decode_tps,
        window_s=args.window_s,
    )
    try:
        trace = list(read_trace(Path(args.trace), block_tokens=args.block_tokens))
    except (OSError, TraceError) as exc:
        print(f"gateway replay: {exc}", file=sys.stderr)
        return 2
    if args.gateways is None:
        result = {"trace": args.trace, "policy": args.policy, **evaluate(trace, routing, config)}
        return _print_report(result, args.json, _replay_table)
    try:
        counts, sharings = parse_counts(args.gateways), parse_sharings(args.sharing)
        fleet = FleetConfig(
            balancer=args.balancer,
            batch_s=args.batch_ms / 1000,
            lag_s=args.lag_ms / 1000,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"gateway replay: {exc}", file=sys.stderr)
        return 2
    scale_out = evaluate_scale_out(trace, routing, config, counts, sharings, fleet)
    result = {"trace": args.trace, "policy": args.policy, **scale_out}
    return _print_report(result, args.json, scale_out_table)


def _print_report(
    result: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], str]
) -> int:
    print(json.dumps(result, indent=2) if as_json else table(result))
    return 0


def _replay_table(r: dict[str, Any]) -> str:
    rows = [
        ("gateway", r),
        ("round-robin", r["round_robin"]),
        ("sglang-style", r["sglang_cache_aware"]),
    ]
    lines = [
        f"{r['requests']} requests, {r['replicas']} replicas x {r['cache_blocks']} blocks; "
        f"oracle hit rate {r['oracle_hit_rate']:.3f}",
        f"{'router':<14} {'hit_rate':>9} {'imbalance_p95':>14} "
        f"{'ttft_p50_s':>11} {'ttft_p95_s':>11}",
    ]
    for name, row in rows:
        lines.append(
            f"{name:<14} {row['hit_rate']:>9.3f} {row['imbalance_p95']:>14.3f} "
            f"{row['ttft_p50_s']:>11.3f} {row['ttft_p95_s']:>11.3f}"
        )
    return "\n".join(lines)


def _add_part(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--part",
        choices=("both", "design", "report", "all"),
        default="both",
        help="the evaluation protocol's parts (docs/development/evaluation.md): each apart "
        "(default), one of them, or all the data pooled",
    )


def _trim_eval(args: argparse.Namespace) -> int:
    from gateway.offline.trim_eval import evaluate, table
    from gateway.trimming.tokens import token_counter

    try:
        spec = load_policy(args.policy).trimming
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    tokenizer = args.tokenizer or spec.tokenizer
    try:
        with open(args.trajectories, encoding="utf-8") as lines:
            records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gateway trim-eval: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        records = records[: args.limit]
    result = evaluate(spec, token_counter(tokenizer), records, window=args.window, part=args.part)
    result = {"trajectories": args.trajectories, "policy": args.policy, **result}
    return _print_report(result, args.json, table)


def _route_train(args: argparse.Namespace) -> int:
    from gateway.offline.route_train.labels import LabelError, read_labels
    from gateway.offline.route_train.outcomes import read_log, train_from_outcomes
    from gateway.offline.route_train.train import TrainConfig, train_router
    from gateway.tiering.learned import LearnedRouter

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        router: LearnedRouter
        if args.from_log:
            outcomes = read_log(args.from_log, args.tier, feedback_pass=args.feedback_pass)
            say(f"{len(outcomes.prompts)} labelled answers; {outcomes.skipped} other lines")
            router = train_from_outcomes(
                outcomes.prompts, trained_on=Path(args.from_log).name, progress=say
            )
        else:
            prompts = read_labels(args.labels)
            router = train_router(
                prompts,
                TrainConfig(seed=args.seed, words=args.words),
                labels_name=Path(args.labels).name,
                progress=say,
            )
        router.save(args.out)
    except (OSError, LabelError) as exc:
        print(f"gateway route-train: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {router.version}, trained on {router.trained_on}")
    return 0


def _route_eval(args: argparse.Namespace) -> int:
    from gateway.offline.route_eval import parts_table, route_eval_parts
    from gateway.offline.route_train.labels import LabelError, read_labels
    from gateway.tiering.learned import ArtifactError, LearnedRouter
    from gateway.tiering.rules import policy_fixed_tier

    if args.shadow:
        return _shadow_eval(args)
    try:
        prompts = read_labels(args.labels)
        router = LearnedRouter.load(args.artifact) if args.artifact else None
        fixed_tier = policy_fixed_tier(load_policy(args.policy)) if args.policy else None
    except (OSError, LabelError, ArtifactError, PolicyError) as exc:
        print(f"gateway route-eval: {exc}", file=sys.stderr)
        return 2
    result = route_eval_parts(
        prompts,
        part=args.part,
        router=router,
        folds=args.folds,
        fixed_tier=fixed_tier,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    result = {"labels": args.labels, "policy": args.policy, "artifact": args.artifact, **result}
    return _print_report(result, args.json, parts_table)


def _shadow_eval(args: argparse.Namespace) -> int:
    from gateway.offline.log_lines import LogLineError, read_entries
    from gateway.offline.shadow_eval import shadow_eval, table

    try:
        entries = list(read_entries(args.shadow))
    except (OSError, LogLineError) as exc:
        print(f"gateway route-eval: {exc}", file=sys.stderr)
        return 2
    result = shadow_eval(entries, tier=args.tier, last=args.last)
    return _print_report({"log": args.shadow, **result}, args.json, table)


def _tools_eval(args: argparse.Namespace) -> int:
    from gateway.offline.tools_eval import (
        DEFAULT_DATA,
        DEFAULT_OUT,
        DataError,
        table,
        tools_eval,
        write_report,
    )

    out = Path(args.out) if args.out else DEFAULT_OUT
    try:
        result = tools_eval(
            Path(args.data) if args.data else DEFAULT_DATA,
            seed=args.seed,
            limit=args.limit,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        write_report(result, out)
    except (OSError, DataError) as exc:
        print(f"gateway tools-eval: {exc}", file=sys.stderr)
        return 2
    print(table(result))
    print(f"wrote {out}")
    return 1 if result["missed"] else 0


def _dataset_export(args: argparse.Namespace) -> int:
    from gateway.offline.dataset import export_command

    return export_command(
        args.log,
        args.out,
        policy=_policy_path(args.policy),
        tenant=args.tenant,
        feedback=not args.no_feedback,
    )


def _keys(args: argparse.Namespace) -> int:
    from gateway.tenants.cli import run_keys_command

    try:
        policy = load_policy(_policy_path(args.policy))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    return run_keys_command(policy, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="OpenAI-compatible agent gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--policy", help=f"policy YAML (default: $GATEWAY_POLICY or {DEFAULT_POLICY})"
    )
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.add_argument("--drain-s", type=float, default=20.0, help="graceful shutdown budget")
    serve.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("GATEWAY_WORKERS", "1")),
        help="serving processes on the one port, about one core each "
        "(default: $GATEWAY_WORKERS or 1)",
    )
    serve.set_defaults(run=_serve)

    policy = sub.add_parser("policy", help="policy tools").add_subparsers(
        dest="action", required=True
    )
    check = policy.add_parser("check", help="validate policy files without serving")
    check.add_argument("files", nargs="+")
    check.add_argument(
        "--against",
        metavar="RUNNING",
        help="the policy a gateway serves: also fail when applying FILE to it would need "
        "a restart (a running gateway does not apply such a change)",
    )
    check.set_defaults(run=_check)
    schema = policy.add_parser("schema", help="print the policy's JSON Schema")
    schema.add_argument("--out")
    schema.set_defaults(run=_schema)
    reference = policy.add_parser(
        "reference", help="print the policy reference page (docs/reference/policy.md)"
    )
    reference.add_argument("--out")
    reference.set_defaults(run=_reference)

    replay = sub.add_parser("replay", help="replay a trace through the routing code")
    replay.add_argument(
        "--trace", required=True, help="Mooncake JSONL or the gateway's request log"
    )
    replay.add_argument("--replicas", type=int, default=8)
    replay.add_argument("--cache-blocks", type=int, default=10_000, help="blocks per replica")
    replay.add_argument("--policy", help="policy whose `routing` section to replay")
    replay.add_argument("--block-tokens", type=int, default=512)
    replay.add_argument(
        "--prefill-tps", type=float, default=10_000.0, help="simulated prefill tokens/s"
    )
    replay.add_argument(
        "--decode-tps", type=float, default=30.0, help="simulated decode tokens/s per request"
    )
    replay.add_argument(
        "--gateways",
        metavar="K[,K...]",
        help="K gateway routers behind a balancer (e.g. 1,2,4,8): the scale-out report",
    )
    replay.add_argument("--balancer", choices=("random", "round_robin"), default="random")
    replay.add_argument(
        "--sharing",
        default="none",
        metavar="none|placements[,...]",
        help="what the gateways share (with --gateways); a list runs each side by side",
    )
    replay.add_argument(
        "--batch-ms",
        type=float,
        default=10.0,
        help="placement publisher's flush interval (routing.sharing.flush_ms)",
    )
    replay.add_argument(
        "--lag-ms",
        type=float,
        default=0.0,
        help="from a flush until the other gateways applied it (Redis round trip)",
    )
    replay.add_argument("--seed", type=int, default=0, help="the random balancer's seed")
    replay.add_argument(
        "--window-s", type=float, default=60.0, help="window of the imbalance figure"
    )
    replay.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    replay.set_defaults(run=_replay)

    trim = sub.add_parser("trim-eval", help="replay conversations through session trimming")
    trim.add_argument("--trajectories", required=True, help="JSONL, one {messages, tools} each")
    trim.add_argument("--policy", default="policies/agent-airline.yaml")
    trim.add_argument("--tokenizer", help="tokenizer.json for token counts (else the policy's)")
    trim.add_argument("--window", type=int, default=12, help="baseline: last N messages")
    trim.add_argument("--limit", type=int, default=0, help="only the first N conversations")
    _add_part(trim)
    trim.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    trim.set_defaults(run=_trim_eval)

    train = sub.add_parser("route-train", help="train the learned tier router from labels")
    given = train.add_mutually_exclusive_group(required=True)
    given.add_argument("--labels", help="RouteLLM-style JSONL of labelled prompts")
    given.add_argument(
        "--from-log",
        help="a request log or dataset export: learn from checked answers (cascade, tool "
        "calls, feedback; needs `route_text`, kept where content capture is on)",
    )
    train.add_argument("--tier", help="with --from-log: only answers of this tier (the small one)")
    train.add_argument(
        "--feedback-pass",
        type=float,
        help="with --from-log on a dataset export: an answer whose mean feedback score "
        "reaches this passed (unset: feedback is not a label)",
    )
    train.add_argument("--out", required=True, help="artifact to write (.npz)")
    train.add_argument("--seed", type=int, default=0, help="how groups are dealt to folds")
    train.add_argument(
        "--words",
        action="store_true",
        help="weigh hashed words too: for labels from the traffic the router will route "
        "(words did not carry across MMLU subjects; docs/concepts/tiers.md)",
    )
    train.set_defaults(run=_route_train)

    route = sub.add_parser("route-eval", help="small-tier share and quality of the router")
    judged = route.add_mutually_exclusive_group(required=True)
    judged.add_argument("--labels", help="RouteLLM-style JSONL of labelled prompts")
    judged.add_argument(
        "--shadow",
        metavar="LOG",
        help="a request log: the shadow router against the live one on checked answers",
    )
    route.add_argument("--tier", default="small", help="with --shadow: the checked (small) tier")
    route.add_argument(
        "--last", type=int, default=0, help="with --shadow: only the most recent N requests"
    )
    route.add_argument("--policy", help="apply this policy's tier rules before the router")
    route.add_argument("--artifact", help="score this artifact as it is (labels it never saw)")
    route.add_argument(
        "--folds", type=int, default=0, help="held-out folds over groups (0: one per group)"
    )
    _add_part(route)
    route.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    route.set_defaults(run=_route_eval)

    tools = sub.add_parser("tools-eval", help="tool-call checker on real and seeded calls")
    tools.add_argument(
        "--data", help="the shared data folder (default: ../shared/data from the repository)"
    )
    tools.add_argument(
        "--out", help="the JSON report (default: .run/bench/tools-eval.json in the repository)"
    )
    tools.add_argument("--seed", type=int, default=0, help="which faults are seeded")
    tools.add_argument("--limit", type=int, default=0, help="only the first N calls per dataset")
    tools.set_defaults(run=_tools_eval)

    add_keys_parser(sub, DEFAULT_POLICY).set_defaults(run=_keys)

    dataset = sub.add_parser("dataset", help="the gateway's traffic as labelled data")
    actions = dataset.add_subparsers(dest="dataset_command", required=True)
    exported = actions.add_parser(
        "export", help="request-log lines with a check's outcome or feedback, as JSONL"
    )
    exported.add_argument("--log", required=True, help="the request log (telemetry.request_log)")
    exported.add_argument("--out", required=True, help="JSONL to write")
    exported.add_argument(
        "--policy", help=f"for the feedback's Redis (default: $GATEWAY_POLICY or {DEFAULT_POLICY})"
    )
    exported.add_argument("--tenant", help="only this tenant's requests")
    exported.add_argument(
        "--no-feedback", action="store_true", help="checks' outcomes only: no Redis needed"
    )
    exported.set_defaults(run=_dataset_export)

    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
