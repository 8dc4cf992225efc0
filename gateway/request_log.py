"""The routing request log: one JSON line per routed request, the input of
`gateway replay`, so operators can replay their own traffic against a changed policy.

Lines are handed to a background thread (logging's QueueHandler/QueueListener): the
event loop never waits on the disk.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import time
from pathlib import Path

import orjson

from gateway.routing.costs import RouteRequest
from gateway.routing.router import Decision


class RequestLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(logging.Formatter("%(message)s"))
        self._listener = logging.handlers.QueueListener(self._queue, self._file)
        self._logger = logging.Logger(f"agw.request_log.{path}")
        self._logger.addHandler(logging.handlers.QueueHandler(self._queue))
        self._logger.propagate = False
        self._listener.start()

    def write(self, model: str, route: RouteRequest, decision: Decision) -> None:
        entry = {
            "ts": round(time.time(), 3),
            "model": model,
            "session": route.session,
            "blocks": route.blocks,
            "replica": decision.replica.id,
            "reason": decision.reason,
            "cached_blocks": decision.cached_blocks,
        }
        self._logger.info(orjson.dumps(entry).decode())

    def close(self) -> None:
        self._listener.stop()  # drains what is queued
        self._file.close()
