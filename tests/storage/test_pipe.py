"""The auto-pipelined connection (broker/storage/pipe.py): one turn's commands in one write,
replies matched in order, errors as redis-py raises them, and the pool's failure rules: a
connection the server or the network dropped is replaced before anything is sent on it, one
idle past the health-check interval is PINGed first, and a command sent when Redis stops
answering fails with a timeout (a 503) instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import warnings

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.storage.client import Backend
from broker.storage.pipe import AutoPipeline
from tests.support.brokers import RedisServer
from tests.support.relay import RelayProxy


def _run(main: object) -> None:
    asyncio.run(asyncio.wait_for(main, 30))  # type: ignore[arg-type]


async def _count_each_once(pipe: AutoPipeline, calls: int) -> list[int]:
    """INCR is not idempotent: each result appears once only if each call ran exactly once."""
    return sorted(await asyncio.gather(*(pipe.execute("INCR", "counter")
                                         for _ in range(calls))))


def test_concurrent_commands_share_a_write_and_get_their_own_replies(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        pipe = AutoPipeline(private_redis.url, timeout=2)
        await asyncio.gather(*(pipe.execute("SET", f"k{i}", f"v{i}") for i in range(300)))
        got = await asyncio.gather(*(pipe.execute("GET", f"k{i}") for i in range(300)))
        assert got == [f"v{i}".encode() for i in range(300)]
        assert await _count_each_once(pipe, 200) == list(range(1, 201))
        client = aioredis.Redis.from_url(private_redis.url)
        assert await client.client_list(_type="normal") is not None
        # the 300 + 300 + 200 commands went over one connection (besides this client's)
        assert len(await client.client_list(_type="normal")) == 2
        await client.aclose()
        await pipe.close()

    _run(main())


def test_error_replies_raise_redis_py_errors_and_leave_the_others_alone(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        pipe = AutoPipeline(private_redis.url, timeout=2)
        results = await asyncio.gather(
            pipe.execute("SET", "s", "x"), pipe.execute("EVALSHA", "0" * 40, 0),
            pipe.execute("HGETALL", "s"), pipe.execute("GET", "s"), return_exceptions=True)
        assert results[0] == b"OK"
        assert isinstance(results[1], NoScriptError)
        assert isinstance(results[2], ResponseError) and "WRONGTYPE" in str(results[2])
        assert results[3] == b"x"
        await pipe.close()

    _run(main())


def test_connections_the_server_closed_are_replaced_before_use(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        pipe = AutoPipeline(private_redis.url, timeout=2)
        assert await pipe.execute("PING") == b"PONG"
        killer = aioredis.Redis.from_url(private_redis.url)
        await killer.client_kill_filter(_type="normal", skipme=True)  # a FIN
        await killer.aclose()
        await asyncio.sleep(0.1)
        assert await _count_each_once(pipe, 8) == list(range(1, 9))
        await pipe.close()

    _run(main())


def test_connections_reset_by_the_network_are_replaced_before_use(relay: RelayProxy) -> None:
    async def main() -> None:
        pipe = AutoPipeline(relay.url, timeout=2)
        assert await pipe.execute("PING") == b"PONG"
        relay.reset()
        await asyncio.sleep(0.1)
        assert await _count_each_once(pipe, 8) == list(range(1, 9))
        await pipe.close()

    _run(main())


def test_connections_that_died_silently_fail_their_health_check_not_the_command(
    relay: RelayProxy,
) -> None:
    async def main() -> None:
        pipe = AutoPipeline(relay.url, timeout=2, health_check_interval=0.2)
        assert await pipe.execute("PING") == b"PONG"
        relay.go_silent()
        await asyncio.sleep(0.3)  # idle past the interval: the next use PINGs first
        assert await _count_each_once(pipe, 8) == list(range(1, 9))
        await pipe.close()

    _run(main())


def test_a_server_that_stops_answering_times_out_every_waiting_command() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts, never answers
        port = mute.getsockname()[1]

        async def main() -> None:
            pipe = AutoPipeline(f"redis://127.0.0.1:{port}/0", timeout=0.3)
            results = await asyncio.gather(*(pipe.execute("GET", f"k{i}") for i in range(5)),
                                           return_exceptions=True)
            assert all(isinstance(r, RedisTimeoutError) for r in results), results
            await pipe.close()

        _run(main())


def test_a_server_that_is_gone_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused

    async def main() -> None:
        pipe = AutoPipeline(f"redis://127.0.0.1:{port}/0", timeout=1)
        with pytest.raises(RedisConnectionError):
            await pipe.execute("PING")

    _run(main())


def test_credentials_and_database_from_the_url(private_redis: RedisServer) -> None:
    async def main() -> None:
        admin = aioredis.Redis.from_url(private_redis.url)
        await admin.acl_setuser("hot", enabled=True, passwords=["+s3cret"], keys=["*"],
                                commands=["+@all"])
        try:
            url = f"redis://hot:s3cret@127.0.0.1:{private_redis.port}/3"
            pipe = AutoPipeline(url, timeout=2)
            assert await pipe.execute("SET", "in-db-3", "yes") == b"OK"
            await pipe.close()
            db3 = aioredis.Redis.from_url(f"redis://127.0.0.1:{private_redis.port}/3")
            assert await db3.get("in-db-3") == b"yes"
            assert await admin.get("in-db-3") is None
            await db3.aclose()
            wrong = AutoPipeline(f"redis://hot:wrong@127.0.0.1:{private_redis.port}/0", 2)
            with pytest.raises(RedisConnectionError):  # AuthenticationError is one
                await wrong.execute("PING")
        finally:
            with contextlib.suppress(Exception):
                await admin.acl_deluser("hot")
            await admin.aclose()

    _run(main())


def test_a_script_redis_forgot_is_loaded_and_run_once(private_redis: RedisServer) -> None:
    async def main() -> None:
        backend = Backend.open(private_redis.url, 2)
        assert backend.pipe is not None
        script = backend.redis.register_script("return redis.call('INCR', KEYS[1])")
        assert await backend.call(script, ["n"], []) == 1
        await backend.redis.script_flush()
        assert await backend.call(script, ["n"], []) == 2
        assert await backend.redis.get("n") == b"2"
        await backend.close()

    _run(main())


def test_a_pipe_used_again_from_another_event_loop_connects_anew(
    private_redis: RedisServer,
) -> None:
    pipe = AutoPipeline(private_redis.url, timeout=2)
    with warnings.catch_warnings():
        # A closed loop cannot close its sockets any more; collected here, not in a later test.
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(2):  # the first loop, and its connection, are gone by the second run
            assert asyncio.run(asyncio.wait_for(pipe.execute("PING"), 10)) == b"PONG"
        asyncio.run(pipe.close())
        gc.collect()


def test_a_failed_connect_is_not_the_answer_to_later_commands(
    private_redis: RedisServer,
) -> None:
    async def main() -> None:
        pipe = AutoPipeline(private_redis.url, timeout=2)
        assert await pipe.execute("PING") == b"PONG"
        private_redis.stop()
        results = await asyncio.gather(*(pipe.execute("PING") for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        private_redis.start()
        assert await _count_each_once(pipe, 4) == [1, 2, 3, 4]
        await pipe.close()

    _run(main())
