"""`jsonschema` validator classes that cannot stall: patterns run on RE2, `uniqueItems` is a
linear hash check, and every keyword checks a deadline, so a validation past its time budget
stops with ValidationTimeout instead of running on."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import attrs
from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend, validator_for
from referencing.jsonschema import lookup_recursive_ref

from broker.schemas.regex import PatternError, compile_regex

Keyword = Callable[[Any, Any, Any, Any], Any]

_DEADLINE: ContextVar[float] = ContextVar("memp_schema_deadline", default=math.inf)


class ValidationTimeout(Exception):
    """Validation ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Validations inside the block stop with ValidationTimeout after `seconds`."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def tick() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise ValidationTimeout


def _checked(keyword: Keyword) -> Keyword:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        tick()
        return keyword(validator, value, instance, schema)
    return run


def _regex_or_error(pattern: str) -> Any:
    try:
        return compile_regex(pattern)
    except PatternError as exc:
        return ValidationError(f"{pattern!r} cannot be applied: {exc}")


# ---- keywords: same messages as jsonschema's, RE2 instead of `re` ----


def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    regex = _regex_or_error(patrn)
    if isinstance(regex, ValidationError):
        yield regex
    elif regex.search(instance) is None:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
                       ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        regex = _regex_or_error(patrn)
        if isinstance(regex, ValidationError):
            yield regex
            continue
        for k, v in instance.items():
            tick()
            if regex.search(k) is not None:
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _matches_any(patterns: Any, name: str) -> bool:
    for patrn in patterns:
        tick()
        regex = _regex_or_error(patrn)
        if not isinstance(regex, ValidationError) and regex.search(name) is not None:
            return True
    return False


def additional_properties(validator: Any, aP: Any, instance: Any, schema: Any
                          ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = {p for p in instance
              if p not in properties and not (patterns and _matches_any(patterns, p))}
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            names = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {names}")
        else:
            yield ValidationError(f"Additional properties are not allowed "
                                  f"({_extras(sorted(extras, key=str))} unexpected)")


def _extras(extras: list[Any]) -> str:
    """jsonschema's extras_msg: `'a', 'b' were`."""
    verb = "was" if len(extras) == 1 else "were"
    return f"{', '.join(repr(extra) for extra in extras)} {verb}"


def _unique_key(item: Any) -> Any:
    """A hashable stand-in equal for JSON-equal values (1 == 1.0, true != 1)."""
    if item is True or item is False:
        return ("bool", item)
    if isinstance(item, list):
        return ("list", tuple(_unique_key(i) for i in item))
    if isinstance(item, dict):
        return ("object", frozenset((k, _unique_key(v)) for k, v in item.items()))
    return item


def unique_items(validator: Any, uI: Any, instance: Any, schema: Any
                 ) -> Iterator[ValidationError]:
    # jsonschema compares unhashable items pairwise, O(n^2) for an array of objects
    if uI and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _unique_key(item)
            if key in seen:
                yield ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


def _evaluated_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> set[str]:
    """jsonschema's find_evaluated_property_keys_by_schema (2020-12, or 2019-09 when `legacy`),
    with RE2 for patternProperties."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    refs = ("$ref", "$recursiveRef") if legacy else ("$ref", "$dynamicRef")
    for keyword in refs:
        ref = schema.get(keyword)
        if ref is None:
            continue
        if keyword == "$recursiveRef":
            resolved = lookup_recursive_ref(validator._resolver)
        else:
            resolved = validator._resolver.lookup(ref)
        keys |= _evaluated_keys(
            validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
            instance, resolved.contents, legacy)
    if legacy:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if value is True:
                keys |= instance.keys()
            elif isinstance(value, dict):
                keys |= {p for p in value if p in instance}
    else:
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            keys |= properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            subschema = schema.get(keyword)
            if subschema is not None:
                keys |= {k for k, v in instance.items()
                         if next(validator.descend(v, subschema), None) is None}
    if "patternProperties" in schema:
        keys |= {p for p in instance if _matches_any(schema["patternProperties"], p)}
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, subschema, legacy)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if next(validator.descend(instance, subschema), None) is None:
                keys |= _evaluated_keys(validator, instance, subschema, legacy)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"], legacy)
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"], legacy)
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"], legacy)
    return keys


def _unevaluated_properties(legacy: bool) -> Keyword:
    def unevaluated_properties(validator: Any, uP: Any, instance: Any, schema: Any
                               ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, instance, schema, legacy)
        unevaluated = [p for p in instance if p not in evaluated
                       and next(validator.descend(instance[p], uP, path=p, schema_path=p),
                                None) is not None]
        if unevaluated and uP is False:
            yield ValidationError(f"Unevaluated properties are not allowed "
                                  f"({_extras(sorted(unevaluated, key=str))} unexpected)")
        elif unevaluated:
            yield ValidationError(f"Unevaluated properties are not valid under the given schema "
                                  f"({_extras(unevaluated)} unevaluated and invalid)")
    return unevaluated_properties


_REPLACED: dict[str, Keyword] = {
    "pattern": pattern,
    "patternProperties": pattern_properties,
    "additionalProperties": additional_properties,
    "uniqueItems": unique_items,
}
_STOCK: dict[str, type[Validator]] = {
    "http://json-schema.org/draft-04/schema": Draft4Validator,
    "http://json-schema.org/draft-06/schema": Draft6Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
    "https://json-schema.org/draft/2019-09/schema": Draft201909Validator,
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
}


_FIELDS = [(f.name, f.alias) for f in attrs.fields(Draft202012Validator) if f.init]


def _evolve(self: Any, **changes: Any) -> Any:
    """jsonschema's evolve, except that a subschema naming its own `$schema` gets the safe class
    of that draft, never the stock one (whose `pattern` would run on `re`); a draft not
    supported here keeps the current class."""
    schema = changes.setdefault("schema", self.schema)
    chosen = validator_for(schema, default=type(self))
    cls = chosen if chosen in _SAFE_OF.values() else _SAFE_OF.get(chosen, type(self))
    for name, alias in _FIELDS:
        if alias not in changes:
            changes[alias] = getattr(self, name)
    return cls(**changes)


def _safe_class(draft: str, stock: type[Validator]) -> type[Validator]:
    keywords = {**stock.VALIDATORS, **_REPLACED}
    if "unevaluatedProperties" in keywords:
        keywords["unevaluatedProperties"] = _unevaluated_properties(
            legacy=draft.endswith("2019-09/schema"))
    safe: type[Validator] = extend(stock, {name: _checked(k) for name, k in keywords.items()})
    safe.evolve = _evolve
    return safe


SAFE_VALIDATORS: dict[str, type[Validator]] = {d: _safe_class(d, c) for d, c in _STOCK.items()}
_SAFE_OF: dict[type[Validator], type[Validator]] = {
    _STOCK[d]: SAFE_VALIDATORS[d] for d in _STOCK}
