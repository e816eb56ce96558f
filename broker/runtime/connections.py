"""Connections a client cannot hold or swamp: request heads bounded in bytes, line length and
field count (`431`, `414`), and a deadline whenever the broker waits on the client — for a
whole head (`408`), for a body, for the next request on a kept-alive connection, and for a
TLS handshake (docs/security.md, "Request heads and idle connections").

uvicorn's httptools protocol reads a head of any size (llhttp has no limit, and httptools
buffers each header value until it ends) and waits for it for ever: it arms its keep-alive
timer only once a response is complete. `BoundedProtocol` is that protocol with the limits
added around the parser; `ServerConfig` is uvicorn's configuration that serves with it and
bounds TLS handshakes in the event loop, since uvicorn passes no handshake timeout.
docs/design.md says why a protocol subclass rather than h11's limits or another server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from broker.core.errors import MempError
from broker.runtime.settings import Settings

log = logging.getLogger("memp.connections")
# A body must arrive at this rate on average once its `body_timeout` grace is spent: a client
# dribbling a body holds a connection and a task no longer than its size allows.
BODY_MIN_BYTES_PER_SECOND = 16 * 1024
# After a refusal the broker reads and drops what the client still sends, this long at most,
# so its reply is not lost to a reset (the "lingering close" of nginx and Apache).
LINGER_SECONDS = 2.0
# A deadline that fires this much late means the broker itself stalled (a long collection, a
# blocking import): what the client sent meanwhile may not be read yet (uvloop runs due timers
# before it reads), so the client gets another second rather than the blame.
STALL_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What a connection may send and how long the broker waits for it (`MEMP_*` settings)."""

    max_head_bytes: int
    max_header_line_bytes: int
    max_header_fields: int
    head_timeout: float
    body_timeout: float
    keep_alive: int

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.max_head_bytes, settings.max_header_line_bytes,
                   settings.max_header_fields, settings.head_timeout_seconds,
                   settings.body_timeout_seconds, settings.keep_alive_seconds)


class ServerConfig(Config):
    """uvicorn's configuration for the broker: `BoundedProtocol` with `limits`, keep-alive
    connections idle for `limits.keep_alive` seconds closed, no WebSocket (the broker serves
    none), and TLS handshakes bounded by `limits.head_timeout`. It travels to worker
    processes as uvicorn's own does."""

    def __init__(self, app: Any, limits: ConnectionLimits, **options: Any) -> None:
        super().__init__(app, http=BoundedProtocol, ws="none",
                         timeout_keep_alive=limits.keep_alive, **options)
        self.limits = limits

    def get_loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop] | None:
        return _handshake_bounded_loop(self.limits.head_timeout)


