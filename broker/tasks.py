"""Stopping background tasks reliably."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel the tasks and wait until every one has ended.

    On Python 3.11, `asyncio.wait_for` (which redis-py uses for socket timeouts) can swallow a
    cancellation that races with its inner call finishing (CPython gh-86296), leaving a loop
    running and a plain cancel-then-gather waiting forever; a task that shrugs off one cancel
    is cancelled again."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)
    await asyncio.gather(*tasks, return_exceptions=True)
