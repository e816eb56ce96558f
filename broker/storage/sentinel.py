"""Following Sentinel's word: connections only to the primary the sentinels name, moved the
moment they announce a failover.

redis-py asks the sentinels for the primary only when it opens a connection, and keeps using
every open one: after a primary paused and resumed (SIGSTOP, a long GC pause of a VM) the
pooled connections wrote to the deposed node for seconds, until Sentinel demoted it, and those
writes vanished when it resynced. Here every broker process subscribes to the sentinels'
`+switch-master` and, within a second of a failover, drops the idle connections to the old
primary, closes the busy ones once their command ends, and counts the move (the pool's
`epoch`): a write in flight across a move answers 503 (it may have landed on the deposed
node). A new connection checks with `ROLE` that the node it reached is a primary."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError

log = logging.getLogger("memp.store")

Address = tuple[str, int]
SWITCH = "+switch-master"
# After a `+switch-master`, a sentinel that has not heard of it yet may still name the old
# primary for a moment; its word does not undo the announced move for this long.
TRUST_SWITCH_SECONDS = 5.0
RETRY_SECONDS = 1.0  # a sentinel out of reach is subscribed to again this often


class NotPrimary(RedisConnectionError):
    """The node is not (or no longer) the primary: nothing was sent to it, or a write sent
    before the failover was announced may have landed on the deposed node."""


class FollowingConnection(SentinelManagedConnection):
    """A connection to the service's primary that checks, once connected, that the node says
    it is one (`ROLE`; an ACL user without that command is taken at Sentinel's word)."""

    async def connect_to(self, address: Any) -> None:
        await super().connect_to(address)  # type: ignore[no-untyped-call]
        if not self.connection_pool.is_master:
            return
        try:
            await self.send_command("ROLE")
            reply = await self.read_response()
        except NoPermissionError:
            return
        role = reply[0] if isinstance(reply, list) and reply else b""
        if (role.decode() if isinstance(role, bytes) else str(role)) != "master":
            await self.disconnect()
            raise NotPrimary(f"{address[0]}:{address[1]} is not a primary (ROLE {role!r})")


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    pass


class FollowingPool(SentinelConnectionPool):
    """A pool of connections to the primary that moves them when told the primary moved;
    `epoch` counts the moves."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        kwargs.setdefault("connection_class", FollowingSSLConnection if kwargs.pop("ssl", False)
                          else FollowingConnection)
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self.epoch = 0
        self._moved_at = float("-inf")

    async def follow(self, address: Address, *, announced: bool = False) -> None:
        """The primary is at `address`: idle connections elsewhere close now, busy ones once
        their command ends."""
        if address == self.master_address:
            return
        if self.master_address is not None:
            self.epoch += 1
            log.warning("Sentinel names a new primary for %s: %s:%s", self.service_name,
                        *address)
        self.master_address = address
        if announced:
            self._moved_at = time.monotonic()
        for connection in list(self._in_use_connections):
            connection.mark_for_reconnect()  # type: ignore[no-untyped-call]
        with contextlib.suppress(RedisError, OSError):
            await self.disconnect(inuse_connections=False)

    async def get_master_address(self) -> Address:
        found: Address = await self.sentinel_manager.discover_master(self.service_name)
        current: Address | None = self.master_address
        if (current is not None and found != current
                and time.monotonic() - self._moved_at < TRUST_SWITCH_SECONDS):
            return current  # a sentinel that has not heard of the move yet
        await self.follow(found)
        return found

    async def ensure_connection(self, connection: Any) -> None:
        """A pooled connection to a node that is no longer the primary is not reused."""
        if (connection.is_connected and self.master_address is not None
                and (connection.host, connection.port) != self.master_address):
            await connection.disconnect()
        await super().ensure_connection(connection)


class Follower:
    """The sentinels of one service, the clients of its primary, and the loop that moves them
    all when the sentinels announce a failover."""

    def __init__(self, sentinel: Sentinel, service: str) -> None:
        self.sentinel = sentinel
        self.service = service
        self._pools: weakref.WeakSet[FollowingPool] = weakref.WeakSet()

    def client(self) -> aioredis.Redis:
        client: aioredis.Redis = self.sentinel.master_for(
            self.service, connection_pool_class=FollowingPool)
        self._pools.add(client.connection_pool)  # type: ignore[arg-type]
        return client

    async def move(self, address: Address, *, announced: bool = False) -> None:
        for pool in list(self._pools):
            await pool.follow(address, announced=announced)

    async def run(self) -> None:
        """Listen to every sentinel's `+switch-master` (one that is out of reach is tried again
        each second; the others keep listening)."""
        await asyncio.gather(*(self._listen(client) for client in self.sentinel.sentinels))

    async def _listen(self, client: aioredis.Redis) -> None:
        while True:
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(SWITCH)
                    # A failover announced while this sentinel was not listened to.
                    with contextlib.suppress(RedisError, OSError):
                        await self.move(await self.sentinel.discover_master(self.service))
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                           timeout=1.0)
                        if message is not None:
                            await self._switched(message.get("data"))
            except (RedisError, OSError) as exc:
                log.debug("sentinel subscription lost: %s", exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def _switched(self, data: Any) -> None:
        """`<service> <old ip> <old port> <new ip> <new port>`."""
        text = data.decode() if isinstance(data, bytes) else str(data)
        parts = text.split()
        if len(parts) == 5 and parts[0] == self.service and parts[4].isdigit():
            await self.move((parts[3], int(parts[4])), announced=True)
