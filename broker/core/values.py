"""Stored values are canonical: the compact JSON of the value the broker decoded and checked.

A writer's bytes are never stored as they came. Whitespace (raw CR and LF included) is dropped,
so every change event is one SSE `data:` line, and an object with a repeated key keeps its last
occurrence (as JSON.parse does), so what a schema checked is exactly what is stored."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from broker.core.errors import MempError

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def decode_value(raw: bytes) -> Any:
    """The JSON value in `raw`, or `invalid_json` naming what is wrong with it."""
    try:
        return _decode(raw)
    except msgspec.ValidationError as exc:  # a number beyond what a double holds
        raise MempError("invalid_json", f"value is not valid JSON: {exc}") from None
    except msgspec.DecodeError as exc:
        raise MempError("invalid_json", f"value is not valid JSON: {exc}") from None
    except RecursionError:
        raise MempError("invalid_json", "JSON is nested too deeply") from None


def encode_value(value: Any) -> bytes:
    """The canonical (compact) JSON of a decoded value."""
    return _encode(value)


def canonical(raw: bytes) -> tuple[Any, bytes]:
    """Decode a writer's value and return it with the bytes the broker stores for it."""
    value = decode_value(raw)
    return value, _encode(value)


def recanonical(stored: bytes) -> bytes:
    """Stored bytes fit for one SSE line. Values written by releases that stored the writer's
    bytes may hold raw line breaks; those are re-encoded (a cheap scan skips all others)."""
    if b"\n" in stored or b"\r" in stored:
        try:
            return _encode(_decode(stored))
        except (msgspec.DecodeError, RecursionError):
            return stored.replace(b"\r", b" ").replace(b"\n", b" ")
    return stored


def check_finite(value: Any, field: str) -> None:
    """Refuse NaN and ±Infinity anywhere in a value decoded by another parser than the
    broker's (MCP arguments): JSON has no such numbers, the broker's own decoder refuses
    them, and encoding one would store `null` in its place."""
    stack = [value]
    while stack:  # a loop, not recursion: the value may be nested deeply
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise MempError("invalid_json", f"{field} holds {item!r}, which JSON has no "
                                "number for; nothing was written", {"field": field})
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
