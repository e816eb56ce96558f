"""A wake-up call between a process's writes and its background loops: a write that leaves work
behind rings, and a loop that found nothing to do sleeps until a ring or its longest wait,
rather than looking again every few milliseconds."""

from __future__ import annotations

import asyncio


class Doorbell:
    """Rings every loop listening on it; a ring between two waits of a loop is not lost."""

    def __init__(self) -> None:
        self._listeners: list[asyncio.Event] = []

    def listen(self) -> asyncio.Event:
        """A new listener: set by every later ring, cleared by `wait`."""
        event = asyncio.Event()
        self._listeners.append(event)
        return event

    def forget(self, listener: asyncio.Event) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def ring(self) -> None:
        for event in self._listeners:
            event.set()

    @staticmethod
    async def wait(listener: asyncio.Event, longest: float) -> bool:
        """Wait until the listener was rung (since its last wait) or `longest` seconds have
        passed; whether it was rung."""
        if not listener.is_set():
            try:
                async with asyncio.timeout(longest):
                    await listener.wait()
            except TimeoutError:
                return False
        listener.clear()
        return True
