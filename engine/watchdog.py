"""`engine stack` keeps its replicas running.

A replica whose API server exited is stopped whole first: vLLM's engine-core process
outlives its API server and goes on with whatever it was generating. Seen here: a killed
replica's orphaned engine core went on generating a 3,000-token answer for nobody, and
starved the other replicas of this 2-core machine; on a GPU it would also keep the GPU's
memory, and a replica started in its place would fail for want of it.

Then a replica of the same launch is started in its place. The dead one leaves the engine
state file at once and the new one joins it once healthy; the gateway watches that file
(a pool's `engine_state:`), so it stops routing to the one and starts on the other.
Restarts are limited: a replica that dies `max_restarts` times within `window_s` is left
down, its log named, and the gateway serves from the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine.lifeline import Lifeline
from engine.state import ReplicaRecord, read_state, write_state
from engine.supervisor import EngineError, Launch, Paths, exit_code, stop_replica, up


def _ended(code: int) -> str:
    if code == -1:
        return "exited"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _key(launch: Launch) -> tuple[str, str]:
    return launch.profile.name, launch.pool or launch.profile.pool


@dataclass
class ReplicaWatchdog:
    launches: list[Launch]
    paths: Paths
    say: Callable[[str], None] = print
    max_restarts: int = 3
    window_s: float = 600.0
    start_timeout_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    lifeline: Lifeline | None = None  # replacements die with the stack too (engine/lifeline.py)
    _restarts: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def check(self) -> None:
        """Replaces every replica of the state file whose API server has exited."""
        for record in read_state(self.paths.state):
            code = exit_code(record.pid)
            if code is not None:
                self._replace(record, code)

    def _replace(self, record: ReplicaRecord, code: int) -> None:
        self._forget(record)  # first, as `down` does: the gateway stops routing to it
        stop_replica(record.pid, lifeline=self.lifeline)  # the orphaned engine core and workers
        key = (record.profile, record.pool)
        launch = next((one for one in self.launches if _key(one) == key), None)
        now = self.clock()
        recent = [t for t in self._restarts.get(key, []) if now - t < self.window_s]
        what = f"engine: replica {record.url} (pid {record.pid}) {_ended(code)}"
        if launch is None or len(recent) >= self.max_restarts:
            why = "not one of this stack's" if launch is None else (
                f"{len(recent)} restarts in the last {self.window_s:g}s"
            )  # fmt: skip
            self.say(f"{what}; not restarted ({why}); see {record.log}")
            return
        self._restarts[key] = [*recent, now]
        self.say(f"{what}; its processes are stopped, a new replica is starting")
        try:
            up([replace(launch, count=1)], paths=self.paths, timeout_s=self.start_timeout_s,
               say=self.say, lifeline=self.lifeline)  # fmt: skip
        except EngineError as exc:
            self.say(f"engine: the replacement of {record.url} did not start: {exc}")

    def _forget(self, record: ReplicaRecord) -> None:
        """Out of the state file at once: the gateway stops routing to it."""
        kept = [r for r in read_state(self.paths.state) if r.pid != record.pid]
        write_state(self.paths.state, kept)
