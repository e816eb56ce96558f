"""Message ids: a write retried with the same id is applied once, and the id is bound to the
request it first came with, so the same id with another request is refused rather than
answered with a reply about something else (as payment APIs do)."""

from __future__ import annotations

import hashlib

import msgspec

from broker.core.errors import MempError


def fingerprint(*parts: object) -> str:
    """A short digest of what a request asks for (its operation, key, canonical value and
    conditions), stored beside the first reply to its message id."""
    return hashlib.blake2b(msgspec.json.encode(parts), digest_size=12).hexdigest()


def asks_approval(asked: bool) -> tuple[str, ...]:
    """The per-write approval flag's part of a fingerprint: none when unset, so requests
    without it keep the fingerprints earlier releases gave them."""
    return ("approval_required",) if asked else ()


def reused(message_id: str | None) -> MempError:
    return MempError(
        "idempotency_key_reused",
        "this message id was already used, within the retry window, for a different request; "
        "nothing was written: send a new id for a new request", {"id": message_id})
