"""`gateway dataset export`: the gateway's own traffic as labelled data.

Each request-log line that carries a label becomes one JSONL row: the cascade's outcome on
its first checked answer (`cascade`, `cascade_tier`), whether its first answer's tool calls
were valid (`tool_check`, `tool_check_tier`), and the scores given to it through
`POST /v1/feedback` (joined by tenant and request id: a tenant's feedback only ever labels
its own requests). The prompt (`route_text`, what the tier router reads) is in a row only
where the log kept it, which it does only where the policy and the tenant allow keeping
content. Rows keep the request log's field names, so `gateway route-train --from-log`
reads an export as it reads the log.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.offline.route_train.outcomes import CHECKED, TOOL_CHECKS
from gateway.policy.sessions import StateSpec

ROW_FIELDS = ("request_id", "ts", "tenant", "model", "tier", "route_text", "cascade",
              "cascade_tier", "tool_check", "tool_check_tier")  # fmt: skip


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Export:
    rows: list[dict[str, Any]]
    lines: int  # request-log lines read
    cascade_labels: int  # a cascade or tool-call check's outcome
    feedback_labels: int
    with_text: int


def export(
    entries: Iterable[dict[str, Any]],
    feedback: Mapping[str, Iterable[Mapping[str, str]]],
    *,
    tenant: str | None = None,
) -> Export:
    """`feedback`: each tenant's stored feedback (gateway/feedback/store.py), oldest first."""
    scores: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for name, items in feedback.items():
        for item in items:
            score: dict[str, Any] = {
                "name": item.get("name", "user"),
                "score": float(item["score"]),
            }
            if comment := item.get("comment"):
                score["comment"] = comment
            scores.setdefault((name, item["request_id"]), []).append(score)
    rows: list[dict[str, Any]] = []
    lines = cascades = scored = with_text = 0
    for entry in entries:
        lines += 1
        owner, request_id = entry.get("tenant"), entry.get("request_id")  # untyped JSON
        if not isinstance(owner, str) or not isinstance(request_id, str):
            continue
        if tenant is not None and owner != tenant:
            continue
        given = scores.get((owner, request_id), [])
        checked = entry.get("cascade") in CHECKED or entry.get("tool_check") in TOOL_CHECKS
        if not checked and not given:
            continue
        row = {name: entry.get(name) for name in ROW_FIELDS}
        if given:
            row["feedback"] = given
        rows.append(row)
        cascades += checked
        scored += bool(given)
        with_text += bool(row["route_text"])
    return Export(rows, lines, cascades, scored, with_text)


def tenants_in(entries: Iterable[dict[str, Any]]) -> set[str]:
    return {e["tenant"] for e in entries if isinstance(e.get("tenant"), str)}


async def stored_feedback(
    state: StateSpec, tenants: Iterable[str]
) -> dict[str, list[dict[str, str]]]:
    """Each tenant's feedback, from the policy's Redis."""
    # Imported here: an export without feedback needs no Redis client.
    from gateway.feedback.store import FeedbackStore
    from gateway.state.store import StateStore

    if not state.redis_url:
        raise ExportError(
            "the policy's state store is an embedded Redis (no state.redis_url), which only "
            "the running gateway opens: point state.redis_url at it, or pass --no-feedback"
        )
    store = StateStore(state)
    await store.open()
    try:
        assert store.redis is not None
        feedback = FeedbackStore(store.redis)
        return {tenant: await feedback.read(tenant) for tenant in sorted(tenants)}
    finally:
        await store.close()


def export_command(log: str, out: str, *, policy: str, tenant: str | None, feedback: bool) -> int:
    """`gateway dataset export`: the rows written to `out`, a one-line summary printed."""
    # Imported here: `gateway --help` loads neither the policy nor Redis clients.
    from gateway.errors import StateUnavailable
    from gateway.offline.log_lines import LogLineError, read_entries
    from gateway.policy import PolicyError, load_policy

    try:
        entries = list(read_entries(log))
        scores: dict[str, list[dict[str, str]]] = {}
        if feedback:
            tenants = {tenant} if tenant else tenants_in(entries)
            scores = asyncio.run(stored_feedback(load_policy(policy).state, tenants))
        result = export(entries, scores, tenant=tenant)
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as rows:
            rows.writelines(json.dumps(row) + "\n" for row in result.rows)
    except (OSError, ExportError, LogLineError, PolicyError, StateUnavailable) as exc:
        print(f"gateway dataset export: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {out}: {len(result.rows)} labelled requests of {result.lines} log lines "
        f"({result.cascade_labels} with a check's outcome, {result.feedback_labels} with "
        f"feedback, {result.with_text} with the prompt's text)"
    )
    return 0
