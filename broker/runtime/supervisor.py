"""One supervisor for the process's background work: it logs and restarts any loop that fails.

Loops run as arq's worker and uvicorn's supervisors run theirs, so none can end unnoticed: a
loop that raises (anything, not only a store error) or returns is logged and started again
after a pause that doubles up to a cap, and starts over from the shortest once a run has stayed
up `healthy_after` seconds (supervisord's `startsecs`). The store being out of reach is expected
and logged as a one-line warning (one a period, when given a `Throttle` for it); anything else
is an error with its traceback. Stopping is bounded: a loop that shrugs off its cancel is
cancelled again, and one still running after the timeout is named in the log and left behind
rather than holding up shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from broker.runtime.logs import Throttle
from broker.runtime.tasks import stop_tasks

log = logging.getLogger("memp.supervisor")
Loop = Callable[[], Awaitable[object]]
STOP_SECONDS = 5.0  # the longest the supervisor waits for its loops to stop


@dataclass(frozen=True)
class Backoff:
    """The pause before a restart: `first`, doubled after each quick failure up to `cap`, and
    `first` again after a run that stayed up `healthy_after` seconds."""

    first: float = 0.1
    cap: float = 5.0
    healthy_after: float = 1.0

    def after(self, previous: float | None, ran: float) -> float:
        if previous is None or ran >= self.healthy_after:
            return self.first
        return min(previous * 2, self.cap)


@dataclass(frozen=True)
class Supervised:
    """A background loop as declared: `run()` again and again (or every `every` seconds)."""

    name: str
    run: Loop
    every: float | None = None
    backoff: Backoff | None = None


class Supervisor:
    """Starts, restarts and stops the background loops of one process.

    `transient` lists the exceptions that mean the store is out of reach: logged as a warning
    without a traceback. Everything else a loop raises is logged as an error with one."""

    def __init__(self, transient: tuple[type[BaseException], ...] = (),
                 throttle: Callable[[BaseException], Throttle] | None = None) -> None:
        self.transient = transient
        # Where a transient failure's warning goes: one line a period, not each.
        self.throttle = throttle
        self.tasks: set[asyncio.Task[None]] = set()
        self._stopping: set[asyncio.Task[None]] = set()
        self._closing = False

    def start(self, name: str, loop: Loop, backoff: Backoff | None = None) -> asyncio.Task[None]:
        """Run `loop()` until stopped, starting it again whenever it fails or returns."""
        task = asyncio.create_task(self._supervise(name, loop, backoff or Backoff()), name=name)
        return self._track(task)

    def every(self, name: str, interval: float, job: Loop,
              backoff: Backoff | None = None) -> asyncio.Task[None]:
        """Run `job()` every `interval` seconds."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                await job()

        return self.start(name, loop, backoff)

    def start_all(self, loops: Iterable[Supervised]) -> None:
        for loop in loops:
            if loop.every is None:
                self.start(loop.name, loop.run, loop.backoff)
            else:
                self.every(loop.name, loop.every, loop.run, loop.backoff)

    def spawn(self, name: str, job: Coroutine[Any, Any, object]) -> None:
        """Run a one-off job in the background: a failure is logged, not retried."""
        if self._closing:
            job.close()
            return
        self._track(asyncio.create_task(self._once(name, job), name=name))

    def stop_soon(self, task: asyncio.Task[None]) -> None:
        """Stop a loop from synchronous code: cancelled now, cancelled again should it shrug
        that off, and never restarted."""
        self._stopping.add(task)
        task.cancel()
        self.spawn(f"stopping {task.get_name()}", self.stop([task]))

    async def stop(self, tasks: Iterable[asyncio.Task[None]],
                   grace: float = STOP_SECONDS) -> None:
        """Stop these loops, waiting at most `grace` seconds; names any still running."""
        tasks = list(tasks)
        self._stopping.update(task for task in tasks if not task.done())
        stuck = await stop_tasks(tasks, grace)
        self._stopping.difference_update(task for task in tasks if task.done())
        if stuck:
            self.tasks.difference_update(stuck)  # not waited for again by `close`
            names = ", ".join(sorted(task.get_name() for task in stuck))
            log.error("still running %.1fs after being told to stop, left behind: %s",
                      grace, names)

    async def close(self, grace: float = STOP_SECONDS) -> None:
        """Stop everything within `grace` seconds; nothing starts or restarts after this."""
        self._closing = True
        await self.stop(list(self.tasks), grace)

    def _track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._stopping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Only what `except Exception` lets through (KeyboardInterrupt, SystemExit).
            log.error("%s ended", task.get_name(), exc_info=task.exception())

    def _over(self, task: asyncio.Task[Any] | None) -> bool:
        return self._closing or task in self._stopping

    async def _supervise(self, name: str, loop: Loop, backoff: Backoff) -> None:
        task = asyncio.current_task()
        clock = asyncio.get_running_loop().time
        delay: float | None = None
        while not self._over(task):
            started = clock()
            failure: Exception | None = None
            try:
                await loop()
            except Exception as exc:
                failure = exc
            # A cancel swallowed inside the loop (CPython gh-86296) must not become a restart.
            if self._over(task):
                return
            delay = backoff.after(delay, clock() - started)
            self._report(name, failure, f"restarting in {delay:.2f}s")
            failure = None
            await asyncio.sleep(delay)

    async def _once(self, name: str, job: Coroutine[Any, Any, object]) -> None:
        try:
            await job
        except Exception as exc:
            self._report(name, exc, "not retried")

    def _report(self, name: str, failure: Exception | None, then: str) -> None:
        if failure is None:
            log.error("%s returned; %s", name, then)
        elif isinstance(failure, self.transient):
            if self.throttle is not None:
                self.throttle(failure).failure("%s failed: %s; %s", name, _describe(failure),
                                               then)
            else:
                log.warning("%s failed: %s; %s", name, _describe(failure), then)
        else:
            log.error("%s failed: %s; %s", name, _describe(failure), then, exc_info=failure)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
