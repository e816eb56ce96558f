"""Redis connections: a pool that never sends a command down a connection the server has
already dropped, and a TCP connection that packs commands with hiredis (C) instead of Python.

Packing a write script's ~30 arguments in Python costs more than the rest of the request's
Redis work; hiredis does it in a few microseconds. Anything hiredis cannot pack falls back to
the library's own packer, so behaviour is unchanged."""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, BlockingConnectionPool, Connection
from redis.exceptions import ConnectionError as RedisConnectionError

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
