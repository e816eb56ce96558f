"""SSE responses whose sends cost no timer, and the one watchdog per process that times them.

sse-starlette bounds every send with a cancel scope of its own: a timer armed and disarmed per
event per subscriber, about a quarter of the CPU a live delivery takes. A socket send almost
never waits, so instead each stream notes when its current send began and `SendWatchdog`
looks at every open stream a few times per timeout, cutting those stuck longer than it.

A stream's events go to the server's own `send`, past the middleware: each middleware wraps
`send` only to look at the response's start (status, headers), which still passes through
them, and six wrappers per event were a third of what a lone event's delivery cost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from broker.runtime.metrics import Metrics

log = logging.getLogger("memp.sse")

TRANSPORT = "memp.transport"  # scope key: the request's connection, where the server has one
SERVER_SEND = "memp.send"  # scope key: the server's `send`, before any middleware wrapped it


class AbortableApp(Starlette):
    """Starlette that puts each HTTP request's transport in its scope, so a stream whose client
    reads nothing can abort its connection (`EventStreamResponse.cut`), and the server's own
    `send`, which a stream's events take. Only the server's own `send` knows the transport
    (uvicorn's is a method of an object holding it), and middleware wraps `send`, so both are
    read here, at the outermost layer; other servers simply have no transport."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if callable(getattr(transport, "abort", None)):
                scope[TRANSPORT] = transport
            scope[SERVER_SEND] = send
        await super().__call__(scope, receive, send)


class SendWatchdog:
    """Cuts the streams whose current send has waited longer than `timeout` seconds."""

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

    def __init__(self, content: Any, *, watchdog: SendWatchdog, metrics: Metrics,
                 ending: Callable[[], str | None] = lambda: None, **kwargs: Any) -> None:
        super().__init__(content, send_timeout=None, **kwargs)
        self.watchdog = watchdog
        self.metrics = metrics
        self.ending = ending  # the reason the content gave for ending, if it ended itself
        self.close_reason: str | None = None
        self.send_started: float | None = None
        self._sender: asyncio.Task[Any] | None = None
        self._transport: Any = None
        self._server_send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._transport = scope.get(TRANSPORT)
        self._server_send = scope.get(SERVER_SEND)
        clock = asyncio.get_running_loop().time

        async def timed_send(message: Message) -> None:
            # Every send, the closing one included (sse-starlette sends that one untimed).
            self._sender = asyncio.current_task()
            self.send_started = clock()
            try:
                await send(message)
            finally:
                self.send_started = None

        self.watchdog.streams.add(self)
        self.metrics.subscribers.inc()
        reason = "client_gone"
        try:
            await super().__call__(scope, receive, timed_send)
        except OSError:
            reason = "reset"  # the connection broke under a send
            raise
        except Exception:
            reason = "error"
            raise
        finally:
            self.watchdog.streams.discard(self)
            self.metrics.subscribers.dec()
            if self._shutdown_event is not None and self._shutdown_event.is_set():
                reason = "shutdown"
            self.metrics.stream_closed(self.close_reason or self.ending() or reason)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        await send(message)  # no cancel scope per send: `timed_send` is watched instead

    async def _stream_response(self, send: Send) -> None:
        """sse-starlette's, with each event (bytes: the content yields nothing else) sent to
        the server's `send` past the middleware, timed inline; the start and the end go
        through `send` as before."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        self._response_started = True
        events = self._server_send or send
        clock = asyncio.get_running_loop().time
        sender = asyncio.current_task()
        async for chunk in self.body_iterator:
            self._sender = sender
            self.send_started = clock()
            try:
                await events({"type": "http.response.body", "body": chunk, "more_body": True})
            except BaseException:
                self._send_interrupted = True
                await self._close_content()
                raise
            finally:
                self.send_started = None
        async with self._send_lock:  # as sse-starlette ends it: see its _stream_response
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except BaseException:
                self._send_interrupted = True
                raise
            self._response_complete = True
            self.active = False

    async def _close_content(self) -> None:
        """After a failed send, close the content (so its cleanup runs) within the cleanup
        timeout, as sse-starlette does."""
        aclose = getattr(self.body_iterator, "aclose", None)
        if aclose is None:
            return
        with anyio.move_on_after(self._cleanup_timeout, shield=True):
            try:
                await aclose()
            except Exception:
                log.exception("error closing a stream's content after a failed send")

    def cut(self) -> None:
        """End the stream: its send has been stuck too long (the client reads nothing).

        Aborted, not closed: closing waits to flush the buffered megabytes to a client that
        never reads, so the connection and its buffer stayed. Aborting drops both, and the
        server reports the client gone, which ends the response. The client still gets what
        the kernel had taken, maybe ending mid-event: an SSE parser drops a trailing partial
        event, and the last whole event's id resumes the rest. Without a transport (another
        server), the stuck send is cancelled instead."""
        self.send_started = None
        self.close_reason = "send_timeout"
        self.watchdog.streams.discard(self)
        log.info("closing a stream whose client read nothing for %.0f s", self.watchdog.timeout)
        if self._transport is not None:
            self._transport.abort()
        elif self._sender is not None:
            self._sender.cancel()
