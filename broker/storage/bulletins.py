"""What one broker process announces to the others: a namespace whose configuration or
schemas changed, and revoked credentials. Announcements go to a capped Redis Stream, so a
listener that reconnects reads what it missed; when it was away so long that they were
trimmed (or it starts), it says "subscribed" and its caller treats everything as changed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from broker.storage import layout
from broker.storage.client import Redis, read_stream, text

Kind = Literal["subscribed", "namespace", "revoked"]
Announced = Literal["namespace", "revoked"]
Bulletin = tuple[Kind, str, str]  # kind, subject, position in the stream
KEEP = 10_000  # announcements kept (approximately)


def announcement(kind: Announced, subject: str) -> tuple[Any, ...]:
    """The command that announces `subject` (storage/writes.py sends it, and waits for
    replicas: an announcement lost in a failover would leave other processes' streams and
    caches unaware of a revocation)."""
    return ("XADD", layout.bulletins(), "MAXLEN", "~", KEEP, "*", "kind", kind,
            "subject", subject)


async def _continues(client: Redis, position: str) -> bool:
    """Whether every announcement after `position` is still kept."""
    oldest: Any = await client.xrange(layout.bulletins(), "-", "+", count=1)
    if not oldest:
        return True  # nothing kept, so nothing after `position` was trimmed either
    # Kept from `oldest` on: continuous only if that reaches back to `position` (a trim, or
    # Redis losing its data, may otherwise have dropped announcements in between).
    return _order(text(oldest[0][0])) <= _order(position)


def _order(position: str) -> tuple[int, int]:
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


async def listen(client: Redis, position: str | None, block_ms: int
                 ) -> AsyncIterator[Bulletin]:
    """Announcements after `position` (None: from now on). It first yields ("subscribed", "",
    position) when what came before may have been missed: at the start, or when `position` is
    older than what is kept. Ends when the connection fails (StoreError)."""
    if position is None or not await _continues(client, position):
        last: Any = await client.xrevrange(layout.bulletins(), "+", "-", count=1)
        position = text(last[0][0]) if last else "0-0"
        yield "subscribed", "", position
    while True:
        for raw_id, fields in await read_stream(client, layout.bulletins(), position, 100,
                                                block_ms):
            position = text(raw_id)
            kind = cast(Kind, text(fields.get(b"kind", b"")))
            if kind in ("namespace", "revoked"):
                yield kind, text(fields.get(b"subject", b"")), position