def _handshake_bounded_loop(timeout: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """uvicorn's own loop (uvloop when installed), whose TLS servers close a connection that
    has not finished its handshake within `timeout` (asyncio's default is 60 s)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        base: type[asyncio.AbstractEventLoop] = asyncio.SelectorEventLoop
    else:
        base = uvloop.Loop

    class HandshakeBoundedLoop(base):  # type: ignore[valid-type,misc]
        async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout)
            server: asyncio.Server = await super().create_server(*args, **kwargs)
            return server

    return HandshakeBoundedLoop


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a head over a limit."""

    def __init__(self, status: int, error: MempError) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with bounded heads and a deadline whenever it waits."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = config.limits if isinstance(config, ServerConfig) \
            else ConnectionLimits.of(Settings())
        self._in_head = True  # waiting for, or reading, a request's head
        self._head_bytes = 0  # received toward the head being read
        self._heads = 0  # heads parsed on this connection
        self._body_since = 0.0
        self._body_bytes = 0  # received since the head (about the body's size)
        self._deadline: asyncio.TimerHandle | None = None  # the head's or the body's
        self._due = 0.0  # when it is due, by the loop's clock
        self._lingering = False

    # ---- the connection ----

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.head_timeout, self._head_overdue)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # what follows a refusal is read and dropped
        self._unset_keepalive_if_required()
        if self._in_head:
            room = self.limits.max_head_bytes - self._head_bytes
            if len(data) > room:
                heads = self._heads
                if room > 0 and not self._feed(data[:room]):
                    return
                if self._heads == heads:  # the head goes on past its limit
                    self._refuse(431, MempError(
                        "headers_too_large", f"the request's head is over "
                        f"{self.limits.max_head_bytes} bytes",
                        {"limit": "max_head_bytes", "max": self.limits.max_head_bytes}))
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        else:
            self._body_bytes += len(data)
        if self._feed(data):
            self._watch()

    def _feed(self, data: bytes) -> bool:
        """Parse `data`; False when the connection is being closed for what it held."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.status, refused.error)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserUpgrade:
            # Served as plain HTTP/1.1 (the broker upgrades to no WebSocket or h2c), and said
            # quietly: uvicorn's warning, per request, would let any client fill the log.
            log.debug("an upgrade request was served as HTTP/1.1")
        return not self.transport.is_closing()

    def _watch(self) -> None:
        """Whenever the broker waits on the client, a deadline runs: for the rest of a head,
        for the rest of a body, or (uvicorn's keep-alive) for the next request."""
        if self.transport.is_closing() or self._deadline is not None:
            return
        if not self._in_head:
            self._body_since = self.loop.time()
            self._arm(self.limits.body_timeout, self._body_overdue)
        elif self._head_bytes:  # part of a head came (a pipelined one in the same read is
            # left to the keep-alive timer, armed when the reply before it is complete)
            self._arm(self.limits.head_timeout, self._head_overdue)
        elif self.timeout_keep_alive_task is None and (
                self.cycle is None or self.cycle.response_complete):
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)

    # ---- the parser's callbacks ----

    def on_headers_complete(self) -> None:
        # The raw count in data_received bounds what the parser buffered; the head's parts
        # are checked here, once, rather than in a callback per field.
        limits = self.limits
        if len(self.url) > limits.max_header_line_bytes:
            raise _Refused(414, MempError(
                "uri_too_long", f"the request's target is over "
                f"{limits.max_header_line_bytes} bytes",
                {"limit": "max_header_line_bytes", "max": limits.max_header_line_bytes}))
        if len(self.headers) > limits.max_header_fields:
            raise _Refused(431, MempError(
                "headers_too_large", f"the request has over {limits.max_header_fields} "
                "header fields", {"limit": "max_header_fields", "max": limits.max_header_fields}))
        for name, value in self.headers:
            if len(name) + len(value) > limits.max_header_line_bytes:
                raise _Refused(431, MempError(
                    "headers_too_large", f"a header field is over "
                    f"{limits.max_header_line_bytes} bytes",
                    {"limit": "max_header_line_bytes", "max": limits.max_header_line_bytes,
                     "field": name[:64].decode("latin-1")}))
        self._in_head, self._head_bytes, self._body_bytes = False, 0, 0
        self._heads += 1
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._disarm()
        super().on_message_complete()

    # ---- deadlines and refusals ----

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._disarm()
        self._due = self.loop.time() + seconds
        self._deadline = self.loop.call_later(seconds, then)

    def _stalled(self, then: Callable[[], None]) -> bool:
        """Whether the deadline fired late because the broker stalled; if so, it is moved a
        second on, and the stall is not counted against the client's body."""
        late = self.loop.time() - self._due
        if late <= STALL_SECONDS:
            return False
        self._body_since += late
        self._arm(1.0, then)
        return True

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_overdue(self) -> None:
        self._deadline = None
        if self._stalled(self._head_overdue):
            return
        if self._in_head and self._head_bytes:
            self._refuse(408, MempError(
                "request_timeout", f"the request's head did not arrive within "
                f"{self.limits.head_timeout:g} s", {"limit": "head_timeout_seconds"}))
        elif self._in_head and self._heads == 0:
            self._close("sent nothing")  # a connection that never asked for anything

    def _body_overdue(self) -> None:
        self._deadline = None
        if self._in_head or self._stalled(self._body_overdue):
            return
        allowed = self.limits.body_timeout + self._body_bytes / BODY_MIN_BYTES_PER_SECOND
        waited = self.loop.time() - self._body_since
        waiting = self.cycle is not None and self.cycle.waiting_for_100_continue
        if self.flow.read_paused or waiting:  # the broker is the slow one: it has not read
            # what came, or the client waits for its `100 Continue`
            self._body_since += 1.0
            self._arm(1.0, self._body_overdue)
            return
        if waited < allowed:  # more of the body came meanwhile, and bought it more time
            self._arm(allowed - waited + 0.01, self._body_overdue)
            return
        self._refuse(408, MempError(
            "request_timeout", f"the request's body did not arrive within "
            f"{self.limits.body_timeout:g} s (and a second per "
            f"{BODY_MIN_BYTES_PER_SECOND} bytes received)", {"limit": "body_timeout_seconds"}))

    def _refuse(self, status: int, error: MempError) -> None:
        """Answer `status` with the error, unless another reply is under way (a head is
        refused while the request before it is answered) or done (a body comes too slowly
        after its reply), then close."""
        self._disarm()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or (not cycle.response_started if not self._in_head
                             else cycle.response_complete):
            body = error.encode()
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: application/json\r\ncontent-length: ",
                     str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]
            self.transport.write(b"".join(head))
        if cycle is not None and not cycle.response_complete:
            # The request being served gets no more of its body, and its reply goes nowhere.
            cycle.keep_alive = False
            cycle.disconnected = True
            cycle.message_event.set()
        self._close(f"{status} {error.message}", linger=True)

    def _close(self, why: str, linger: bool = False) -> None:
        """Close the connection; with `linger`, once what was written is sent, reading and
        dropping what still comes for a moment, so the client reads the reply rather than a
        reset."""
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        log.info("closing a connection from %s: %s", client, why)
        if not linger:
            self.transport.close()
            return
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)
