"""Writes of the records beside entries (namespace configuration, schemas, API keys, agents'
homes and removals): plain commands sent as one atomic script call, so they wait for replicas
as entry writes do (`MEMP_WRITE_REPLICAS`, `Backend.run(..., durable=True)`) on one server,
Sentinel and Cluster alike, and what they change is announced to every broker process even
when replicas did not confirm it in time (the write was applied all the same)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.storage import bulletins, scripts
from broker.storage.client import Backend, NotReplicated, ScriptCall
from broker.storage.scripts import Fields

WRITE_KEYS = Fields("write_keys", (), rest="keys", counted=False)
WRITE_GUARD = Fields("write_guard", ("check",), rest="expected")
WRITE_COMMAND = Fields("write_command", ("name",), rest="args")

Command = tuple[Any, ...]  # name, key, the arguments after the key
Announcement = tuple[bulletins.Announced, str]  # kind, subject
T = TypeVar("T")


@dataclass(frozen=True)
class Holds:
    """A write's condition: its first key holds `value` (None: the key does not exist)."""

    value: bytes | None


class RecordWriter:
    """Sends commands as atomic, replicated-acknowledged writes."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._script = scripts.register(backend.redis, ["write.lua"],
                                        [WRITE_KEYS, WRITE_GUARD, WRITE_COMMAND])

    def call(self, *commands: Command, only_if: Holds | None = None) -> ScriptCall:
        """One atomic write of `commands`, whose keys share a hash slot; with `only_if`, it
        runs only if that holds, else its reply is None."""
        args: list[Any] = WRITE_GUARD.pack(
            check=int(only_if is not None),
            expected=[only_if.value] if only_if is not None and only_if.value is not None
            else None)
        for name, _key, *rest in commands:
            args += WRITE_COMMAND.pack(name=name, args=rest)
        return self._script, WRITE_KEYS.pack(keys=[c[1] for c in commands]), args

    async def run(self, calls: Sequence[ScriptCall], announce: Announcement | None = None
                  ) -> list[Any]:
        """Script calls (`call`s or others), acknowledged once the required replicas have
        them; then `announce` (unless no call ran: each one's condition failed), which waits
        for replicas too. It is made also when the calls were applied but not confirmed in
        time, and the NotReplicated raised after it."""
        try:
            replies = await self.backend.run(calls, durable=True)
        except NotReplicated:
            if announce is not None:
                with contextlib.suppress(NotReplicated):
                    await self._announce(announce)
            raise
        if announce is not None and any(reply is not None for reply in replies):
            await self._announce(announce)
        return replies

    async def write(self, *commands: Command, only_if: Holds | None = None,
                    announce: Announcement | None = None) -> list[Any] | None:
        """`run` of one `call`: the commands' replies, or None when `only_if` did not hold."""
        replies: list[Any] | None = (
            await self.run([self.call(*commands, only_if=only_if)], announce))[0]
        return replies

    async def _announce(self, announcement: Announcement) -> None:
        """After the write it announces: on a Cluster the two are in different slots, and a
        process that heard of a revocation before it was applied could cache the key again."""
        await self.backend.run([self.call(bulletins.announcement(*announcement))],
                               durable=True)


async def settle(write: Awaitable[T], follow_up: Callable[[], Awaitable[object]]) -> T:
    """Await `write`, then `follow_up` (a cache to drop, an audit record); a write applied but
    not confirmed by replicas is followed up all the same before its NotReplicated (a 503
    saying it was applied) is raised."""
    try:
        result = await write
    except NotReplicated:
        await follow_up()
        raise
    await follow_up()
    return result
