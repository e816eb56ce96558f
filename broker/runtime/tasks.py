"""Stopping background tasks reliably."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

_RECANCEL_SECONDS = 0.5  # how long a task gets to end before it is cancelled again


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], grace: float | None = None
                     ) -> set[asyncio.Task[Any]]:
    """Cancel the tasks and wait until every one has ended, or `grace` seconds have passed;
    returns those still running then.

    On Python 3.11, `asyncio.wait_for` (which redis-py uses for socket timeouts) can swallow a
    cancellation that races with its inner call finishing (CPython gh-86296), leaving a loop
    running and a plain cancel-then-gather waiting forever; a task that shrugs off one cancel
    is cancelled again."""
    tasks = list(tasks)
    loop = asyncio.get_running_loop()
    deadline = None if grace is None else loop.time() + grace
    pending = {task for task in tasks if not task.done()}
    while pending:
        wait = _RECANCEL_SECONDS
        if deadline is not None:
            wait = min(wait, deadline - loop.time())
            if wait <= 0:
                break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait)
    await asyncio.gather(*(task for task in tasks if task not in pending),
                         return_exceptions=True)
    return pending
