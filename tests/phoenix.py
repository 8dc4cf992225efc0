"""Arize Phoenix as a real OTLP trace receiver for tests: start it from `.venv-phoenix` (built
by deploy/observability/phoenix-env.sh, which `make test` runs), send it spans over OTLP/HTTP
at `{base_url}/v1/traces`, and read them back through its REST API.

Phoenix 20.x lists a project's spans at `GET /v1/projects/{project}/spans` (newest first by
default, paged with `next_cursor`, at most 1000 a page), each as
`{"name", "context": {"trace_id", "span_id"}, "parent_id", "span_kind", "attributes", ...}`
with OpenTelemetry's hex ids and the attributes already flat (`"gen_ai.request.model"`).
It ingests through a queue, so a span exported a moment ago may not be listed yet: use
`wait_for_spans`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.supervisor import free_port
from tests.lifetimes import suite_reaper

ROOT = Path(__file__).resolve().parent.parent
PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
STARTUP_TIMEOUT_S = 120.0  # about 10 s here; migrations on a busy 2-core CI run take longer

# Offline and quiet: no telemetry pixels or web fonts (there is no network at run time), no
# assistant with server-side bash, and no per-migration SQL in the log.
_PHOENIX_ENV = {
    "PHOENIX_TELEMETRY_ENABLED": "false",
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_AGENTS_DISABLE_BASH": "true",
    "PHOENIX_LOG_MIGRATIONS": "false",
}


class PhoenixNotInstalled(RuntimeError):
    pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_phoenix(work_dir: Path) -> Iterator[str]:
    """A fresh Phoenix (its SQLite database in work_dir) on free loopback ports; yields its
    base URL, e.g. http://127.0.0.1:41234, and stops it on exit."""
    if not PHOENIX.exists():
        raise PhoenixNotInstalled(
            f"no Phoenix environment at {PHOENIX.parent.parent}: `make test` builds it "
            "(or run `bash deploy/observability/phoenix-env.sh`)"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # A developer's own PHOENIX_*/OTEL_* settings (a Postgres URL, a project name, a
    # collector) would point this throwaway server at their data: drop them all.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}
    env |= _PHOENIX_ENV | {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),  # 4317 may be a running `make traces`
        "PHOENIX_WORKING_DIR": str(work_dir),
    }
    log = work_dir / "phoenix.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(PHOENIX), "serve"], cwd=work_dir, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    suite_reaper().hold(proc.pid)  # gone with pytest, however it ends
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _answers(f"{base}/healthz"):
            if proc.poll() is not None:
                raise RuntimeError(f"Phoenix exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Phoenix not ready in {STARTUP_TIMEOUT_S:.0f} s:\n{_tail(log)}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        suite_reaper().release(proc.pid)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def phoenix_spans(base_url: str, project: str = "default") -> list[dict[str, Any]]:
    """Every span of the project, oldest first, each as
    {"name", "trace_id", "span_id", "parent_id" (None for a root), "kind", "status_code",
    "start_time", "end_time", "attributes" (flat: {"gen_ai.request.model": "tiny"})}."""
    spans: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {"limit": "1000", "sort": "start_time", "order": "asc"}
        if cursor:
            query["cursor"] = cursor
        url = (
            f"{base_url}/v1/projects/{urllib.parse.quote(project, safe='')}/spans?"
            + urllib.parse.urlencode(query)
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                page: dict[str, Any] = json.load(resp)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # no span has reached the project yet
                exc.close()
                return []
            raise
        for raw in page["data"]:
            spans.append(
                {
                    "name": raw["name"],
                    "trace_id": raw["context"]["trace_id"],
                    "span_id": raw["context"]["span_id"],
                    "parent_id": raw.get("parent_id"),
                    "kind": raw.get("span_kind"),
                    "status_code": raw.get("status_code"),
                    "start_time": raw.get("start_time"),
                    "end_time": raw.get("end_time"),
                    "attributes": _flatten(raw.get("attributes") or {}),
                }
            )
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def wait_for_spans(
    base_url: str, count: int, project: str = "default", timeout: float = 15.0
) -> list[dict[str, Any]]:
    """phoenix_spans once at least `count` spans are listed (Phoenix ingests through a
    queue); raises TimeoutError with what it has otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        spans = phoenix_spans(base_url, project)
        if len(spans) >= count:
            return spans
        if time.monotonic() > deadline:
            names = [s["name"] for s in spans]
            raise TimeoutError(
                f"{len(spans)} of {count} spans in Phoenix after {timeout} s: {names}"
            )
        time.sleep(0.2)


def _flatten(attributes: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys whatever the shape: Phoenix stores attributes nested ({"gen_ai":
    {"request": {...}}}) and its REST API flattens them today; don't depend on which."""
    flat: dict[str, Any] = {}
    for key, value in attributes.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= _flatten(value, f"{name}.")
        else:
            flat[name] = value
    return flat
