"""Schema work off the event loop: one validation thread per process, a time budget per
validation, one validation per namespace at a time (so a hostile schema delays its own
namespace first), and compiled schemas kept, in a thread of their own, while unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from broker.core.errors import MempError
from broker.schemas.compile import CompiledSchema, SchemaRecord, compile_schema
from broker.schemas.keywords import ValidationTimeout, deadline

T = TypeVar("T")


class SchemaRunner:
    """Runs validations in a worker thread, each stopped after `timeout` seconds of running.

    One validation thread, because validation is Python code that holds the GIL: the event
    loop gets it back within the interpreter's 5 ms switch interval, and each further busy
    thread would add as much again to every request's latency."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memp-schemas")
        # compiling has a thread of its own, so that it never waits behind a validation
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memp-compile")
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._compiled: dict[tuple[str, str], CompiledSchema] = {}

    async def compile(self, namespace: str, records: list[SchemaRecord]) -> list[CompiledSchema]:
        """Compiled schemas for the records: unchanged ones as compiled before, others compiled
        in a thread (a 64 KiB schema of patterns takes up to about 0.5 s)."""
        known = {r.id: self._compiled.get((namespace, r.id)) for r in records}
        if any(c is None or c.record != r for r, c in zip(records, known.values(), strict=True)):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._compiler, self._compile, namespace, records)
        for key in list(self._compiled):  # a copy: the worker may be adding to it
            if key[0] == namespace and key[1] not in known:
                self._compiled.pop(key, None)
        return [self._compiled[(namespace, r.id)] for r in records]

    def _compile(self, namespace: str, records: list[SchemaRecord]) -> None:
        for record in records:
            cached = self._compiled.get((namespace, record.id))
            if cached is None or cached.record != record:
                self._compiled[(namespace, record.id)] = compile_schema(record)

    async def run(self, namespace: str, job: Callable[[], T], budget: float | None = None
                  ) -> T:
        """Run `job` in the worker; MempError `schema_timeout` when it runs out of time (the
        runner's timeout, or `budget`), or the namespace's earlier jobs keep it waiting as long."""
        timeout = budget or self.timeout
        turn = self._turns.setdefault(namespace, asyncio.Lock())
        self._waiting[namespace] = self._waiting.get(namespace, 0) + 1
        try:
            try:
                async with asyncio.timeout(timeout):
                    await turn.acquire()
            except TimeoutError:
                raise _timed_out("earlier validations in this namespace are still running",
                                 timeout) from None
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, _timed, job, timeout)
            except ValidationTimeout:
                raise _timed_out("validation ran out of time", timeout) from None
            finally:
                turn.release()
        finally:
            self._waiting[namespace] -= 1
            if not self._waiting[namespace]:
                del self._waiting[namespace], self._turns[namespace]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._compiler.shutdown(wait=False, cancel_futures=True)


def _timed(job: Callable[[], T], timeout: float) -> T:
    with deadline(timeout):
        return job()


def _timed_out(why: str, timeout: float) -> MempError:
    ms = round(timeout * 1000)
    return MempError("schema_timeout", f"{why}: schema validation did not finish within {ms} ms; "
                     "nothing was written", {"timeout_ms": ms})
