"""Unit tests of broker/services/conflicts.py: choosing a strategy by pattern, agent priorities,
the deep merge and the three-way merge that flags conflicts (with hypothesis properties against an
independent reference)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.services.conflicts import (
    MISSING,
    Conflict,
    agent_priority,
    deep_merge,
    merge,
    pick_by_pattern,
    pointer,
    specificity,
)

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

# ---- deep_merge ----


@pytest.mark.parametrize(
    ("stored", "incoming", "arrays", "expected"),
    [
        pytest.param({"a": 1}, {"b": 2}, "replace", {"a": 1, "b": 2}, id="disjoint-keys"),
        pytest.param({"a": 1}, {"a": 2}, "replace", {"a": 2}, id="incoming-wins-scalar"),
        pytest.param({"o": {"x": 1, "y": {"z": 1}}}, {"o": {"y": {"w": 2}}}, "replace",
                     {"o": {"x": 1, "y": {"z": 1, "w": 2}}}, id="objects-recursive"),
        pytest.param({"l": [1, 2]}, {"l": [3]}, "replace", {"l": [3]}, id="arrays-replaced"),
        pytest.param({"l": [1, 2]}, {"l": [3]}, "append", {"l": [1, 2, 3]}, id="arrays-appended"),
        pytest.param({"o": {"l": [1]}}, {"o": {"l": [2]}}, "append", {"o": {"l": [1, 2]}},
                     id="nested-arrays-appended"),
        pytest.param({"a": 1}, {"a": {"x": 1}}, "replace", {"a": {"x": 1}},
                     id="object-over-scalar"),
        pytest.param({"a": {"x": 1}}, {"a": 2}, "replace", {"a": 2}, id="scalar-over-object"),
        pytest.param({"a": [1]}, {"a": {"x": 1}}, "append", {"a": {"x": 1}},
                     id="object-over-array-append-mode"),
        pytest.param({"a": 1}, {"a": None}, "replace", {"a": None}, id="null-is-a-value"),
        pytest.param({"a": 1}, [1, 2], "replace", [1, 2], id="array-replaces-object"),
        pytest.param("text", {"a": 1}, "replace", {"a": 1}, id="object-replaces-string"),
        pytest.param({"a": 1}, 7, "append", 7, id="scalar-replaces-object"),
        pytest.param({}, {}, "replace", {}, id="empty"),
    ],
)
def test_deep_merge(stored: Any, incoming: Any, arrays: Any, expected: Any) -> None:
    assert deep_merge(stored, incoming, arrays) == expected


@pytest.mark.parametrize("arrays", [pytest.param("replace", id="replace"),
                                    pytest.param("append", id="append")])
def test_deep_merge_does_not_mutate_its_inputs(arrays: Any) -> None:
    stored = {"o": {"x": 1, "l": [1, 2]}, "s": "v"}
    incoming = {"o": {"y": 2, "l": [3]}, "n": {"deep": [4]}}
    before = copy.deepcopy((stored, incoming))
    result = deep_merge(stored, incoming, arrays)
    assert (stored, incoming) == before
    result["o"]["l"].append(99)
    result["n"]["deep"].append(99)
    assert (stored, incoming) == before


# ---- merge(): the cases of the docstring ----


def test_merge_without_a_base_is_a_plain_deep_merge_without_conflicts() -> None:
    result, conflicts = merge({"a": 1, "o": {"x": 1}}, {"a": 2, "o": {"y": 2}},
                              base_known=False, stored_agent="s", incoming_agent="i")
    assert result == {"a": 2, "o": {"x": 1, "y": 2}}
    assert conflicts == []


def test_three_way_merge_flags_only_paths_both_sides_changed_differently() -> None:
    base = {"status": "open", "owner": "ann", "n": 1, "tags": ["a"], "o": {"x": 1, "y": 1}}
    stored = {"status": "closed", "owner": "ann", "n": 2, "tags": ["a"], "o": {"x": 2, "y": 1}}
    incoming = {"status": "pending", "owner": "bob", "n": 2, "tags": ["b"], "o": {"x": 3},
                "new": True}
    result, conflicts = merge(stored, incoming, base=base, base_known=True,
                              stored_agent="agent-s", incoming_agent="agent-i")
    assert result == {"status": "pending", "owner": "bob", "n": 2, "tags": ["b"],
                      "o": {"x": 3, "y": 1}, "new": True}
    assert conflicts == [
        Conflict("/status", "open", "closed", "pending", "agent-s", "agent-i"),
        Conflict("/o/x", 1, 2, 3, "agent-s", "agent-i"),
    ]


def test_three_way_merge_with_same_change_on_both_sides_is_no_conflict() -> None:
    result, conflicts = merge({"a": 2}, {"a": 2}, base={"a": 1}, base_known=True,
                              stored_agent="s", incoming_agent="i")
    assert (result, conflicts) == ({"a": 2}, [])


def test_three_way_merge_flags_a_path_the_stored_side_added_since_the_base() -> None:
    _, conflicts = merge({"a": 1, "b": "stored"}, {"b": "incoming"}, base={"a": 1},
                         base_known=True, stored_agent="s", incoming_agent="i")
    assert conflicts == [Conflict("/b", None, "stored", "incoming", "s", "i")]


def test_three_way_merge_flags_an_object_written_over_a_changed_scalar() -> None:
    _, conflicts = merge({"a": 2}, {"a": {"x": 1}}, base={"a": 1}, base_known=True,
                         stored_agent="s", incoming_agent="i")
    assert conflicts == [Conflict("/a", 1, 2, {"x": 1}, "s", "i")]


def test_lost_base_flags_every_differing_leaf_and_says_so() -> None:
    stored = {"a": 1, "b": 2, "o": {"x": 1, "y": 1}}
    incoming = {"a": 1, "b": 3, "o": {"x": 2}, "c": 4}
    result, conflicts = merge(stored, incoming, base=MISSING, base_known=True,
                              stored_agent="s", incoming_agent="i")
    assert result == {"a": 1, "b": 3, "o": {"x": 2, "y": 1}, "c": 4}
    assert conflicts == [
        Conflict("/b", None, 2, 3, "s", "i", base_missing=True),
        Conflict("/o/x", None, 1, 2, "s", "i", base_missing=True),
    ]


@pytest.mark.parametrize(
    ("stored", "incoming", "base", "base_known", "base_missing"),
    [
        pytest.param({"a": 1}, "text", MISSING, False, False, id="string-over-object-no-base"),
        pytest.param("text", {"a": 1}, MISSING, False, False, id="object-over-string"),
        pytest.param([1], [2], [0], True, False, id="array-over-array-with-base"),
        pytest.param(1, 2, MISSING, True, True, id="number-base-lost"),
        pytest.param({"a": 1}, None, MISSING, False, False, id="null-over-object"),
    ],
)
def test_non_object_values_replace_and_are_flagged(
    stored: Any, incoming: Any, base: Any, base_known: bool, base_missing: bool
) -> None:
    result, conflicts = merge(stored, incoming, base=base, base_known=base_known,
                              stored_agent="s", incoming_agent="i")
    assert result == incoming
    assert conflicts == [Conflict("", None if base is MISSING else base, stored, incoming,
                                  "s", "i", base_missing=base_missing)]


def test_non_object_value_equal_to_the_stored_one_is_not_flagged() -> None:
    assert merge("same", "same", base_known=False, stored_agent="s",
                 incoming_agent="i") == ("same", [])


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        pytest.param((), "", id="root"),
        pytest.param(("a", "b"), "/a/b", id="plain"),
        pytest.param(("a/b", "c~d"), "/a~1b/c~0d", id="escaped"),
        pytest.param(("",), "/", id="empty-name"),
    ],
)
def test_pointer_is_rfc6901(parts: tuple[str, ...], expected: str) -> None:
    assert pointer(parts) == expected


def test_conflict_paths_are_escaped_json_pointers() -> None:
    _, conflicts = merge({"a/b": {"c~d": 2}}, {"a/b": {"c~d": 3}}, base={"a/b": {"c~d": 1}},
                         base_known=True, stored_agent="s", incoming_agent="i")
    assert [c.path for c in conflicts] == ["/a~1b/c~0d"]


# ---- strategy rules: the most specific pattern wins ----

RULES = [
    ("*", "last-write-wins"),
    ("customer/*", "merge"),
    ("customer/vip/*", "agent-priority"),
    ("customer/*/notes", "merge"),
    ("customer/vip/1", "last-write-wins"),
    ("cust*", "agent-priority"),
]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        pytest.param("customer/vip/1", "last-write-wins", id="exact-beats-globs"),
        pytest.param("customer/vip/2", "agent-priority", id="longer-prefix-beats-shorter"),
        pytest.param("customer/vip/notes", "agent-priority", id="longer-literal-prefix"),
        pytest.param("customer/7/notes", "merge", id="middle-star"),
        pytest.param("customer/7", "merge", id="segment-prefix"),
        pytest.param("custard", "agent-priority", id="stem"),
        pytest.param("other", "last-write-wins", id="catch-all"),
    ],
)
def test_pick_by_pattern_prefers_the_most_specific_rule(key: str, expected: str) -> None:
    assert pick_by_pattern(RULES, key) == expected
    shuffled = RULES[:]
    random.Random(key).shuffle(shuffled)
    assert pick_by_pattern(shuffled, key) == expected
    assert pick_by_pattern(list(reversed(RULES)), key) == expected


def test_pick_by_pattern_without_a_match_is_none() -> None:
    assert pick_by_pattern([("customer/*", "merge")], "other/1") is None
    assert pick_by_pattern([], "any") is None


def test_specificity_orders_exact_then_literal_segments_then_prefix() -> None:
    ordered = ["*", "c*", "customer/*", "customer/vip/*", "customer/vip/1"]
    ranks = [specificity(p) for p in ordered]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


# ---- agent priorities ----

PRIORITIES = [("planner-*", 5), ("planner-lead-*", 8), ("planner-lead-1", 1), ("*", 2)]


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        pytest.param("planner-lead-1", 1, id="exact-beats-longer-glob"),
        pytest.param("planner-lead-2", 8, id="longest-glob"),
        pytest.param("planner-3", 5, id="shorter-glob"),
        pytest.param("writer-1", 2, id="catch-all-glob"),
    ],
)
def test_agent_priority(agent: str, expected: int) -> None:
    assert agent_priority(PRIORITIES, 0, agent) == expected
    assert agent_priority(list(reversed(PRIORITIES)), 0, agent) == expected


def test_agent_priority_falls_back_to_the_default() -> None:
    assert agent_priority([("planner-*", 5)], -3, "writer") == -3
    assert agent_priority([], 4, "anyone") == 4


# ---- properties ----

# Values are flat-ish nested objects: up to three levels, small keys, small scalars, short arrays.
_SCALARS = st.one_of(st.integers(-2, 2), st.sampled_from(["", "a", "b"]), st.booleans(),
                     st.none())
_LEAVES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2))
_NAMES = st.sampled_from(["a", "b", "c", "x/y", "~"])
_DOCS = st.recursive(_LEAVES, lambda inner: st.dictionaries(_NAMES, inner, max_size=4),
                     max_leaves=10)
OBJECTS = st.dictionaries(_NAMES, _DOCS, max_size=4)
_ABSENT = object()


def _canon(value: Any) -> str:
    """JSON identity: `1`, `1.0` and `true` differ, as do `[1]` and `[true]`."""
    return json.dumps(value, sort_keys=True)


def _get(document: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(document, dict) or name not in document:
            return _ABSENT
        document = document[name]
    return document


def _differ(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT:
        return a is not b
    return _canon(a) != _canon(b)


def _shown(value: Any) -> Any:
    return None if value is _ABSENT else value


def _nodes(document: dict[str, Any], prefix: tuple[str, ...] = ()
           ) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for name, value in document.items():
        found.append(((*prefix, name), value))
        if isinstance(value, dict):
            found += _nodes(value, (*prefix, name))
    return found


def _set_paths(incoming: dict[str, Any], stored: dict[str, Any]) -> list[tuple[str, ...]]:
    """What the incoming write sets: each non-object value, or a whole object where the stored
    side holds a non-object, and nothing below a path already set."""
    chosen: list[tuple[str, ...]] = []
    for path, value in _nodes(incoming):
        if any(path[:len(p)] == p for p in chosen):
            continue
        there = _get(stored, path)
        if not isinstance(value, dict) or (there is not _ABSENT and not isinstance(there, dict)):
            chosen.append(path)
    return chosen


def _reference_merge(stored: Any, incoming: Any) -> Any:
    if isinstance(stored, dict) and isinstance(incoming, dict):
        merged = dict(stored)
        for name, value in incoming.items():
            merged[name] = _reference_merge(stored[name], value) if name in stored else value
        return merged
    return incoming


def _reference_conflicts(base: Any, stored: dict[str, Any], incoming: dict[str, Any]
                         ) -> list[tuple[str, Any, Any, Any]]:
    """Paths the incoming write sets that both sides changed, differently, since the base."""
    flagged = []
    for path in _set_paths(incoming, stored):
        b, s, i = _get(base, path), _get(stored, path), _get(incoming, path)
        if _differ(s, i) and _differ(b, s) and _differ(b, i):
            flagged.append((pointer(path), _shown(b), _shown(s), i))
    return flagged


def _as_tuples(conflicts: list[Conflict]) -> list[tuple[str, Any, Any, Any]]:
    return [(c.path, c.base, c.stored, c.incoming) for c in conflicts]


@settings(max_examples=300, deadline=None)
@given(stored=OBJECTS, incoming=OBJECTS)
def test_property_no_concurrent_change_is_a_plain_deep_merge(
    stored: dict[str, Any], incoming: dict[str, Any]
) -> None:
    result, conflicts = merge(stored, incoming, base=copy.deepcopy(stored), base_known=True,
                              stored_agent="s", incoming_agent="i")
    assert conflicts == []
    assert result == deep_merge(stored, incoming)
    assert _canon(result) == _canon(_reference_merge(stored, incoming))


@settings(max_examples=300, deadline=None)
@given(stored=OBJECTS, incoming=OBJECTS)
def test_property_no_base_no_conflicts(stored: dict[str, Any], incoming: dict[str, Any]) -> None:
    result, conflicts = merge(stored, incoming, base_known=False, stored_agent="s",
                              incoming_agent="i")
    assert conflicts == []
    assert _canon(result) == _canon(_reference_merge(stored, incoming))


@settings(max_examples=500, deadline=None)
@given(base=OBJECTS, stored=OBJECTS, incoming=OBJECTS)
@example(base={"a": [0]}, stored={"a": [1]}, incoming={"a": [True]})
@example(base={"a": 0}, stored={"a": {"x": 1}}, incoming={"a": {"x": True}})
@example(base={"a": 1}, stored={"a": 2}, incoming={"a": {"x": 1}})
def test_property_flagged_paths_are_exactly_those_both_sides_changed_differently(
    base: dict[str, Any], stored: dict[str, Any], incoming: dict[str, Any]
) -> None:
    before = copy.deepcopy((base, stored, incoming))
    result, conflicts = merge(stored, incoming, base=base, base_known=True,
                              stored_agent="s", incoming_agent="i")
    assert _canon(_as_tuples(conflicts)) == _canon(_reference_conflicts(base, stored, incoming))
    assert all(c.stored_agent == "s" and c.incoming_agent == "i" and not c.base_missing
               for c in conflicts)
    assert _canon(result) == _canon(_reference_merge(stored, incoming))
    assert _canon((base, stored, incoming)) == _canon(before)


@settings(max_examples=300, deadline=None)
@given(stored=OBJECTS, incoming=OBJECTS)
def test_property_lost_base_flags_every_differing_leaf(
    stored: dict[str, Any], incoming: dict[str, Any]
) -> None:
    _, conflicts = merge(stored, incoming, base=MISSING, base_known=True,
                         stored_agent="s", incoming_agent="i")
    expected = [(pointer(p), None, _get(stored, p), _get(incoming, p))
                for p in _set_paths(incoming, stored)
                if _get(stored, p) is not _ABSENT and _differ(_get(stored, p), _get(incoming, p))]
    assert _canon(_as_tuples(conflicts)) == _canon(expected)
    assert all(c.base_missing for c in conflicts)


@settings(max_examples=200, deadline=None)
@given(stored=OBJECTS, incoming=OBJECTS)
def test_property_append_mode_concatenates_arrays_present_on_both_sides(
    stored: dict[str, Any], incoming: dict[str, Any]
) -> None:
    def reference(s: Any, i: Any) -> Any:
        if isinstance(s, dict) and isinstance(i, dict):
            return {**s, **{k: reference(s[k], v) if k in s else v for k, v in i.items()}}
        if isinstance(s, list) and isinstance(i, list):
            return s + i
        return i

    assert _canon(deep_merge(stored, incoming, "append")) == _canon(reference(stored, incoming))
