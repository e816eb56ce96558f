"""The depth measure of broker/core/nesting.py against its definition: how deep any JSON nests,
without recursion; bodies and decoded values refused past the limit; stored JSON too deep to
decode. Over HTTP, MCP and stored values: tests/web/test_deep_json.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.errors import MempError
from broker.core.nesting import (
    DECODED_DEPTH,
    balanced,
    check_body,
    check_value,
    decode_stored,
    deeper_than,
    depth,
)
from tests.support.depth import LIMIT, TOO_DEEP, arrays, objects, reference_depth

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

# ---- the measure ----

_TEXT = st.text(alphabet='ab[]{}"\\,:', max_size=6)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=30)


@settings(max_examples=400)
@given(_JSON, st.integers(0, 8))
def test_depth_is_how_deep_any_json_nests(value: Any, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert depth(raw) == reference_depth(value)
    assert deeper_than(raw, limit) is (reference_depth(value) > limit)
    assert balanced(raw)
    try:
        check_value(value, limit)
        kept = True
    except MempError:
        kept = False
    assert kept is (reference_depth(value) <= limit)


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param(arrays(100_000), 100_000, id="100000-arrays"),
    pytest.param(objects(5_000, b'"]]]"'), 5_000, id="brackets-in-a-string"),
    pytest.param(b'["\\\\", ["\\"[", [[]]]]', 4, id="escapes"),
    pytest.param(b"[" + b"[[]]," * 10_000 + b"1]", 3, id="wide"),
    pytest.param(b'"[[["', 0, id="scalar"),
])
def test_depth_needs_no_recursion(raw: bytes, expected: int) -> None:
    assert depth(raw) == expected


@pytest.mark.parametrize("raw", [
    pytest.param(arrays(5_000)[:-1], id="one-close-short"),
    pytest.param(b"]" + arrays(5_000)[1:], id="closes-first"),
    pytest.param(b'["' + arrays(5_000), id="open-string"),
])
def test_broken_deep_json_is_not_balanced(raw: bytes) -> None:
    assert not balanced(raw)


def test_a_body_is_refused_by_depth_naming_the_limit() -> None:
    check_body(arrays(LIMIT), LIMIT)
    check_body(b"[" * 100 + b"not json", LIMIT)  # the route's decoder says what is wrong
    for raw in (arrays(LIMIT + 1), objects(10_000), b"[" * 10_000):
        with pytest.raises(MempError) as refused_:
            check_body(raw, LIMIT)
        assert (refused_.value.code, refused_.value.details) == ("invalid_request", TOO_DEEP)


def test_stored_json_past_the_decoded_depth_is_not_decoded() -> None:
    assert decode_stored(arrays(DECODED_DEPTH)) is not None
    with pytest.raises(ValueError, match="deeper than"):
        decode_stored(arrays(DECODED_DEPTH + 1))
