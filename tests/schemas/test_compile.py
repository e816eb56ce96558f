"""The jsonschema-rs fast path must agree with `jsonschema` on which values are valid."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bench.profiles import SCHEMA, profile
from broker.schemas.compile import SchemaRecord, compile_schema

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

_BROKEN: list[tuple[str, Any]] = [
    ("created_at", 5), ("created_at", "not a date"), ("plan", "platinum"), ("seats", -1),
    ("seats", "ten"), ("tags", [1, 2]), ("address", {"city": 3}), ("email", None),
]


def _compiled(schema: dict[str, Any]) -> Any:
    record = SchemaRecord(id="s", namespace="n", pattern="*", schema=schema, enforce=False,
                          draft="", created_at=0, created_by="test")
    return compile_schema(record)


def test_realistic_schema_takes_the_fast_path() -> None:
    assert _compiled(SCHEMA).fast is not None


@pytest.mark.parametrize("seed", range(20))
def test_fast_and_full_validators_agree(seed: int) -> None:
    compiled = _compiled(SCHEMA)
    rng = random.Random(seed)
    value = profile(rng, seed)
    field, broken = rng.choice(_BROKEN)
    for candidate in (value, {**value, field: broken}, {k: v for k, v in value.items()
                                                        if k != field}):
        full_says_valid = not list(compiled.validator.iter_errors(candidate))
        assert compiled.fast.is_valid(candidate) == full_says_valid
        assert (compiled.errors(candidate) == []) == full_says_valid


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}}, id="ref"),
        pytest.param({"$schema": "https://json-schema.org/draft/2019-09/schema",
                      "dependencies": {"a": ["b"]}}, id="dependencies"),
    ],
)
def test_schemas_the_validators_may_judge_differently_stay_on_the_full_path(
        schema: dict[str, Any]) -> None:
    assert _compiled(schema).fast is None
