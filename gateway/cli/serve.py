"""`gateway serve`: one serving process, or a supervisor of `--workers N` of them
(gateway/edge/workers.py), each stopping as a person or an orchestrator stops it."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from types import FrameType

from gateway.cli.common import DEFAULT_POLICY, Subcommands, policy_path
from gateway.policy import PolicyError
from gateway.policy.reloadable import load_policy_file

# Allocations between two collections of the youngest generation (gc.set_threshold)
# in a serving process; measured in make bench (docs/benchmarks/overhead.md).
GC_YOUNG_THRESHOLD = 20_000


def register(sub: Subcommands) -> None:
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
    path = policy_path(args.policy)
    try:
        policy, _ = load_policy_file(path)  # an invalid policy stops here, not in N workers
    except PolicyError as exc:
        print(f"gateway: invalid policy\n{exc}", file=sys.stderr)
        return 2
    if not policy.state.redis_url:
        # Each worker would start an embedded Redis of its own on one directory, and each
        # would keep its own sessions: the workers meet through a Redis they share.
        print(
            f"gateway: --workers {args.workers} needs `state.redis_url` (a Redis the "
            "workers share); the embedded Redis belongs to one process",
            file=sys.stderr,
        )
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
    from gateway.edge.server import ServerSayingItServes
    from gateway.edge.workers import (
        die_with_supervisor,
        shared_port_socket,
        tagged_log_config,
        worker_identity,
    )
    from gateway.lifetime.startup import StartupRefused
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
    path = policy_path(args.policy)
    try:
        policy, source = load_policy_file(path)
    except PolicyError as exc:
        print(f"gateway: invalid policy\n{exc}", file=sys.stderr)
        return 2
    host = args.host or policy.server.host
    port = args.port or policy.server.port
    # The file is watched while serving: a changed policy is validated, then applied
    # or rejected with the running one kept (gateway/reload.py); SIGHUP checks at once.
    try:
        app = create_app(policy, policy_file=source, reload_on_sighup=True)
    except StartupRefused as exc:  # a file the policy names (API keys): said in one line
        print(f"{tag}gateway: {exc}", file=sys.stderr)
        return 2
    interval = policy.server.reload_interval_s
    watching = f"re-read every {interval:g} s and on SIGHUP" if interval else "re-read on SIGHUP"
    serving = (
        f"{tag}gateway: serving {len(policy.models)} model(s) from {path} ({watching}) "
        f"on http://{host}:{port}/v1"
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
    server = ServerSayingItServes(config, serving)
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
