"""The safe `jsonschema` validators (`broker/schemas/keywords.py`) judge and word errors exactly as
jsonschema's own, but run patterns on RE2, check uniqueItems in linear time and stop at a
deadline."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from broker.schemas.keywords import SAFE_VALIDATORS, ValidationTimeout, deadline

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

DRAFT7 = "http://json-schema.org/draft-07/schema"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"


def _errors(validator: Any) -> Any:
    def judge(instance: Any) -> list[tuple[str, list[Any], list[Any]]]:
        return sorted((e.message, list(e.absolute_path), list(e.absolute_schema_path))
                      for e in validator.iter_errors(instance))
    return judge


@pytest.mark.parametrize(
    ("draft", "schema", "instances"),
    [
        pytest.param(DRAFT2020, {"pattern": "^[a-z]+$"}, ["abc", "ab1", 5], id="pattern"),
        pytest.param(DRAFT2020, {"patternProperties": {"^n_": {"type": "integer"},
                                                       "x$": {"maxLength": 1}}},
                     [{"n_a": 1, "bx": "yy"}, {"n_a": "1", "n_x": "zz"}], id="pattern-properties"),
        pytest.param(DRAFT7, {"properties": {"a": {}}, "patternProperties": {"^b": {}},
                              "additionalProperties": False},
                     [{"a": 1, "b1": 2}, {"a": 1, "c": 2, "d": 3}], id="additional-with-patterns"),
        pytest.param(DRAFT2020, {"properties": {"a": {}}, "additionalProperties": False},
                     [{"a": 1}, {"c": 2, "d": 3}], id="additional-false"),
        pytest.param(DRAFT2020, {"patternProperties": {"^b": {}},
                                 "additionalProperties": {"type": "string"}},
                     [{"b": 1, "c": "s"}, {"c": 2}], id="additional-schema"),
        pytest.param(DRAFT2020, {"uniqueItems": True},
                     [[1, 2], [1, 1.0], [True, 1], [False, 0], [{"a": [1]}, {"a": [1.0]}],
                      [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[1, 2], [2, 1]], [None, None],
                      ["1", 1], [{"a": True}, {"a": 1}]], id="unique-items"),
        pytest.param(DRAFT2020, {"patternProperties": {"^p": {}},
                                 "anyOf": [{"properties": {"a": {}}}],
                                 "unevaluatedProperties": False},
                     [{"p1": 1, "a": 2}, {"p1": 1, "z": 2}], id="unevaluated-2020"),
        pytest.param(DRAFT2019, {"patternProperties": {"^p": {}},
                                 "allOf": [{"properties": {"a": {}}}],
                                 "unevaluatedProperties": {"type": "integer"}},
                     [{"p1": "x", "z": 1}, {"p1": 1, "z": "y"}], id="unevaluated-2019"),
    ],
)
def test_errors_are_those_of_jsonschema(draft: str, schema: dict[str, Any],
                                        instances: list[Any]) -> None:
    stock = jsonschema.validators.validator_for({"$schema": draft})(schema)
    safe = SAFE_VALIDATORS[draft](schema)
    for instance in instances:
        assert _errors(safe)(instance) == _errors(stock)(instance), instance


def test_a_subschema_naming_another_draft_still_runs_on_re2() -> None:
    schema = {"properties": {"a": {"$schema": DRAFT7 + "#", "pattern": "^(a+)+$"}}}
    # on a backtracking engine, 2^40 steps: the per-test timeout would fail it
    errors = list(SAFE_VALIDATORS[DRAFT2020](schema).iter_errors({"a": "a" * 40 + "!"}))
    assert [e.message for e in errors] == [f"'{'a' * 40}!' does not match '^(a+)+$'"]


def test_uncompilable_pattern_is_an_error_not_a_crash() -> None:
    errors = list(SAFE_VALIDATORS[DRAFT2020]({"pattern": "(?=a)"}).iter_errors("a"))
    assert [e.message.split(":")[0] for e in errors] == ["'(?=a)' cannot be applied"]


def test_uniqueness_of_many_objects_is_linear() -> None:
    # 50,000 objects: a pairwise check (1.25 billion comparisons) would run into the test's
    # timeout; the hash-based one takes well under a second.
    validator = SAFE_VALIDATORS[DRAFT2020]({"uniqueItems": True})
    items = [{"n": i, "tags": [i, str(i)]} for i in range(50_000)]
    assert validator.is_valid(items)
    assert not validator.is_valid([*items, {"tags": [7, "7"], "n": 7.0}])


def test_validation_stops_at_the_deadline() -> None:
    defs = {f"l{i}": {"anyOf": [{"$ref": f"#/$defs/l{i + 1}"}] * 2} for i in range(40)}
    schema = {"$defs": {**defs, "l40": {"type": "string"}}, "$ref": "#/$defs/l0"}
    validator = SAFE_VALIDATORS[DRAFT2020](schema)
    with pytest.raises(ValidationTimeout), deadline(0.05):
        validator.is_valid(0)  # 2^40 paths: only the deadline ends it
    assert validator.is_valid("no deadline outside the block")
