"""BoundedProtocol (broker/runtime/connections.py) in process, on a transport of the test's own:
a connection that sends nothing is closed at its head deadline, and a deadline that fires late
because the broker's loop stalled leaves the waiting request to be served. The same limits
against real broker processes are in test_connections.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from uvicorn.server import ServerState

from broker.runtime.connections import BoundedProtocol, ConnectionLimits, ServerConfig
from broker.runtime.settings import Settings

pytestmark = pytest.mark.fast

WAIT = 30.0  # far beyond the deadline below: a connection left open this long is a failure
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.written = b""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _protocol(loop: asyncio.AbstractEventLoop) -> tuple[BoundedProtocol, _Transport]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limits = dataclasses.replace(ConnectionLimits.of(Settings()), head_timeout=0.2)
    config = ServerConfig(app, limits, log_config=None)
    config.load()
    protocol = BoundedProtocol(config, ServerState(), {}, _loop=loop)
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


def test_a_connection_is_not_closed_for_the_brokers_own_stall() -> None:
    """The head's deadline passes while the broker's loop is stalled (here: not running),
    with the request already sent: it fires late, gives the client another second, and the
    request that was waiting is served."""
    loop = asyncio.new_event_loop()
    try:
        protocol, transport = _protocol(loop)
        time.sleep(0.8)  # the loop does not run: the 0.2 s deadline is 0.6 s late
        loop.run_until_complete(asyncio.sleep(0))
        assert not transport.closed
        protocol.data_received(REQUEST + b"\r\n")  # what was waiting, read at last
        loop.run_until_complete(asyncio.sleep(0.05))
        assert transport.written.startswith(b"HTTP/1.1 204 ")
        assert not transport.closed
    finally:
        loop.close()


def test_a_connection_that_sends_nothing_is_closed_in_process() -> None:
    loop = asyncio.new_event_loop()
    try:
        _, transport = _protocol(loop)
        deadline = time.monotonic() + WAIT
        while not transport.closed and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.1))
        assert transport.closed and transport.written == b""
    finally:
        loop.close()
