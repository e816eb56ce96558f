"""Schema patterns (`broker/schemas/regex.py`): what RE2 refuses and why, every pattern found
wherever it sits in a schema, and jsonschema-rs matching exactly what RE2 matches."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from broker.schemas.regex import (
    PatternError,
    compile_regex,
    patterns_of,
    refused_pattern,
    rust_pattern,
    search,
)

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        pytest.param("(?=a)b", "lookahead", id="lookahead"),
        pytest.param("a(?!b)", "lookahead", id="negative-lookahead"),
        pytest.param("(?<=a)b", "lookbehind", id="lookbehind"),
        pytest.param("(?<!a)b", "lookbehind", id="negative-lookbehind"),
        pytest.param(r"(a)\1", "backreferences", id="backreference"),
        pytest.param(r"(?<n>a)\k<n>", "backreferences", id="named-backreference"),
        pytest.param("(?>a+)b", "atomic", id="atomic-group"),
        pytest.param("a*+", "possessive", id="possessive"),
        pytest.param(r"\u00e9", r"\x{XXXX}", id="u-escape"),
        pytest.param(r"\cJ", "control", id="control-escape"),
        pytest.param("[ab]{1000}[ab]{1000}", "instructions", id="too-big"),
        pytest.param("(a", "missing )", id="unbalanced"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_with_the_reason(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError, match=None) as caught:
        compile_regex(pattern)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        pytest.param("^(a+)+$", "a" * 5000 + "b", False, id="nested-quantifier-is-linear"),
        pytest.param(r"^\d+$", "١٢٣", False, id="digits-are-ascii"),
        pytest.param(r"^\w+$", "é", False, id="word-is-ascii"),
        pytest.param(r"^\p{L}+$", "é", True, id="unicode-class"),
        pytest.param("abc$", "abc\n", False, id="dollar-is-end-of-text"),
        pytest.param("b", "abc", True, id="unanchored-search"),
    ],
)
def test_re2_semantics(pattern: str, text: str, matches: bool) -> None:
    assert search(pattern, text) is matches


def test_every_pattern_is_found_wherever_it_sits() -> None:
    schema = {
        "pattern": "root",
        "$defs": {"a": {"pattern": "defs"}},
        "definitions": {"b": {"patternProperties": {"pp": {"pattern": "in-pp"}}}},
        "items": [{"pattern": "items-list"}],
        "additionalItems": {"pattern": "additional-items"},
        "anyOf": [{"not": {"pattern": "any-not"}}],
        "if": {"pattern": "if"}, "then": {"pattern": "then"}, "else": {"pattern": "else"},
        "properties": {"pattern": {"pattern": "named-pattern"}, "x/y": {"pattern": "slash"}},
        "propertyNames": {"pattern": "names"},
        "dependentSchemas": {"d": {"pattern": "dependent"}},
        "dependencies": {"e": {"pattern": "dependencies"}, "f": ["g"]},
        "contains": {"pattern": "contains"},
        "unevaluatedProperties": {"pattern": "unevaluated"},
        "const": {"pattern": "data, not a schema"},
        "enum": [{"pattern": "data too"}],
    }
    found = dict((p, path) for path, p in patterns_of(schema))
    assert set(found) == {
        "root", "defs", "pp", "in-pp", "items-list", "additional-items", "any-not", "if", "then",
        "else", "named-pattern", "slash", "names", "dependent", "dependencies", "contains",
        "unevaluated"}
    assert found["slash"] == "/properties/x~1y/pattern"
    assert found["pp"] == "/definitions/b/patternProperties/pp"
    assert refused_pattern(schema) is None
    deep = {"items": {"anyOf": [{}, {"properties": {"a": {"pattern": "(?=x)"}}}]}}
    assert refused_pattern(deep) == {
        "path": "/items/anyOf/1/properties/a/pattern", "pattern": "(?=x)",
        "reason": "lookahead is not supported (invalid perl operator: (?=)"}


# ---- jsonschema-rs reads the spelled pattern as RE2 reads the original ----

_PIECES = ["a", "b", "é", "1", " ", ".", r"\.", r"\s", r"\S", r"\d", r"\D", r"\w", r"\W", r"\n",
           r"\t", r"\r", r"\v", r"\f", r"\x41", r"\x{e9}", r"\/", r"\-", r"\$", "[ab]", "[^a]",
           r"[\s.]", r"[^\s]", r"[\d\w-]", r"[a\]]", "[.]", "(", "(?:", "(?P<g>", ")", "|", "*",
           "+", "?", "*?", "{2}", "{1,3}", "{2,}", "{,2}", "^", "$", "]", "}", r"\b", r"\pL",
           "(?i)", "[[:alpha:]]", "[a&&b]", "[]a]"]
_TEXT = st.text(alphabet="ab1é A.\t\n\r\x0b\x0c\u00a0\u2028\u3000-_/$]}", max_size=8)


@settings(max_examples=600, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6),
       texts=st.lists(_TEXT, min_size=1, max_size=8))
def test_spelled_pattern_matches_what_re2_matches(pieces: list[str], texts: list[str]) -> None:
    pattern = "".join(pieces)
    try:
        compile_regex(pattern)
    except PatternError:
        assume(False)
    spelled = rust_pattern(pattern)
    assume(spelled is not None)
    assert spelled is not None
    try:
        fast = jsonschema_rs.Draft202012Validator(
            {"pattern": spelled}, pattern_options=jsonschema_rs.RegexOptions())
    except ValueError:
        return  # not on the fast path: the full validator judges the schema
    for text in texts:
        assert fast.is_valid(text) == search(pattern, text), (pattern, spelled, text)


@pytest.mark.parametrize(
    "pattern",
    [pytest.param(r"\bword", id="word-boundary"), pytest.param(r"\p{L}", id="unicode-class"),
     pytest.param("(?i)a", id="flags"), pytest.param("[[:alpha:]]", id="posix-class"),
     pytest.param("[a&&b]", id="class-operator"), pytest.param("a{,2}", id="open-repetition"),
     pytest.param(r"[^\S]", id="negated-space-in-class"), pytest.param(r"\z", id="end-of-text")],
)
def test_patterns_that_may_read_differently_keep_the_schema_off_the_fast_path(
        pattern: str) -> None:
    assert rust_pattern(pattern) is None


def test_dot_and_space_are_spelled_as_re2_means_them() -> None:
    spelled: Any = rust_pattern(r"^.\s[.\s]\S$")
    assert spelled == "^[^\\n][\\t\\n\\f\\r ][.\\t\\n\\f\\r ][^\\t\\n\\f\\r ]$"
