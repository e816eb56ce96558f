"""RFC 6902 JSON Patch between two JSON values, for the diff a proposal shows its reviewers.
Objects are compared member by member; arrays and scalars that differ are replaced whole."""

from __future__ import annotations

from typing import Any

MISSING: Any = object()


def _pointer(path: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def diff(old: Any, new: Any) -> list[dict[str, Any]]:
    """The operations that turn `old` into `new` (MISSING for no value: add or remove the
    whole document at path "")."""
    ops: list[dict[str, Any]] = []
    _diff(old, new, [], ops)
    return ops


def _diff(old: Any, new: Any, path: list[str], ops: list[dict[str, Any]]) -> None:
    if old is MISSING and new is MISSING:
        return
    if old is MISSING:
        ops.append({"op": "add", "path": _pointer(path), "value": new})
    elif new is MISSING:
        ops.append({"op": "remove", "path": _pointer(path)})
    elif isinstance(old, dict) and isinstance(new, dict):
        for name in old:
            if name not in new:
                ops.append({"op": "remove", "path": _pointer([*path, name])})
        for name, value in new.items():
            _diff(old.get(name, MISSING), value, [*path, name], ops)
    elif type(old) is not type(new) or old != new:
        ops.append({"op": "replace", "path": _pointer(path), "value": new})
