"""Namespace, key and pattern grammar, and pattern matching (openapi.yaml's "Names", the
contract)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.core.errors import MempError

NAMESPACE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
NAMESPACE_GLOB_RE = re.compile(r"[a-z0-9*][a-z0-9._*-]{0,62}")  # grants and shares
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode category Cc: C0, DEL, C1
MAX_KEY_BYTES = 1024


def validate_namespace(namespace: object) -> str:
    """Return the namespace if it is valid, else raise `invalid_namespace`."""
    if not isinstance(namespace, str) or not NAMESPACE_RE.fullmatch(namespace):
        raise MempError(
            "invalid_namespace",
            "namespace must match [a-z0-9][a-z0-9._-]* and be at most 63 characters",
            {"namespace": namespace if isinstance(namespace, str) else None},
        )
    return namespace


def _segment_problem(segment: str) -> str | None:
    if segment == "":
        return "empty segment"
    if segment in (".", ".."):
        return f"'{segment}' segment"
    if "*" in segment:
        return "'*' is not allowed in a key"
    if _CONTROL_RE.search(segment):
        return "control character"
    return None


def validate_key(key: object, max_bytes: int = MAX_KEY_BYTES) -> str:
    """Return the key if it is valid, else raise `invalid_key` naming the problem."""
    if not isinstance(key, str) or key == "":
        raise MempError("invalid_key", "key must be a non-empty string")
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise MempError(
            "invalid_key", f"key is {size} bytes; the limit is {max_bytes}", {"limit": max_bytes}
        )
    _reject_surrogates(key, "invalid_key")
    for segment in key.split("/"):
        problem = _segment_problem(segment)
        if problem:
            raise MempError("invalid_key", f"invalid key: {problem}", {"key": key[:200]})
    return key


def _reject_surrogates(text: str, code: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MempError(code, "text must be valid UTF-8") from None


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled key pattern: exact key, trailing-`*` prefix, and whole-segment `*` wildcards.
    Matched segment by segment, never by a regular expression: linear in the key's length."""

    text: str
    literal_prefix: str
    _segments: tuple[str, ...] | None  # with a middle `*`: the segments, the last maybe `x*`

    @property
    def is_exact(self) -> bool:
        return "*" not in self.text

    @property
    def is_prefix(self) -> bool:
        """True when every key starting with `literal_prefix` matches (no middle wildcard)."""
        return self._segments is None and not self.is_exact

    def matches(self, key: str) -> bool:
        if self.is_exact:
            return key == self.text
        if self._segments is None:
            return key.startswith(self.literal_prefix)
        return _segments_match(self._segments, key)


def _segments_match(segments: tuple[str, ...], key: str) -> bool:
    """Whether `key` matches literal segments and `*` segments (exactly one non-empty segment
    each), the last segment either literal or `stem*` (the rest of the key, starting with
    `stem`, at least one character, not a `/`)."""
    *middle, last = segments
    parts = key.split("/", len(middle))
    if len(parts) <= len(middle):
        return False
    rest = parts[-1]
    if last.endswith("*"):
        stem = last[:-1]
        if not rest.startswith(stem) or (not stem and rest[:1] in ("", "/")):
            return False
    elif rest != last:
        return False
    return all(part == pattern if pattern != "*" else part != ""
               for pattern, part in zip(middle, parts, strict=False))


def compile_pattern(pattern: object, max_bytes: int = MAX_KEY_BYTES) -> Pattern:
    """Parse a pattern or raise `invalid_pattern`."""
    if not isinstance(pattern, str) or pattern == "":
        raise MempError("invalid_pattern", "pattern must be a non-empty string")
    if len(pattern.encode("utf-8", "surrogatepass")) > max_bytes:
        raise MempError("invalid_pattern", f"pattern is longer than {max_bytes} bytes")
    _reject_surrogates(pattern, "invalid_pattern")
    if "*" not in pattern:
        try:
            validate_key(pattern, max_bytes)
        except MempError as exc:
            raise MempError("invalid_pattern", exc.message, {"pattern": pattern[:200]}) from None
        return Pattern(pattern, pattern, None)
    segments = pattern.split("/")
    middle_star = False
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if last and segment.endswith("*") and "*" not in segment[:-1]:
            stem = segment[:-1]  # the start of a segment: '.' and '..' begin '.x' and '..x'
            if stem not in ("", ".", "..") and _segment_problem(stem):
                raise _bad_pattern(pattern, _segment_problem(stem))
            continue
        if segment == "*":
            middle_star = True
            continue
        problem = _segment_problem(segment)
        if problem:
            raise _bad_pattern(pattern, problem + " ('*' must be a whole middle segment)")
    literal_prefix = pattern.split("*", 1)[0]
    return Pattern(pattern, literal_prefix, tuple(segments) if middle_star else None)


def _bad_pattern(pattern: str, problem: str | None) -> MempError:
    return MempError("invalid_pattern", f"invalid pattern: {problem}", {"pattern": pattern[:200]})


def glob_match(glob: str, text: str) -> bool:
    """Whether `text` matches `glob`, where `*` stands for any run of characters (grants,
    shares, agent priorities, AMP access policies). The one glob matcher, the same algorithm
    as `glob_match` in storage/lua/amp_common.lua: the literal parts between the stars are
    found leftmost-first (which is exact when `*` is the only wildcard), so a match takes
    time linear in len(glob) + len(text), never the backtracking a regex engine does on
    `a*a*a*...b` (CWE-1333)."""
    if "*" not in glob:
        return glob == text
    parts = glob.split("*")
    first, last = parts[0], parts[-1]
    end = len(text) - len(last)  # where the last part must start
    if end < len(first) or not text.startswith(first) or not text.endswith(last):
        return False
    at = len(first)
    for part in parts[1:-1]:
        found = text.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


def glob_covers(outer: str, inner: str) -> bool:
    """True when every name matched by glob `inner` is also matched by glob `outer`."""
    if outer == "*" or outer == inner:
        return True
    if "*" not in inner:
        return glob_match(outer, inner)
    if outer.endswith("*") and "*" not in outer[:-1]:
        return inner.startswith(outer[:-1])
    return False
