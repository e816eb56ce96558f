"""The connection to Redis, or to the embedded in-process server: clients, a pool that never
sends a command down a connection the server has already dropped, a TCP connection that packs
commands with hiredis (C) instead of Python, and the errors that mean the store is unreachable.

Packing a write script's ~30 arguments in Python costs more than the rest of the request's
Redis work; hiredis does it in a few microseconds. Anything hiredis cannot pack falls back to
the library's own packer, so behaviour is unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool, Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

Redis = aioredis.Redis
# Any failure of the store; services catch this, never a Redis library class.
StoreError = RedisError
# Failures that mean the store cannot be reached (or the URL names something that is not
# Redis): answered 503 with Retry-After, never 500.
STORE_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError,
                                           InvalidResponse)

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
    """One Redis server (or the embedded one): the shared client, and more clients with
    connections of their own for blocking reads and pub/sub."""

    def __init__(self, connect: Callable[[], Redis], *, embedded: bool) -> None:
        self._connect = connect
        self.redis = connect()
        self.embedded = embedded

    @classmethod
    def open(cls, url: str | None, timeout: float) -> Backend:
        """Redis at `url`, or a fresh embedded in-process server when it is None."""
        connect: Callable[[], Redis]
        if url:
            plain_tcp = url.startswith("redis://")

            def connect() -> Redis:
                extra: dict[str, Any] = (
                    {"connection_class": HiredisPackingConnection} if plain_tcp else {})
                pool = FreshConnectionPool.from_url(
                    url, socket_timeout=timeout, socket_connect_timeout=timeout,
                    max_connections=1024, timeout=timeout, health_check_interval=10, **extra,
                )
                return aioredis.Redis.from_pool(pool)
        else:
            import fakeredis

            server = fakeredis.FakeServer()

            def connect() -> Redis:
                return fakeredis.FakeAsyncRedis(server=server)
        return cls(connect, embedded=not url)

    def new_client(self) -> Redis:
        return self._connect()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.redis.aclose()


def text(value: Any) -> str:
    """A reply value as text (replies are bytes; scripts' numbers may be ints)."""
    return value.decode() if isinstance(value, bytes) else str(value)
