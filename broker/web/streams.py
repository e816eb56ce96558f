"""One subscriber's event stream: replay or snapshot, then live changes, as SSE frames.

Gap-free seam: the subscriber joins the hub (its queue starts filling) before the log is
read from the cursor, and live changes at or before the last position replayed are dropped.
Live changes already queued are sent together, in one write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from broker.core.filters import MISSING, Filter, Guard
from broker.core.grammar import Pattern
from broker.core.models import Entry
from broker.runtime.metrics import Metrics
from broker.services.auth import Principal
from broker.services.memory import MemoryService
from broker.storage.changelog import CORRUPT, TRIMMED, Mark, position_key
from broker.streaming.changes import Change, ChangeLog, encode_payload
from broker.streaming.hub import Hub, Subscriber
from broker.streaming.queues import ENTRY_CHANGES
from broker.web import frames

_REPLAY_BATCH = 500
_LIVE_BATCH = 64  # queued changes sent in one write, at most


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """What a client asked to follow, and from where; which changes it wants (`accepts`), and
    whether a lagging stream sends only the newest change per key (`conflate`), at most
    `max_rate` changes a second (which conflates too)."""

    patterns: dict[str, list[Pattern]]
    cursor: dict[str, Mark] | None
    snapshot: bool
    accepts: Filter | None = None
    guard: Guard | None = None
    conflate: bool = False
    max_rate: float | None = None


class EntrySubject:
    """A snapshot's entry as a filter sees it: a `put` of its current value."""

    type = "put"

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.key = entry.key
        self.agent = entry.agent_id
        self.version = entry.version

    def document(self) -> Any:
        return MISSING if self.entry.value is None else msgspec.json.decode(self.entry.value)


