"""JSON Schemas: compile (draft chosen by `$schema`), refuse remote refs, validate values."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import msgspec
from jsonschema import FormatChecker
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import specification_with

from broker.core.errors import MempError
from broker.core.grammar import Pattern, compile_pattern
from broker.schemas.keywords import SAFE_VALIDATORS
from broker.schemas.regex import program_size, refused_pattern, schema_for_rust

SCHEMA_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MAX_ERRORS = 10
_DRAFTS = SAFE_VALIDATORS
_LATEST = "https://json-schema.org/draft/2020-12/schema"
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
_PROBES: tuple[Any, ...] = (None, True, 0, "", [], {})


class SchemaBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `PUT /v1/namespaces/{ns}/schemas/{id}`."""

    pattern: str
    schema: dict[str, Any] | bool
    enforce: bool = False


class SchemaRecord(msgspec.Struct, kw_only=True):
    """A registered schema as stored and listed."""

    id: str
    namespace: str
    pattern: str
    schema: dict[str, Any] | bool
    enforce: bool
    draft: str
    created_at: int
    created_by: str


class SchemaErrorDetail(msgspec.Struct):
    """One validation error: where in the value (JSON Pointer), and what."""

    schema_id: str
    path: str
    message: str


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_NO_REMOTE: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


def _draft_of(schema: dict[str, Any] | bool) -> tuple[str, type[Validator]]:
    if isinstance(schema, bool) or "$schema" not in schema:
        return _LATEST, _DRAFTS[_LATEST]
    uri = schema["$schema"]
    normalised = uri.rstrip("#") if isinstance(uri, str) else ""
    if normalised not in _DRAFTS:
        raise MempError("invalid_schema", f"unsupported $schema {uri!r}; use draft 4, 6, 7, "
                        "2019-09 or 2020-12")
    return normalised, _DRAFTS[normalised]


def _remote_refs(node: Any) -> list[str]:
    found = []
    if isinstance(node, dict):
        for name, value in node.items():
            if name in _REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                found.append(value)
            else:
                found += _remote_refs(value)
    elif isinstance(node, list):
        for item in node:
            found += _remote_refs(item)
    return found


