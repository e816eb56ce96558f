"""Redis connections: the hiredis packer produces exactly the bytes redis-py's own packer does,
and the pool replaces connections the server or the network dropped before sending on them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from broker.storage.client import FreshConnectionPool, HiredisPackingConnection
from tests.conftest import RedisServer


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


class RelayProxy:
    """Relays TCP to Redis. `reset()` resets every relayed connection at once; `go_silent()`
    makes them drop what they are sent and reset only then, as a connection that died without
    a word (a NAT or load balancer that forgot it) does."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.silent: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self.lock:
                self.pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if source in self.silent:
                    _reset(source)
                    _reset(target)
                    return
                target.sendall(chunk)
        _reset(target)

    def reset(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)

    def go_silent(self) -> None:
        with self.lock:
            self.silent |= {client for client, _ in self.pairs}

    def close(self) -> None:
        self.listener.close()
        self.reset()


def _reset(sock: socket.socket) -> None:
    """Close with an RST, not a FIN (SO_LINGER with a zero timeout); shutting the reading side
    first wakes a thread blocked reading it, which would otherwise keep the socket open."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    sock.close()


@pytest.fixture
def relay(private_redis: RedisServer) -> Iterator[RelayProxy]:
    proxy = RelayProxy(private_redis.port)
    yield proxy
    proxy.close()


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
