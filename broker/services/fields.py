"""Checks on request fields shared by the REST routes and the message endpoint."""

from __future__ import annotations

import base64
import binascii
import re

from broker.core.errors import MempError
from broker.runtime.settings import Settings

_MESSAGE_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def check_message_id(message_id: str | None) -> str | None:
    if message_id is not None and not _MESSAGE_ID_RE.fullmatch(message_id):
        raise MempError("invalid_request",
                        "message id must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    return message_id


def check_ttl(ttl_seconds: int | None, settings: Settings) -> int | None:
    if ttl_seconds is None:
        return None
    if ttl_seconds <= 0 or ttl_seconds > settings.max_ttl_seconds:
        raise MempError(
            "invalid_ttl",
            f"ttl_seconds must be between 1 and {settings.max_ttl_seconds}, or null",
            {"ttl_seconds": ttl_seconds},
        )
    return ttl_seconds


def check_timestamp(timestamp: int | None, now: int, settings: Settings) -> int | None:
    if timestamp is None:
        return None
    if timestamp <= 0:
        raise MempError("invalid_timestamp", "timestamp must be Unix milliseconds")
    if timestamp > now + settings.max_clock_skew_ms:
        raise MempError(
            "invalid_timestamp",
            f"timestamp is more than {settings.max_clock_skew_ms} ms ahead of the broker's clock",
            {"timestamp": timestamp, "broker_time": now},
        )
    return timestamp


def check_value_size(size: int, settings: Settings) -> None:
    if size > settings.max_value_bytes:
        raise MempError(
            "payload_too_large",
            f"value is {size} bytes; the limit is {settings.max_value_bytes}",
            {"limit": settings.max_value_bytes},
        )


def check_version(version: int | None) -> int | None:
    if version is not None and version < 1:
        raise MempError("invalid_request", "a version is a positive integer")
    return version


def check_limit(limit: int | None, default: int, maximum: int) -> int:
    if limit is None:
        return default
    if limit < 1:
        raise MempError("invalid_request", "limit must be at least 1")
    return min(limit, maximum)


def encode_cursor(position: str) -> str:
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None or cursor == "":
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        raise MempError("invalid_request", "cursor is not one this broker issued") from None
