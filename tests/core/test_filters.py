"""Unit tests of broker/core/filters.py: the subscription filter language, its run-time
semantics, its error positions, and hostile filters (size, depth, characters, numbers)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.errors import MempError
from broker.core.filters import (
    MAX_FILTER_BYTES,
    MISSING,
    compile_filter,
    compile_guarded,
    index_key,
)

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


@dataclass
class Event:
    value: Any = MISSING
    type: str = "put"
    key: str = "tasks/1"
    agent: str = "agent-1"
    version: int = 1

    def document(self) -> Any:
        return self.value


def matches(text: str, **event: Any) -> bool:
    return compile_filter(text)(Event(**event))


TASK = {"status": "done", "priority": 3, "tags": ["urgent", "home"], "owner": None,
        "nested": {"a/b": {"~x": [10, 20]}}, "ratio": 0.5, "flag": True}


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param('/status == "done"', True, id="string-equal"),
    pytest.param('/status != "done"', False, id="string-not-equal"),
    pytest.param('/priority >= 3', True, id="number-ge"),
    pytest.param('/priority > 3', False, id="number-gt"),
    pytest.param('/priority == 3.0', True, id="int-equals-float"),
    pytest.param('/ratio < 1', True, id="float-lt-int"),
    pytest.param('/tags contains "urgent"', True, id="array-contains"),
    pytest.param('/tags contains "work"', False, id="array-lacks"),
    pytest.param('/status contains "on"', True, id="substring"),
    pytest.param('exists(/owner)', True, id="exists-null"),
    pytest.param('exists(/missing)', False, id="exists-missing"),
    pytest.param('/owner == null', True, id="null-equal"),
    pytest.param('/flag == true', True, id="bool-equal"),
    pytest.param('/flag == 1', False, id="bool-is-not-a-number"),
    pytest.param('/nested/a~1b/~0x/1 == 20', True, id="pointer-escapes-and-index"),
    pytest.param('/nested/a~1b/~0x/01 == 20', False, id="index-with-leading-zero"),
    pytest.param('/nested/a~1b/~0x/5 == 20', False, id="index-out-of-range"),
    pytest.param('/tags/0 == "urgent"', True, id="array-index"),
    pytest.param('type in ["put", "delete"]', True, id="type-in"),
    pytest.param('type in ["delete"]', False, id="type-not-in"),
    pytest.param('key == "tasks/1" and agent == "agent-1" and version == 1', True, id="fields"),
    pytest.param('key contains "tasks/"', True, id="key-contains"),
    pytest.param('key >= "tasks/"', True, id="key-ordering"),
    pytest.param('version in [2, 3]', False, id="version-in"),
    pytest.param('not /status == "done"', False, id="not"),
    pytest.param('/status == "x" or /priority == 3', True, id="or"),
    pytest.param('/status == "x" or /priority == 3 and /flag == false', False, id="and-binds"),
    pytest.param('(/status == "x" or /priority == 3) and /flag == true', True, id="parens"),
    pytest.param('/status < 3', False, id="mismatch-is-false"),
    pytest.param('/missing != "done"', False, id="not-equal-needs-the-field"),
    pytest.param('/status != 3', True, id="not-equal-across-types"),
    pytest.param('/tags > "a"', False, id="ordering-an-array-is-false"),
    pytest.param('/status/deeper == 1', False, id="pointer-through-a-string"),
])
def test_filter_semantics(text: str, expected: bool) -> None:
    assert matches(text, value=TASK) is expected


def test_a_value_that_is_not_an_object_resolves_no_pointer() -> None:
    assert matches("exists(/a)", value=[1]) is False
    assert matches("/0 == 1", value=[1]) is True
    assert matches('/a == "x"', value=MISSING) is False
    assert matches('type == "delete" and not exists(/a)', type="delete") is True


@pytest.mark.parametrize(("text", "position", "word"), [
    pytest.param("/a ==", 5, "expected a value", id="missing-literal"),
    pytest.param("/a = 1", 3, "unexpected character", id="single-equals"),
    pytest.param("status == 1", 0, "unknown name", id="unknown-name"),
    pytest.param("regex(/a)", 0, "unknown name", id="unknown-function"),
    pytest.param('version == "1"', 11, "cannot be compared", id="version-vs-string"),
    pytest.param("type == 3", 8, "cannot be compared", id="type-vs-number"),
    pytest.param("version contains 1", 8, "contains needs", id="contains-on-version"),
    pytest.param("/a < null", 3, "compares numbers or strings", id="ordering-null"),
    pytest.param("(/a == 1", 8, "expected ')'", id="unclosed"),
    pytest.param("/a == 1)", 7, "unexpected", id="extra-close"),
    pytest.param("/a in [1, ]", 10, "expected a value", id="trailing-comma"),
    pytest.param("exists(type)", 7, "exists() takes", id="exists-a-field"),
    pytest.param("/a == 1 and", 11, "end of filter", id="dangling-and"),
    pytest.param("", 0, "expected a field", id="empty"),
    pytest.param('/a == "x\\q"', 6, "invalid string", id="bad-escape"),
    pytest.param("/a~2 == 1", 0, "~0 or ~1", id="bad-pointer-escape"),
])
def test_errors_name_the_position(text: str, position: int, word: str) -> None:
    with pytest.raises(MempError) as caught:
        compile_filter(text)
    error = caught.value
    assert error.code == "invalid_request" and error.status == 400
    assert error.details == {"parameter": "filter", "position": position}, error.message
    assert word in error.message and f"position {position}" in error.message


@pytest.mark.parametrize(("text", "word"), [
    pytest.param("(" * 1000 + "/a == 1" + ")" * 1000, "longer than", id="1000-deep-parens"),
    pytest.param("(" * 17 + "/a == 1" + ")" * 17, "nested deeper", id="17-deep-parens"),
    pytest.param("not " * 17 + "/a == 1", "nested deeper", id="17-nots"),
    pytest.param("*" * 128, "unexpected character", id="128-stars"),
    pytest.param('/a == "\x00"', "control character", id="nul-in-string"),
    pytest.param("/a == 1\x07", "unexpected character", id="bell"),
    pytest.param("/a == 1e999", "out of range", id="huge-float"),
    pytest.param("/a == " + "9" * 400, "out of range", id="huge-integer"),
    pytest.param("/a == 1 or " * 100 + "/a == 1", "longer than", id="long"),
    pytest.param("/a == \"" + "é" * 600 + "\"", "longer than", id="long-in-bytes"),
])
def test_hostile_filters_are_refused(text: str, word: str) -> None:
    with pytest.raises(MempError) as caught:
        compile_filter(text)
    assert caught.value.code == "invalid_request" and word in caught.value.message


def test_sixteen_levels_and_the_full_length_are_allowed() -> None:
    assert matches("(" * 16 + "/a == 1" + ")" * 16, value={"a": 1})
    assert matches("not " * 16 + "/a == 1", value={"a": 1})
    text = "/a == 1" + " " * (MAX_FILTER_BYTES - 7)
    assert len(text) == MAX_FILTER_BYTES and matches(text, value={"a": 1})
    assert matches("/a == -12345678901234567890", value={"a": -12345678901234567890})


# ---- property: the compiled filter agrees with a plain reading of the same expression ----

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([0.5, -1.5]),
                    st.sampled_from(["a", "b", "ab"]))
VALUES = st.dictionaries(st.sampled_from(["x", "y"]),
                         st.one_of(SCALARS, st.lists(SCALARS, max_size=3)), max_size=2)
OPS = ["==", "!=", "<", "<=", ">", ">=", "contains"]


def kind(value: Any) -> str:
    return "number" if type(value) in (int, float) else type(value).__name__


def reference(node: Any, doc: dict[str, Any]) -> bool:
    """The documented semantics, written plainly."""
    if node[0] in ("and", "or"):
        results = [reference(n, doc) for n in node[1:]]
        return all(results) if node[0] == "and" else any(results)
    if node[0] == "not":
        return not reference(node[1], doc)
    if node[0] == "exists":
        return node[1] in doc
    _, field, op, literal = node
    if field not in doc:
        return False
    value = doc[field]
    same = kind(value) == kind(literal)
    if op == "==":
        return same and value == literal
    if op == "!=":
        return not (same and value == literal)
    if op == "contains":
        if isinstance(value, list):
            return any(kind(v) == kind(literal) and v == literal for v in value)
        return isinstance(value, str) and isinstance(literal, str) and literal in value
    if not same or kind(literal) not in ("number", "str"):
        return False
    return bool({"<": value < literal, "<=": value <= literal,
                 ">": value > literal, ">=": value >= literal}[op])


def render(node: Any) -> str:
    if node[0] in ("and", "or"):
        return "(" + f" {node[0]} ".join(render(n) for n in node[1:]) + ")"
    if node[0] == "not":
        return "not " + render(node[1])
    if node[0] == "exists":
        return f"exists(/{node[1]})"
    _, field, op, literal = node
    return f"/{field} {op} {json.dumps(literal)}"


def _leaf_ok(node: Any) -> bool:
    return not (node[0] == "cmp" and node[2] in ("<", "<=", ">", ">=")
                and kind(node[3]) not in ("number", "str"))


LEAVES = st.one_of(
    st.tuples(st.just("cmp"), st.sampled_from(["x", "y"]), st.sampled_from(OPS), SCALARS),
    st.tuples(st.just("exists"), st.sampled_from(["x", "y"])),
).filter(_leaf_ok)
TREES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.tuples(st.just("not"), inner),
    st.tuples(st.sampled_from(["and", "or"]), inner, inner)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(TREES, VALUES)
def test_compiled_filters_agree_with_the_reference(tree: Any, doc: dict[str, Any]) -> None:
    assert matches(render(tree), value=doc) is reference(tree, doc)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_compiles_or_is_a_400(text: str) -> None:
    try:
        compiled = compile_filter(text)
    except MempError as error:
        assert error.code == "invalid_request" and error.details["parameter"] == "filter"
    else:
        assert compiled(Event(value={"x": 1})) in (True, False)


# ---- guards: the equality the hub indexes subscribers by ----


@pytest.mark.parametrize(("text", "operand", "keys"), [
    pytest.param('/status == "done"', "/status", {("str", "done")}, id="equality"),
    pytest.param('/n == 3 and type == "put"', "/n", {("float", 3)}, id="first-term-of-and"),
    pytest.param('(/n > 1 and key in ["a", "b"])', "key", {("str", "a"), ("str", "b")},
                 id="in-inside-parentheses"),
    pytest.param("/flag == true", "/flag", {("bool", True)}, id="bool-is-its-own-kind"),
    pytest.param("/n != 3", None, None, id="not-equal-has-none"),
    pytest.param("/a == 1 or /b == 2", None, None, id="or-has-none"),
    pytest.param("not /a == 1", None, None, id="not-has-none"),
])
def test_guards(text: str, operand: str | None, keys: set[Any] | None) -> None:
    _, guard = compile_guarded(text)
    if operand is None:
        assert guard is None
    else:
        assert guard is not None and guard.operand == operand and set(guard.keys) == keys
        assert guard.whole is (" and " not in text)


@settings(max_examples=300, deadline=None)
@given(TREES, VALUES)
def test_a_guard_never_rules_out_a_change_the_filter_accepts(tree: Any,
                                                             doc: dict[str, Any]) -> None:
    accepts, guard = compile_guarded(render(tree))
    event = Event(value=doc)
    if guard is not None and accepts(event):
        assert index_key(guard.read(event)) in guard.keys
    if guard is not None and guard.whole:  # the index alone decides, as the filter would
        assert accepts(event) is (index_key(guard.read(event)) in guard.keys)
