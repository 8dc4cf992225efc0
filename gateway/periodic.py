"""A background task that runs one round of work every interval until stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    """`stop()` wakes the loop from its sleep at once, but lets a round in progress finish
    (up to `stop_grace_s`, then cancels it): cancelled mid-way, a usage flush would drop the
    counts it had taken to write. The loop also ends at its next turn when its work
    swallowed a cancellation: on Python 3.11, `asyncio.wait_for` returns its inner result
    instead of raising when a cancel arrives just as that finishes (CPython gh-86296), and
    redis-py sends every command through it. Seen here: about half of the Redis commands
    cancelled mid-flight went on as if nothing happened, and a usage flush loop kept a
    gateway's shutdown waiting for ever."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        work: Callable[[], Awaitable[None]],
        *,
        stop_grace_s: float = 5.0,
    ) -> None:
        self._name = name
        self._interval_s = interval_s
        self._work = work
        self._stop_grace_s = stop_grace_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._working = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        self._stopping = True
        task = self._task
        if task is None:
            return
        if not self._working:
            task.cancel()  # asleep: nothing to lose
        # asyncio.wait, not `await task`: a cancel of stop() itself still propagates.
        done, _ = await asyncio.wait({task}, timeout=self._stop_grace_s)
        if not done:
            log.warning("%s: the round in progress outlasted %gs, cancelled", self._name,
                        self._stop_grace_s)  # fmt: skip
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("%s ended with %r", self._name, error)

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval_s)
            if self._stopping:
                return
            self._working = True
            try:
                await self._work()
            except Exception:  # the loop must outlive any single bad round
                log.exception("%s round failed", self._name)
            finally:
                self._working = False
