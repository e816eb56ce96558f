"""Reads of the per-namespace change log, a Redis Stream the write scripts append to, its
positions (`ms-seq`) as numbers, and the check of the record at a position (`record_check`), by
which a cursor tells the record it read from another held under the same id after a failover.
A stream's resume cursor is the web layer's (broker/web/frames.py)."""

from __future__ import annotations

import hashlib
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


# The fields that tell one record from another written under the same id in another history
# (a deposed primary's): what was written, to which key, by whom, when, as which version. The
# value is left out: hashing it would cost a large value's size on every change.
_CHECKED_FIELDS = (b"type", b"key", b"ver", b"ua", b"id", b"agent", b"ts", b"pid", b"by")
CHECK_LENGTH = 8  # hex digits


def record_check(fields: dict[bytes, bytes]) -> str:
    """A short digest of a change-log record's identifying fields (see _CHECKED_FIELDS)."""
    digest = hashlib.blake2b(digest_size=CHECK_LENGTH // 2)
    for name in _CHECKED_FIELDS:
        value = fields.get(name, b"")
        digest.update(len(value).to_bytes(4, "big"))
        digest.update(value)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Mark:
    """A position in a change log and the check of the record there ("": none, or unknown)."""

    position: str
    check: str = ""


def _mark(record: StreamRecord) -> Mark:
    return Mark(record[0].decode(), record_check(record[1]))


# Why a log no longer continues after a position (a stream's `reset`, docs/subscriptions.md).
TRIMMED = "trimmed"  # retention dropped changes after it
LOST = "lost"  # the log started over: Redis lost its data
REPLACED = "replaced"  # the history after some earlier record differs: a failover or restore


@dataclass(frozen=True, slots=True)
class Gap:
    """Changes after a position are not in the log: why (`cause`), and the position from which
    the log's own history goes on (`resume`: the newest record before it that is still there,
    or "0-0"), with the check of the record there (`check`)."""

    cause: str
    resume: str
    check: str = ""


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
    check: str = ""  # record_check of the record


def _record(namespace: str, record: StreamRecord) -> ChangeRecord:
    raw_id, raw_fields = record
    check = record_check(raw_fields)
    try:
        return _change(namespace, raw_id.decode(), raw_fields, check)
    except (CorruptRecord, UnicodeDecodeError, msgspec.DecodeError, RecursionError) as exc:
        skipped(CorruptRecord(f"change-log record {namespace}/{raw_id.decode()}: {exc}"))
        return ChangeRecord(raw_id.decode(), CORRUPT, "", None, check=check)


def _change(namespace: str, position: str, raw_fields: dict[bytes, bytes], check: str
            ) -> ChangeRecord:
    fields = {k.decode(): v for k, v in raw_fields.items()}
    kind = fields.pop("type", b"put").decode()
    key = fields.pop("key", b"").decode()
    if kind in PROPOSAL_EVENTS:
        doc = fields.get("doc") or b"{}"
        msgspec.json.decode(doc, type=dict[str, Any])  # spliced into the event as an object
        return ChangeRecord(position, kind, key, None, doc, (fields.get("by") or b"").decode(),
                            check=check)
    removed = fields.pop("was", None)
    if kind != "put":
        fields["del"] = b"1"
    return ChangeRecord(position, kind, key, entry_from_fields(namespace, key, fields),
                        removed=removed or None, check=check)


class ChangeLogStore:
    """Reads one namespace's change log: its end, ranges after a position, blocking reads.
    `pipe` (the auto-pipelining connection to the same server, where there is one) takes the
    check a reader makes after every read, at a seventh of what the client costs."""

    def __init__(self, client: Redis, pipe: AutoPipeline | None = None) -> None:
        self.redis = client
        self.pipe = pipe

    async def last_position(self, namespace: str) -> Mark:
        """The newest record's position and check ("0-0" for an empty log)."""
        records = await self.redis.xrevrange(layout.changelog(namespace), "+", "-", count=1)
        return _mark(cast(StreamRecord, records[0])) if records else Mark("0-0")

    async def gap(self, namespace: str, position: str, check: str | None = None) -> Gap | None:
        """None when the log still holds every change after `position` (and the record there
        is the one read, when its `check` is given); else why it does not (Gap).

        With `check` given, the record at `position` still matching it answers at once, in
        one command: records leave the log only from its start, in the script that moves
        `trimmed` past them, so a record still there is after `trimmed`."""
        log_key = layout.changelog(namespace)
        if check and await self._check_at(log_key, position) == check:
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
            if not check or record_check(cast(StreamRecord, found[0])[1]) == check:
                return None
        elif position in (trimmed, "0-0"):
            return None
        earlier = [_mark(cast(StreamRecord, r)) for r in before or []]
        earlier = [m for m in earlier if m.position != position]
        if not earlier:  # nothing at or before it: the log started over
            return Gap(LOST, "0-0")
        return Gap(REPLACED, earlier[0].position, earlier[0].check)

    async def _check_at(self, log_key: str, position: str) -> str | None:
        """The check of the record at `position`, None if there is none."""
        if self.pipe is not None:
            found: Any = await self.pipe.execute("XRANGE", log_key, position, position,
                                                 "COUNT", 1)
            if not found:
                return None
            fields = found[0][1]
            return record_check(dict(zip(fields[::2], fields[1::2], strict=True)))
        found = await self.redis.xrange(log_key, position, position, count=1)
        return record_check(found[0][1]) if found else None

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
