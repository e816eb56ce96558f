"""Reads of the per-namespace change log, a Redis Stream the write scripts append to, and the
stream cursor: the format of a resume cursor (`ns:ms-seq[,ns:ms-seq...]`) and its parser."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from broker.errors import MempError
from broker.models import Entry
from broker.storage import layout
from broker.storage.client import Redis, read_stream
from broker.storage.records import CorruptRecord, entry_from_fields, skipped

_CURSOR_PART_RE = re.compile(r"([a-z0-9][a-z0-9._-]{0,62}):([0-9]{1,20})-([0-9]{1,20})")
_STREAM_ID_MAX = 2**64 - 1  # each half of a Redis stream id is an unsigned 64-bit number
StreamRecord = tuple[bytes, dict[bytes, bytes]]


def format_cursor(positions: dict[str, str]) -> bytes:
    """A stream's cursor, sent as every event's id: `ns:ms-seq[,ns:ms-seq...]`, sorted."""
    return ",".join(f"{ns}:{pos}" for ns, pos in sorted(positions.items())).encode()


def parse_cursor(text: str | None) -> dict[str, str] | None:
    """The positions of a cursor `format_cursor` made (None for none given); anything else is
    `invalid_request`."""
    if text is None or text.strip() == "":
        return None
    positions = {}
    for part in text.strip().split(","):
        match = _CURSOR_PART_RE.fullmatch(part)
        if match is None or max(int(match[2]), int(match[3])) > _STREAM_ID_MAX:
            raise MempError("invalid_request", "Last-Event-ID is not a cursor this broker issued",
                            {"last_event_id": text[:200]})
        positions[match[1]] = f"{int(match[2])}-{int(match[3])}"
    return positions


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
    if kind != "put":
        fields["del"] = b"1"
    return ChangeRecord(position, kind, key, entry_from_fields(namespace, key, fields))


class ChangeLogStore:
    """Reads one namespace's change log: its end, ranges after a position, blocking reads."""

    def __init__(self, client: Redis) -> None:
        self.redis = client

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
