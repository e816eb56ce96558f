"""Per-process fan-out: one change-log reader per namespace in use, bounded queues per subscriber.

A reader decodes and encodes each change once and offers it to its namespace's subscribers; a
subscriber whose queue is full is marked overflowed instead of slowing the reader down."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import anyio

from broker.core.errors import unavailable
from broker.core.grammar import Pattern
from broker.runtime.supervisor import Backoff, Supervisor
from broker.services.visibility import Viewer
from broker.storage.changelog import CORRUPT, Gap
from broker.streaming.changes import Change, ChangeLog

log = logging.getLogger("memp.hub")
# A reader's subscribers wait for it: it retries soon, and never more than 2 s apart.
READER_BACKOFF = Backoff(first=0.05, cap=2.0)


class ChangeQueue:
    """A FIFO with one consumer, bounded by count and by the bytes of the frames it holds (one
    change is always taken, however large): asyncio.Queue's get/put_nowait without its three
    deques and an event per queue (about 3 KiB, held by each of thousands of subscribers).
    None is a nudge: look at the subscriber's flags."""

    def __init__(self, maxsize: int, maxbytes: int | None = None) -> None:
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.bytes = 0
        self._items: list[Change | None] = []
        self._waiter: asyncio.Future[None] | None = None

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: Change | None) -> None:
        size = 0 if item is None else len(item.frame)
        if len(self._items) >= self.maxsize or (
                self._items and self.maxbytes is not None and self.bytes + size > self.maxbytes):
            raise asyncio.QueueFull
        self._items.append(item)
        self.bytes += size
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> Change | None:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._taken(self._items.pop(0))

    async def get(self) -> Change | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._taken(self._items.pop(0))

    def _taken(self, item: Change | None) -> Change | None:
        if item is not None:
            self.bytes -= len(item.frame)
        return item

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def drop(self, namespace: str) -> None:
        """Forget the queued changes of `namespace` (read from a history that was replaced)."""
        kept = [i for i in self._items if i is None or i.namespace != namespace]
        self._items = kept
        self.bytes = sum(len(i.frame) for i in kept if i is not None)


class Subscriber:
    """One subscriber: what it wants, its bounded queue, and flags the hub sets."""

    def __init__(self, patterns: dict[str, list[Pattern]], queue_size: int,
                 viewer: Viewer, writer: str = "", reviews: frozenset[str] = frozenset(),
                 *, queue_bytes: int | None = None) -> None:
        self.patterns = patterns
        self.viewer = viewer
        self.writer = writer  # who it is, and where it may review: for proposals' changes
        self.reviews = reviews
        self.queue = ChangeQueue(queue_size, queue_bytes)
        self.overflowed = False
        self.closing = False
        self.revoked: str | None = None  # why the stream lost its right to continue
        # Namespaces whose log lost changes: why, and the position the log goes on from.
        self.resets: dict[str, Gap] = {}

    def wants(self, change: Change) -> bool:
        if change.readers is not None and not self.viewer.may_read(change.readers):
            return False
        if change.proposer is not None and change.proposer != self.writer \
                and change.namespace not in self.reviews:
            return False
        for pattern in self.patterns.get(change.namespace, ()):
            if pattern.matches(change.key):
                return True
        return False

    def offer(self, change: Change) -> None:
        if self.overflowed or not self.wants(change):
            return
        try:
            self.queue.put_nowait(change)
        except asyncio.QueueFull:
            self.overflowed = True

    def revoke(self, reason: str) -> None:
        """End the stream with a `revoked` event saying why."""
        self.revoked = reason
        self.nudge()

    def rearm(self) -> None:
        """Forget queued changes after an overflow; the caller re-reads them from the log."""
        self.queue.clear()
        self.overflowed = False

    def nudge(self) -> None:
        """Wake the consumer so it looks at the flags."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)


class NamespaceReader:
    """Follows one namespace's change log and hands each change to the subscribers."""

    def __init__(self, changelog: ChangeLog, namespace: str, block_ms: int,
                 supervisor: Supervisor) -> None:
        self.changelog = changelog
        self.namespace = namespace
        self.block_ms = block_ms
        self.subscribers: set[Subscriber] = set()
        self.ready = asyncio.Event()
        self.position = "0-0"
        self.key: str | None = None  # the key of the record at `position`, once one was read
        self.stopped = False
        self.task = supervisor.start(f"change-log reader for {namespace}", self.run,
                                     READER_BACKOFF)

    async def run(self) -> None:
        """Follow the log until stopped. A failure ends the run; the supervisor starts it
        again, from the last position."""
        while not self.stopped:
            if not self.ready.is_set():
                self.position = await self.changelog.last_position(self.namespace)
                self.ready.set()
            changes = await self.changelog.wait(self.namespace, self.position,
                                                self.block_ms, 1000)
            # Checked on every read, not only after errors: the client library may
            # reconnect to a restarted Redis, or to a new primary after a failover, without
            # the reader ever seeing an error. The record at the position must be the one
            # read there: after a failover the new history may hold another under its id.
            if self.position != "0-0":
                gap = await self.changelog.gap(self.namespace, self.position, self.key)
                if gap is not None:
                    self._reset_subscribers(gap)
                    continue
            for change in changes:
                if change.type == CORRUPT:  # its position is passed, nobody gets it
                    continue
                for subscriber in self.subscribers:
                    subscriber.offer(change)
            if changes:
                self.position = changes[-1].position
                self.key = changes[-1].key if changes[-1].type != CORRUPT else None

    def _reset_subscribers(self, gap: Gap) -> None:
        """Changes after our position are gone (retention overtook us, Redis lost its data,
        or a failover replaced the history): tell every subscriber to re-sync, then follow the
        log from where its own history goes on (the start, after a loss), so changes the new
        history holds and no one was sent are delivered."""
        log.warning("change log of %s does not go on after %s (%s); resetting subscribers",
                    self.namespace, self.position, gap.cause)
        self.position, self.key = gap.resume, None
        for subscriber in self.subscribers:
            subscriber.queue.drop(self.namespace)
            subscriber.resets[self.namespace] = gap
            subscriber.nudge()


