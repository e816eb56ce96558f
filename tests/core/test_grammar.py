"""Unit tests of broker/core/grammar.py: namespace, key and pattern grammar, and the one glob
matcher against its definition, in linear time (as storage/lua/amp_common.lua runs it, on both
stores: tests/storage/test_globs.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.errors import MempError
from broker.core.grammar import (
    MAX_KEY_BYTES,
    compile_pattern,
    glob_covers,
    glob_match,
    validate_key,
    validate_namespace,
)
from tests.support.globs import (
    AGENT_CHARS,
    GLOBS_SMALL,
    GLOBS_WIDE,
    HOSTILE_GLOBS,
    TEXTS_SMALL,
    reference_glob,
)

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

# ---- namespaces ----


@pytest.mark.parametrize(
    "namespace",
    [
        pytest.param("acme-crm", id="dash"),
        pytest.param("acme.support_2", id="dot-underscore-digit"),
        pytest.param("a", id="one-char"),
        pytest.param("0team", id="leading-digit"),
        pytest.param("a" * 63, id="63-chars"),
    ],
)
def test_valid_namespaces(namespace: str) -> None:
    assert validate_namespace(namespace) == namespace


@pytest.mark.parametrize(
    "namespace",
    [
        pytest.param("a" * 64, id="64-chars"),
        pytest.param("", id="empty"),
        pytest.param("Acme", id="uppercase"),
        pytest.param("-acme", id="leading-dash"),
        pytest.param(".acme", id="leading-dot"),
        pytest.param("_acme", id="leading-underscore"),
        pytest.param("acme crm", id="space"),
        pytest.param("acme/crm", id="slash"),
        pytest.param("acme*", id="star"),
        pytest.param("acme\n", id="trailing-newline"),
        pytest.param("acmé", id="non-ascii"),
        pytest.param("{acme}", id="hash-tag-braces"),
        pytest.param(None, id="none"),
        pytest.param(7, id="int"),
    ],
)
def test_invalid_namespaces(namespace: object) -> None:
    with pytest.raises(MempError) as raised:
        validate_namespace(namespace)
    assert raised.value.code == "invalid_namespace"
    assert raised.value.status == 400


# ---- keys ----


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("customer/prospect/12345", id="draft-example"),
        pytest.param("agent/support/queue/length", id="four-segments"),
        pytest.param("k", id="one-segment"),
        pytest.param("a/.hidden/..x/x..", id="dots-inside-segments"),
        pytest.param("kunde/müller/straße", id="latin-1"),
        pytest.param("顧客/一二三", id="cjk"),
        pytest.param("notes/🦜", id="emoji"),
        pytest.param("with space/and:colon/{brace}", id="punctuation"),
        pytest.param("a" * MAX_KEY_BYTES, id="1024-ascii-bytes"),
        pytest.param("é" * (MAX_KEY_BYTES // 2), id="1024-utf8-bytes"),
    ],
)
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("/a", id="leading-slash"),
        pytest.param("a/", id="trailing-slash"),
        pytest.param("a//b", id="empty-segment"),
        pytest.param(".", id="dot"),
        pytest.param("a/./b", id="dot-segment"),
        pytest.param("../x", id="dotdot-first"),
        pytest.param("a/..", id="dotdot-last"),
        pytest.param("*", id="star"),
        pytest.param("customer/*", id="trailing-star"),
        pytest.param("a*b", id="star-inside"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
        pytest.param("a\tb", id="tab"),
        pytest.param("a\x1bb", id="escape"),
        pytest.param("a\x7fb", id="del"),
        pytest.param("a\x85b", id="c1-next-line"),
        pytest.param("a\ud800b", id="lone-surrogate"),
        pytest.param("a" * (MAX_KEY_BYTES + 1), id="1025-ascii-bytes"),
        pytest.param("é" * (MAX_KEY_BYTES // 2) + "x", id="1025-utf8-bytes"),
        pytest.param("€" * 342, id="1026-bytes-in-342-chars"),
        pytest.param(None, id="none"),
        pytest.param(["a"], id="list"),
    ],
)
def test_invalid_keys(key: object) -> None:
    with pytest.raises(MempError) as raised:
        validate_key(key)
    assert raised.value.code == "invalid_key"
    assert raised.value.status == 400


def test_key_limit_counts_utf8_bytes_not_characters() -> None:
    key = "€" * 341  # 341 characters, 1023 bytes
    assert validate_key(key) == key
    with pytest.raises(MempError, match="1026 bytes"):
        validate_key(key + "€")


def test_key_limit_is_configurable_downwards() -> None:
    assert validate_key("abcd", max_bytes=4) == "abcd"
    with pytest.raises(MempError) as raised:
        validate_key("abcde", max_bytes=4)
    assert raised.value.details == {"limit": 4}


# ---- patterns ----

KEYS = [
    "customer",
    "customer/1",
    "customer/1/summary",
    "customer/1/notes/summary",
    "customer/2/summary",
    "customers/9",
    "cust",
    "agent/q",
    "a/x/b/y",
    "a/x/b/y/z",
    "a/x/c/y",
    "a/b",
]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("customer/1", {"customer/1"}, id="exact"),
        pytest.param(
            "customer/*",
            {"customer/1", "customer/1/summary", "customer/1/notes/summary",
             "customer/2/summary"},
            id="prefix-any-depth",
        ),
        pytest.param("*", set(KEYS), id="star-alone-is-everything"),
        pytest.param(
            "cust*",
            {"cust", "customer", "customer/1", "customer/1/summary", "customer/1/notes/summary",
             "customer/2/summary", "customers/9"},
            id="stem",
        ),
        pytest.param("customer/*/summary", {"customer/1/summary", "customer/2/summary"},
                     id="middle-star-is-one-segment"),
        pytest.param("a/*/b/*", {"a/x/b/y", "a/x/b/y/z"}, id="middle-and-trailing"),
        pytest.param("*/b", {"a/b"}, id="leading-middle-star"),
        pytest.param("*/*/*/*", {"customer/1/notes/summary", "a/x/b/y", "a/x/b/y/z", "a/x/c/y"},
                     id="four-or-more-segments"),
        pytest.param("a/*/*/y", {"a/x/b/y", "a/x/c/y"}, id="two-middle-stars"),
        pytest.param("customer/*/sum*", {"customer/1/summary", "customer/2/summary"},
                     id="middle-star-then-stem"),
        pytest.param("nothing/*", set(), id="no-match"),
    ],
)
def test_pattern_matching(pattern: str, expected: set[str]) -> None:
    compiled = compile_pattern(pattern)
    assert {key for key in KEYS if compiled.matches(key)} == expected


@pytest.mark.parametrize(
    ("pattern", "prefix", "exact", "is_prefix"),
    [
        pytest.param("customer/1", "customer/1", True, False, id="exact"),
        pytest.param("customer/*", "customer/", False, True, id="prefix"),
        pytest.param("*", "", False, True, id="everything"),
        pytest.param("cust*", "cust", False, True, id="stem"),
        pytest.param("customer/*/summary", "customer/", False, False, id="middle"),
        pytest.param("*/b", "", False, False, id="leading-middle"),
    ],
)
def test_pattern_shape(pattern: str, prefix: str, exact: bool, is_prefix: bool) -> None:
    compiled = compile_pattern(pattern)
    assert compiled.literal_prefix == prefix
    assert compiled.is_exact is exact
    assert compiled.is_prefix is is_prefix


def test_stem_of_dots_matches_dot_segments() -> None:
    # ".x" and "..x" are valid segments, so a stem of "." or ".." names real keys.
    assert compile_pattern("a/.*").matches("a/.hidden")
    assert compile_pattern("a/..*").matches("a/..x")
    assert not compile_pattern("a/.*").matches("a/b")


def test_regex_metacharacters_in_patterns_are_literal() -> None:
    pattern = compile_pattern("a.b/*/(c)+")
    assert pattern.matches("a.b/x/(c)+")
    assert not pattern.matches("axb/x/(c)+")
    assert not pattern.matches("a.b/x/cc")


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param("", id="empty"),
        pytest.param("**", id="double-star"),
        pytest.param("a/**", id="trailing-double-star"),
        pytest.param("a*/b", id="stem-in-middle"),
        pytest.param("a/*x", id="star-then-text"),
        pytest.param("a/x*y", id="star-inside-last"),
        pytest.param("*a", id="star-first-in-only-segment"),
        pytest.param("a//*", id="empty-segment"),
        pytest.param("/*", id="leading-slash"),
        pytest.param("a/*/", id="trailing-slash"),
        pytest.param("../*", id="dotdot-segment"),
        pytest.param("a/./b", id="exact-with-dot-segment"),
        pytest.param("a/\x00*", id="control-in-stem"),
        pytest.param("a\n/*/b", id="control-in-segment"),
        pytest.param("a\ud800*", id="lone-surrogate"),
        pytest.param("a" * MAX_KEY_BYTES + "*", id="over-1024-bytes"),
        pytest.param(None, id="none"),
        pytest.param(3, id="int"),
    ],
)
def test_invalid_patterns(pattern: object) -> None:
    with pytest.raises(MempError) as raised:
        compile_pattern(pattern)
    assert raised.value.code == "invalid_pattern"
    assert raised.value.status == 400


# ---- grant globs ----


@pytest.mark.parametrize(
    ("glob", "name", "expected"),
    [
        pytest.param("acme-crm", "acme-crm", True, id="exact"),
        pytest.param("acme-crm", "acme-crm2", False, id="exact-is-not-prefix"),
        pytest.param("acme-*", "acme-crm", True, id="trailing-star"),
        pytest.param("acme-*", "acme-", True, id="star-matches-empty"),
        pytest.param("acme-*", "acme", False, id="needs-the-literal"),
        pytest.param("acme-*", "xacme-crm", False, id="anchored-start"),
        pytest.param("*", "anything.at_all", True, id="star-alone"),
        pytest.param("*-crm", "acme-crm", True, id="leading-star"),
        pytest.param("a*-*m", "acme-crm", True, id="two-stars"),
        pytest.param("a*-*m", "acme-crx", False, id="two-stars-anchored-end"),
        pytest.param("a.c", "abc", False, id="dot-is-literal"),
    ],
)
def test_glob_match(glob: str, name: str, expected: bool) -> None:
    assert glob_match(glob, name) is expected


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        pytest.param("*", "acme-*", True, id="star-covers-all"),
        pytest.param("acme-*", "acme-*", True, id="itself"),
        pytest.param("acme-*", "acme-crm", True, id="prefix-covers-name"),
        pytest.param("acme-*", "acme-crm-*", True, id="prefix-covers-narrower-prefix"),
        pytest.param("acme-crm", "acme-crm", True, id="exact-covers-itself"),
        pytest.param("acme-crm", "acme-*", False, id="name-does-not-cover-glob"),
        pytest.param("acme-*", "acm*", False, id="narrow-does-not-cover-wider"),
        pytest.param("acme-*", "*", False, id="prefix-does-not-cover-star"),
        pytest.param("acme-*", "other", False, id="unrelated-name"),
        pytest.param("*-crm", "acme-crm", True, id="leading-star-covers-name"),
    ],
)
def test_glob_covers(outer: str, inner: str, expected: bool) -> None:
    assert glob_covers(outer, inner) is expected


# ---- properties ----

_SEGMENT_CHARS = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/*")
segments = st.text(_SEGMENT_CHARS, min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
keys = st.lists(segments, min_size=1, max_size=6).map("/".join)
_GLOB_CHARS = st.sampled_from("abc-.*")


@given(keys, st.data())
def test_trailing_star_is_a_prefix_match(key: str, data: st.DataObject) -> None:
    """For any prefix that forms a pattern, `prefix*` matches exactly the keys starting with it."""
    source = data.draw(keys, label="source")
    cut = data.draw(st.integers(0, len(source)), label="cut")
    prefix = source[:cut]
    if data.draw(st.booleans(), label="use prefix of key"):
        prefix = key[: data.draw(st.integers(0, len(key)), label="key cut")]
    pattern = compile_pattern(prefix + "*")
    assert pattern.matches(key) == key.startswith(prefix)
    assert key.startswith(pattern.literal_prefix) or not pattern.matches(key)


@given(st.lists(segments, min_size=1, max_size=5), st.data())
def test_middle_star_matches_when_segments_agree(key_segments: list[str],
                                                 data: st.DataObject) -> None:
    """A pattern of literal and `*` segments (last one literal) matches iff segment counts agree
    and every literal equals the key's segment at its position."""
    size = data.draw(st.integers(1, 5), label="pattern length")
    pattern_segments: list[str] = []
    for index in range(size):
        last = index == size - 1
        choice = data.draw(st.sampled_from(["own", "other"] if last else ["own", "other", "*"]),
                           label=f"segment {index}")
        if choice == "*":
            pattern_segments.append("*")
        elif choice == "own" and index < len(key_segments):
            pattern_segments.append(key_segments[index])
        else:
            pattern_segments.append(data.draw(segments, label=f"literal {index}"))
    key = "/".join(key_segments)
    expected = len(pattern_segments) == len(key_segments) and all(
        p == "*" or p == k for p, k in zip(pattern_segments, key_segments, strict=False))
    assert compile_pattern("/".join(pattern_segments)).matches(key) is expected


