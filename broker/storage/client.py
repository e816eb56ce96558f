"""The connection to Redis, or to the embedded in-process server: clients, a pool that never
sends a command down a connection the server has already dropped, a TCP connection that packs
commands with hiredis (C) instead of Python, and the errors that mean the store is unreachable.

Packing a write script's ~30 arguments in Python costs more than the rest of the request's
Redis work; hiredis does it in a few microseconds. Anything hiredis cannot pack falls back to
the library's own packer, so behaviour is unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ClusterError,
    InvalidResponse,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.core.errors import MempError, unavailable
from broker.storage.pipe import AutoPipeline
from broker.storage.records import corrupt
from broker.storage.sentinel import Follower, NotPrimary
from broker.storage.urls import RedisTarget, parse

log = logging.getLogger("memp.store")

# The client type the stores use. A Cluster client is not a subclass but answers the same
# commands the stores send (its pipelines refuse scripts: Backend.run sends those itself).
Redis = aioredis.Redis
ScriptCall = tuple[AsyncScript, list[Any], list[Any]]  # script, keys, args
# Any failure of the store; services catch this, never a Redis library class. A Cluster
# client that reaches no node at all (none up yet, or none whose certificate verifies) raises
# RedisClusterException, which is not a RedisError.
StoreError: tuple[type[Exception], ...] = (RedisError, RedisClusterException)


class NotReplicated(RedisError):
    """A write the primary applied but fewer replicas than required confirmed in time: it may
    or may not survive a failover."""

    def __init__(self, confirmed: int, required: int, timeout_ms: int) -> None:
        super().__init__(f"the write was applied, but {confirmed} of the {required} replicas "
                         f"required confirmed it within {timeout_ms} ms: it may or may not "
                         "survive a failover; retry it with the same message id")
        self.details = {"applied": True, "replicas_confirmed": confirmed,
                        "replicas_required": required}


class NoReplicas(ResponseError):
    """The primary refused a write for want of replicas (`min-replicas-to-write`): it was
    deposed, or its replicas are gone. Nothing of the write was applied, unless `part_way`."""

    def __init__(self, message: str, *, part_way: bool = False) -> None:
        super().__init__(message)
        self.part_way = part_way


# Failures that mean the store cannot be reached, or cannot take writes right now (a
# failover: a demoted primary, slots moving, a cluster without a quorum; a Redis at its
# maxmemory), or the URL names something that is not Redis: answered 503 with Retry-After,
# never 500.
STORE_DOWN: tuple[type[Exception], ...] = (
    RedisConnectionError, RedisTimeoutError, InvalidResponse, ClusterError, TryAgainError,
    ReadOnlyError, SlotNotCoveredError, AskError, NotReplicated, RedisClusterException,
    OutOfMemoryError, NoReplicas)

# Redis at `maxmemory` under `noeviction` refuses a script before its first write and a
# transaction before EXEC, so a write refused for memory was not applied (docs/design.md,
# "Redis out of memory").
OUT_OF_MEMORY = ("Redis is out of memory (maxmemory reached) and refused the write; nothing "
                 "was written. Free memory or raise maxmemory, then retry")
NO_REPLICAS = ("the Redis primary refused the write for want of replicas "
               "(min-replicas-to-write): it was deposed in a failover or lost its replicas; "
               "nothing was written. Retry it")
NO_REPLICAS_PART_WAY = ("the Redis primary refused part of the write for want of replicas "
                        "(min-replicas-to-write): what came before was written, the rest was "
                        "not. Retry it with the same id")
FAILED_OVER = ("the Redis primary changed while the write was in flight: it may have landed "
               "on the deposed primary and may or may not last; retry it with the same "
               "message id")
# A batch stored in several scripts (an AMP import of many cells) may be refused part-way.
OUT_OF_MEMORY_PART_WAY = ("Redis ran out of memory (maxmemory reached) part-way through the "
                          "write: what came before was written, the rest was not. Free memory "
                          "or raise maxmemory, then retry it with the same id")


def out_of_memory(exc: BaseException) -> bool:
    """Whether Redis refused a write for memory: it answers, so this is no outage."""
    return isinstance(exc, OutOfMemoryError)


def store_down(exc: BaseException) -> MempError:
    """The 503 for a store failure: a write refused for memory says so and that it was not
    applied; one that replicas did not confirm in time says it was applied and may or may not
    survive a failover; anything else is unreachable."""
    if isinstance(exc, OutOfMemoryPartWay):
        return unavailable(OUT_OF_MEMORY_PART_WAY, {"reason": "out_of_memory"})
    if out_of_memory(exc):
        return unavailable(OUT_OF_MEMORY, {"reason": "out_of_memory", "applied": False})
    if isinstance(exc, NotReplicated):
        return unavailable(str(exc), exc.details)
    if isinstance(exc, NoReplicas):
        if exc.part_way:
            return unavailable(NO_REPLICAS_PART_WAY, {"reason": "no_replicas"})
        return unavailable(NO_REPLICAS, {"reason": "no_replicas", "applied": False})
    if isinstance(exc, NotPrimary):
        return unavailable(FAILED_OVER, {"reason": "failover"})
    return unavailable()

# Argument types the library encodes its own way (float repr, bool refused, buffers); checked by
# exact type, which is all the broker passes.
_LIBRARY_PACKS = frozenset((float, bool, memoryview, bytearray))


class FreshConnectionPool(BlockingConnectionPool):
    """Hands out a pooled connection only once it is known to be usable; one the server hung
    up on (a Redis restart, a killed client, a reset) is replaced before anything is sent.

    redis-py checks pooled connections itself, but 8.x skips the check while maintenance
    notifications are "auto" (its default, truthy), so after a Redis restart every idle
    connection failed once, on the command it carried. See docs/design.md, "Redis restarts"."""

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        conn: Any = connection  # redis-py leaves connect() and check_health() untyped
        await conn.connect()
        try:
            if _hung_up(conn) or await conn.can_read():
                # The server closed or reset it, or it holds an unread reply: not reusable.
                raise RedisConnectionError("pooled connection is no longer usable")
            # A PING when the connection has been idle past health_check_interval; one that
            # fails with a connection error means the connection died without a word.
            await conn.check_health()
        except (RedisConnectionError, OSError):
            await conn.disconnect()
            await conn.connect()


def _hung_up(connection: AbstractConnection) -> bool:
    """True when the transport is gone: a reset arrives as a closed transport, not as EOF."""
    writer = getattr(connection, "_writer", None)
    return writer is None or bool(writer.is_closing())


class HiredisPackingConnection(Connection):
    """TCP connection whose command packing runs in hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        if not _LIBRARY_PACKS.isdisjoint(map(type, args)):
            return super().pack_command(*args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return super().pack_command(*args)


class Backend:
    """The Redis deployment (one server, Sentinel, Cluster) or the embedded server: the shared
    client, more clients with connections of their own for blocking reads, and script calls
    that wait for replicas when writes must survive a failover (`MEMP_WRITE_REPLICAS`)."""

    def __init__(self, connect: Callable[[], Redis], *, kind: str = "single",
                 embedded: bool = False, replicas: int = 0, wait_ms: int = 1000,
                 pipe: AutoPipeline | None = None) -> None:
        self._connect = connect
        self.redis = connect()
        self.kind = kind
        self.embedded = embedded
        self.replicas = replicas
        self.wait_ms = wait_ms
        # The hot path's commands on one `redis://` server (see pipe.py); None elsewhere.
        self.pipe = pipe
        self._sentinels: list[Redis] = []  # Sentinel's own clients, closed with the backend
        # On Sentinel: what moves every client to the primary the sentinels name.
        self.follower: Follower | None = None

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"

    @classmethod
    def open(cls, url: str | None, timeout: float, *, replicas: int = 0,
             wait_ms: int = 1000) -> Backend:
        """Redis at `url` (see broker/storage/urls.py), or a fresh embedded in-process server
        when it is None."""
        if not url:
            import fakeredis

            server = fakeredis.FakeServer()
            return cls(lambda: fakeredis.FakeAsyncRedis(server=server), embedded=True)
        target = parse(url)
        if target.kind == "sentinel":
            sentinel = _sentinel(target, timeout)
            follower = Follower(sentinel, target.service)
            backend = cls(follower.client, kind="sentinel", replicas=replicas,
                          wait_ms=wait_ms)
            backend._sentinels = sentinel.sentinels
            backend.follower = follower
            return backend
        connect = _cluster if target.kind == "cluster" else _single
        pipe = AutoPipeline(target.url, timeout) if target.url.startswith("redis://") else None
        return cls(lambda: connect(target, timeout), kind=target.kind, replicas=replicas,
                   wait_ms=wait_ms, pipe=pipe)

    def new_client(self) -> Redis:
        return self._connect()

    async def ping(self) -> bool:
        """Whether the store answers. On a Cluster: True when every primary answers, False
        when only some do (a shard failing over: the other shards' keys are still served),
        the error when none does; a failed ping refreshes the topology, so a finished
        failover is seen at once."""
        if not self.cluster:
            return bool(await self.redis.ping())
        cluster = cast(RedisCluster, self.redis)
        primaries = cluster.get_primaries()
        try:
            if not primaries:  # no topology yet: the client discovers it
                return bool(await cluster.ping(target_nodes=RedisCluster.PRIMARIES))
            replies = await asyncio.gather(*(cluster.ping(target_nodes=node)
                                             for node in primaries), return_exceptions=True)
        except (RedisConnectionError, RedisTimeoutError, ClusterError):
            await refresh(cluster)
            raise
        failed = [r for r in replies if isinstance(r, BaseException)]
        for exc in failed:
            if not isinstance(exc, (RedisConnectionError, RedisTimeoutError, ClusterError)):
                raise exc
        if failed:
            await refresh(cluster)
            if len(failed) == len(replies):
                raise failed[0]
        return not failed

    async def close(self) -> None:
        if self.pipe is not None:
            await self.pipe.close()
        await self.redis.aclose()
        for client in self._sentinels:
            await client.aclose()

    # ---- script calls ----

    async def call(self, script: AsyncScript, keys: list[Any], args: list[Any], *,
                   durable: bool = False, replayable: bool = False) -> Any:
        """One script call; `durable` writes wait for the required replicas (`replayable`:
        see `run`)."""
        return (await self.run([(script, keys, args)], durable=durable,
                               replayable=replayable))[0]

    async def run(self, calls: Sequence[ScriptCall], *, durable: bool = False,
                  replayable: bool = False) -> list[Any]:
        """Script calls, in one round trip where the deployment allows it (a Cluster refuses
        scripts in pipelines: there they go concurrently, each to its slot's primary).
        `durable` writes then wait until `replicas` replicas have them (WAIT, on the same
        connection), or raise NotReplicated. A script that found a record it cannot read
        (a `CORRUPT` error, common.lua) raises CorruptRecord.

        `replayable` calls answer a second sending from their first outcome (a write under a
        message id: its script replays the reply it remembered), so when their connection
        closed under them, or the primary moved while they were in flight, whether they ran
        is unknown but harmless: they are sent once more, on a new connection (to the new
        primary), instead of failing with a 503 that cannot say whether they were applied."""
        for attempt in range(2 if replayable else 1):
            epoch = self._epoch()
            try:
                replies = await self._run(calls, durable)
            except ResponseError as exc:
                raise _refused(corrupt(exc)) from None
            except RedisConnectionError:
                if attempt or not replayable:
                    raise
                log.info("a connection closed under a replayable write; sending it again")
                continue
            if self._epoch() == epoch:
                return replies
            if attempt or not replayable:
                raise NotPrimary("the primary changed while the write was in flight")
            log.info("the primary moved under a replayable write; sending it again")
        raise AssertionError("unreachable")  # pragma: no cover

    def _epoch(self) -> int:
        """How often the primary moved under this process's clients (Sentinel; 0 elsewhere):
        a call across a move may have run on the deposed primary."""
        if self.follower is None:
            return 0
        return int(getattr(self.redis.connection_pool, "epoch", 0))

    async def follow_failovers(self) -> None:
        """Move every client to the new primary the moment the sentinels announce a failover
        (broker/storage/sentinel.py); returns at once elsewhere."""
        if self.follower is not None:
            await self.follower.run()

    async def _run(self, calls: Sequence[ScriptCall], durable: bool) -> list[Any]:
        wait = durable and self.replicas > 0
        if self.cluster:
            results = await asyncio.gather(*(self._on_primary(c, wait) for c in calls),
                                           return_exceptions=True)
            return _all_or_first_failure(results)
        if len(calls) == 1 and not wait:  # a call of its own costs less than a pipeline
            script, keys, args = calls[0]
            if self.pipe is not None:
                return [await _auto_pipelined(self.pipe, script, keys, args)]
            return [await script(keys, args)]
        return await self._pipelined(calls, wait)

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        """A hash's fields (the hot path's read: auto-pipelined on one server)."""
        try:
            if self.pipe is None:
                return cast(dict[bytes, bytes], await self.redis.hgetall(key))
            flat = await self.pipe.execute("HGETALL", key)
        except ResponseError as exc:
            raise corrupt(exc, key) from None
        return dict(zip(flat[::2], flat[1::2], strict=True))

    async def _pipelined(self, calls: Sequence[ScriptCall], wait: bool) -> list[Any]:
        """Calls by digest in one pipeline (and a WAIT after them). Calls Redis refuses for an
        unknown script (a restart or SCRIPT FLUSH emptied its cache) did not run; they are sent
        again, in order, once their scripts are loaded. Replicas are counted only once every
        call ran: each pipeline's WAIT (on its own connection) covers the calls it ran."""
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        confirmations: list[Any] = []
        ran = False  # some call of the batch ran: a later refusal leaves what it wrote
        for attempt in range(2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in pending:
                    script, keys, args = calls[i]
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                if wait:
                    pipe.execute_command("WAIT", self.replicas, self.wait_ms)
                results = await pipe.execute(raise_on_error=False)
            confirmed = results.pop() if wait else None
            unknown = []
            ran = ran or any(not isinstance(r, Exception) for r in results)
            for i, result in zip(pending, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 0:
                    unknown.append(i)
                elif isinstance(result, Exception):
                    raise _part_way(result, ran)
                else:
                    replies[i] = result
            if wait and len(unknown) < len(pending):  # this pipeline wrote something
                confirmations.append(confirmed)
            if not unknown:
                break
            for script in {calls[i][0].sha: calls[i][0] for i in unknown}.values():
                await self.redis.script_load(script.script)
            pending = unknown
        for confirmed in confirmations:
            self._confirmed(confirmed)
        return replies

    async def _on_primary(self, call: ScriptCall, wait: bool) -> Any:
        """A Cluster script call on a connection of its slot's primary, and its WAIT on the
        same connection (the client's own routing would hand WAIT to another one, where it
        means nothing). The script is loaded on that primary when it lacks it: a replica
        promoted in a failover has never seen it, and the client's own reload asks every
        primary, the dead one too. A slot that moved was not run there: the topology is
        refreshed and the call sent once more; a connection that failed may have run it, so
        that is a 503 to retry with the message id."""
        cluster = cast(RedisCluster, self.redis)
        for attempt in range(2):
            try:
                return await self._on_node(cluster, call, wait)
            except AskError:  # MOVED or ASK: the slot is served elsewhere now
                await refresh(cluster)
                if attempt:
                    raise
            except (RedisConnectionError, RedisTimeoutError, SlotNotCoveredError):
                await refresh(cluster)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _on_node(self, cluster: RedisCluster, call: ScriptCall, wait: bool) -> Any:
        script, keys, args = call
        node = cluster.get_node_from_key(keys[0])
        if node is None:
            raise SlotNotCoveredError(f"no primary serves the slot of {keys[0]!r}")
        connection = await _connected(node)
        try:
            reply = await _command(connection, "EVALSHA", script.sha, len(keys), *keys, *args)
            if isinstance(reply, NoScriptError):
                await _command(connection, "SCRIPT", "LOAD", script.script)
                reply = await _command(connection, "EVALSHA", script.sha, len(keys), *keys,
                                       *args)
            if isinstance(reply, Exception):
                raise reply
            if wait:
                self._confirmed(await _command(connection, "WAIT", self.replicas,
                                               self.wait_ms))
            return reply
        except (RedisConnectionError, RedisTimeoutError):
            await connection.disconnect()
            raise
        finally:
            node.release(connection)

    def _confirmed(self, count: Any) -> None:
        if isinstance(count, ResponseError) and "replica" in str(count):
            # "WAIT cannot be used with replica instances": demoted since the write ran.
            raise NotPrimary("the primary was demoted before replicas confirmed the write")
        if isinstance(count, Exception):
            raise count
        if int(count) < self.replicas:
            raise NotReplicated(int(count), self.replicas, self.wait_ms)


class OutOfMemoryPartWay(OutOfMemoryError):
    """Redis refused a batch's script for memory after running others of the batch: what
    they wrote stays."""


def _part_way(failure: Exception, others_ran: bool) -> Exception:
    if others_ran and isinstance(failure, OutOfMemoryError):
        return OutOfMemoryPartWay(str(failure))
    return _refused(failure, part_way=others_ran)


def _refused(failure: Exception, *, part_way: bool = False) -> Exception:
    """A `NOREPLICAS` refusal (Redis sends it as a plain error reply) as NoReplicas."""
    if type(failure) is ResponseError and "NOREPLICAS" in str(failure).split(" ", 2)[:2]:
        return NoReplicas(str(failure), part_way=part_way)
    return failure


def _all_or_first_failure(results: Sequence[Any]) -> list[Any]:
    """Concurrent calls' replies, or the first failure (saying when others ran)."""
    failures = [r for r in results if isinstance(r, BaseException)]
    if not failures:
        return list(results)
    if not isinstance(failures[0], Exception):
        raise failures[0]
    raise _part_way(failures[0], len(failures) < len(results))


async def _auto_pipelined(pipe: AutoPipeline, script: AsyncScript, keys: list[Any],
                          args: list[Any]) -> Any:
    """One script call in this turn's batch; a script Redis does not know (a restart or SCRIPT
    FLUSH emptied its cache) did not run, and is sent again once loaded."""
    try:
        return await pipe.execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await pipe.execute("SCRIPT", "LOAD", script.script)
        return await pipe.execute("EVALSHA", script.sha, len(keys), *keys, *args)


async def stream_continues(client: Redis, key: str, position: str) -> bool:
    """Whether every record of the capped stream `key` after `position` is still kept."""
    oldest: Any = await client.xrange(key, "-", "+", count=1)
    if not oldest:
        return True  # nothing kept, so nothing after `position` was trimmed either
    # Kept from `oldest` on: continuous only if that reaches back to `position` (a trim, or
    # Redis losing its data, may otherwise have dropped records in between).
    return _stream_order(text(oldest[0][0])) <= _stream_order(position)


def _stream_order(position: str) -> tuple[int, int]:
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


async def read_stream(client: Redis, key: str, position: str, count: int, block_ms: int
                      ) -> list[Any]:
    """XREAD of one stream after `position`, waiting up to `block_ms`: its records.

    On a Cluster the read goes straight to the primary of the key's slot. The client would
    otherwise first ask its default node which argument of XREAD is the key (COMMAND GETKEYS),
    and after that node died in a failover it would keep asking it, failing every read until
    the topology was refreshed by some other command. A read that fails refreshes it."""
    if not isinstance(client, RedisCluster):
        found: Any = await client.xread({key: position}, count=count, block=block_ms)
        return list(found[0][1]) if found else []
    node = client.get_node_from_key(key)
    try:
        if node is None:
            raise SlotNotCoveredError(f"no primary serves the slot of {key!r}")
        for attempt in range(2):  # a read: sent again once if its connection closed under it
            try:
                found = await client.execute_command(
                    "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, position,
                    target_nodes=node)
                break
            except (RuntimeError, AttributeError) as exc:
                if not _transport_closed(exc):
                    raise
                if attempt:
                    raise ClosedUnderUse("the connection was closed under the read") from exc
    except (RedisConnectionError, RedisTimeoutError, ClusterError, SlotNotCoveredError):
        await refresh(client)
        raise
    if not found:
        return []
    # RESP2 gives [[key, records]]; a RESP3 server, {key: records}.
    return list(found[0][1] if isinstance(found, list) else next(iter(found.values())))


def _transport_closed(exc: BaseException) -> bool:
    """What redis-py before 8.2 let through when a connection it was using was closed by
    another task (it keeps no connection in hand to look at)."""
    text = str(exc)
    return ("unable to perform operation" in text or "'NoneType' object has no attribute" in text)


async def refresh(client: Any) -> None:
    """Ask a Cluster for its current topology (after a failover); nothing elsewhere."""
    if isinstance(client, RedisCluster):
        with contextlib.suppress(RedisError, OSError):
            await client.nodes_manager.initialize()


class ClosedUnderUse(RedisConnectionError):
    """A connection closed by another task while a command used it (a topology refresh
    closing pooled connections): the command may or may not have run."""


def _closed_under_use(exc: BaseException, connection: Any) -> bool:
    """Whether `exc` is what a write or connect on a connection closed meanwhile raises
    (uvloop's "unable to perform operation on <TCPTransport closed=True>", or a writer that is
    gone), rather than a fault of the broker's own."""
    return isinstance(exc, RuntimeError | AttributeError) and _hung_up(connection)


async def _connected(node: ClusterNode) -> Connection:
    """A connection of `node`, connected before anything is sent on it. One another task
    closed under its connect (redis-py before 8.2 closed every node's connections when a
    topology refresh failed) is replaced, once: nothing was sent, so that is always safe."""
    for attempt in range(2):
        connection = node.acquire_connection()
        conn: Any = connection
        try:
            if conn.should_reconnect():  # marked by a topology refresh
                await conn.disconnect()
            if not conn.is_connected:
                await conn.connect()
            return connection
        except (RuntimeError, AttributeError) as exc:
            if not _closed_under_use(exc, conn):
                node.release(connection)
                raise
            await conn.disconnect()
            node.release(connection)
            if attempt:
                raise ClosedUnderUse("the connection was closed while it connected") from exc
        except BaseException:
            node.release(connection)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


async def _command(connection: Connection, *args: Any) -> Any:
    """Send one command on a connection the caller holds; a Redis error reply is returned.
    A connection closed under it is a ConnectionError (a 503), never a 500."""
    try:
        await connection.send_packed_command(connection.pack_command(*args))
        return await connection.read_response()
    except NoScriptError as exc:
        return exc
    except (RuntimeError, AttributeError) as exc:
        if _closed_under_use(exc, connection):
            raise ClosedUnderUse("the connection was closed under the command") from exc
        raise


def _single(target: RedisTarget, timeout: float) -> Redis:
    extra: dict[str, Any] = (
        {"connection_class": HiredisPackingConnection} if target.url.startswith("redis://")
        else {})
    pool = FreshConnectionPool.from_url(
        target.url, socket_timeout=timeout, socket_connect_timeout=timeout,
        max_connections=1024, timeout=timeout, health_check_interval=10, **extra)
    return aioredis.Redis.from_pool(pool)


def _sentinel(target: RedisTarget, timeout: float) -> Sentinel:
    """The sentinels of a service; `master_for` gives a client of its current primary, asked of
    the sentinels on every new connection: after a failover, connections to the old primary
    fail once and reconnect to the new one."""
    options = target.connection_options()
    # A sentinel that fails is not retried: the next one is asked at once (redis-py's default
    # retries with backoff held every discovery ~4 s per sentinel out of reach).
    sentinel_options: dict[str, Any] = {"socket_timeout": timeout,
                                        "socket_connect_timeout": timeout,
                                        "retry": Retry(NoBackoff(), 0)}
    if target.sentinel_password:
        sentinel_options.update(username=target.sentinel_username,
                                password=target.sentinel_password)
    if target.ssl:
        sentinel_options.update(ssl=True, **target.tls)
    sentinel = Sentinel(
        list(target.hosts), sentinel_kwargs=sentinel_options,
        socket_timeout=timeout, socket_connect_timeout=timeout, health_check_interval=10,
        **options)
    return sentinel


def _cluster(target: RedisTarget, timeout: float) -> Redis:
    nodes = [ClusterNode(host, port) for host, port in target.hosts]
    client = RedisCluster(startup_nodes=nodes, socket_timeout=timeout,
                          socket_connect_timeout=timeout, health_check_interval=10,
                          **target.connection_options())
    return cast(Redis, client)


def text(value: Any) -> str:
    """A reply value as text (replies are bytes; scripts' numbers may be ints)."""
    return value.decode() if isinstance(value, bytes) else str(value)
