"""Changes as subscribers get them: each change-log record decoded and encoded once for every
subscriber of the process (its JSON payload and its SSE frame), with the audience the read
policy gives the changes of the namespace it guards (AMP cells: broker/amp/visibility.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from broker.core.filters import MISSING
from broker.core.models import Entry
from broker.services.visibility import Readers, ReadPolicy
from broker.storage.changelog import (
    CORRUPT,
    ChangeLogStore,
    ChangeRecord,
    Gap,
    Mark,
    position_key,
)


class ChangePayload(Entry, kw_only=True):
    """What a subscriber receives for one change: the entry version plus the change type."""

    type: str


# How a change is framed for a subscriber following its namespace alone, made once per change:
# (namespace, Mark of the change, type, data) -> bytes. The wiring passes SSE's
# (broker/web/frames.py).
Framer = Callable[[str, Mark, str, bytes], bytes]


def encode_payload(entry: Entry, kind: str) -> bytes:
    """The JSON a subscriber gets: the entry's fields plus `type`."""
    fields = {f: getattr(entry, f) for f in entry.__struct_fields__}
    return msgspec.json.encode(ChangePayload(**fields, type=kind))


@dataclass(frozen=True, slots=True)
class Change:
    """One change as subscribers get it. `data` is its JSON payload; `frame` is its event for
    a stream following this namespace only (see `Framer`); `order` is the position as numbers.
    All are made once here, not by each subscriber. `raw_value` is the JSON value a filter
    looks at (a delete's or expiry's: the value it removed), decoded once, on demand. `check`
    tells its record from another under the same position (changelog.record_check)."""

    namespace: str
    position: str
    type: str
    key: str
    version: int
    data: bytes
    readers: Readers | None = None  # AMP cells: who may receive it (None: every subscriber)
    proposer: str | None = None  # a proposal's change: only its proposer and reviewers get it
    frame: bytes = field(default=b"", repr=False, compare=False)
    agent: str = ""
    raw_value: bytes | None = field(default=None, repr=False, compare=False)
    check: str = ""
    order: tuple[int, int] = field(init=False, repr=False, compare=False)
    _document: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", position_key(self.position))
        object.__setattr__(self, "_document", _UNDECODED)

    def document(self) -> Any:
        """The value filters look at (`filters.Subject`), MISSING for none."""
        if self._document is _UNDECODED:
            decoded = MISSING
            if self.raw_value is not None:
                # a damaged record matches nothing
                with contextlib.suppress(msgspec.DecodeError, RecursionError):
                    decoded = msgspec.json.decode(self.raw_value)
            object.__setattr__(self, "_document", decoded)
        return self._document


_UNDECODED: Any = object()


class ChangeLog:
    """One namespace's changes, read from the store and prepared for subscribers."""

    def __init__(self, store: ChangeLogStore, cells: ReadPolicy, frame: Framer) -> None:
        self.store = store
        self.cells = cells
        self.frame = frame

    def change(self, namespace: str, record: ChangeRecord) -> Change:
        entry, kind, position = record.entry, record.type, record.position
        mark = Mark(position, record.check)
        if kind == CORRUPT:
            return Change(namespace, position, kind, record.key, 0, b"{}",
                          frame=self.frame(namespace, mark, kind, b"{}"), check=record.check)
        if entry is None:  # a proposal's change: its JSON with the type
            data = b'{"type":"' + kind.encode() + b'",' + record.doc.removeprefix(b"{")
            return Change(namespace, position, kind, record.key, 0, data,
                          proposer=record.proposer,
                          frame=self.frame(namespace, mark, kind, data), check=record.check)
        readers = None
        removed = record.removed
        if self.cells.guards(namespace):
            entry, kind, readers = self.cells.audience(entry, kind)
            removed = None  # a cell's content is never an oracle once it is gone
        data = encode_payload(entry, kind)
        value = entry.value if kind == "put" else removed
        return Change(namespace, position, kind, record.key, entry.version, data, readers,
                      frame=self.frame(namespace, mark, kind, data), agent=entry.agent_id,
                      raw_value=None if value is None else bytes(value), check=record.check)

    async def last_position(self, namespace: str) -> Mark:
        return await self.store.last_position(namespace)

    async def gap(self, namespace: str, position: str, check: str | None = None
                  ) -> Gap | None:
        """Why changes after `position` are not in the log, or None (ChangeLogStore.gap)."""
        return await self.store.gap(namespace, position, check)

    async def after(self, namespace: str, position: str, count: int) -> list[Change]:
        return [self.change(namespace, r)
                for r in await self.store.after(namespace, position, count)]

    async def wait(self, namespace: str, position: str, block_ms: int, count: int
                   ) -> list[Change]:
        """Changes after `position`, waiting up to `block_ms` for the first one."""
        return [self.change(namespace, r)
                for r in await self.store.wait(namespace, position, block_ms, count)]
