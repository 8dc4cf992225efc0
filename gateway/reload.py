"""Policy hot reload: `gateway serve --policy FILE` applies a changed file without a restart.

In Kubernetes the policy is a ConfigMap mounted as a file. The kubelet updates it by
writing the new content into a fresh timestamped directory and swapping a symlink, so the
file's own mtime says nothing reliable; the watcher reads the bytes every
`server.reload_interval_s` (5 s; 0 turns polling off) and compares their SHA-256 with the
last bytes it looked at. SIGHUP checks at once (`gateway serve` installs the handler).

A changed file goes through three gates, and the running policy keeps serving unless it
passes all three:
1. valid: the same loader and messages as `gateway policy check` (YAML, schema, cross
   references; file, line and key path named) -> outcome `invalid`;
2. appliable without a restart: no field of `RESTART_ONLY` (gateway/policy/reloadable.py)
   differs from the running policy -> outcome `needs_restart`, the fields named;
3. buildable: a new runtime is built from it (gateway/runtime.py; a learned-router artifact
   or tokenizer that cannot be loaded fails here) -> outcome `invalid`.
Then the new runtime's background tasks start, it is swapped in at once, and the old
runtime's tasks stop (outcome `applied`). No request fails or is lost: one already running
finishes on the objects it started with. Each outcome is logged once per distinct file
content and counted in `gateway_policy_reloads_total{outcome}`; `gateway_policy_info
{sha256}` names the file content serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Coroutine
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.datastructures import State

from gateway.policy import PolicyError
from gateway.policy.reloadable import (
    PolicyFile,
    needs_restart,
    parse_policy_bytes,
    read_policy_bytes,
    sha256_of,
)
from gateway.runtime import Runtime, Services, build_runtime, current

log = logging.getLogger(__name__)

ReloadOutcome = Literal["applied", "invalid", "needs_restart"]
OUTCOMES: tuple[ReloadOutcome, ...] = ("applied", "invalid", "needs_restart")


class ReloadMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reloads = Counter(
            "gateway_policy_reloads",
            "Changed policy files by outcome: applied, invalid (rejected by validation or "
            "when building it; the running policy keeps serving), needs_restart (changes a "
            "setting only a restart applies; not applied).",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:  # every outcome is exported from the start, at 0
            self.reloads.labels(outcome)
        self.info = Gauge(
            "gateway_policy_info",
            "1, labelled with the SHA-256 of the policy file serving (compare with "
            "`sha256sum` of the ConfigMap's file).",
            ["sha256"],
            registry=registry,
        )
        self.loaded = Gauge(
            "gateway_policy_loaded_timestamp_seconds",
            "When the policy serving was applied (Unix time).",
            registry=registry,
        )
        self._serving: str | None = None

    def serving(self, sha256: str) -> None:
        # The previous policy's series is set to 0, not cleared: in prometheus_client's
        # multiprocess mode (`gateway serve --workers N`) `clear()` does nothing.
        previous, self._serving = self._serving, sha256
        if previous is not None and previous != sha256:
            self.info.labels(previous).set(0)
        self.info.labels(sha256).set(1)
        self.loaded.set_to_current_time()


class PolicyReloader:
    """Watches the policy file of a running app and applies changes (module docstring).

    The current runtime is `state.runtime` (gateway/runtime.py); checks run one at a time."""

    def __init__(
        self, state: State, services: Services, file: PolicyFile, metrics: ReloadMetrics
    ) -> None:
        self._state = state
        self._services = services
        self._path = file.path
        self._metrics = metrics
        self._applied = file.sha256  # the content serving
        self._seen = file.sha256  # the content last judged: a rejected one is judged once
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gc_settle: asyncio.Task[None] | None = None
        self._sighup = False
        metrics.serving(file.sha256)

    def start(self, *, sighup: bool = False) -> None:
        """Start polling (unless the interval is 0); with `sighup`, SIGHUP checks at once
        (only `gateway serve` asks: a test's or an embedding program's signals are its own)."""
        self._watch_if_enabled()
        if sighup:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.on_sighup)
            self._sighup = True

    async def stop(self) -> None:
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        # A reload in progress ends first, so no runtime is left half swapped or running;
        # then every task is at a wait it can be cancelled at.
        async with self._lock:
            tasks = (self._watcher, self._gc_settle, *self._tasks)
            pending = [task for task in tasks if task is not None]
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def on_sighup(self) -> None:
        """The signal handler: check now, also content rejected before (a referenced file
        such as a learned-router artifact may have been fixed since)."""
        log.info("SIGHUP: checking the policy file %s", self._path)
        self._spawn(self.check(force=True))

    async def check(self, *, force: bool = False) -> ReloadOutcome | None:
        """Re-read the file and apply it if its content changed; the outcome, or None
        when there was nothing new to judge."""
        async with self._lock:
            try:
                data = await asyncio.to_thread(read_policy_bytes, self._path)
            except PolicyError as exc:
                return self._rejected_unreadable(exc, force=force)
            sha256 = sha256_of(data)
            if sha256 == self._applied:
                if force:
                    log.info("policy %s unchanged (sha256 %.12s)", self._path, sha256)
                self._seen = sha256
                return None
            if sha256 == self._seen and not force:
                return None
            self._seen = sha256
            return await self._judge(data, sha256)

    async def _judge(self, data: bytes, sha256: str) -> ReloadOutcome:
        path, running = self._path, self._running()
        try:
            policy = await asyncio.to_thread(parse_policy_bytes, data, path)
        except PolicyError as exc:
            log.warning(
                "policy %s (sha256 %.12s) rejected, the running policy keeps serving:\n%s",
                path,
                sha256,
                exc,
            )
            return self._count("invalid")
        if fields := needs_restart(running.policy, policy):
            log.warning(
                "policy %s (sha256 %.12s) not applied: needs a restart: %s; the running "
                "policy keeps serving",
                path,
                sha256,
                ", ".join(fields),
            )
            return self._count("needs_restart")
        fresh: Runtime | None = None
        try:
            fresh = await asyncio.to_thread(build_runtime, policy, self._services, running)
            await fresh.start(first=False)
        except asyncio.CancelledError:  # shutting down mid-reload
            if fresh is not None:
                await fresh.stop()
            raise
        except Exception as exc:
            if fresh is not None:
                await fresh.stop()
            log.warning(
                "policy %s (sha256 %.12s) rejected, the running policy keeps serving: "
                "cannot build it: %s: %s",
                path,
                sha256,
                type(exc).__name__,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return self._count("invalid")
        fresh.activate(self._state, self._services, running)
        self._applied = sha256
        self._metrics.serving(sha256)
        log.info(
            "policy %s (sha256 %.12s) applied: %d model(s), %d pool(s)",
            path,
            sha256,
            len(policy.models),
            len(policy.pools),
        )
        # Counted as it starts serving: stopping the old runtime below can take a while
        # (its sharing writes what it queued), and the count must not lag what is served.
        outcome = self._count("applied")
        await running.stop()
        self._settle_gc_after(running.policy.timeouts.total_s)
        self._watch_if_enabled()  # the interval may have changed, or polling been turned on
        return outcome

    def _rejected_unreadable(self, exc: PolicyError, *, force: bool) -> ReloadOutcome | None:
        marker = f"unreadable: {exc}"
        if marker == self._seen and not force:
            return None
        self._seen = marker
        log.warning("policy %s: the running policy keeps serving:\n%s", self._path, exc)
        return self._count("invalid")

    def _count(self, outcome: ReloadOutcome) -> ReloadOutcome:
        self._metrics.reloads.labels(outcome).inc()
        return outcome

    def _running(self) -> Runtime:
        return current(self._state)

    def _watch_if_enabled(self) -> None:
        idle = self._watcher is None or self._watcher.done()
        if idle and self._running().policy.server.reload_interval_s > 0:
            self._watcher = asyncio.create_task(self._watch(), name="policy-reload")

    async def _watch(self) -> None:
        # The interval is read each round: a reload may change it (0 ends the loop).
        while (interval := self._running().policy.server.reload_interval_s) > 0:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except Exception:  # the watcher must outlive any one bad round
                log.exception("policy reload check of %s failed", self._path)

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _settle_gc_after(self, delay_s: float) -> None:
        """The app froze its start-up objects out of the collector's sight (gc.freeze in
        gateway/app.py), the replaced runtime among them; once no request can still use
        it (the longest a request may take), thaw, collect it, and freeze again: one
        full collection per reload instead of a leak."""
        if self._gc_settle is not None:
            self._gc_settle.cancel()
        self._gc_settle = asyncio.create_task(self._settle_gc(delay_s), name="policy-gc")

    async def _settle_gc(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        gc.unfreeze()
        gc.collect()
        gc.freeze()
