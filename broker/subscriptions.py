"""One subscriber's event stream: replay or snapshot, then live changes, as SSE frames.

Gap-free seam: the subscription joins the hub (its queue starts filling) before the log is
read from the cursor, and live changes at or before the last position replayed are dropped."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import msgspec

from broker.auth import Principal
from broker.changelog import Change, ChangeLog, encode_payload, position_key
from broker.errors import MempError
from broker.hub import Hub, Subscription
from broker.keys import Pattern
from broker.memory import MemoryService

_CURSOR_PART_RE = re.compile(r"([a-z0-9][a-z0-9._-]{0,62}):(\d{1,20}-\d{1,20})")
_REPLAY_BATCH = 500


def parse_cursor(text: str | None) -> dict[str, str] | None:
    """`ns:ms-seq[,ns:ms-seq...]`, as sent in every event's id."""
    if text is None or text.strip() == "":
        return None
    positions = {}
    for part in text.strip().split(","):
        match = _CURSOR_PART_RE.fullmatch(part)
        if match is None:
            raise MempError("invalid_request", "Last-Event-ID is not a cursor this broker issued",
                            {"last_event_id": text[:200]})
        positions[match.group(1)] = match.group(2)
    return positions


def format_cursor(positions: dict[str, str]) -> bytes:
    return ",".join(f"{ns}:{pos}" for ns, pos in sorted(positions.items())).encode()


def frame(event: bytes, cursor: bytes | None, data: bytes) -> bytes:
    head = b"id: " + cursor + b"\n" if cursor is not None else b""
    return head + b"event: " + event + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """What a client asked to follow, and from where."""

    patterns: dict[str, list[Pattern]]
    cursor: dict[str, str] | None
    snapshot: bool


class EventStream:
    """Produces the SSE frames of one subscription."""

    def __init__(self, hub: Hub, changelog: ChangeLog, memory: MemoryService,
                 principal: Principal, request: StreamRequest, queue_size: int,
                 retry_ms: int) -> None:
        self.hub = hub
        self.changelog = changelog
        self.memory = memory
        self.principal = principal
        self.request = request
        self.subscription = Subscription(request.patterns, queue_size)
        self.retry_ms = retry_ms
        self.positions: dict[str, str] = {}
        self.snapshot_versions: dict[tuple[str, str], int] = {}

    @property
    def cursor(self) -> bytes:
        return format_cursor(self.positions)

    async def open(self) -> list[str]:
        """Join the hub and fix the start positions before any response is sent, so a store
        that is down is a 503 and a client that has seen the first frame knows the stream
        follows every change made from then on. Returns the namespaces whose cursor lost
        changes."""
        await self.hub.join(self.subscription)
        try:
            return await self._locate()
        except BaseException:
            self.hub.leave(self.subscription)
            raise

    def close(self) -> None:
        """Leave the hub (idempotent)."""
        self.hub.leave(self.subscription)

    async def frames(self, lost: list[str], shutdown: anyio.Event) -> AsyncIterator[bytes]:
        watcher = asyncio.create_task(self._watch_shutdown(shutdown))
        try:
            yield f"retry: {self.retry_ms}\n\n".encode()
            for namespace in lost:
                yield self._reset(namespace, "the cursor is older than the retained change log")
            if self.request.cursor is None and self.request.snapshot:
                async for chunk in self._snapshot():
                    yield chunk
            async for chunk in self._catch_up():
                yield chunk
            async for chunk in self._live():
                yield chunk
        finally:
            watcher.cancel()
            self.close()

    async def _watch_shutdown(self, shutdown: anyio.Event) -> None:
        await shutdown.wait()
        self.subscription.closing = True
        self.subscription.nudge()

    async def _locate(self) -> list[str]:
        """Set each namespace's start: the cursor, else the log's end; returns the namespaces
        whose cursor lost changes (they start from the end, after a reset)."""
        lost: list[str] = []
        cursor = self.request.cursor or {}
        for namespace in self.request.patterns:
            self.positions[namespace] = await self.changelog.last_position(namespace)
            start = cursor.get(namespace)
            if start is None:
                continue
            if await self.changelog.continues(namespace, start):
                self.positions[namespace] = start
            else:
                lost.append(namespace)
        return lost

    async def _snapshot(self) -> AsyncIterator[bytes]:
        for namespace, patterns in self.request.patterns.items():
            for pattern in patterns:
                page_cursor = None
                while True:
                    page = await self.memory.query(self.principal, namespace, pattern.text,
                                                   page_cursor, None, permission="subscribe")
                    for entry in page.entries:
                        seen = (namespace, entry.key)
                        if seen in self.snapshot_versions:
                            continue
                        self.snapshot_versions[seen] = entry.version
                        yield frame(b"snapshot", None, encode_payload(entry, "snapshot"))
                    page_cursor = page.next_cursor
                    if page_cursor is None:
                        break
        marker = msgspec.json.encode({"cursor": self.cursor.decode()})
        yield frame(b"snapshot-end", self.cursor, marker)

    def _reset(self, namespace: str, reason: str) -> bytes:
        data = msgspec.json.encode({"namespace": namespace, "reason": reason,
                                    "cursor": self.cursor.decode()})
        return frame(b"reset", self.cursor, data)

    def _fresh(self, change: Change) -> bool:
        """Not yet sent: after the namespace's position, and newer than the snapshot's version."""
        position = self.positions.get(change.namespace, "0-0")
        if position_key(change.position) <= position_key(position):
            return False
        self.positions[change.namespace] = change.position
        if self.snapshot_versions:
            snapshot_version = self.snapshot_versions.get((change.namespace, change.key), 0)
            if change.version <= snapshot_version:
                return False
        return self.subscription.wants(change)

    async def _catch_up(self) -> AsyncIterator[bytes]:
        """Read the log from each position until it is exhausted with no overflow meanwhile;
        changes an overflow dropped were logged before the rearm, so the next pass reads them."""
        while True:
            self.subscription.rearm()
            for namespace in self.request.patterns:
                while True:
                    changes = await self.changelog.after(namespace, self.positions[namespace],
                                                         _REPLAY_BATCH)
                    for change in changes:
                        if self._fresh(change):
                            yield frame(change.type.encode(), self.cursor, change.data)
                    if len(changes) < _REPLAY_BATCH:
                        break
            if not self.subscription.overflowed:
                break
        self.snapshot_versions.clear()

    async def _live(self) -> AsyncIterator[bytes]:
        subscription = self.subscription
        while True:
            change = await subscription.queue.get()
            if subscription.overflowed:
                data = msgspec.json.encode({"cursor": self.cursor.decode(),
                                            "reason": "the subscriber fell too far behind"})
                yield frame(b"overflow", self.cursor, data)
                return
            if subscription.closing:
                data = msgspec.json.encode({"cursor": self.cursor.decode(),
                                            "reason": "the broker is shutting down"})
                yield frame(b"shutdown", self.cursor, data)
                return
            while subscription.resets:
                namespace = subscription.resets.pop()
                self.positions[namespace] = "0-0"
                yield self._reset(namespace, "the change log was lost and started over")
            if change is not None and self._fresh(change):
                yield frame(change.type.encode(), self.cursor, change.data)
