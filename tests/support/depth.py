"""JSON nested to a given depth, and the depth of a decoded value by its definition."""

from __future__ import annotations

from typing import Any

LIMIT = 64  # MEMP_MAX_JSON_DEPTH's default
TOO_DEEP = {"limit": "max_json_depth", "max": LIMIT}  # the details of the refusal


def arrays(levels: int, leaf: bytes = b"1") -> bytes:
    return b"[" * levels + leaf + b"]" * levels


def objects(levels: int, leaf: bytes = b"1") -> bytes:
    return b'{"a":' * levels + leaf + b"}" * levels


def reference_depth(value: Any) -> int:
    """How deep a decoded JSON value nests (a scalar is 0, `[]` is 1), recursively."""
    if isinstance(value, dict | list):
        items = value.values() if isinstance(value, dict) else value
        return 1 + max((reference_depth(item) for item in items), default=0)
    return 0
