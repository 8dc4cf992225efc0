"""A background task that runs one round of work every interval until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._interval_s = interval_s
        self._work = work
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._work()
            except Exception:  # the loop must outlive any single bad round
                log.exception("%s round failed", self._name)
