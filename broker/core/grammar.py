"""Namespace, key and pattern grammar, and pattern matching (openapi.yaml's "Names", the
contract)."""

from __future__ import annotations

import functools
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
    """A compiled key pattern: exact key, trailing-`*` prefix, and whole-segment `*` wildcards."""

    text: str
    literal_prefix: str
    _regex: re.Pattern[str] | None

    @property
    def is_exact(self) -> bool:
        return "*" not in self.text

    @property
    def is_prefix(self) -> bool:
        """True when every key starting with `literal_prefix` matches (no middle wildcard)."""
        return self._regex is None and not self.is_exact

    def matches(self, key: str) -> bool:
        if self.is_exact:
            return key == self.text
        if self._regex is None:
            return key.startswith(self.literal_prefix)
        return self._regex.fullmatch(key) is not None


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
    parts: list[str] = []
    middle_star = False
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if last and segment.endswith("*") and "*" not in segment[:-1]:
            stem = segment[:-1]  # the start of a segment: '.' and '..' begin '.x' and '..x'
            if stem not in ("", ".", "..") and _segment_problem(stem):
                raise _bad_pattern(pattern, _segment_problem(stem))
            parts.append(re.escape(stem) + r".*" if stem else r"[^/].*")
            continue
        if segment == "*":
            middle_star = True
            parts.append(r"[^/]+")
            continue
        problem = _segment_problem(segment)
        if problem:
            raise _bad_pattern(pattern, problem + " ('*' must be a whole middle segment)")
        parts.append(re.escape(segment))
    literal_prefix = pattern.split("*", 1)[0]
    regex = re.compile("/".join(parts), re.DOTALL) if middle_star else None
    return Pattern(pattern, literal_prefix, regex)


def _bad_pattern(pattern: str, problem: str | None) -> MempError:
    return MempError("invalid_pattern", f"invalid pattern: {problem}", {"pattern": pattern[:200]})


def glob_match(glob: str, text: str) -> bool:
    """Match a grant or policy glob where `*` stands for any run of characters."""
    if "*" not in glob:
        return glob == text
    return _glob_regex(glob).fullmatch(text) is not None


@functools.lru_cache(maxsize=4096)
def _glob_regex(glob: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")), re.DOTALL)


def glob_covers(outer: str, inner: str) -> bool:
    """True when every name matched by glob `inner` is also matched by glob `outer`."""
    if outer == "*" or outer == inner:
        return True
    if "*" not in inner:
        return glob_match(outer, inner)
    if outer.endswith("*") and "*" not in outer[:-1]:
        return inner.startswith(outer[:-1])
    return False
