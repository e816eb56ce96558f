"""Per-process fan-out: one change-log reader per namespace in use, bounded queues per subscriber.

A reader decodes and encodes each change once and offers it to its namespace's subscribers; a
subscriber whose queue is full is marked overflowed instead of slowing the reader down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import anyio

from broker.core.errors import unavailable
from broker.core.filters import Filter, Guard, index_key
from broker.core.grammar import Pattern
from broker.runtime.supervisor import Backoff, Supervisor
from broker.services.visibility import Viewer
from broker.storage.changelog import CORRUPT, Gap, Mark
from broker.streaming.changes import Change, ChangeLog
from broker.streaming.queues import ChangeQueue, ConflatingQueue

log = logging.getLogger("memp.hub")
# A reader's subscribers wait for it: it retries soon, and never more than 2 s apart.
READER_BACKOFF = Backoff(first=0.05, cap=2.0)
# A filtered stream whose changes were all filtered out passes its cursor on this often.
PROGRESS_SECONDS = 1.0


class Subscriber:
    """One subscriber: what it wants, its bounded queue, and flags the hub sets. With a
    filter, a change it rejects is not queued; a filter with a `Guard` is not even asked about
    changes the guard rules out (the reader indexes it). `progress_due` says the reader moved
    past changes a filter left out (raised at most every PROGRESS_SECONDS): the stream sends
    its cursor with its next send, which a nudge (`progress_nudged`) brings about unless the
    stream `sent` changes since the last tick and so will likely send again soon."""

    def __init__(self, patterns: dict[str, list[Pattern]], queue_size: int,
                 viewer: Viewer, writer: str = "", reviews: frozenset[str] = frozenset(),
                 *, queue_bytes: int | None = None, accepts: Filter | None = None,
                 guard: Guard | None = None, conflate: bool = False) -> None:
        self.patterns = patterns
        self.viewer = viewer
        self.writer = writer  # who it is, and where it may review: for proposals' changes
        self.reviews = reviews
        self.accepts = accepts
        self.guard = guard if accepts is not None else None
        self.guarded_whole = self.guard is not None and self.guard.whole  # the guard decides
        self.queue = (ConflatingQueue if conflate else ChangeQueue)(queue_size, queue_bytes)
        self.filtered = 0  # changes the filter rejected, not yet counted in the metrics
        self.progress_due = False
        self.progress_nudged = False
        self.sent = False  # the stream sent changes since the reader's last progress tick
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

    def passes(self, change: Change) -> bool:
        """The filter accepts the change (counted when it does not)."""
        if self.accepts is None or self.accepts(change):
            return True
        self.filtered += 1
        return False

    def offer(self, change: Change, accepted: bool = False) -> None:
        """Queue the change if wanted and (unless `accepted` already) the filter passes it."""
        if self.overflowed or not self.wants(change) or not (accepted or self.passes(change)):
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
        """Forget queued changes (nudges too) after an overflow; the caller re-reads them from
        the log, and sends its cursor after."""
        self.queue.clear()
        self.overflowed = False
        self.progress_due = self.progress_nudged = False

    def nudge(self) -> None:
        """Wake the consumer so it looks at the flags."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)


class GuardIndex:
    """Subscribers whose filters have a guard on one operand, by the keys the guard allows:
    the operand is read once per change, and only the subscribers under its key are asked."""

    def __init__(self, guard: Guard) -> None:
        self.read = guard.read
        self.by_key: dict[Any, set[Subscriber]] = {}
        self.size = 0

    def add(self, subscriber: Subscriber, guard: Guard) -> None:
        for key in guard.keys:
            self.by_key.setdefault(key, set()).add(subscriber)
        self.size += 1

    def discard(self, subscriber: Subscriber, guard: Guard) -> None:
        for key in guard.keys:
            chosen = self.by_key.get(key)
            if chosen is not None:
                chosen.discard(subscriber)
                if not chosen:
                    del self.by_key[key]
        self.size -= 1

    def chosen(self, change: Change) -> set[Subscriber]:
        key = index_key(self.read(change))
        return self.by_key.get(key, _NOBODY) if key is not None else _NOBODY


_NOBODY: set[Subscriber] = set()


class FilterTally:
    """Changes the indexes kept from filtered subscribers, not yet in the metrics."""

    filtered = 0


