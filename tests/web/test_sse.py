"""broker/web/sse.py leans on sse-starlette's internals: check they are still what it expects."""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from sse_starlette.sse import EventSourceResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Message

from broker.app import create_app
from broker.runtime.logs import RequestIdMiddleware
from broker.runtime.metrics import Metrics, MetricsMiddleware
from broker.runtime.settings import Settings
from broker.web.http import InternalErrorMiddleware
from broker.web.sse import SERVER_SEND, EventStreamResponse, SendWatchdog

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_sse_starlette_is_pinned_below_its_next_major() -> None:
    """The broker overrides a private method, which a new major may rename or rework."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in dependencies if Requirement(d).name == "sse-starlette"]
    installed = Version(metadata.version("sse-starlette"))
    assert installed in pin.specifier
    next_major = Version(f"{installed.major + 1}")
    assert next_major not in pin.specifier
    assert any(spec.operator == "<" for spec in pin.specifier)


def test_the_send_method_the_broker_replaces_is_still_there() -> None:
    """A minor release renaming `_send_with_timeout`, or sending without it, would silently
    bring back a timer per event per subscriber."""
    original = inspect.signature(EventSourceResponse._send_with_timeout)
    override = inspect.signature(EventStreamResponse._send_with_timeout)
    assert list(original.parameters) == list(override.parameters) == ["self", "send", "message"]
    events = inspect.getsource(EventSourceResponse._stream_response)
    assert "await self._send_with_timeout(" in events


def test_the_stream_loop_the_broker_replaces_still_keeps_the_same_state() -> None:
    """`EventStreamResponse._stream_response` replaces sse-starlette's: the flags the rest of
    sse-starlette reads (the closing send, the shutdown grace, the disconnect watch) must
    still be the ones it sets."""
    events = inspect.getsource(EventSourceResponse._stream_response)
    for line in (
        "self._response_started = True",
        "self._response_complete = True",
        "self.active = False",
        "self._send_interrupted = True",
        "async with self._send_lock:",
        "self._cleanup_timeout",
    ):
        assert line in events


def test_events_go_to_the_servers_send_and_the_start_and_end_through_the_middleware() -> None:
    """The response's start and end pass through `send` as the app wrapped it (its middleware
    sees the status and headers); each event goes to the server's own, in order."""
    through: list[Message] = []
    past: list[Message] = []

    async def content() -> AsyncIterator[bytes]:
        yield b"event: a\n\n"
        yield b"event: b\n\n"

    async def wrapped(message: Message) -> None:
        through.append(message)

    async def server(message: Message) -> None:
        past.append(message)

    async def receive() -> Message:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        stream = EventStreamResponse(
            content(), watchdog=SendWatchdog(30.0), metrics=Metrics(), ping=0
        )
        scope = {"type": "http", "method": "GET", SERVER_SEND: server}
        await asyncio.wait_for(stream(scope, receive, wrapped), 10)
        assert stream.send_started is None

    asyncio.run(scenario())
    assert [m["type"] for m in through] == ["http.response.start", "http.response.body"]
    assert through[1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert past == [
        {"type": "http.response.body", "body": b"event: a\n\n", "more_body": True},
        {"type": "http.response.body", "body": b"event: b\n\n", "more_body": True},
    ]


def test_every_middleware_only_looks_at_a_responses_start() -> None:
    """A stream's events go past the middleware (broker/web/sse.py), which is sound only while
    every middleware wraps `send` to look at (or add to) the response's start alone: request
    id and access line, CORS headers, the 500 answer before a start, the request metrics. A
    new one that reads or rewrites bodies (compression, byte counts) would be skipped by every
    event: this list is to change only with a look at that."""
    settings = Settings.from_env(environ={}, admin_key="k" * 32, cors_origins="https://a.example")
    app = create_app(settings)
    classes: list[Any] = [m.cls for m in app.user_middleware]
    assert classes == [
        RequestIdMiddleware,
        CORSMiddleware,
        InternalErrorMiddleware,
        MetricsMiddleware,
    ]
