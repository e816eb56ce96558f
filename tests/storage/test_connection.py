"""Redis connections: the hiredis packer produces exactly the bytes redis-py's own packer does,
and the pool replaces connections the server or the network dropped before sending on them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from broker.storage.client import FreshConnectionPool, HiredisPackingConnection
from tests.support.brokers import RedisServer
from tests.support.relay import RelayProxy


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("SET", "key", "value"), id="strings"),
        pytest.param(("EVALSHA", "abc", 2, "k1", b"k2", "x\u00e9", 12345678901234, b"\x00\xff"),
                     id="script-call"),
        pytest.param(("CONFIG GET", "maxmemory"), id="two-word-command"),
        pytest.param((b"CLIENT SETNAME", b"x"), id="two-word-bytes"),
        pytest.param(("ZADD", "z", 1.5, "m"), id="float"),
        pytest.param(("SET", "k", memoryview(b"abc")), id="memoryview"),
        pytest.param(("SET", "k", "x" * 100_000), id="large"),
        pytest.param(("XADD", "s", "*", "v", -3), id="negative"),
    ],
)
def test_packing_matches_redis_py(args: tuple[Any, ...]) -> None:
    ours = b"".join(bytes(part) for part in HiredisPackingConnection().pack_command(*args))
    theirs = b"".join(bytes(part) for part in Connection().pack_command(*args))
    assert ours == theirs


# ---- the pool: connections the server dropped are replaced before anything is sent ----


async def _pooled_client(url: str, **options: Any) -> tuple[aioredis.Redis, int]:
    """A client like the store's, with several connections open in its pool."""
    pool = FreshConnectionPool.from_url(url, connection_class=HiredisPackingConnection,
                                        socket_timeout=2, max_connections=16, **options)
    client = aioredis.Redis.from_pool(pool)
    await asyncio.gather(*(client.blpop(["nothing"], timeout=0.05) for _ in range(8)))
    return client, len(pool._available_connections)


async def _count_each_once(client: aioredis.Redis, calls: int) -> list[int]:
    """INCR is not idempotent: each result appears once only if each call ran exactly once."""
    return sorted(await asyncio.gather(*(client.incr("counter") for _ in range(calls))))


def test_connections_the_server_closed_are_replaced_before_use(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        client, pooled = await _pooled_client(private_redis.url)
        assert pooled == 8
        killer = aioredis.Redis.from_url(private_redis.url)
        await killer.client_kill_filter(_type="normal", skipme=True)  # a FIN on each
        await killer.aclose()
        await asyncio.sleep(0.1)
        assert await _count_each_once(client, 8) == list(range(1, 9))
        await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_connections_reset_by_the_network_are_replaced_before_use(relay: RelayProxy) -> None:
    async def main() -> None:
        client, pooled = await _pooled_client(relay.url)
        assert pooled == 8
        relay.reset()
        await asyncio.sleep(0.1)
        assert await _count_each_once(client, 8) == list(range(1, 9))
        await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_connections_that_died_silently_fail_their_health_check_not_the_command(
    relay: RelayProxy,
) -> None:
    async def main() -> None:
        client, pooled = await _pooled_client(relay.url, health_check_interval=0.2)
        assert pooled == 8
        relay.go_silent()
        await asyncio.sleep(0.3)  # idle past the interval: the next use PINGs first
        assert await _count_each_once(client, 8) == list(range(1, 9))
        await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
