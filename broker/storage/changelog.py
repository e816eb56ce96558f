"""Reads of the per-namespace change log, a Redis Stream the write scripts append to, and its
positions (`ms-seq`) as numbers. A stream's resume cursor is the web layer's
(broker/web/frames.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import msgspec

from broker.core.models import Entry
from broker.storage import layout
from broker.storage.client import Redis, read_stream
from broker.storage.pipe import AutoPipeline
from broker.storage.records import CorruptRecord, entry_from_fields, skipped

StreamRecord = tuple[bytes, dict[bytes, bytes]]


def position_key(position: str) -> tuple[int, int]:
    """Stream ids as comparable numbers (`ms-seq`)."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


# Change types about proposals (docs/governance.md): their record holds the proposal's JSON
# (`doc`) and its proposer (`by`), not an entry version.
PROPOSAL_EVENTS = frozenset({"proposal", "approved", "rejected", "expired"})
# The type of a record that cannot be read: it keeps its place in the log (positions move past
# it) but is delivered to no one, so it cannot stop the namespace's other changes.
CORRUPT = "corrupt"


# Why a log no longer continues after a position (a stream's `reset`, docs/subscriptions.md).
TRIMMED = "trimmed"  # retention dropped changes after it
LOST = "lost"  # the log started over: Redis lost its data
REPLACED = "replaced"  # the history after some earlier record differs: a failover or restore


@dataclass(frozen=True, slots=True)
class Gap:
    """Changes after a position are not in the log: why (`cause`), and the position from which
    the log's own history goes on (`resume`: the newest record before it that is still there,
    or "0-0")."""

    cause: str
    resume: str


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One change-log record: where it sits, the change type, and the entry version (or, for
    a proposal's change, the proposal's JSON and its proposer)."""

    position: str
    type: str
    key: str
    entry: Entry | None
    doc: bytes = b""
    proposer: str | None = None
    removed: bytes | None = None  # a delete's or expiry's: the JSON value it removed


def _record(namespace: str, record: StreamRecord) -> ChangeRecord:
    raw_id, raw_fields = record
    try:
        return _change(namespace, raw_id.decode(), raw_fields)
    except (CorruptRecord, UnicodeDecodeError, msgspec.DecodeError, RecursionError) as exc:
        skipped(CorruptRecord(f"change-log record {namespace}/{raw_id.decode()}: {exc}"))
        return ChangeRecord(raw_id.decode(), CORRUPT, "", None)


def _change(namespace: str, position: str, raw_fields: dict[bytes, bytes]) -> ChangeRecord:
    fields = {k.decode(): v for k, v in raw_fields.items()}
    kind = fields.pop("type", b"put").decode()
    key = fields.pop("key", b"").decode()
    if kind in PROPOSAL_EVENTS:
        doc = fields.get("doc") or b"{}"
        msgspec.json.decode(doc, type=dict[str, Any])  # spliced into the event as an object
        return ChangeRecord(position, kind, key, None, doc, (fields.get("by") or b"").decode())
    removed = fields.pop("was", None)
    if kind != "put":
        fields["del"] = b"1"
    return ChangeRecord(position, kind, key, entry_from_fields(namespace, key, fields),
                        removed=removed or None)


class ChangeLogStore:
    """Reads one namespace's change log: its end, ranges after a position, blocking reads.
    `pipe` (the auto-pipelining connection to the same server, where there is one) takes the
    check a reader makes after every read, at a seventh of what the client costs."""

    def __init__(self, client: Redis, pipe: AutoPipeline | None = None) -> None:
        self.redis = client
        self.pipe = pipe

    async def last_position(self, namespace: str) -> str:
        records = await self.redis.xrevrange(layout.changelog(namespace), "+", "-", count=1)
        return cast(bytes, records[0][0]).decode() if records else "0-0"

    async def gap(self, namespace: str, position: str, key: str | None = None) -> Gap | None:
        """None when the log still holds every change after `position` (and the record there
        is the one read, when its `key` is given); else why it does not (Gap).

        With `key` given, the record at `position` still holding it answers at once, in one
        command: records leave the log only from its start, in the script that moves
        `trimmed` past them, so a record still there is after `trimmed`."""
        log_key = layout.changelog(namespace)
        if key is not None and await self._key_at(log_key, position) == key:
            return None
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xrange(log_key, position, position, count=1)
            pipe.hget(layout.meta(namespace), "trimmed")
            pipe.xrevrange(log_key, position, "-", count=2)  # the record there and the one before
            found, raw, before = await pipe.execute()
        trimmed = cast(bytes, raw).decode() if raw else "0-0"
        if position_key(position) < position_key(trimmed):
            return Gap(TRIMMED, "0-0")
        if found:
            fields = cast(StreamRecord, found[0])[1]
            if key is None or fields.get(b"key", b"").decode() == key:
                return None
        elif position in (trimmed, "0-0"):
            return None
        earlier = [cast(bytes, r[0]).decode() for r in before or []
                   if cast(bytes, r[0]).decode() != position]
        if not earlier:  # nothing at or before it: the log started over
            return Gap(LOST, "0-0")
        return Gap(REPLACED, earlier[0])

    async def _key_at(self, log_key: str, position: str) -> str | None:
        """The key of the record at `position`, None if there is none."""
        if self.pipe is not None:
            found: Any = await self.pipe.execute("XRANGE", log_key, position, position,
                                                 "COUNT", 1)
            fields = found[0][1] if found else []
            pairs = dict(zip(fields[::2], fields[1::2], strict=True))
        else:
            found = await self.redis.xrange(log_key, position, position, count=1)
            pairs = found[0][1] if found else {}
        raw = pairs.get(b"key") if found else None
        return raw.decode() if raw is not None else None

    async def after(self, namespace: str, position: str, count: int) -> list[ChangeRecord]:
        records: Any = await self.redis.xrange(layout.changelog(namespace), f"({position}", "+",
                                               count=count)
        return [_record(namespace, cast(StreamRecord, r)) for r in records or []]

    async def wait(self, namespace: str, position: str, block_ms: int, count: int
                   ) -> list[ChangeRecord]:
        """Changes after `position`, waiting up to `block_ms` for the first one."""
        found = await read_stream(self.redis, layout.changelog(namespace), position, count,
                                  block_ms)
        return [_record(namespace, cast(StreamRecord, r)) for r in found]
