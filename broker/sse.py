"""SSE responses whose sends cost no timer, and the one watchdog per process that times them.

sse-starlette bounds every send with a cancel scope of its own: a timer armed and disarmed per
event per subscriber, about a quarter of the CPU a live delivery takes. A socket send almost
never waits, so instead each stream notes when its current send began and `SendWatchdog`
looks at every open stream a few times per timeout, cancelling those stuck longer than it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger("memp.sse")


class SendWatchdog:
    """Cancels the streams whose current send has waited longer than `timeout` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.streams: set[EventStreamResponse] = set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self.timeout / 4, 1.0))
            self.check(loop.time())

    def check(self, now: float) -> None:
        for stream in list(self.streams):
            started = stream.send_started
            if started is not None and now - started > self.timeout:
                stream.cut()


class EventStreamResponse(EventSourceResponse):
    """sse-starlette's response (heartbeats, disconnects, shutdown) with its sends timed by a
    `SendWatchdog` instead of one timer each."""

    def __init__(self, content: Any, *, watchdog: SendWatchdog, **kwargs: Any) -> None:
        super().__init__(content, send_timeout=None, **kwargs)
        self.watchdog = watchdog
        self.send_started: float | None = None
        self._sender: asyncio.Task[Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.watchdog.streams.add(self)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.watchdog.streams.discard(self)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        self._sender = asyncio.current_task()
        self.send_started = asyncio.get_running_loop().time()
        try:
            await send(message)
        finally:
            self.send_started = None

    def cut(self) -> None:
        """End the stream: its send has been stuck too long (the client reads nothing)."""
        self.send_started = None
        if self._sender is not None:
            log.info("closing a stream whose client read nothing for %.0f s",
                     self.watchdog.timeout)
            self._sender.cancel()