def _dangling_refs(schema: dict[str, Any] | bool, draft: str) -> list[str]:
    """Local references that point nowhere: validation would fail on them at every write."""
    spec = specification_with(draft)
    found: list[str] = []

    def walk(contents: Any, resolver: Any) -> None:
        if not isinstance(contents, dict):
            return
        resolver = resolver.in_subresource(spec.create_resource(contents))
        for keyword in _REF_KEYWORDS:
            ref = contents.get(keyword)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    found.append(ref)
        for subschema in spec.subresources_of(contents):
            walk(subschema, resolver)

    walk(schema, _NO_REMOTE.resolver_with_root(spec.create_resource(schema)))
    return found


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A registered schema ready to validate values."""

    record: SchemaRecord
    pattern: Pattern
    validator: Validator
    fast: Any = None
    weight: int = 0

    def conforms_inline(self, value: Any, size: int) -> bool:
        """Whether the fast validator finds the value valid, asked only where that is sure to
        be quick (it holds the GIL, so it runs on the event loop); False means "ask errors()"."""
        return (self.fast is not None and size * self.weight <= INLINE_WORK
                and bool(self.fast.is_valid(value)))

    def errors(self, value: Any) -> list[SchemaErrorDetail]:
        """Every error (up to MAX_ERRORS) from `jsonschema`; run it under a deadline in the
        worker thread, since it may take long (ValidationTimeout)."""
        found = []
        try:
            for error in self.validator.iter_errors(value):
                path = "".join("/" + str(p).replace("~", "~0").replace("/", "~1")
                               for p in error.absolute_path)
                found.append(SchemaErrorDetail(self.record.id, path, error.message[:500]))
                if len(found) >= MAX_ERRORS:
                    break
        except (RecursionError, Unresolvable):
            # `$ref`s that lead back to themselves without consuming the value, or a value
            # nested deeper than recursion allows: flag the value rather than fail the write
            found.append(SchemaErrorDetail(self.record.id, "", "the schema could not be applied: "
                                           "its references loop or the value is too deep"))
        return found


def check_schema(schema: dict[str, Any] | bool) -> str:
    """Return the schema's draft URI, or raise `invalid_schema`. Takes up to seconds for a large
    schema (its meta-schema is applied in Python): run it in the worker thread."""
    draft, validator_class = _draft_of(schema)
    try:
        validator_class.check_schema(schema, format_checker=_META_FORMATS[draft])
        refused = refused_pattern(schema)
        if refused:
            raise MempError(
                "invalid_schema",
                f"pattern {refused['pattern']!r} at {refused['path'] or '/'} cannot run on the "
                f"broker's linear-time regular-expression engine (RE2): {refused['reason']}",
                refused)
        remote = _remote_refs(schema)
        if remote:
            raise MempError("invalid_schema", "schemas may only use local references ('#...'); "
                            "remote $ref is never fetched", {"refs": remote[:10]})
        dangling = _dangling_refs(schema, draft)
        if dangling:
            raise MempError("invalid_schema", "local references point nowhere in the schema",
                            {"refs": dangling[:10]})
    except SchemaError as exc:
        raise MempError("invalid_schema", f"not a valid schema: {exc.message}") from None
    except (RecursionError, Unresolvable):
        raise _unusable() from None
    return draft


def probe_schema(schema: dict[str, Any] | bool) -> None:
    """Apply a checked schema to a few small values, which catches references that loop without
    consuming the value; run it under a deadline in the worker thread (ValidationTimeout)."""
    _, validator_class = _draft_of(schema)
    validator = validator_class(schema, registry=_NO_REMOTE)
    try:
        for probe in _PROBES:
            validator.is_valid(probe)
    except (RecursionError, Unresolvable):
        raise _unusable() from None


def _unusable() -> MempError:
    return MempError("invalid_schema", "the schema's references loop without end or cannot be "
                     "resolved, or it is nested too deeply")


def _without_regex_format(checker: FormatChecker) -> FormatChecker:
    """The meta-schema's format checker minus `regex`, which would judge patterns by Python's
    `re`; refused_pattern judges them by RE2, with a message naming the pattern."""
    copy = FormatChecker(formats=())
    copy.checkers = {name: check for name, check in checker.checkers.items() if name != "regex"}
    return copy


_META_FORMATS = {draft: _without_regex_format(cls.FORMAT_CHECKER)
                 for draft, cls in _DRAFTS.items()}


def compile_schema(record: SchemaRecord) -> CompiledSchema:
    draft, validator_class = _draft_of(record.schema)
    validator = validator_class(record.schema, registry=_NO_REMOTE)
    fast = _fast_validator(record.schema, draft)
    weight = 0
    if fast is not None:
        weight = len(msgspec.json.encode(record.schema)) + REGEX_WEIGHT * program_size(
            record.schema)
    return CompiledSchema(record, compile_pattern(record.pattern), validator, fast, weight)


# The fast validator holds the GIL until it answers, so it runs on the event loop only where its
# worst case is short: value bytes x schema weight <= INLINE_WORK. The weight is the schema's
# JSON size plus REGEX_WEIGHT per RE2 instruction of its patterns. Worst cases measured with
# jsonschema-rs 0.61 on this project's 2-core VM: 0.13 ns per value byte x schema byte (a large
# `enum` applied to every item of an array) and 4 ns per value byte x instruction (a pattern
# whose DFA gives up), so an inline check stays under about 5 ms. See docs/design.md.
INLINE_WORK = 40_000_000
REGEX_WEIGHT = 30

_FAST_DRAFTS: dict[str, Any] = {
    "http://json-schema.org/draft-04/schema": jsonschema_rs.Draft4Validator,
    "http://json-schema.org/draft-06/schema": jsonschema_rs.Draft6Validator,
    "http://json-schema.org/draft-07/schema": jsonschema_rs.Draft7Validator,
    "https://json-schema.org/draft/2019-09/schema": jsonschema_rs.Draft201909Validator,
    "https://json-schema.org/draft/2020-12/schema": jsonschema_rs.Draft202012Validator,
}
# Keywords where the two validators are known to judge differently: references, which
# jsonschema-rs resolves and loops through on its own terms, and `dependencies`, which it
# applies under 2019-09 and later; `unevaluated*`, which jsonschema-rs evaluates in time
# exponential in their nesting (20 levels took 0.2 s on a 17-byte value). `format` is an
# annotation in both (no format assertion). A `$schema` below the root may switch drafts.
_SLOW_ONLY = ("$ref", "$dynamicRef", "$recursiveRef", "dependencies", "unevaluatedProperties",
              "unevaluatedItems")


def _fast_validator(schema: dict[str, Any] | bool, draft: str) -> Any:
    """A jsonschema-rs validator that answers "valid?" about 100x faster, its patterns on Rust's
    linear-time `regex` crate and spelled to mean what RE2 means; the errors of an invalid
    value still come from `jsonschema`, so messages and paths are the same. None for schemas
    the two may judge differently."""
    if isinstance(schema, bool) or _uses(schema, _SLOW_ONLY) or any(
            _uses(sub, ("$schema",)) for key, sub in schema.items() if key != "$schema"):
        return None
    spelled = schema_for_rust(schema)
    if spelled is None:
        return None
    try:
        return _FAST_DRAFTS[draft](spelled, validate_formats=False,
                                   pattern_options=jsonschema_rs.RegexOptions())
    except (ValueError, jsonschema_rs.ValidationError):
        return None


def _uses(node: Any, keywords: tuple[str, ...]) -> bool:
    if isinstance(node, dict):
        return any(k in keywords or _uses(v, keywords) for k, v in node.items())
    if isinstance(node, list):
        return any(_uses(item, keywords) for item in node)
    return False
