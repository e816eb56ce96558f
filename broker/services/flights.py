"""Cache look-ups that run once however many requests miss at the same moment.

When a cached entry expires under load, every request in flight misses it in the same turn
(64 connections: 64 identical Redis reads, each taking a pooled connection). A `Flights`
runs one load per key and hands its result to every request that asked meanwhile. A load
started before an invalidation is not kept: its caller gets the result, but nothing is cached
from it, so a revocation or configuration change is never undone by a read that raced it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Flights(Generic[K, V]):
    """One load in flight per key; `generation` moves on at every invalidation."""

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}
        self.generation = 0

    async def load(self, key: K, load: Callable[[], Awaitable[V]],
                   keep: Callable[[V], None]) -> V:
        """The result of `load()`, shared with every caller of the same key meanwhile;
        `keep(result)` caches it unless an invalidation came while it ran."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._run(key, load, keep))
            # its waiters take any error; if all of them were cancelled, nobody must
            flight.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._flights[key] = flight
        return await asyncio.shield(flight)

    async def _run(self, key: K, load: Callable[[], Awaitable[V]],
                   keep: Callable[[V], None]) -> V:
        started = self.generation
        try:
            result = await load()
            if self.generation == started:
                keep(result)
            return result
        finally:
            if self._flights.get(key) is asyncio.current_task():
                del self._flights[key]

    def invalidate(self) -> None:
        """Whatever is loading now was read before the change: let it be used, not kept."""
        self.generation += 1
        self._flights.clear()
