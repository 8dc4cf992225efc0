"""What a change to the policy file can do to a running gateway (gateway/reload.py): the
file read as exact bytes (their SHA-256 names the content serving), validated the way a
reload validates it, and the fields only a restart applies (`RESTART_ONLY`, each with why).

Kept apart from the reloader so `gateway policy check --against` runs without importing
the serving code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gateway.policy.loader import PolicyError, PolicyProblem, parse_policy
from gateway.policy.schema import Policy

# Settings a running gateway cannot change, each with why; a policy that changes one is
# not applied (the whole section where a prefix names one). Everything else reloads.
RESTART_ONLY: dict[str, str] = {
    "server.host": "the listening socket is bound once, before the app starts",
    "server.port": "the listening socket is bound once, before the app starts",
    "server.header_timeout_s": "the server's connection protocol (gateway/edge/connections.py) is "
    "built once, before the listening socket opens",
    "server.keep_alive_s": "the server's connection protocol is built once",
    "server.max_connections": "the server's connection protocol is built once",
    "limits.max_body_bytes": "built into the ASGI stack (gateway/api/inference.py), which is "
    "assembled once",
    "auth": "the API-key check is part of the ASGI stack, on or off, from the start; the "
    "keys file has its own watcher (gateway/edge/auth.py): rotate keys in that file",
    "tenants": "tenants' static keys and settings are built into the API-key check once; "
    "keys created at run time (`gateway keys create`, POST /admin/keys) need no restart",
    "state": "the state store's connection (or embedded Redis) is opened once, and sessions, "
    "usage and stored responses live in it: switching stores would strand them",
    "routing.sharing": "turning sharing on or off is a change to the whole fleet of "
    "gateways (one that stops publishing is still counted by the others until its in-flight "
    "counts expire), and any change to `routing` starts a new router, dropping the prefix "
    "index sharing filled: roll it out by restarting the gateways",
    "telemetry": "the trace exporter, the request log and the usage ledger (which keeps the "
    "start-up sessions.ttl_s for per-session usage) are opened once, and the edge "
    "middleware holds them",
}


@dataclass(frozen=True)
class PolicyFile:
    """Where a policy was read from, and the SHA-256 of the exact bytes validated."""

    path: Path
    sha256: str


def parse_policy_bytes(data: bytes, path: Path) -> Policy:
    """Validate a policy file's content. Relative paths in it are taken from the directory
    the path names, not the one a symlink leads to: a ConfigMap's file is a symlink into a
    timestamped directory that the kubelet replaces on every update."""
    source = str(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(source, [PolicyProblem("", f"not UTF-8 text: {exc}")]) from None
    return parse_policy(text, source=source, base_dir=path.absolute().parent)


def read_policy_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        problem = PolicyProblem("", f"cannot read the file: {exc.strerror}")
        raise PolicyError(str(path), [problem]) from exc


def load_policy_file(path: str | Path) -> tuple[Policy, PolicyFile]:
    """Read and validate a policy file (raises PolicyError naming every problem)."""
    where = Path(path)
    data = read_policy_bytes(where)
    return parse_policy_bytes(data, where), PolicyFile(where, sha256_of(data))


def needs_restart(running: Policy, candidate: Policy) -> list[str]:
    """The restart-only fields the candidate changes, as dotted paths (`server.port`)."""
    changed: list[str] = []
    for path in RESTART_ONLY:
        old, new = _at(running, path), _at(candidate, path)
        if old != new:
            changed += _changed_leaves(path, old, new)
    return changed


def _at(policy: Policy, path: str) -> Any:
    value: Any = policy
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _changed_leaves(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, BaseModel) and isinstance(new, BaseModel):
        old, new = old.model_dump(), new.model_dump()
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(old.keys() | new.keys(), key=str):
            if old.get(key) != new.get(key):
                out += _changed_leaves(f"{path}.{key}", old.get(key), new.get(key))
        return out
    return [path]


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
