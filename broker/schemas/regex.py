"""Regular expressions in JSON Schemas: RE2 (linear time) for `pattern` and `patternProperties`,
the checks that refuse what RE2 cannot run, and the same patterns for jsonschema-rs.

A backtracking engine (Python's `re`, ECMA-262, fancy-regex) takes exponential time on patterns
such as `^(a+)+$` (CWE-1333); RE2 and Rust's `regex` crate match in time linear in the input
(times the pattern's program size), so no pattern can stall validation."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import msgspec
import re2

# Program size (RE2 instructions) of the largest pattern accepted. A match costs at most about
# size x input length steps when RE2's DFA gives up; counted repetitions (`[a-z]{1,300}`) and
# Unicode classes (`\p{L}` is 1,200) make programs large.
MAX_PROGRAM = 2000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # refusals are reported to the client, not logged by RE2

# RE2's complaint -> what it means for someone writing ECMA-262 patterns.
_EXPLAIN = (
    ("(?=", "lookahead is not supported"),
    ("(?!", "lookahead is not supported"),
    ("(?<=", "lookbehind is not supported"),
    ("(?<!", "lookbehind is not supported"),
    ("(?>", "atomic groups are not supported"),
    ("\\k", "backreferences are not supported"),
    ("\\u", "\\uXXXX escapes are not supported; write \\x{XXXX} or the character itself"),
    ("\\c", "\\cX control escapes are not supported; write \\x{XX}"),
    ("*+", "possessive quantifiers are not supported"),
    ("++", "possessive quantifiers are not supported"),
    ("?+", "possessive quantifiers are not supported"),
)


class PatternError(ValueError):
    """A pattern the broker cannot run; the message says why."""


@functools.lru_cache(maxsize=4096)
def compile_regex(pattern: str) -> Any:
    """The RE2 regex for a schema pattern, or PatternError."""
    try:
        regex = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        detail = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        raise PatternError(_explain(detail)) from None
    if regex.programsize > MAX_PROGRAM:
        raise PatternError(f"it compiles to {regex.programsize} RE2 instructions, more than "
                           f"{MAX_PROGRAM}; use smaller counted repetitions")
    return regex


def _explain(detail: str) -> str:
    if "invalid escape sequence: \\" in detail and detail[-1:].isdigit():
        return f"backreferences are not supported ({detail})"
    for marker, meaning in _EXPLAIN:
        if detail.endswith(marker) or f": {marker}" in detail:
            return f"{meaning} ({detail})"
    return detail


def search(pattern: str, text: str) -> bool:
    """Whether the pattern matches anywhere in the text (JSON Schema's `pattern` semantics)."""
    return compile_regex(pattern).search(text) is not None


# Keywords whose values are subschemas, in every draft from 4 to 2020-12.
_ONE = frozenset({"additionalItems", "additionalProperties", "contains", "contentSchema", "else",
                  "if", "items", "not", "propertyNames", "then", "unevaluatedItems",
                  "unevaluatedProperties"})
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_NAMED = frozenset({"$defs", "definitions", "dependencies", "dependentSchemas",
                    "patternProperties", "properties"})


def _pointer(name: str) -> str:
    return "/" + name.replace("~", "~0").replace("/", "~1")


def subschemas(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema object with its JSON Pointer, the root included."""
    if not isinstance(node, dict):
        return
    yield path, node
    for keyword, value in node.items():
        where = path + _pointer(keyword)
        if keyword in _ONE and isinstance(value, dict):
            yield from subschemas(value, where)
        elif keyword in _LIST and isinstance(value, list):
            for index, item in enumerate(value):
                yield from subschemas(item, f"{where}/{index}")
        elif keyword in _NAMED and isinstance(value, dict):
            for name, item in value.items():
                yield from subschemas(item, where + _pointer(name))


def patterns_of(schema: Any) -> Iterator[tuple[str, str]]:
    """Every `pattern` and `patternProperties` key in the schema, with its JSON Pointer."""
    for path, node in subschemas(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            yield f"{path}/pattern", pattern
        named = node.get("patternProperties")
        if isinstance(named, dict):
            for key in named:
                yield f"{path}/patternProperties{_pointer(key)}", key


def refused_pattern(schema: Any) -> dict[str, str] | None:
    """The first pattern RE2 cannot run (`path`, `pattern`, `reason`), or None."""
    for path, pattern in patterns_of(schema):
        try:
            compile_regex(pattern)
        except PatternError as exc:
            return {"path": path, "pattern": pattern[:200], "reason": str(exc)}
    return None


def program_size(schema: Any) -> int:
    """The RE2 program sizes of every pattern in the schema, summed (0 for unusable ones)."""
    total = 0
    for _, pattern in patterns_of(schema):
        with contextlib.suppress(PatternError):
            total += compile_regex(pattern).programsize
    return total


# ---- the same patterns for jsonschema-rs ----
#
# jsonschema-rs reads patterns as ECMA-262 and runs them on Rust's `regex` crate. Where its
# reading and RE2's agree the pattern is passed as is; `.`, `\s` and `\S` (whose ECMA meaning
# differs from RE2's) are spelled out as RE2 means them; anything else that might be read
# differently (`\b`, `\p{..}`, flags, POSIX or nested classes, `{,n}`) keeps the schema off the
# fast path, so both validators always agree.

_SPACE = "\\t\\n\\f\\r "  # RE2's \s: ASCII whitespace without \v
_KEEP_ESCAPES = frozenset("dDwWnrtfv\\^$.|?*+()[]{}/-")


def rust_pattern(pattern: str) -> str | None:
    """The pattern spelled so that jsonschema-rs matches what RE2 matches, or None."""
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = pattern[i + 1]
            if e in _KEEP_ESCAPES:
                out.append(c + e)
            elif e == "s":
                out.append(_SPACE if in_class else f"[{_SPACE}]")
            elif e == "S" and not in_class:
                out.append(f"[^{_SPACE}]")
            elif e == "x":
                end = _hex_escape_end(pattern, i + 2)
                if end is None:
                    return None
                out.append(pattern[i:end])
                i = end
                continue
            else:
                return None
            i += 2
            continue
        if in_class:
            if c == "[" or pattern[i:i + 2] in ("&&", "--", "~~"):
                return None
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            start = i + 2 if pattern[i + 1:i + 2] == "^" else i + 1
            if pattern[start:start + 1] in ("]", ""):
                return None
            out.append(pattern[i:start])
            in_class = True
            i = start
            continue
        if c == ".":
            out.append("[^\\n]")
        elif c == "(" and pattern[i + 1:i + 2] == "?":
            if pattern[i + 2:i + 3] != ":" and pattern[i + 2:i + 4] != "P<":
                return None
            out.append(c)
        elif c == "{":
            end = _repetition_end(pattern, i)
            if end is None:
                return None
            out.append(pattern[i:end])
            i = end
            continue
        else:
            out.append(c)
        i += 1
    return None if in_class else "".join(out)


def _hex_escape_end(pattern: str, start: int) -> int | None:
    """End of `\\xHH` or `\\x{H..}` whose digits start at `start`."""
    if pattern[start:start + 1] == "{":
        close = pattern.find("}", start)
        digits = pattern[start + 1:close] if close > 0 else ""
        return close + 1 if 0 < len(digits) <= 6 and _hex(digits) else None
    digits = pattern[start:start + 2]
    return start + 2 if len(digits) == 2 and _hex(digits) else None


def _hex(text: str) -> bool:
    return all(d in "0123456789abcdefABCDEF" for d in text)


def _repetition_end(pattern: str, start: int) -> int | None:
    """End of `{n}`, `{n,}` or `{n,m}` at `start`; None for anything RE2 might read literally."""
    close = pattern.find("}", start)
    if close < 0:
        return None
    low, _, high = pattern[start + 1:close].partition(",")
    if not _digits(low) or not (high == "" or _digits(high)):
        return None
    return close + 1


def _digits(text: str) -> bool:
    return bool(text) and all(d in "0123456789" for d in text)


def schema_for_rust(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of the schema with every pattern spelled for jsonschema-rs, or None when some
    pattern cannot be spelled so that both engines agree."""
    copy: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(schema))
    for _, node in subschemas(copy):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            spelled = rust_pattern(pattern)
            if spelled is None:
                return None
            node["pattern"] = spelled
        named = node.get("patternProperties")
        if isinstance(named, dict):
            respelled = {rust_pattern(key): sub for key, sub in named.items()}
            if None in respelled or len(respelled) != len(named):
                return None
            node["patternProperties"] = respelled
    return copy
