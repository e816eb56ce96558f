"""Conflict strategies: picking one for a key, agent priorities, and the deep/three-way merge."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from deepmerge import Merger

from broker.core.errors import MempError
from broker.core.grammar import Pattern, compile_pattern, glob_match
from broker.core.nesting import DECODED_DEPTH, TooDeep, decode_stored

Strategy = Literal["last-write-wins", "agent-priority", "merge"]
STRATEGIES: tuple[str, ...] = ("last-write-wins", "agent-priority", "merge")
ArrayMode = Literal["replace", "append"]

_MISSING: Any = object()

_MERGERS = {
    "replace": Merger([(dict, ["merge"]), (list, ["override"])], ["override"], ["override"]),
    "append": Merger([(dict, ["merge"]), (list, ["append"])], ["override"], ["override"]),
}


@dataclass(frozen=True, slots=True)
class Conflict:
    """A path both sides changed differently since the base; enough to recover either intent."""

    path: str
    base: Any
    stored: Any
    incoming: Any
    stored_agent: str
    incoming_agent: str
    base_missing: bool = False


@functools.lru_cache(maxsize=4096)
def _rule_pattern(pattern_text: str) -> Pattern:
    """A configuration rule's pattern, compiled once (rules are matched on every write)."""
    return compile_pattern(pattern_text)


def specificity(pattern_text: str) -> tuple[int, int, int]:
    """Order rules so the most specific pattern wins: exact, then longer literal parts."""
    pattern = _rule_pattern(pattern_text)
    literal_segments = sum(1 for s in pattern_text.split("/") if "*" not in s)
    return (1 if pattern.is_exact else 0, literal_segments, len(pattern.literal_prefix))


def pick_by_pattern(rules: list[tuple[str, Any]], key: str) -> Any:
    """The value of the most specific pattern matching `key`, or None."""
    best: tuple[tuple[int, int, int], Any] | None = None
    for pattern_text, value in rules:
        if _rule_pattern(pattern_text).matches(key):
            rank = specificity(pattern_text)
            if best is None or rank > best[0]:
                best = (rank, value)
    return best[1] if best else None


def agent_priority(priorities: list[tuple[str, int]], default: int, agent_id: str) -> int:
    """An exact agent id wins over patterns; among patterns the longest wins."""
    exact = [p for glob, p in priorities if glob == agent_id]
    if exact:
        return exact[0]
    matches = sorted(((len(glob), p) for glob, p in priorities if glob_match(glob, agent_id)),
                     reverse=True)
    return matches[0][1] if matches else default


def _copy(value: Any) -> Any:
    """A deep copy of decoded JSON (objects and arrays rebuilt, scalars shared): several
    times faster than `copy.deepcopy`, which dominated the cost of a merge."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return copy.deepcopy(value) if isinstance(value, tuple | set) else value


def merged_into(raw: msgspec.Raw | None, key: str) -> Any:
    """The stored value a merge goes into; `409` when it nests too deep to look inside (stored
    before MEMP_MAX_JSON_DEPTH): nothing is written, and deleting the key clears the way."""
    try:
        return None if raw is None else decode_stored(raw)
    except TooDeep:
        raise MempError("write_conflict", f"the stored value nests deeper than {DECODED_DEPTH} "
                        "levels, too deep to merge into: delete the key, then write it",
                        {"key": key, "limit": "max_json_depth"}) from None


def merge_base(raw: msgspec.Raw) -> Any:
    """A merge's base version; unknown (MISSING) when it nests too deep to look inside."""
    try:
        return decode_stored(raw)
    except TooDeep:
        return _MISSING


def deep_merge(stored: Any, incoming: Any, arrays: ArrayMode = "replace") -> Any:
    """Objects merge recursively; the incoming side wins for scalars and (by default) arrays."""
    if not isinstance(stored, dict) or not isinstance(incoming, dict):
        return _copy(incoming)
    return _MERGERS[arrays].merge(_copy(stored), _copy(incoming))


def pointer(parts: tuple[str, ...]) -> str:
    """RFC 6901 JSON Pointer."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _at(document: Any, parts: tuple[str, ...]) -> Any:
    for part in parts:
        if not isinstance(document, dict) or part not in document:
            return _MISSING
        document = document[part]
    return document


def _leaves(incoming: Any, stored: Any, parts: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Paths the incoming side sets: its non-object values, or a whole object where the stored
    side holds a non-object there."""
    if isinstance(incoming, dict) and (stored is _MISSING or isinstance(stored, dict)):
        for name, value in incoming.items():
            below = stored.get(name, _MISSING) if isinstance(stored, dict) else _MISSING
            yield from _leaves(value, below, (*parts, name))
    else:
        yield parts, incoming


def _same(a: Any, b: Any) -> bool:
    """JSON equality, where an absent path equals only another absent path and `1`, `1.0` and
    `true` differ at any depth (Python's `==` would call `[1]` and `[true]` equal)."""
    if a is _MISSING or b is _MISSING:
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _shown(value: Any) -> Any:
    return None if value is _MISSING else value


def merge(stored: Any, incoming: Any, *, base: Any = _MISSING, base_known: bool,
          stored_agent: str, incoming_agent: str, arrays: ArrayMode = "replace"
          ) -> tuple[Any, list[Conflict]]:
    """Deep-merge `incoming` into `stored` and say which paths conflict.

    - base_known=False (the writer named no base): plain deep merge, no conflicts.
    - base_known=True with a base value: three-way; a path conflicts when both sides changed it
      since the base, to different values.
    - base_known=True with base MISSING (no longer in history): every path where the sides
      differ is flagged, with `base_missing`.
    Non-object values replace the stored one, and the replacement is flagged."""
    result = deep_merge(stored, incoming, arrays)
    if not isinstance(stored, dict) or not isinstance(incoming, dict):
        if _same(stored, incoming):
            return result, []
        return result, [Conflict("", _shown(base), stored, incoming, stored_agent,
                                 incoming_agent, base_missing=base_known and base is _MISSING)]
    if not base_known:
        return result, []
    conflicts = []
    for parts, value in _leaves(incoming, stored):
        stored_value = _at(stored, parts)
        if _same(stored_value, value):
            continue
        if base is _MISSING:
            if stored_value is not _MISSING:
                conflicts.append(Conflict(pointer(parts), None, stored_value, value,
                                          stored_agent, incoming_agent, base_missing=True))
            continue
        base_value = _at(base, parts)
        if not _same(base_value, value) and not _same(base_value, stored_value):
            conflicts.append(Conflict(pointer(parts), _shown(base_value), _shown(stored_value),
                                      value, stored_agent, incoming_agent))
    return result, conflicts


MISSING = _MISSING
