"""The SSE wire format of a subscription: every event a stream sends, and its id, the resume
cursor `ns:ms-seq~check[,ns:ms-seq~check...]` (one change-log position per namespace followed,
with the check of the record there, so a resume notices a record another history holds under
the same id) that a client hands back as `Last-Event-ID`, with that cursor's parser. A cursor
without checks (as brokers issued before them, or at the start of an empty log) is read too."""

from __future__ import annotations

import re

import msgspec

from broker.core.errors import MempError
from broker.storage.changelog import CHECK_LENGTH, Mark

_CURSOR_PART_RE = re.compile(r"([a-z0-9][a-z0-9._-]{0,62}):([0-9]{1,20})-([0-9]{1,20})"
                             rf"(?:~([0-9a-f]{{{CHECK_LENGTH}}}))?")
_STREAM_ID_MAX = 2**64 - 1  # each half of a Redis stream id is an unsigned 64-bit number


def event(name: bytes, cursor: bytes | None, data: bytes) -> bytes:
    """One SSE event: its id (the cursor, if any), name and data."""
    head = b"id: " + cursor + b"\n" if cursor is not None else b""
    return head + b"event: " + name + b"\ndata: " + data + b"\n\n"


def retry(ms: int) -> bytes:
    """The reconnection delay a stream opens with."""
    return f"retry: {ms}\n\n".encode()


def change(namespace: str, mark: Mark, kind: str, data: bytes) -> bytes:
    """A change's event for a stream following its namespace alone: the cursor is the
    change's own position, so every such subscriber sends the same bytes (made once, by the
    change-log reader: `streaming.changes.Framer`)."""
    return event(kind.encode(), format_cursor({namespace: mark}), data)


# What a `reset` says, by its cause (broker/storage/changelog.py, docs/subscriptions.md).
RESET_REASONS = {
    "trimmed": "the cursor is older than the retained change log",
    "lost": "the change log was lost and started over (Redis lost its data)",
    "replaced": "the change log's history after the cursor was replaced (a Redis failover to "
                "a replica that lacked the latest changes, or a restore)",
}


def reset(cursor: bytes, namespace: str, cause: str) -> bytes:
    """Changes of `namespace` were lost (`cause`: trimmed, lost, replaced): the stream goes
    on from `cursor`."""
    data = msgspec.json.encode({"namespace": namespace, "cause": cause,
                                "reason": RESET_REASONS[cause], "cursor": cursor.decode()})
    return event(b"reset", cursor, data)


def progress(cursor: bytes) -> bytes:
    """The cursor moved past changes a filter left out: resume from here."""
    return event(b"progress", cursor, msgspec.json.encode({"cursor": cursor.decode()}))


def snapshot_end(cursor: bytes) -> bytes:
    return event(b"snapshot-end", cursor, msgspec.json.encode({"cursor": cursor.decode()}))


def farewell(name: bytes, cursor: bytes, reason: str) -> bytes:
    """The last event of a stream that ends itself (overflow, shutdown, revoked)."""
    return event(name, cursor, msgspec.json.encode({"cursor": cursor.decode(),
                                                    "reason": reason}))


def format_cursor(marks: dict[str, Mark]) -> bytes:
    """A stream's cursor, sent as every event's id: `ns:ms-seq~check[,...]`, sorted by
    namespace (`~check` left out where the position has no record)."""
    return ",".join(f"{ns}:{m.position}~{m.check}" if m.check else f"{ns}:{m.position}"
                    for ns, m in sorted(marks.items())).encode()


def parse_cursor(text: str | None) -> dict[str, Mark] | None:
    """The positions of a cursor `format_cursor` made, with their checks where it has them
    (None for no cursor); anything else is `invalid_request`."""
    if text is None or text.strip() == "":
        return None
    positions = {}
    for part in text.strip().split(","):
        match = _CURSOR_PART_RE.fullmatch(part)
        if match is None or max(int(match[2]), int(match[3])) > _STREAM_ID_MAX:
            raise MempError("invalid_request", "Last-Event-ID is not a cursor this broker issued",
                            {"last_event_id": text[:200]})
        positions[match[1]] = Mark(f"{int(match[2])}-{int(match[3])}", match[4] or "")
    return positions
