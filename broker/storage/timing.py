"""Times the commands a client sends and counts the ones that fail, for the broker's metrics.

The client's own methods are wrapped on the instance (redis-py has no hook of its own): every
command goes through `execute_command` and every pipeline through its `execute`, so one
wrapper each sees them all. Blocking stream reads use clients of their own, which are not
wrapped: their time is waiting for news, not Redis working."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class CommandObserver(Protocol):
    """Where timings go (`broker.runtime.metrics.Metrics`)."""

    def redis_command(self, command: str, seconds: float) -> None: ...

    def redis_error(self, command: str, error: BaseException) -> None: ...


def _name(args: tuple[Any, ...]) -> str:
    head = args[0] if args else b"?"
    if isinstance(head, bytes):
        head = head.decode("ascii", "replace")
    return str(head).split(" ", 1)[0].upper()


def _timed(call: Callable[..., Awaitable[Any]], name: Callable[[tuple[Any, ...]], str],
           observer: CommandObserver) -> Callable[..., Awaitable[Any]]:
    clock = time.perf_counter

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            reply = await call(*args, **kwargs)
        except Exception as exc:
            observer.redis_error(name(args), exc)
            raise
        observer.redis_command(name(args), clock() - started)
        return reply

    return timed


def time_commands(client: Any, observer: CommandObserver) -> None:
    """Wrap `client` (a Redis, Sentinel-primary or Cluster client) so each command and each
    pipeline is reported to `observer`; a pipeline is reported as PIPELINE."""
    client.execute_command = _timed(client.execute_command, _name, observer)
    open_pipeline = client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = open_pipeline(*args, **kwargs)
        pipe.execute = _timed(pipe.execute, lambda _: "PIPELINE", observer)
        return pipe

    client.pipeline = pipeline


def time_pipe(pipe: Any, observer: CommandObserver) -> None:
    """Wrap the auto-pipelined connection's `execute` (`broker.storage.pipe`) the same way."""
    pipe.execute = _timed(pipe.execute, _name, observer)