@given(keys)
def test_every_valid_key_is_an_exact_pattern_of_itself(key: str) -> None:
    assert validate_key(key) == key
    pattern = compile_pattern(key)
    assert pattern.is_exact and pattern.matches(key)


@given(st.text(_GLOB_CHARS, min_size=1, max_size=6), st.text(_GLOB_CHARS, min_size=1, max_size=6),
       st.lists(st.text("abc-.", max_size=4), min_size=6, max_size=6))
def test_glob_covers_never_over_grants(outer: str, inner: str, fillers: list[str]) -> None:
    """Whenever `outer` is said to cover `inner`, every name `inner` matches, `outer` matches."""
    if not glob_covers(outer, inner):
        return
    parts = inner.split("*")
    name = "".join(part + (fillers[i] if i < len(parts) - 1 else "")
                   for i, part in enumerate(parts))
    assert glob_match(inner, name)
    assert glob_match(outer, name)


# ---- globs: one matcher, in linear time ----


@settings(max_examples=500)
@given(GLOBS_SMALL, TEXTS_SMALL)
def test_glob_match_agrees_with_the_definition(glob: str, text: str) -> None:
    assert glob_match(glob, text) is reference_glob(glob, text)


@settings(max_examples=300)
@given(GLOBS_WIDE, st.data())
def test_glob_match_agrees_with_the_definition_on_agent_ids(glob: str,
                                                              data: st.DataObject) -> None:
    # Half the texts are built from the glob itself, so matches are common.
    parts = glob.split("*")
    fill = data.draw(st.lists(st.text(AGENT_CHARS, max_size=3), min_size=len(parts),
                              max_size=len(parts)))
    text = data.draw(st.one_of(st.text(AGENT_CHARS, max_size=12),
                               st.just("".join(p + f for p, f in zip(parts, fill, strict=True)))))
    assert glob_match(glob, text) is reference_glob(glob, text)


