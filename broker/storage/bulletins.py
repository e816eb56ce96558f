"""What one broker process announces to the others, over Redis pub/sub: a namespace whose
configuration or schemas changed, and revoked credentials. Announcements are not stored: a
process that was not listening misses them, so listeners treat every (re)subscription as
"anything may have changed"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from broker.storage import layout
from broker.storage.client import Redis, text

Bulletin = tuple[Literal["subscribed", "namespace", "revoked"], str]


async def announce_namespace(client: Redis, namespace: str) -> None:
    await client.publish(layout.invalidations(), namespace)


async def announce_revocation(client: Redis, what: str) -> None:
    await client.publish(layout.revocations(), what)


async def listen(client: Redis) -> AsyncIterator[Bulletin]:
    """("subscribed", "") once listening, then each announcement as ("namespace", name) or
    ("revoked", what), until the connection fails (StoreError) or the caller stops."""
    kinds: dict[str, Literal["namespace", "revoked"]] = {
        layout.invalidations(): "namespace", layout.revocations(): "revoked"}
    async with client.pubsub() as pubsub:
        await pubsub.subscribe(*kinds)
        yield "subscribed", ""
        async for message in pubsub.listen():
            kind = kinds.get(text(message.get("channel", b"")))
            if message.get("type") == "message" and kind is not None:
                yield kind, text(message["data"])