class Audience:
    """The subscribers of one namespace, and the offer of a change to them: to each one
    without a guarded filter, and to those a `GuardIndex` chooses."""

    def __init__(self, tally: FilterTally | None = None) -> None:
        self.members: set[Subscriber] = set()
        self.plain: set[Subscriber] = set()  # asked about every change
        self.indexes: dict[str, GuardIndex] = {}  # by the guard's operand
        self.filtering = 0  # subscribers with a filter
        self.tally = tally or FilterTally()

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[Subscriber]:
        return iter(self.members)

    def __contains__(self, subscriber: object) -> bool:
        return subscriber in self.members

    def add(self, subscriber: Subscriber) -> None:
        if subscriber in self.members:
            return
        self.members.add(subscriber)
        self.filtering += subscriber.accepts is not None
        guard = subscriber.guard
        if guard is None:
            self.plain.add(subscriber)
        else:
            self.indexes.setdefault(guard.operand, GuardIndex(guard)).add(subscriber, guard)

    def discard(self, subscriber: Subscriber) -> None:
        if subscriber not in self.members:
            return
        self.members.discard(subscriber)
        self.filtering -= subscriber.accepts is not None
        guard = subscriber.guard
        if guard is None:
            self.plain.discard(subscriber)
            return
        index = self.indexes[guard.operand]
        index.discard(subscriber, guard)
        if not index.size:
            del self.indexes[guard.operand]

    def offer(self, change: Change) -> None:
        for subscriber in self.plain:
            subscriber.offer(change)
        for index in self.indexes.values():
            chosen = index.chosen(change)
            for subscriber in chosen:
                subscriber.offer(change, subscriber.guarded_whole)
            self.tally.filtered += index.size - len(chosen)


class NamespaceReader:
    """Follows one namespace's change log and hands each change to its `Audience`."""

    def __init__(self, changelog: ChangeLog, namespace: str, block_ms: int,
                 supervisor: Supervisor, tally: FilterTally | None = None) -> None:
        self.changelog = changelog
        self.namespace = namespace
        self.block_ms = block_ms
        self.subscribers = Audience(tally)
        self.ticked = ("0-0", 0.0)  # the position and time of the last progress tick
        self.riding = False  # a progress waits for its stream's next send: tick again
        self.ready = asyncio.Event()
        self.position = "0-0"
        self.check = ""  # the check of the record at `position` ("": none)
        self.stopped = False
        self.task = supervisor.start(f"change-log reader for {namespace}", self.run,
                                     READER_BACKOFF)

    async def run(self) -> None:
        """Follow the log until stopped. A failure ends the run; the supervisor starts it
        again, from the last position."""
        while not self.stopped:
            if not self.ready.is_set():
                end = await self.changelog.last_position(self.namespace)
                self.position, self.check = end.position, end.check
                self.ready.set()
            changes = await self.changelog.wait(self.namespace, self.position,
                                                self.block_ms, 1000)
            # Checked on every read, not only after errors: the client library may
            # reconnect to a restarted Redis, or to a new primary after a failover, without
            # the reader ever seeing an error. The record at the position must be the one
            # read there: after a failover the new history may hold another under its id.
            if self.position != "0-0":
                gap = await self.changelog.gap(self.namespace, self.position, self.check)
                if gap is not None:
                    self._reset_subscribers(gap)
                    continue
            for change in changes:
                if change.type != CORRUPT:  # its position is passed, nobody gets it
                    self.subscribers.offer(change)
            if changes:
                self.position, self.check = changes[-1].position, changes[-1].check
            if self.subscribers.filtering:
                self._progress()

    def _progress(self) -> None:
        """At most every PROGRESS_SECONDS, once the log moved: tell the filtered subscribers,
        so a stream that sent nothing can pass its cursor on. One that sent changes since the
        last tick takes its cursor along with its next send instead (a nudge is a send of
        its own, about what a delivery costs); if none came by the next tick, it is nudged."""
        now = asyncio.get_running_loop().time()
        position, when = self.ticked
        moved = position != self.position
        if not (moved or self.riding) or now - when < PROGRESS_SECONDS:
            return
        self.ticked = (self.position, now)
        riding = False
        for subscriber in self.subscribers:
            if subscriber.accepts is None:
                continue
            sent, subscriber.sent = subscriber.sent, False
            if subscriber.progress_nudged or not (moved or subscriber.progress_due):
                continue  # one nudge pending at most, however long
            if sent and moved and not subscriber.progress_due:
                subscriber.progress_due = riding = True
                continue
            subscriber.progress_due = subscriber.progress_nudged = True
            subscriber.nudge()
        self.riding = riding

    def _reset_subscribers(self, gap: Gap) -> None:
        """Changes after our position are gone (retention overtook us, Redis lost its data,
        or a failover replaced the history): tell every subscriber to re-sync, then follow the
        log from where its own history goes on (the start, after a loss), so changes the new
        history holds and no one was sent are delivered."""
        log.warning("change log of %s does not go on after %s (%s); resetting subscribers",
                    self.namespace, self.position, gap.cause)
        self.position, self.check = gap.resume, gap.check
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
        self.tally = FilterTally()
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
                                         self.supervisor, self.tally)
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
                # Forgotten first: a stopped reader must never take new subscribers.
                reader.stopped = True
                del self.readers[namespace]
                self.supervisor.stop_soon(reader.task)

    def position(self, namespace: str) -> Mark | None:
        """How far this process's reader of `namespace` has offered changes (None: no reader).
        A subscriber whose queue is empty has been offered everything up to here."""
        reader = self.readers.get(namespace)
        return Mark(reader.position, reader.check) if reader is not None else None

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
