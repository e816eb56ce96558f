"""Subscriptions: SSE streams that reconnect with backoff and resume from the last event id.

The broker's event ids are resume cursors: reconnecting with `Last-Event-ID` replays every
change after it exactly once, so a stream that breaks (broker restart, network, `overflow`,
`shutdown`) resumes without a gap or a duplicate. `reset` is passed on to the caller. After
`revoked` the reconnect is refused (401 or 403), and that error ends the subscription, as does
a broker certificate that cannot be verified."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Sequence,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, cast, get_args

import httpx
import msgspec
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse, connect_sse

from memp._transport import (
    RETRY_STATUSES,
    AsyncTransport,
    Config,
    SyncTransport,
    failed,
    untrusted,
)
from memp.errors import ConnectionFailed, MempError, error_from_response
from memp.models import EndEventType, Entry, Event, EventType

_ENTRY_EVENTS = frozenset({"put", "delete", "expire", "snapshot"})
_RESUME_EVENTS = frozenset(get_args(EndEventType))


Status = Literal["connecting", "connected", "reconnecting", "closed"]


@dataclass(frozen=True)
class ConnectionState:
    """Where a subscription's connection stands: `connecting` (the first attempt), `connected`
    (the stream is open), `reconnecting` (after a break: `attempt` counts the tries since the
    last success, `error` says what broke), `closed` (for good: `error` is why, or None after
    `close()`)."""

    status: Status
    attempt: int = 0
    error: BaseException | None = None


StateListener = Callable[[ConnectionState], None]


class OpenTimeout(ConnectionFailed):
    """`open(timeout=...)` passed without the stream opening; `__cause__` is the last error."""


class _Marker(msgspec.Struct):
    cursor: str | None = None
    namespace: str | None = None
    reason: str | None = None


class StreamState:
    """What a subscription follows and how far it got; turns SSE frames into events."""

    def __init__(self, targets: Sequence[tuple[str, str]], snapshot: bool,
                 last_event_id: str | None, on_state: StateListener | None = None,
                 options: Sequence[tuple[str, str]] = ()) -> None:
        self.targets = list(targets)
        self.options = list(options)  # filter, conflate, max_rate: sent on every connection
        self.on_state = on_state
        self.status: Status | None = None
        self.deadline: float | None = None  # monotonic time by which `open()` must succeed
        self.error: BaseException | None = None  # what ended the last attempt
        self.cursor = last_event_id or None
        self.snapshot_pending = snapshot and self.cursor is None
        self.snapshot_sent: set[tuple[str, str, int]] = set()
        self.failures = 0  # connection attempts in a row that delivered nothing
        self.retries = 0  # reconnection attempts since the last event (the first is 1)
        self.live = False  # this connection delivered an event
        self.resume_now = False  # the broker ended the stream and asked to be resumed
        self.connections = 0  # streams opened so far

    def request(self) -> tuple[list[tuple[str, str]], dict[str, str]]:
        self.live = False
        namespaces = {ns for ns, _ in self.targets}
        if len(namespaces) == 1:
            params = [("namespace", next(iter(namespaces)))]
            params += [("pattern", pattern) for _, pattern in self.targets]
        else:
            params = [("sub", f"{ns}:{pattern}") for ns, pattern in self.targets]
        if self.snapshot_pending:
            params.append(("snapshot", "1"))
        params += self.options
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if self.cursor is not None:
            headers["Last-Event-ID"] = self.cursor
        return params, headers

    def ended(self) -> None:
        """The connection closed or failed."""
        if not self.live:
            self.failures += 1

    def opened(self) -> None:
        """The broker answered and the stream began."""
        self.connections += 1
        self.report("connected")

    def report(self, status: Status, error: BaseException | None = None) -> None:
        """Tell the listener where the connection stands (each change once)."""
        attempt = self.retries if status == "reconnecting" else 0
        if status == self.status and status != "reconnecting":
            return
        self.status = status
        if self.on_state is not None:
            self.on_state(ConnectionState(status, attempt, error))

    def attempting(self) -> None:
        first = self.connections == 0 and self.failures == 0
        if not first:
            self.retries += 1
        self.report("connecting" if first else "reconnecting", self.error)

    def wait_or_give_up(self, config: Config) -> float:
        """The pause before the next attempt, or OpenTimeout when `open()`'s time is up."""
        pause = self.delay(config)
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0 or pause >= left:
                error = OpenTimeout(
                    f"the event stream at {config.base_url} did not open in time"
                    + (f": {self.error}" if self.error else ""), code="connection_error")
                self.report("closed", error)
                raise error from self.error
        return pause

    def delay(self, config: Config) -> float:
        """No wait after a stream that worked or asked to be resumed; backoff after failures."""
        if self.resume_now or self.failures == 0:
            self.resume_now = False
            return 0.0
        return config.delay(self.failures - 1)

    def handle(self, sse: ServerSentEvent) -> Event | None:
        """The event to hand out for one frame, or None (retry hints, resume markers, snapshot
        entries already handed out before a reconnect, types this SDK does not know)."""
        if not sse.event:
            return None
        self.live = True
        self.failures = 0
        self.retries = 0
        if sse.id:  # `progress` too: changes a filter left out moved the cursor
            self.cursor = sse.id
        kind = sse.event
        if kind in _ENTRY_EVENTS:
            entry = msgspec.json.decode(sse.data, type=Entry)
            if kind != "snapshot":
                return Event(type=cast(EventType, kind), id=self.cursor, entry=entry,
                             namespace=entry.namespace)
            seen = (entry.namespace, entry.key, entry.version)
            if seen in self.snapshot_sent:
                return None
            self.snapshot_sent.add(seen)
            return Event(type="snapshot", entry=entry, namespace=entry.namespace)
        if kind not in ("snapshot-end", "reset", *_RESUME_EVENTS):
            return None
        marker = msgspec.json.decode(sse.data or "{}", type=_Marker)
        if marker.cursor:
            self.cursor = marker.cursor
        if kind in _RESUME_EVENTS:
            self.resume_now = True
            return None
        if kind == "snapshot-end":
            self.snapshot_pending = False
            self.snapshot_sent.clear()
            return Event(type="snapshot-end", id=self.cursor)
        return Event(type="reset", id=self.cursor, namespace=marker.namespace,
                     reason=marker.reason)


