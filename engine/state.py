"""The engine state file: which local replicas run, where, and for which gateway pool.

`engine up` writes it, `engine down` empties it, and the gateway re-reads it whenever it
changes (a pool's `engine_state:`). Writes are atomic (temp file + rename) so the gateway
never reads half a file. A replica whose profile publishes KV-cache events records where
(`kv_events`, `kv_replay`: ZMQ endpoints a subscriber dials; absent: it publishes none).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReplicaRecord:
    pool: str
    profile: str
    served_model: str
    url: str
    port: int
    pid: int
    log: str
    kv_events: str | None = None
    kv_replay: str | None = None


def read_state(path: Path) -> list[ReplicaRecord]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    return [ReplicaRecord(**entry) for entry in data.get("replicas", [])]


def write_state(path: Path, replicas: list[ReplicaRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    payload = {"version": 1, "replicas": [asdict(r) for r in replicas]}
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
