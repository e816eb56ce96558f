"""Schema work off the event loop: one worker thread per process, a time budget per job, and
one job per namespace at a time, so a hostile schema delays its own namespace first."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from broker.errors import MempError
from broker.schema_keywords import ValidationTimeout, deadline

T = TypeVar("T")


class SchemaRunner:
    """Runs validations in a worker thread, each stopped after `timeout` seconds of running.

    One thread, because validation is Python code that holds the GIL: the event loop gets it
    back within the interpreter's 5 ms switch interval, and each further busy thread would add
    as much again to every request's latency."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memp-schemas")
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

    async def run(self, namespace: str, job: Callable[[], T]) -> T:
        """Run `job` in the worker; MempError `schema_timeout` when it runs out of time, or
        when the namespace's earlier jobs keep it waiting longer than the budget."""
        turn = self._turns.setdefault(namespace, asyncio.Lock())
        self._waiting[namespace] = self._waiting.get(namespace, 0) + 1
        try:
            try:
                async with asyncio.timeout(self.timeout):
                    await turn.acquire()
            except TimeoutError:
                raise self._timed_out("earlier validations in this namespace are still running"
                                      ) from None
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, self._timed, job)
            except ValidationTimeout:
                raise self._timed_out("validation ran out of time") from None
            finally:
                turn.release()
        finally:
            self._waiting[namespace] -= 1
            if not self._waiting[namespace]:
                del self._waiting[namespace], self._turns[namespace]

    def _timed(self, job: Callable[[], T]) -> T:
        with deadline(self.timeout):
            return job()

    def _timed_out(self, why: str) -> MempError:
        ms = round(self.timeout * 1000)
        return MempError("schema_timeout", f"{why}: schema validation did not finish within "
                         f"{ms} ms; nothing was written", {"timeout_ms": ms})

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