def stream_options(filter: str | None, conflate: str | None, max_rate: float | None
                   ) -> list[tuple[str, str]]:
    """The query parameters fitting a stream to its consumer (docs/subscriptions.md)."""
    options = [("filter", filter)] if filter else []
    if conflate is not None:
        options.append(("conflate", conflate))
    if max_rate is not None:
        options.append(("max_rate", repr(float(max_rate))))
    return options


def _shutdown(response: httpx.Response) -> None:
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    with contextlib.suppress(OSError):
        if isinstance(sock, socket.socket):
            sock.shutdown(socket.SHUT_RDWR)


def _raise_fatal(response: httpx.Response, state: StreamState) -> None:
    """Refusals that reconnecting cannot fix (4xx) end the subscription with their error;
    server trouble (5xx, 503 while Redis is away) and 429 are retried with backoff."""
    error = error_from_response(response)
    if response.status_code < 500 and response.status_code not in RETRY_STATUSES:
        state.report("closed", error)
        raise error
    state.error = error


class _Progress:
    """What a subscription tells of its stream, sync or async alike."""

    state: StreamState

    @property
    def last_event_id(self) -> str | None:
        """The cursor to resume from (pass it as `last_event_id=` to a later subscribe)."""
        return self.state.cursor

    @property
    def reconnects(self) -> int:
        """How often the stream was reopened after a break (each time without a gap)."""
        return max(self.state.connections - 1, 0)


class Subscription(_Progress, Iterator[Event]):
    """An endless iterator of events; `close()` (or leaving a `with` block) ends it.

    It connects on the first `next()`, or at `open()` / entering a `with` block, which return
    once the stream is open: every change made after that is delivered."""

    def __init__(self, transport: SyncTransport, state: StreamState) -> None:
        self._transport = transport
        self.state = state
        self._closed = threading.Event()
        self._opened = False
        self._response: httpx.Response | None = None
        self._items = self._run()

    def open(self, timeout: float | None = None) -> Subscription:
        """Connect now, reconnecting with backoff while the broker is unreachable; with a
        `timeout` (seconds), raise OpenTimeout once it passes without the stream open."""
        if not self._opened:
            self.state.deadline = None if timeout is None else time.monotonic() + timeout
            try:
                next(self._items)  # the connection's first item is its opening marker (None)
            finally:
                self.state.deadline = None
            self._opened = True
        return self

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Event:
        while True:
            item = next(self._items)
            if item is not None:
                return item
            self._opened = True

    def __enter__(self) -> Subscription:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End the subscription; safe to call from another thread, where it wakes a reader
        blocked on the socket (closing a socket alone does not)."""
        self._closed.set()
        response = self._response
        if response is not None:
            _shutdown(response)
        if inspect.getgeneratorstate(self._items) != inspect.GEN_RUNNING:
            self._items.close()

    def _run(self) -> Generator[Event | None, None, None]:
        """Events, with None before each connection's first frame (the stream is open)."""
        config = self._transport.config
        state = self.state
        try:
            while not self._closed.is_set():
                params, headers = state.request()
                state.attempting()
                try:
                    with connect_sse(self._transport.http, "GET",
                                     config.url("/v1/subscribe"), params=params,
                                     headers={**config.headers(), **headers},
                                     timeout=config.stream_timeouts(state.deadline)) as source:
                        self._response = source.response
                        if source.response.status_code != 200:
                            source.response.read()
                            _raise_fatal(source.response, state)
                        else:
                            opening = True
                            for sse in source.iter_sse():
                                if opening:
                                    opening = False
                                    state.opened()
                                    yield None
                                event = state.handle(sse)
                                if event is not None:
                                    yield event
                                if self._closed.is_set():
                                    return
                            state.error = ConnectionFailed("the broker ended the stream",
                                                           code="connection_error")
                except (httpx.TransportError, httpx.StreamError, SSEError) as exc:
                    if self._closed.is_set():
                        return
                    _raise_lasting(exc, config, state)
                    state.error = exc
                finally:
                    self._response = None
                state.ended()
                self._closed.wait(state.wait_or_give_up(config))
        finally:
            state.report("closed", None)


