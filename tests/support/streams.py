"""A reader of a broker's SSE subscription over real HTTP: parses events as they arrive, and a
fixture that opens streams and closes them after the test."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

WAIT = 15.0  # seconds any single expectation may take before the test fails


@dataclass
class Event:
    event: str
    data: Any
    id: str | None


class EventParser:
    """Turns event-stream lines into events, comments and the retry hint."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.comments: list[str] = []
        self.retry: int | None = None
        self._name = ""
        self._data: list[str] = []
        self._id: str | None = None

    def line(self, line: str) -> None:
        if line == "":
            if self._data:
                self.events.append(Event(self._name or "message",
                                         json.loads("\n".join(self._data)), self._id))
            self._name, self._data, self._id = "", [], None
            return
        if line.startswith(":"):
            self.comments.append(line[1:].strip())
            return
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            self._name = value
        elif key == "data":
            self._data.append(value)
        elif key == "id":
            self._id = value
        elif key == "retry" and value.isdigit():
            self.retry = int(value)


class Stream:
    """One subscription read on a thread; `events`, `comments` and `retry` fill in as it runs."""

    def __init__(self, url: str, params: list[tuple[str, str]], headers: dict[str, str],
                 *, pause_at_open: bool = False) -> None:
        self.url = url
        self.parser = EventParser()
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.body = b""
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self._pause_at_open = pause_at_open
        self._gate = threading.Event()
        self._gate.set()
        self._closing = False
        self._sock: socket.socket | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=30.0))
        self._thread = threading.Thread(target=self._run, args=(params, headers), daemon=True)
        self._thread.start()

    @property
    def events(self) -> list[Event]:
        return self.parser.events

    @property
    def comments(self) -> list[str]:
        return self.parser.comments

    @property
    def retry(self) -> int | None:
        return self.parser.retry

    def _run(self, params: list[tuple[str, str]], headers: dict[str, str]) -> None:
        try:
            with self._client.stream("GET", self.url, params=tuple(params),
                                    headers=headers) as response:
                network = response.extensions.get("network_stream")
                self._sock = network.get_extra_info("socket") if network else None
                self.headers = response.headers
                self.status = response.status_code
                if response.status_code != 200:
                    self.body = response.read()
                    return
                for line in response.iter_lines():
                    self.parser.line(line)
                    if self._pause_at_open and self.retry is not None:
                        self._pause_at_open = False
                        self._gate.clear()
                    if not self._gate.wait(timeout=60):
                        raise TimeoutError("the stream stayed paused")
        except Exception as exc:  # the test looks at `error`; a close we asked for is no error
            if not self._closing:
                self.error = exc
        finally:
            self._client.close()
            self.ended.set()

    def resume(self) -> None:
        self._gate.set()

    def close(self) -> None:
        """Drop the connection as a crashing client would, and wait for the reader to stop."""
        self._closing = True
        self._gate.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the stream reader did not stop"

    # -- waiting --

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.ended.is_set() and not predicate():
                raise AssertionError(f"stream ended before {what}: {self._summary()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self._summary()}")
            time.sleep(0.01)

    def wait_open(self) -> Stream:
        """Until the first frame (`retry:`) arrived: from then on the stream follows the log."""
        self.wait_for(lambda: self.retry is not None, "the retry hint")
        return self

    def wait_event(self, match: Callable[[Event], bool], what: str,
                   timeout: float = WAIT) -> Event:
        found: list[Event] = []

        def seen() -> bool:
            found[:] = [e for e in list(self.events) if match(e)]
            return bool(found)

        self.wait_for(seen, what, timeout)
        return found[0]

    def wait_key(self, key: str, version: int, timeout: float = WAIT) -> Event:
        return self.wait_event(lambda e: e.event != "snapshot" and isinstance(e.data, dict)
                               and e.data.get("key") == key and e.data.get("version") == version,
                               f"{key} v{version}", timeout)

    def wait_changes(self, count: int) -> None:
        self.wait_for(lambda: len(self.changes()) >= count, f"{count} changes")

    def changes(self) -> list[Event]:
        return [e for e in list(self.events) if e.event in ("put", "delete", "expire")]

    def _summary(self) -> str:
        tail = [(e.event, e.data.get("key") if isinstance(e.data, dict) else None,
                 e.data.get("version") if isinstance(e.data, dict) else None)
                for e in self.events[-8:]]
        return (f"status={self.status} error={self.error!r} body={self.body[:300]!r} "
                f"events={len(self.events)} last={tail}")
