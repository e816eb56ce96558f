"""Script calls that keep no reply under a message id but may still be sent twice
(`Backend.run(..., replayable=True)`): each call carries a key of its own under which its
script keeps its first reply for a minute (resend.lua), so a second sending, after the
connection closed under the first or the Sentinel primary moved, gets that reply instead of
running again. AMP cell writes and merges use it."""

from __future__ import annotations

import uuid
from typing import Any

from broker.storage import layout
from broker.storage.scripts import Fields

SENT_KEYS = Fields("sent_keys", ("reply",))
SENT = Fields("sent", ("window_ms",))
FILES = ("resend.lua",)
# Longer than a second sending can come after the first (a new connection, a Sentinel move).
WINDOW_MS = 60_000


def blocks(namespace: str, *, kept: bool = True) -> tuple[list[Any], list[Any]]:
    """A call's SENT_KEYS and SENT blocks: a fresh key for its reply, or (not `kept`, a call
    sent once) none kept."""
    token = uuid.uuid4().hex if kept else "-"
    return (
        SENT_KEYS.pack(reply=layout.sent_reply(namespace, token)),
        SENT.pack(window_ms=WINDOW_MS if kept else 0),
    )
