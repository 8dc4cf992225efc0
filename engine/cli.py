"""`engine` command line.

engine up [--profile cpu-tiny] [--replicas 2] [--model DIR] [--pool NAME]
engine status
engine down [--pool NAME]
engine build-tiny-model DIR [--seed N]
engine args --profile NAME [--json]        # the rendered `vllm serve` arguments
engine validate [--profile NAME ...]       # checked by vLLM's own parser
engine manifests [--profile NAME ...] [--out DIR] [--check]   # Kubernetes pools
engine stack                               # what `make run` runs
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from engine.profiles import Profile, ProfileError, available_profiles, load_profile
from engine.supervisor import ROOT, EngineError, Launch, Paths, build_tiny_model, down, status, up


def resolve_model(profile: Profile, override: str | None, paths: Paths) -> str:
    """A local model path, built first when the profile says it is the offline tiny model."""
    model = override or profile.model
    local = Path(model) if Path(model).is_absolute() else ROOT / model
    if profile.build_tiny_model and override is None and not (local / "config.json").exists():
        build_tiny_model(local, paths)
    if local.exists():
        return str(local)
    return model  # a model-hub id, for GPU machines that can fetch it


def _up(args: argparse.Namespace) -> int:
    paths = Paths.default()
    profile = load_profile(args.profile)
    model = resolve_model(profile, args.model, paths)
    records = up(
        [Launch(profile, args.replicas, model, args.pool)], paths=paths, timeout_s=args.timeout
    )
    print(f"engine: {len(records)} replica(s) of {profile.name} healthy; state in {paths.state}")
    return 0


def _status(args: argparse.Namespace) -> int:
    rows = status(Paths.default())
    if not rows:
        print("engine: no replicas running")
        return 0
    print(f"{'pool':<14} {'profile':<18} {'url':<24} {'pid':>7}  state")
    for record, alive, healthy in rows:
        state = "healthy" if healthy else ("starting/unhealthy" if alive else "dead")
        print(f"{record.pool:<14} {record.profile:<18} {record.url:<24} {record.pid:>7}  {state}")
    return 0 if all(h for _, _, h in rows) else 1


def _down(args: argparse.Namespace) -> int:
    stopped = down(Paths.default(), pool=args.pool)
    print(f"engine: {stopped} replica(s) stopped")
    return 0


def _build(args: argparse.Namespace) -> int:
    build_tiny_model(Path(args.dir).resolve(), Paths.default(), seed=args.seed)
    return 0


def _args(args: argparse.Namespace) -> int:
    rendered = load_profile(args.profile).serve_args(port=args.port)
    print(json.dumps(rendered) if args.json else shlex.join(["vllm", "serve", *rendered]))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from engine.supervisor import validate_args

    paths = Paths.default()
    failed = 0
    for name in args.profile or available_profiles():
        ok, message = validate_args(load_profile(name), paths)
        print(f"{name}: {message}")
        failed += not ok
    return 1 if failed else 0


def _manifests(args: argparse.Namespace) -> int:
    from engine.manifests import (
        DEFAULT_OUT,
        default_profiles,
        render_files,
        stale_diffs,
        write_files,
    )

    profiles = [load_profile(name) for name in args.profile] if args.profile else default_profiles()
    files = render_files(profiles)
    out = Path(args.out) if args.out else DEFAULT_OUT
    if args.check:
        diffs = stale_diffs(files, out)
        for diff in diffs:
            print(diff, end="")
        if diffs:
            print(f"engine: {len(diffs)} manifest(s) in {out} are stale: run `engine manifests`")
            return 1
        print(f"engine: {len(files)} manifest(s) in {out} are up to date")
        return 0
    for path in write_files(files, out):
        print(f"engine: wrote {path}")
    return 0


def _stack(args: argparse.Namespace) -> int:
    from engine.stack import run_stack

    return run_stack()


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its options (docs/reference/cli.md lists them; a test keeps
    the two together)."""
    parser = argparse.ArgumentParser(prog="engine", description="Run and watch local vLLM engines")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start replicas and wait until healthy")
    p.add_argument("--profile", default="cpu-tiny")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--model", help="model directory (default: the profile's)")
    p.add_argument("--pool", help="gateway pool label (default: the profile's)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(run=_up)

    p = sub.add_parser("status", help="list replicas and their health")
    p.set_defaults(run=_status)

    p = sub.add_parser("down", help="stop replicas")
    p.add_argument("--pool")
    p.set_defaults(run=_down)

    p = sub.add_parser("build-tiny-model", help="build the offline tiny model")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_build)

    p = sub.add_parser("args", help="print a profile's vllm serve arguments")
    p.add_argument("--profile", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_args)

    p = sub.add_parser("validate", help="check profiles with vLLM's own argument parser")
    p.add_argument("--profile", action="append")
    p.set_defaults(run=_validate)

    p = sub.add_parser("manifests", help="render Kubernetes manifests of the GPU engine pools")
    p.add_argument("--profile", action="append", help="GPU profile (default: one per cluster tier)")
    p.add_argument("--out", help="directory (default: deploy/k8s/engines)")
    p.add_argument("--check", action="store_true", help="fail with a diff when files are stale")
    p.set_defaults(run=_manifests)

    p = sub.add_parser("stack", help="state store + engines + gateway until Ctrl-C (make run)")
    p.set_defaults(run=_stack)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except (EngineError, ProfileError) as exc:
        print(f"engine: {exc}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    raise SystemExit(main())
