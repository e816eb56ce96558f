"""Subscribers' bounded queues: a FIFO, and one that conflates pending changes per key
(`conflate=latest`, `max_rate`)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from broker.streaming.changes import Change

# Changes to an entry, which conflation may collapse per key (a proposal's change never is).
ENTRY_CHANGES = frozenset({"put", "delete", "expire"})


class ChangeQueue:
    """A FIFO with one consumer, bounded by count and by the bytes of the frames it holds (one
    change is always taken, however large): asyncio.Queue's get/put_nowait without its three
    deques and an event per queue (about 3 KiB, held by each of thousands of subscribers).
    None is a nudge: look at the subscriber's flags."""

    def __init__(self, maxsize: int, maxbytes: int | None = None) -> None:
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.bytes = 0
        self.conflated = 0  # changes replaced by a newer one (ConflatingQueue), not yet counted
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
        self._wake()

    def get_nowait(self) -> Change | None:
        if self.empty():
            raise asyncio.QueueEmpty
        return self._taken(self._pop())

    async def get(self) -> Change | None:
        await self.wait()
        return self._taken(self._pop())

    async def wait(self) -> None:
        """Until something is queued (without taking it)."""
        while self.empty():
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _pop(self) -> Change | None:
        return self._items.pop(0)

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


class ConflatingQueue(ChangeQueue):
    """A ChangeQueue in which a change to a key replaces that key's change still pending (the
    newest wins, and moves to the back: positions stay in order). Bounded by the number of
    keys pending and their bytes. A proposal's change is never replaced."""

    def __init__(self, maxsize: int, maxbytes: int | None = None) -> None:
        super().__init__(maxsize, maxbytes)
        self._pending: OrderedDict[tuple[str, str], Change] = OrderedDict()
        self._nudged = False

    def qsize(self) -> int:
        return len(self._pending) + self._nudged

    def empty(self) -> bool:
        return not self._pending and not self._nudged

    def put_nowait(self, item: Change | None) -> None:
        if item is None:
            self._nudged = True
            self._wake()
            return
        slot = (item.namespace, item.key if item.type in ENTRY_CHANGES else item.position)
        old = self._pending.get(slot)
        size = len(item.frame) - (len(old.frame) if old is not None else 0)
        if (old is None and len(self._pending) >= self.maxsize) or (
                self._pending and self.maxbytes is not None
                and self.bytes + size > self.maxbytes):
            raise asyncio.QueueFull
        if old is not None:
            del self._pending[slot]
            self.conflated += 1
        self._pending[slot] = item
        self.bytes += size
        self._wake()

    def _pop(self) -> Change | None:
        if self._nudged:
            self._nudged = False
            return None
        return self._pending.popitem(last=False)[1]

    def clear(self) -> None:
        self._pending.clear()
        self._nudged = False
        self.bytes = 0

    def drop(self, namespace: str) -> None:
        for slot in [slot for slot in self._pending if slot[0] == namespace]:
            self.bytes -= len(self._pending.pop(slot).frame)
