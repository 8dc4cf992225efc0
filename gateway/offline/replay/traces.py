"""Trace readers. Two formats, detected per line:

- Mooncake (`timestamp` ms, `input_length`, `output_length`, `hash_ids`: one id per
  512-token block, equal leading ids = shared prefix);
- the gateway's own request log (`ts` s, `blocks`, `prompt_tokens`, `output_tokens`,
  `session`), written when `telemetry.request_log` is set, so operators can replay their own
  traffic against a changed policy before deploying it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TraceRequest:
    at_s: float
    blocks: tuple[int, ...]
    input_tokens: int
    output_tokens: int
    session: str | None = None


class TraceError(Exception):
    pass


def read_trace(path: Path, *, block_tokens: int) -> Iterator[TraceRequest]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if "request_id" in entry and not (entry.get("blocks") and entry.get("replica")):
                    continue  # the request log's line of a request that was not routed
                yield _parse(entry, block_tokens)
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(
                    f"{path}:{number}: not a Mooncake or gateway log entry ({exc})"
                ) from None


def _parse(entry: dict[str, object], block_tokens: int) -> TraceRequest:
    if "hash_ids" in entry:
        return TraceRequest(
            at_s=float(entry["timestamp"]) / 1000.0,  # type: ignore[arg-type]
            blocks=tuple(int(b) for b in entry["hash_ids"]),  # type: ignore[attr-defined]
            input_tokens=int(entry["input_length"]),  # type: ignore[call-overload]
            output_tokens=int(entry["output_length"]),  # type: ignore[call-overload]
        )
    blocks = tuple(int(b) for b in entry["blocks"])  # type: ignore[attr-defined]
    session = entry.get("session")
    return TraceRequest(
        at_s=float(entry["ts"]),  # type: ignore[arg-type]
        blocks=blocks,
        input_tokens=int(entry.get("prompt_tokens") or len(blocks) * block_tokens),  # type: ignore[call-overload]
        output_tokens=int(entry.get("output_tokens") or 1),  # type: ignore[call-overload]
        session=str(session) if session else None,
    )