class _CountedText(str):
    """A text that counts the characters the matcher's searches in it may examine."""

    examined = 0
    calls = 0

    def _count(self, size: int) -> None:
        type(self).examined += size
        type(self).calls += 1

    def startswith(self, prefix: Any, *args: Any) -> bool:
        self._count(len(prefix))
        return str.startswith(self, prefix, *args)

    def endswith(self, suffix: Any, *args: Any) -> bool:
        self._count(len(suffix))
        return str.endswith(self, suffix, *args)

    def find(self, sub: Any, start: Any = 0, end: Any = None) -> int:
        found = str.find(self, sub, start, end)
        stop = len(self) if end is None else end
        self._count(found + len(sub) - start if found >= 0 else stop - start)
        return found


@pytest.mark.parametrize(("glob", "text"), HOSTILE_GLOBS)
def test_a_glob_match_examines_each_character_a_bounded_number_of_times(glob: str,
                                                                        text: str) -> None:
    """The cost of a match, counted in characters its searches examine rather than timed: at
    most the text once plus each literal part once, so 128 stars against 10,000 characters
    cost about 10,000 steps where a backtracking regex takes longer than anyone waits."""
    _CountedText.examined = _CountedText.calls = 0
    counted = _CountedText(text)
    assert glob_match(glob, counted) is False
    assert reference_glob(glob, text) is False
    assert _CountedText.calls > 0  # the match went through the counted searches
    assert _CountedText.examined <= len(text) + len(glob)
    assert _CountedText.calls <= glob.count("*") + 2


@pytest.mark.parametrize(("glob", "text"), HOSTILE_GLOBS)
def test_hostile_globs_still_match_what_they_describe(glob: str, text: str) -> None:
    fitting = "".join(part + "q" for part in glob.split("*"))[:-1]
    assert glob_match(glob, fitting) is reference_glob(glob, fitting) is True