class AsyncSubscription(_Progress, AsyncIterator[Event]):
    """The async twin of `Subscription`: `async for event in ...`; `aclose()` ends it.
    `await open()` or `async with` returns once the stream is open."""

    def __init__(self, transport: AsyncTransport, state: StreamState) -> None:
        self._transport = transport
        self.state = state
        self._opened = False
        self._closed = False
        self._items = self._run()

    def stop(self) -> None:
        """Let the stream end at its next wake-up (the client calls this as it closes)."""
        self._closed = True

    # `timeout` bounds the reconnect loop (as the sync twin's does), not one await.
    async def open(self, timeout: float | None = None) -> AsyncSubscription:  # noqa: ASYNC109
        """Connect now; with a `timeout` (seconds), raise OpenTimeout once it passes without
        the stream open."""
        if not self._opened:
            self.state.deadline = None if timeout is None else time.monotonic() + timeout
            try:
                await anext(self._items)
            finally:
                self.state.deadline = None
            self._opened = True
        return self

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            item = await anext(self._items)
            if item is not None:
                return item
            self._opened = True

    async def __aenter__(self) -> AsyncSubscription:
        return await self.open()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._items.aclose()

    async def _run(self) -> AsyncGenerator[Event | None, None]:
        config = self._transport.config
        state = self.state
        try:
            while not self._closed:
                params, headers = state.request()
                state.attempting()
                try:
                    async with aconnect_sse(self._transport.http, "GET",
                                            config.url("/v1/subscribe"), params=params,
                                            headers={**config.headers(), **headers},
                                            timeout=config.stream_timeouts(state.deadline)
                                            ) as source:
                        if source.response.status_code != 200:
                            await source.response.aread()
                            _raise_fatal(source.response, state)
                        else:
                            opening = True
                            async for sse in source.aiter_sse():
                                if opening:
                                    opening = False
                                    state.opened()
                                    yield None
                                event = state.handle(sse)
                                if event is not None:
                                    yield event
                            state.error = ConnectionFailed("the broker ended the stream",
                                                           code="connection_error")
                except (httpx.TransportError, httpx.StreamError, SSEError) as exc:
                    if self._closed:
                        return
                    _raise_lasting(exc, config, state)
                    state.error = exc
                if self._closed:
                    return
                state.ended()
                await asyncio.sleep(state.wait_or_give_up(config))
        finally:
            state.report("closed", None)


def _raise_lasting(exc: Exception, config: Config, state: StreamState) -> None:
    """Keep reconnecting through network trouble; a reply that is not SSE means a wrong URL,
    and a certificate that cannot be verified would be refused on every reconnect."""
    error: MempError | None = None
    if isinstance(exc, SSEError):
        error = ConnectionFailed(f"{config.base_url} did not answer with an event stream: "
                                 f"{exc}", code="connection_error")
    elif isinstance(exc, httpx.TransportError) and untrusted(exc) is not None:
        error = failed(exc, config)
    if error is not None:
        state.report("closed", error)
        raise error from exc


def targets(namespace: str, pattern: str | Sequence[str]) -> list[tuple[str, str]]:
    """Namespace/pattern pairs for one namespace and one or several patterns."""
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    return [(namespace, p) for p in patterns]


