"""Reads of the per-namespace change log (a Redis Stream written by the write scripts), each
change decoded and encoded once for every subscriber: its JSON payload and its SSE frame."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis

from broker import layout
from broker.amp.visibility import CellVisibility, Readers
from broker.models import Entry
from broker.store import entry_from_fields

StreamRecord = tuple[bytes, dict[bytes, bytes]]


class ChangePayload(Entry, kw_only=True):
    """What a subscriber receives for one change: the entry version plus the change type."""

    type: str


def format_cursor(positions: dict[str, str]) -> bytes:
    """A stream's cursor, sent as every event's id: `ns:ms-seq[,ns:ms-seq...]`, sorted."""
    return ",".join(f"{ns}:{pos}" for ns, pos in sorted(positions.items())).encode()


def encode_frame(event: bytes, cursor: bytes | None, data: bytes) -> bytes:
    """One SSE event."""
    head = b"id: " + cursor + b"\n" if cursor is not None else b""
    return head + b"event: " + event + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class Change:
    """One decoded change-log record. `data` is its JSON payload; `frame` is its SSE event for
    a stream following this namespace only (whose cursor is then this position); `order` is
    the position as numbers. All are made once here, not by each subscriber."""

    namespace: str
    position: str
    type: str
    key: str
    version: int
    data: bytes
    readers: Readers | None = None  # AMP cells: who may receive it (None: every subscriber)
    order: tuple[int, int] = field(init=False, repr=False, compare=False)
    frame: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", position_key(self.position))
        cursor = format_cursor({self.namespace: self.position})
        object.__setattr__(self, "frame", encode_frame(self.type.encode(), cursor, self.data))


def decode_change(namespace: str, record: StreamRecord, cells: CellVisibility) -> Change:
    raw_id, raw_fields = record
    fields = {k.decode(): v for k, v in raw_fields.items()}
    kind = fields.pop("type", b"put").decode()
    key = fields.pop("key", b"").decode()
    if kind != "put":
        fields["del"] = b"1"
    entry = entry_from_fields(namespace, key, fields)
    readers = None
    if cells.guards(namespace):
        entry, kind, readers = cells.audience(entry, kind)
    return Change(namespace, raw_id.decode(), kind, key, entry.version,
                  encode_payload(entry, kind), readers)


def encode_payload(entry: Entry, kind: str) -> bytes:
    """The JSON a subscriber gets: the entry's fields plus `type`."""
    fields = {f: getattr(entry, f) for f in entry.__struct_fields__}
    return msgspec.json.encode(ChangePayload(**fields, type=kind))


def position_key(position: str) -> tuple[int, int]:
    """Stream ids as comparable numbers (`ms-seq`)."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


class ChangeLog:
    """Reads one namespace's change log: its end, ranges after a position, blocking reads."""

    def __init__(self, client: aioredis.Redis, cells: CellVisibility) -> None:
        self.redis = client
        self.cells = cells

    async def last_position(self, namespace: str) -> str:
        records = await self.redis.xrevrange(layout.changelog(namespace), "+", "-", count=1)
        return cast(bytes, records[0][0]).decode() if records else "0-0"

    async def continues(self, namespace: str, position: str) -> bool:
        """False when changes after `position` were lost: trimmed by retention, or the log was
        recreated (Redis lost its data) so the record at `position` is gone untrimmed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xrange(layout.changelog(namespace), position, position, count=1)
            pipe.hget(layout.meta(namespace), "trimmed")
            found, raw = await pipe.execute()
        trimmed = cast(bytes, raw).decode() if raw else "0-0"
        if position_key(position) < position_key(trimmed):
            return False
        return bool(found) or position in (trimmed, "0-0")

    async def after(self, namespace: str, position: str, count: int) -> list[Change]:
        records: Any = await self.redis.xrange(layout.changelog(namespace), f"({position}", "+",
                                               count=count)
        return [decode_change(namespace, cast(StreamRecord, r), self.cells)
                for r in records or []]

    async def wait(self, namespace: str, position: str, block_ms: int, count: int
                   ) -> list[Change]:
        """Changes after `position`, waiting up to `block_ms` for the first one."""
        found: Any = await self.redis.xread({layout.changelog(namespace): position},
                                            count=count, block=block_ms)
        if not found:
            return []
        return [decode_change(namespace, cast(StreamRecord, r), self.cells)
                for r in found[0][1]]
