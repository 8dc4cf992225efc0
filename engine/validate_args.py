"""Check rendered `vllm serve` arguments with vLLM's own parser, without a GPU.

Runs inside the engine environment, fed the arguments as JSON on stdin:

    engine args --profile gpu-llama70b-eagle3 --json \
        | .venv-engine/bin/python -m engine.validate_args

vLLM's argument parser and its pre-load checks run exactly as `vllm serve` runs them;
the speculative config's method and keys are checked against vLLM's SpeculativeConfig.
Nothing is loaded and nothing is downloaded. Prints `ok` or the parser's complaint.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any


def _literal_values(tp: Any) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(tp):
        if isinstance(arg, str):
            out.add(arg)
        else:
            out |= _literal_values(arg)
    return out


def validate(argv: list[str]) -> None:
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve", exit_on_error=False))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)

    spec = args.speculative_config
    if spec is not None:
        spec = spec if isinstance(spec, dict) else json.loads(spec)
        known = {f.name for f in dataclasses.fields(SpeculativeConfig)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"--speculative-config: unknown keys {unknown}")
        methods = _literal_values(SpeculativeMethod)
        if spec.get("method") not in methods:
            raise ValueError(
                f"--speculative-config: method {spec.get('method')!r} not in {sorted(methods)}"
            )


def main() -> int:
    argv = json.load(sys.stdin)
    try:
        validate(argv)
    except (SystemExit, Exception) as exc:  # argparse exits; report it as a failure
        print(f"invalid: {type(exc).__name__}: {exc}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