class Pace:
    """At most `rate` changes a second: each at least 1/rate s after the one before."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = 0.0

    def delay(self) -> float:
        return max(0.0, self.next - asyncio.get_running_loop().time())

    def spend(self) -> None:
        self.next = asyncio.get_running_loop().time() + self.interval


class EventStream:
    """Produces the SSE frames of one subscriber."""

    def __init__(self, hub: Hub, changelog: ChangeLog, memory: MemoryService,
                 principal: Principal, request: StreamRequest, queue_size: int,
                 retry_ms: int, metrics: Metrics, *, queue_bytes: int | None = None,
                 on_close: Callable[[], None] = lambda: None) -> None:
        self.hub = hub
        self.changelog = changelog
        self.memory = memory
        self.principal = principal
        self.request = request
        self.subscriber = Subscriber(
            request.patterns, queue_size, memory.cells.viewer(principal), principal.writer_id,
            frozenset(ns for ns in request.patterns if principal.can("review", ns)),
            queue_bytes=queue_bytes, accepts=request.accepts, guard=request.guard,
            conflate=request.conflate or request.max_rate is not None)
        self.retry_ms = retry_ms
        self.positions: dict[str, str] = {}
        self.checks: dict[str, str] = {}  # the check of the record at each position ("": none)
        self.orders: dict[str, tuple[int, int]] = {}  # the positions as numbers
        self.single = len(request.patterns) == 1
        self.snapshot_versions: dict[tuple[str, str], int] = {}
        self.delivered = metrics.events_delivered
        self.metrics = metrics
        self.pace = Pace(request.max_rate) if request.max_rate is not None else None
        self.conflating = request.conflate or self.pace is not None
        self.unsent = False  # the cursor moved past filtered-out changes since the last id sent
        self.ended: str | None = None  # why the stream ended itself: revoked, overflow, shutdown
        self.on_close = on_close  # run by `close`, which may come more than once

    @property
    def cursor(self) -> bytes:
        return frames.format_cursor({ns: Mark(position, self.checks.get(ns, ""))
                                     for ns, position in self.positions.items()})

    def _move(self, namespace: str, mark: Mark) -> None:
        self.positions[namespace] = mark.position
        self.checks[namespace] = mark.check
        self.orders[namespace] = position_key(mark.position)

    async def open(self) -> dict[str, str]:
        """Join the hub and fix the start positions before any response is sent, so a store
        that is down is a 503 and a client that has seen the first frame knows the stream
        follows every change made from then on. Returns the namespaces whose cursor lost
        changes."""
        await self.hub.join(self.subscriber)
        try:
            return await self._locate()
        except BaseException:
            self.hub.leave(self.subscriber)
            raise

    def close(self) -> None:
        """Leave the hub (idempotent); `on_close` runs even if leaving failed."""
        try:
            self.hub.leave(self.subscriber)
            self._count()
        finally:
            self.on_close()

    def _count(self) -> None:
        """Add the changes filtered out and conflated since last time to the metrics."""
        subscriber, tally = self.subscriber, self.hub.tally
        if subscriber.filtered or tally.filtered:
            self.metrics.events_filtered.inc(subscriber.filtered + tally.filtered)
            subscriber.filtered = tally.filtered = 0
        if subscriber.queue.conflated:
            self.metrics.events_conflated.inc(subscriber.queue.conflated)
            subscriber.queue.conflated = 0

    async def frames(self, lost: dict[str, str]) -> AsyncIterator[bytes]:
        try:
            yield frames.retry(self.retry_ms)
            for namespace, cause in lost.items():
                yield self._reset(namespace, cause)
            if self.request.cursor is None and self.request.snapshot:
                async for chunk in self._snapshot():
                    yield chunk
            async for chunk in self._catch_up():
                yield chunk
            if self.unsent:
                yield self._progress_frame()
            if self.subscriber.revoked is not None:  # no need to wait for a change first
                yield self._farewell() or b""
                return
            async for chunk in self._live():
                yield chunk
        finally:
            self.close()

    async def _locate(self) -> dict[str, str]:
        """Set each namespace's start: the cursor, else the log's end; returns the namespaces
        whose cursor lost changes, with why. After trimming they start from the end; after a
        loss or a replaced history (the record at the cursor is gone, or another one under its
        id fails the cursor's check), from where the log's own history goes on, so the changes
        it holds that the cursor never saw are sent after the reset."""
        lost: dict[str, str] = {}
        cursor = self.request.cursor or {}
        for namespace in self.request.patterns:
            self._move(namespace, await self.changelog.last_position(namespace))
            start = cursor.get(namespace)
            if start is None:
                continue
            gap = await self.changelog.gap(namespace, start.position, start.check or None)
            if gap is None:
                self._move(namespace, start)
                continue
            lost[namespace] = gap.cause
            if gap.cause != TRIMMED:
                self._move(namespace, Mark(gap.resume, gap.check))
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
                        if not self._accepts_entry(entry):
                            continue
                        yield frames.event(b"snapshot", None, encode_payload(entry, "snapshot"))
                    page_cursor = page.next_cursor
                    if page_cursor is None or self.subscriber.revoked is not None:
                        break
        yield frames.snapshot_end(self.cursor)

    def _accepts_entry(self, entry: Entry) -> bool:
        accepts = self.request.accepts
        if accepts is None or accepts(EntrySubject(entry)):
            return True
        self.subscriber.filtered += 1
        return False

    def _reset(self, namespace: str, cause: str) -> bytes:
        self.unsent = False
        return frames.reset(self.cursor, namespace, cause)

    def _progress_frame(self) -> bytes:
        self.unsent = False
        return frames.progress(self.cursor)

    def _progress(self) -> bytes | None:
        """Once the queue is drained: a filtered stream has been offered every change up to
        its readers' positions, so its cursor moves there; when the reader says it is time
        and no event carried the cursor yet, a `progress` event does. The metrics take the
        changes filtered out then (at most a second late), conflated ones at once."""
        subscriber = self.subscriber
        if not subscriber.progress_due:
            if subscriber.queue.conflated:
                self._count()
            return None
        self._count()
        subscriber.progress_due = subscriber.progress_nudged = False
        if subscriber.overflowed or subscriber.resets:
            return None
        for namespace in self.request.patterns:
            mark = self.hub.position(namespace)
            if mark is not None and position_key(mark.position) > self.orders[namespace]:
                self._move(namespace, mark)
                self.unsent = True
        return self._progress_frame() if self.unsent else None

    def _fresh(self, change: Change, matched: bool = False) -> bool:
        """Not yet sent: after the namespace's position, newer than the snapshot's version, and
        wanted (`matched`: the hub has checked the patterns already). Moves the position."""
        if change.order <= self.orders.get(change.namespace, (0, 0)):
            return False
        self.positions[change.namespace] = change.position
        self.checks[change.namespace] = change.check
        self.orders[change.namespace] = change.order
        if self.snapshot_versions and change.proposer is None:
            snapshot_version = self.snapshot_versions.get((change.namespace, change.key), 0)
            if change.version <= snapshot_version:
                return False
        if change.type == CORRUPT:
            return False
        if matched:
            return True
        if not self.subscriber.wants(change):
            return False
        if self.subscriber.passes(change):
            return True
        self.unsent = True
        return False

    def _frame(self, change: Change) -> bytes:
        """The change's event, after `_fresh` moved the position: with one namespace the cursor
        is the change's own position, so every such subscriber sends the same bytes."""
        self.unsent = False
        if self.single:
            return change.frame
        return frames.event(change.type.encode(), self.cursor, change.data)

    async def _catch_up(self) -> AsyncIterator[bytes]:
        """Read the log from each position until it is exhausted with no overflow meanwhile;
        changes an overflow dropped were logged before the rearm, so the next pass reads them."""
        while True:
            self.subscriber.rearm()
            for namespace in self.request.patterns:
                while True:
                    changes = await self.changelog.after(namespace, self.positions[namespace],
                                                         _REPLAY_BATCH)
                    for change in self._latest(changes) if self.conflating else changes:
                        if self._fresh(change):
                            if self.pace is not None:
                                await self._paced(self.pace)
                            self.delivered.inc()
                            yield self._frame(change)
                    if len(changes) < _REPLAY_BATCH or self.subscriber.revoked is not None:
                        break
            if not self.subscriber.overflowed:
                break
        self.snapshot_versions.clear()

    def _latest(self, changes: list[Change]) -> list[Change]:
        """A replayed batch with only the newest change per key (as ConflatingQueue keeps)."""
        newest = {(c.key if c.type in ENTRY_CHANGES else c.position): c for c in changes}
        if len(newest) < len(changes):
            self.metrics.events_conflated.inc(len(changes) - len(newest))
        return sorted(newest.values(), key=lambda c: c.order)

    async def _paced(self, pace: Pace) -> None:
        """Wait for the rate's next slot, looking at the subscriber's flags twice a second."""
        for _ in range(int(pace.interval / 0.5) + 2):
            delay = pace.delay()
            if delay <= 0 or self._farewell(peek=True) is not None:
                break
            await asyncio.sleep(min(delay, 0.5))
        pace.spend()

    async def _live(self) -> AsyncIterator[bytes]:
        """Queued changes, up to _LIVE_BATCH at a time in one chunk (one, under a rate); a
        farewell ends it."""
        subscriber = self.subscriber
        queue = subscriber.queue
        batch = 1 if self.pace is not None else _LIVE_BATCH
        while True:
            if self.pace is not None:
                await queue.wait()
                await self._paced(self.pace)
            change = await queue.get()
            frames: list[bytes] = []
            while True:
                farewell = self._farewell()
                if farewell is not None:
                    frames.append(farewell)
                    yield b"".join(frames)
                    return
                while subscriber.resets:
                    namespace, gap = subscriber.resets.popitem()
                    self._move(namespace, Mark(gap.resume, gap.check))
                    frames.append(self._reset(namespace, gap.cause))
                if change is not None and self._fresh(change, matched=True):
                    frames.append(self._frame(change))
                if queue.empty() or len(frames) >= batch:
                    break
                change = queue.get_nowait()
            delivered = len(frames)
            if queue.empty() and (progress := self._progress()) is not None:
                frames.append(progress)
            if frames:
                if delivered:
                    subscriber.sent = True
                    self.delivered.inc(delivered)
                yield b"".join(frames)

    def _farewell(self, peek: bool = False) -> bytes | None:
        """The last frame, once the subscriber overflowed or the broker is shutting down
        (`peek`: only whether there is one)."""
        if self.subscriber.revoked is not None:
            event, reason = b"revoked", self.subscriber.revoked
        elif self.subscriber.overflowed:
            event, reason = b"overflow", "the subscriber fell too far behind"
        elif self.subscriber.closing:
            event, reason = b"shutdown", "the broker is shutting down"
        else:
            return None
        if peek:
            return b""
        self.ended = event.decode()
        return frames.farewell(event, self.cursor, reason)
