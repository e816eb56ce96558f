"""How deep JSON may nest: the one limit on what a tenant sends (MEMP_MAX_JSON_DEPTH), checked
on the bytes before anything is decoded further or stored, and the depth of stored JSON past
which the broker no longer looks inside (a value stored before the limit existed).

Every decoder and walker the broker runs recurses at least once per level, so each has a depth
it breaks at: msgspec and `json` near 990 levels less the caller's stack, the embedded store's
Lua `cjson` near 490 less the stack, `jsonschema` near 200 (its meta-schema check near 80
levels of `properties`), the merge near 200 and pydantic's serialiser (MCP replies) at 254.
The limit (64 by default, at most MAX_DEPTH_SETTING) keeps every accepted document far below
all of them; docs/security.md lists the measurements."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from typing import Any

import msgspec

from broker.core.errors import MempError

DEFAULT_MAX_DEPTH = 64
MAX_DEPTH_SETTING = 128
# Stored JSON nested deeper than this is never decoded: replies that can carry it unparsed
# serve it as stored, anything that must look inside skips it (docs/security.md).
DECODED_DEPTH = 200

_SYNTAX = msgspec.json.Decoder(msgspec.Raw)  # checks the syntax, builds nothing
_decode = msgspec.json.Decoder().decode
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS = bytes.maketrans(b"[]", b"\x01\xff")  # +1 and -1 as signed bytes


class TooDeep(ValueError):
    """Stored JSON nested deeper than DECODED_DEPTH."""


def _unescaped(raw: bytes) -> bytes:
    """JSON with its escaped backslashes and quotes taken out of its strings. Left to right,
    `\\\\` pairs first: what remains of a run of backslashes escapes the character after it."""
    return raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw


def _brackets(raw: bytes) -> bytes:
    """The brackets of JSON outside its strings, all as `[` and `]`."""
    unescaped = _unescaped(raw)
    unquoted = b"".join(unescaped.split(b'"')[::2]) if b'"' in unescaped else unescaped
    return unquoted.translate(_SQUARE, _NOT_BRACKETS)


def _levels(brackets: bytes) -> tuple[int, Iterator[int]]:
    """The innermost levels taken away while each pass takes a third of what is left (a few
    passes in C), and the running depth through the rest (one step per remaining bracket)."""
    removed = 0
    while brackets:
        fewer = brackets.replace(b"[]", b"")
        removed += 1
        shrunk = len(fewer) * 3 <= len(brackets) * 2
        brackets = fewer
        if not shrunk:
            break
    return removed, itertools.accumulate(array("b", brackets.translate(_STEPS)))


def depth(raw: bytes) -> int:
    """How deep well-formed JSON nests (a scalar is 0, `[]` is 1), whatever the depth: nothing
    recurses."""
    removed, running = _levels(_brackets(raw))
    return removed + max(running, default=0)


def deeper_than(raw: bytes, limit: int) -> bool:
    """Whether well-formed JSON nests deeper than `limit` levels; a count of brackets settles
    it for most documents."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return depth(raw) > limit


def too_deep(limit: int) -> MempError:
    """The refusal of a document nested deeper than the limit."""
    return MempError("invalid_request", f"JSON nests deeper than {limit} levels, the limit "
                     "(MEMP_MAX_JSON_DEPTH)", {"limit": "max_json_depth", "max": limit})


def check_body(raw: bytes, limit: int) -> None:
    """Refuse a request body nested deeper than `limit` (400 `invalid_request`). A body that is
    not JSON passes: the route's decoder names what is wrong with it."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    try:
        _SYNTAX.decode(raw)  # fast, and sure to fail on what is not JSON before `depth` runs
    except RecursionError:
        raise too_deep(limit) from None
    except msgspec.MsgspecError:
        return
    if depth(raw) > limit:
        raise too_deep(limit)


def check_value(value: Any, limit: int) -> None:
    """Refuse a decoded JSON value (MCP tool arguments) nested deeper than `limit`, walking it
    level by level, without recursion."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [item for node in level if isinstance(node, dict | list)
                 for item in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return
    if any(isinstance(node, dict | list) for node in level):
        raise too_deep(limit)


def check_stored(raw: bytes | msgspec.Raw) -> None:
    """TooDeep when stored JSON nests deeper than DECODED_DEPTH."""
    if deeper_than(raw if isinstance(raw, bytes) else bytes(raw), DECODED_DEPTH):
        raise TooDeep(f"stored JSON nests deeper than {DECODED_DEPTH} levels")


def decode_stored(raw: bytes | msgspec.Raw) -> Any:
    """Decode stored JSON, or TooDeep when it nests deeper than DECODED_DEPTH."""
    check_stored(raw)
    return _decode(raw)


def balanced(raw: bytes) -> bool:
    """What can be checked of stored JSON too deep for a decoder: its strings close, and its
    brackets pair up without closing more than they opened."""
    if _unescaped(raw).count(b'"') % 2:
        return False
    _, steps = _levels(_brackets(raw))
    running = list(steps)
    return not running or (min(running) >= 0 and running[-1] == 0)
