"""What one broker process announces to the others: a namespace whose configuration or
schemas changed, and revoked credentials. Announcements go to a capped Redis Stream, so a
listener that reconnects reads what it missed; when it was away so long that they were
trimmed (or it starts), it says "subscribed" and its caller treats everything as changed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from broker.storage import layout
from broker.storage.client import Redis, read_stream, stream_continues, text

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


async def listen(client: Redis, position: str | None, block_ms: int
                 ) -> AsyncIterator[Bulletin]:
    """Announcements after `position` (None: from now on). It first yields ("subscribed", "",
    position) when what came before may have been missed: at the start, or when `position` is
    older than what is kept. Ends when the connection fails (StoreError)."""
    if position is None or not await stream_continues(client, layout.bulletins(), position):
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
