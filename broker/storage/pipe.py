"""An auto-pipelining connection to one Redis server for the hot path (a put's script call, a
get's HGETALL), as ioredis and Lettuce do it: the commands that requests issue in one turn of
the event loop leave in one socket write, and their replies are matched to them in order.

redis-py spends more on a command than Redis does (a pool checkout and its checks, a retry
wrapper, a timeout context and a socket write per command, a read per reply); here a command
costs one hiredis pack, a future, and its share of one write and one read. Everything is on
one connection, so Redis also reads and answers the commands in batches.

The failure rules are the pool's (docs/design.md, "Redis restarts"): a command is sent only on
a connection not known to be dead, one idle past the health-check interval is PINGed before
anything goes on it, and a command that was sent when the connection failed or timed out is
answered with redis-py's ConnectionError or TimeoutError (503: it may have run). A timeout
drops the connection, since later replies could no longer be matched."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# hiredis's stub types the argument as a 1-tuple; it takes a command of any length.
_pack = cast(Callable[[tuple[Any, ...]], bytes], hiredis.pack_command)


def _error(reply: ResponseError) -> Exception:
    """A Redis error reply as redis-py raises it (NoScriptError, ReadOnlyError, ...)."""
    error: Exception = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
    return error


class _Protocol(asyncio.Protocol):
    """One TCP connection: commands out in batches, replies matched to them in order."""

    def __init__(self, pipe: AutoPipeline) -> None:
        self.pipe = pipe
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self.outgoing: list[bytes] = []
        self.flush_scheduled = False
        self.timer: asyncio.TimerHandle | None = None
        self.failure: Exception | None = None
        self.last_reply = time.monotonic()

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        self.last_reply = time.monotonic()
        waiting = self.waiting
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(RedisConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not waiting:  # a reply nobody asked for: the stream is out of step
                self.fail(RedisConnectionError("unexpected reply from Redis"))
                return
            future, _ = waiting.popleft()
            if not future.done():
                if isinstance(reply, ResponseError):
                    future.set_exception(_error(reply))
                else:
                    future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed by server'}"))

    # ---- commands ----

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Queue one packed command for this turn's write; its reply's future."""
        if self.failure is not None:
            raise self.failure
        loop = self.pipe.loop
        future: asyncio.Future[Any] = loop.create_future()
        self.waiting.append((future, loop.time()))
        self.outgoing.append(packed)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            loop.call_soon(self.flush)
        if self.timer is None:
            self.timer = loop.call_later(self.pipe.timeout, self.check_timeout)
        return future

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.outgoing and self.transport is not None and self.failure is None:
            data = b"".join(self.outgoing)
            self.outgoing.clear()
            self.transport.write(data)

    def check_timeout(self) -> None:
        """Fail everything once the oldest unanswered command is past the timeout."""
        self.timer = None
        if not self.waiting or self.failure is not None:
            return
        loop = self.pipe.loop
        overdue = self.waiting[0][1] + self.pipe.timeout - loop.time()
        if overdue <= 0:
            self.fail(RedisTimeoutError("Timeout reading from Redis"))
        else:
            self.timer = loop.call_later(overdue, self.check_timeout)

    def fail(self, exc: Exception) -> None:
        """The connection is done: every command still waiting gets `exc`."""
        if self.failure is None:
            self.failure = exc
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.outgoing.clear()
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()
        self.pipe.forget(self)


class AutoPipeline:
    """Commands to one `redis://` server over one auto-pipelined connection, made on first use
    and again after it fails. Replies are bytes, as redis-py gives them without decoding."""

    def __init__(self, url: str, timeout: float, health_check_interval: float = 10.0) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 6379
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        path = parts.path.strip("/")
        self.db = int(path) if path.isdigit() else 0
        self.timeout = timeout
        self.health_check_interval = health_check_interval
        self._conn: _Protocol | None = None
        self._preparing: asyncio.Future[_Protocol] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    async def execute(self, *args: Any) -> Any:
        """Send one command in this turn's batch; its reply (errors raised as redis-py's)."""
        conn = self._conn
        if conn is not None and self._loop is not asyncio.get_running_loop():
            self._abandon()  # made by an event loop that is gone (tests run several)
            conn = None
        preparing = self._preparing
        if conn is None or conn.failure is not None or (
                preparing is not None and not preparing.done()) or (
                not conn.waiting
                and time.monotonic() - conn.last_reply > self.health_check_interval):
            conn = await self._ready()
        return await conn.send(_pack(args))

    def _abandon(self) -> None:
        conn, self._conn, self._preparing = self._conn, None, None
        if conn is not None and conn.transport is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                conn.transport.abort()

    def forget(self, conn: _Protocol) -> None:
        if self._conn is conn:
            self._conn = None

    async def _ready(self) -> _Protocol:
        """A usable connection; every command that arrives meanwhile waits for the same one."""
        if self._preparing is None or self._preparing.done():  # done: its waiters all left
            self._preparing = asyncio.ensure_future(self._prepare())
            # its waiters take any error; if all of them were cancelled, nobody must
            self._preparing.add_done_callback(lambda done: done.cancelled() or done.exception())
        preparing = self._preparing
        try:
            return await asyncio.shield(preparing)
        finally:
            if self._preparing is preparing and preparing.done():
                self._preparing = None

    async def _prepare(self) -> _Protocol:
        """The current connection once it answered a PING (it was idle past the interval),
        or a new one if it has failed or fails the PING; nothing else was sent on it."""
        conn = self._conn
        if conn is not None and conn.failure is None:
            try:
                await conn.send(_pack(("PING",)))
                return conn
            except (RedisConnectionError, RedisTimeoutError, OSError):
                conn.fail(RedisConnectionError("pooled connection is no longer usable"))
        return await self._connect()

    async def _connect(self) -> _Protocol:
        self._loop = loop = asyncio.get_running_loop()
        conn: _Protocol | None = None
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(lambda: _Protocol(self), self.host,
                                                       self.port)
                if self.password is not None:
                    auth = (self.username, self.password) if self.username else (self.password,)
                    await conn.send(_pack(("AUTH", *auth)))
                if self.db:
                    await conn.send(_pack(("SELECT", str(self.db))))
        except BaseException as exc:
            if conn is not None:
                conn.fail(RedisConnectionError(f"connection setup failed: {exc}"))
            if isinstance(exc, TimeoutError):
                raise RedisTimeoutError(
                    f"Timeout connecting to Redis at {self.host}:{self.port}") from None
            if isinstance(exc, OSError):
                raise RedisConnectionError(
                    f"Error connecting to Redis at {self.host}:{self.port}: {exc}") from None
            raise
        self._conn = conn
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            with contextlib.suppress(RuntimeError):  # its event loop is closed
                conn.transport.close()
