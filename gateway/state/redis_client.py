"""The Redis clients the state store hands out: one node's, or a Redis Cluster's.

redis-py's cluster client keeps a pool per node that raises `MaxConnectionsError` once
all its connections are busy, with no blocking variant; 200 concurrent GETs over a pool of
8 failed that way here, as 2,000 did over the single-node default pool of 100
(shared/docs/measured-facts.md). `GatedRedisCluster` makes callers wait instead: at most
`max_connections` commands (or pipelines) are in flight at once, and each holds at most
one connection per node, so no node's pool of that size can run dry.

redis-py 8.1's asyncio connection writes through `self._writer` after a suspension point,
and the cluster client disconnects a node's idle connections after any connection error
or timeout while other commands may already have taken one of them: that command then
fails with `AttributeError: 'NoneType' object has no attribute 'writelines'`, which no
retry classifies (seen once in CI on a loaded machine; redis-py#3546). Cluster
connections here check the writer first and raise `ConnectionError` instead: nothing was
sent, so redis-py's own retry repeats it. redis-py 8.2 no longer disconnects them on an
error: it marks them, and each reconnects when it is next taken; the check stays for 8.1.

A cluster it cannot reach, or one that leaves slots uncovered, raises redis-py's
`RedisClusterException`, which is no `RedisError`; it is raised as `ClusterUnavailable`
(a `redis.exceptions.ConnectionError`) so the stores treat it as the outage it is. A
transaction over keys of several slots stays `CrossSlotTransactionError`: a bug, not an
outage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import CrossSlotTransactionError, RedisClusterException

# What the stores are given: either client serves every command they send.
RedisClient = aioredis.Redis | RedisCluster

# Set while a task holds a place: redis-py re-enters `execute_command` from inside a
# pipeline (to follow MOVED/ASK redirections), and a second wait there could deadlock.
_holding: ContextVar[bool] = ContextVar("agw_redis_cluster_holding", default=False)


class ClusterUnavailable(RedisConnectionError):
    """No node of the cluster answers, or some hash slots have no node."""


class GuardedConnection(Connection):
    """A `Connection` that never writes through a writer another task cleared."""

    async def _send_packed_command(self, command: Iterable[bytes]) -> None:
        writer = self._writer  # read once: no suspension point between check and write
        if writer is None or writer.transport.is_closing():
            raise RedisConnectionError("the connection was closed by a concurrent disconnect")
        writer.writelines(command)
        await writer.drain()


class GuardedSSLConnection(GuardedConnection, SSLConnection):
    """The same, over TLS."""


_GUARDED: dict[type[Connection], type[Connection]] = {
    Connection: GuardedConnection,
    SSLConnection: GuardedSSLConnection,
}


class _Gate:
    def __init__(self, places: int) -> None:
        self._places = asyncio.Semaphore(places)

    async def run(self, call: Any) -> Any:
        if _holding.get():
            return await call()
        async with self._places:
            token = _holding.set(True)
            try:
                return await call()
            except CrossSlotTransactionError:
                raise
            except RedisClusterException as exc:  # topology: unreachable, slots uncovered
                raise ClusterUnavailable(str(exc)) from exc
            finally:
                _holding.reset(token)


class GatedRedisCluster(RedisCluster):
    """redis-py's RedisCluster, waiting for a free connection instead of failing."""

    def __init__(self, max_connections: int = 100, **kwargs: Any) -> None:
        super().__init__(max_connections=max_connections, **kwargs)
        self._gate = _Gate(max_connections)
        # redis-py fixes the class (plain or TLS); nodes found later take it from these
        # shared keyword arguments, the startup nodes already hold it.
        guarded = _GUARDED[self.connection_kwargs["connection_class"]]
        self.connection_kwargs["connection_class"] = guarded
        for node in self.startup_nodes:
            node.connection_class = guarded

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> GatedRedisCluster:
        client = super().from_url(url, **kwargs)
        assert isinstance(client, GatedRedisCluster)
        return client

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().execute_command
        return await self._gate.run(lambda: parent(*args, **kwargs))

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _GatedPipeline(self, transaction)


class _GatedPipeline(ClusterPipeline):
    """A cluster pipeline holds one place while it runs: one connection per node at most
    (a transaction: one connection, its slot's node)."""

    # Declared by redis-py's typing protocol for commands, never set on cluster pipelines;
    # declaring it keeps mypy from taking the class for abstract.
    _event_dispatcher: Any

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = self.cluster_client
        assert isinstance(client, GatedRedisCluster)
        parent = super().execute
        result: list[Any] = await client._gate.run(
            lambda: parent(raise_on_error, allow_redirections)
        )
        return result