class Hub:
    """Starts a reader when a namespace gets its first subscriber and stops it after its last."""

    def __init__(self, changelog: ChangeLog, block_ms: int, ready_timeout: float,
                 supervisor: Supervisor) -> None:
        self.changelog = changelog
        self.block_ms = block_ms
        self.ready_timeout = ready_timeout
        self.supervisor = supervisor
        self.readers: dict[str, NamespaceReader] = {}
        self.finishing = False
        self._shutdown: anyio.Event | None = None
        self._shutdown_watch: asyncio.Task[None] | None = None

    def shutdown_event(self) -> anyio.Event:
        """One event for every stream of the process, which sse-starlette sets when the server
        starts shutting down; one task then tells every subscriber to send its farewell (one
        task per process, not one per subscriber)."""
        if self._shutdown is None:
            self._shutdown = anyio.Event()
            self._shutdown_watch = asyncio.create_task(self._finish_on(self._shutdown),
                                                       name="memp-hub-shutdown")
        return self._shutdown

    async def _finish_on(self, event: anyio.Event) -> None:
        await event.wait()
        self._finish_all()

    def _finish_all(self) -> None:
        self.finishing = True
        for reader in self.readers.values():
            for subscriber in reader.subscribers:
                subscriber.closing = True
                subscriber.nudge()

    async def join(self, subscriber: Subscriber) -> None:
        """Register the subscriber; returns once every reader it needs is following its log."""
        readers = []
        for namespace in subscriber.patterns:
            reader = self.readers.get(namespace)
            if reader is None:
                reader = NamespaceReader(self.changelog, namespace, self.block_ms,
                                         self.supervisor)
                self.readers[namespace] = reader
            reader.subscribers.add(subscriber)
            readers.append(reader)
        if self.finishing:
            subscriber.closing = True
            subscriber.nudge()
        try:
            async with asyncio.timeout(self.ready_timeout):
                for reader in readers:
                    await reader.ready.wait()
        except TimeoutError:
            self.leave(subscriber)
            raise unavailable("the change log is not reachable") from None

    def leave(self, subscriber: Subscriber) -> None:
        for namespace in subscriber.patterns:
            reader = self.readers.get(namespace)
            if reader is None:
                continue
            reader.subscribers.discard(subscriber)
            if not reader.subscribers:
                # Also flagged: on Python 3.11 a cancel can be swallowed inside redis-py.
                reader.stopped = True
                self.supervisor.stop_soon(reader.task)
                del self.readers[namespace]

    @property
    def subscriber_count(self) -> int:
        return len({s for r in self.readers.values() for s in r.subscribers})

    async def close(self) -> None:
        """Tell every subscriber to finish, then stop the readers."""
        self._finish_all()
        tasks = [r.task for r in self.readers.values()]
        if self._shutdown_watch is not None:
            tasks.append(self._shutdown_watch)
        await self.supervisor.stop(tasks)
        self.readers.clear()
