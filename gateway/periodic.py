"""A background task that runs one round of work every interval until stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._interval_s = interval_s
        self._work = work
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Cancels the loop and waits for it to end. The loop also ends at its next turn
        when its work swallowed the cancellation: on Python 3.11, `asyncio.wait_for` returns
        its inner result instead of raising when a cancel arrives just as that finishes
        (CPython gh-86296, fixed in 3.12), and redis-py sends every command through it. Seen
        here: about half of the Redis commands cancelled mid-flight went on as if nothing
        happened, and a usage flush loop kept a gateway's shutdown waiting for ever."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # a cancel of stop() itself still propagates
            if not self._task.cancelled() and (error := self._task.exception()) is not None:
                log.error("%s ended with %r", self._name, error)

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval_s)
            if self._stopping:
                return
            try:
                await self._work()
            except Exception:  # the loop must outlive any single bad round
                log.exception("%s round failed", self._name)
