"""The SDK's models against the contract: every Struct, Literal and error code in
`memp/models.py` and `memp/errors.py` is checked against `openapi.yaml`, so they cannot drift
apart (field names, which fields the SDK requires, nullability, enums, event types)."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import httpx
import msgspec
import pytest

from broker.core.errors import STATUS_BY_CODE
from memp import messages, models
from memp.errors import ERROR_CLASSES, MempError, SchemaViolation, error_from_response
from tests.support.brokers import load_yaml

DOCUMENT = Path(__file__).resolve().parents[2] / "openapi.yaml"
SPEC: dict[str, Any] = load_yaml(DOCUMENT.read_text())
SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]

# Each wire Struct and the component it decodes; Structs the SDK builds itself are listed apart.
COMPONENTS: dict[type[msgspec.Struct], str] = {
    models.SchemaError: "SchemaErrorDetail",
    models.Conflict: "Conflict",
    models.Entry: "EntryFields",
    models.Agent: "Agent",
    models.Credentials: "Credentials",
    models.Registration: "Registration",
    models.Grant: "Grant",
    models.ApiKey: "ApiKeyRecord",
    models.CreatedKey: "CreatedKey",
    models.Page: "Page",
    models.StrategyRule: "StrategyRule",
    models.PriorityRule: "PriorityRule",
    models.Share: "Share",
    models.NamespaceConfig: "NamespaceConfigFields",
    models.StoredConfig: "StoredConfig",
    models.Limits: "Limits",
    models.UsageReport: "UsageReport",
    models.Usage: "Usage",
    models.AgentDefaults: "AgentDefaults",
    models.SchemaRecord: "SchemaRecord",
    models.AgentPage: "AgentPage",
    models.ErrorBody: "ErrorBody",
    models.CellContent: "CellContent",
    models.CellIdentity: "CellIdentity",
    models.CellScoring: "CellScoring",
    models.CellLifecycle: "CellLifecycle",
    models.AccessPolicy: "AccessPolicy",
    models.Provenance: "Provenance",
    models.MemoryCell: "MemoryCellFields",
    models.CreatedCell: "CreatedMemoryCell",
    models.NearDuplicate: "NearDuplicate",
    models.CellHit: "CellSearchHit",
    models.CellSearchPage: "CellSearchResults",
    models.ImportRefusal: "CellImportError",
    models.ImportResult: "CellImportResult",
    models.Proposal: "Proposal",
    models.ProposalPage: "ProposalPage",
    models.Approval: "ApprovalResult",
    models.AuditRecord: "AuditRecord",
    models.AuditPage: "AuditPage",
    models.AuditVerdict: "AuditVerdict",
}
SDK_ONLY = {
    models.Event,  # made from SSE frames by the subscription, not decoded as one
    # Messages the SDK sends (the broker's own Structs are checked against the document);
    # one Reply for the document's three reply shapes (AckReply, ResultReply, ErrorReply).
    messages.Message, messages.RegisterMessage, messages.AgentGetMessage,
    messages.AgentListMessage,
    messages.PutMessage, messages.GetMessage, messages.QueryMessage, messages.DeleteMessage,
    messages.HistoryMessage, messages.Reply,
}


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def chain(schema: dict[str, Any]) -> list[str]:
    """The components a schema names through `$ref` and one-part `allOf`s."""
    names = []
    while True:
        if "$ref" in schema:
            names.append(schema["$ref"].rsplit("/", 1)[1])
            schema = SCHEMAS[names[-1]]
        elif len(schema.get("allOf", [])) == 1:
            schema = schema["allOf"][0]
        else:
            return names


def shape(name: str) -> tuple[dict[str, Any], set[str]]:
    """A component's properties and required names, its `allOf` parts included."""
    schema = SCHEMAS[name]
    properties: dict[str, Any] = {}
    required: set[str] = set()
    for part in [*schema.get("allOf", []), schema]:
        part = resolve(part)
        properties.update(part.get("properties", {}))
        required.update(part.get("required", []))
    return properties, required


def json_types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema allows; None for any JSON value."""
    schema = resolve(schema)
    if "const" in schema:
        return {_type_of(schema["const"])}
    if "enum" in schema:
        return {_type_of(value) for value in schema["enum"]}
    if "type" in schema:
        kind = schema["type"]
        return set(kind) if isinstance(kind, list) else {kind}
    for combined in ("oneOf", "anyOf"):
        if combined in schema:
            parts = [json_types(part) for part in schema[combined]]
            return None if None in parts else set().union(*(p for p in parts if p))
    for part in schema.get("allOf", []):
        found = json_types(part)
        if found is not None:
            return found
    return None


def enum_of(schema: dict[str, Any]) -> set[Any] | None:
    schema = resolve(schema)
    if "enum" in schema:
        return set(schema["enum"])
    for part in schema.get("allOf", []):
        found = enum_of(part)
        if found is not None:
            return found
    for combined in ("oneOf", "anyOf"):  # a nullable enum: the enum's values
        values = [v for v in (enum_of(part) for part in schema.get(combined, [])) if v]
        if values:
            return set().union(*values)
    return None


def _type_of(value: Any) -> str:
    kinds = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string",
             list: "array", dict: "object"}
    return kinds[type(value)]


def accepted(annotation: Any) -> set[str] | None:
    """The JSON types a Python annotation decodes; None for any JSON value."""
    origin = get_origin(annotation)
    if annotation is Any:
        return None
    if origin is Literal:
        return {_type_of(value) for value in get_args(annotation)}
    if origin in (types.UnionType, typing.Union):
        parts = [accepted(arg) for arg in get_args(annotation)]
        return None if None in parts else set().union(*(p for p in parts if p))
    plain = origin or annotation
    if plain is type(None):
        return {"null"}
    if plain is bool:
        return {"boolean"}
    if plain is int:
        return {"integer"}
    if plain is float:
        return {"number", "integer"}
    if plain is str:
        return {"string"}
    if plain in (list, Sequence):
        return {"array"}
    if plain is dict or typing.is_typeddict(plain) or issubclass(plain, msgspec.Struct):
        return {"object"}
    raise AssertionError(f"no JSON type known for {annotation!r}")


def literals(annotation: Any) -> set[Any] | None:
    """The values of the Literal in an annotation (`Literal[...] | None` included)."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    union = get_origin(annotation) in (types.UnionType, typing.Union)
    for arg in get_args(annotation) if union else ():
        found = literals(arg)
        if found is not None:
            return found
    return None


def item_of(annotation: Any) -> Any:
    """`X` of `list[X]` (or `list[X] | None`), else None."""
    if get_origin(annotation) in (list, Sequence):
        return get_args(annotation)[0]
    union = get_origin(annotation) in (types.UnionType, typing.Union)
    for arg in get_args(annotation) if union else ():
        found = item_of(arg)
        if found is not None:
            return found
    return None


def problems(where: str, annotation: Any, schema: dict[str, Any]) -> list[str]:
    """Where a field's annotation fails to take what the document says the broker sends."""
    found = []
    sent, taken = json_types(schema), accepted(annotation)
    if taken is not None and (sent is None or not sent <= taken):
        found.append(f"{where}: {annotation!r} does not take {sorted(sent or ['any JSON'])}")
    values, allowed = literals(annotation), enum_of(schema)
    if values is not None and values != allowed:
        found.append(f"{where}: Literal {sorted(values)} != enum {sorted(allowed or [])}")
    union = get_origin(annotation) in (types.UnionType, typing.Union)
    nested = [a for a in (get_args(annotation) if union else (annotation,))
              if isinstance(a, type) and issubclass(a, msgspec.Struct)]
    if nested and COMPONENTS.get(nested[0]) not in chain(schema):
        found.append(f"{where}: {nested[0].__name__} is not the document's {chain(schema)}")
    item = item_of(annotation)
    if item is not None and "items" in resolve(schema):
        found += problems(f"{where}[]", item, resolve(schema)["items"])
    return found


@pytest.mark.parametrize("struct", [pytest.param(s, id=s.__name__) for s in COMPONENTS])
def test_struct_matches_its_component(struct: type[msgspec.Struct]) -> None:
    properties, required = shape(COMPONENTS[struct])
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    assert set(fields) == set(properties)
    demanded = {name for name, f in fields.items() if f.required}
    assert demanded <= required, "the SDK requires what the broker may leave out"
    found = [p for name, f in fields.items()
             for p in problems(f"{struct.__name__}.{name}", f.type, properties[name])]
    assert found == []


def test_every_wire_struct_is_checked() -> None:
    structs = {value for module in (models, messages) for value in vars(module).values()
               if isinstance(value, type) and issubclass(value, msgspec.Struct)
               and value.__module__ == module.__name__}
    assert structs == set(COMPONENTS) | SDK_ONLY


def test_config_fields_are_the_configuration_fields() -> None:
    properties, _ = shape("NamespaceConfigFields")
    hints = typing.get_type_hints(models.ConfigFields)
    assert set(hints) == set(properties)
    found = [p for name, hint in hints.items()
             for p in problems(f"ConfigFields.{name}", hint, properties[name])]
    assert found == []


@pytest.mark.parametrize(
    ("literal", "pointer"),
    [
        pytest.param(models.Permission, "Permission", id="Permission"),
        pytest.param(models.Strategy, "Strategy", id="Strategy"),
        pytest.param(models.ArrayMode, "NamespaceConfigFields/merge_arrays", id="ArrayMode"),
        pytest.param(models.SharePermission, "Share/permissions/items", id="SharePermission"),
    ],
)
def test_literal_is_the_document_enum(literal: Any, pointer: str) -> None:
    name, *path = pointer.split("/")
    schema = SCHEMAS[name]
    for step in path:
        schema = resolve(schema)
        schema = schema["items"] if step == "items" else shape(name)[0][step]
    assert set(get_args(literal)) == enum_of(schema)


def test_event_types_are_the_events_the_stream_sends() -> None:
    """What the SDK hands out, what it resumes after and what only moves its cursor, together,
    are every SSE event the subscribe operation declares, each known once."""
    stream = SPEC["paths"]["/v1/subscribe"]["get"]["responses"]["200"]["content"]
    sent = set(stream["text/event-stream"]["x-events"])
    kinds = [set(get_args(t)) for t in (models.EventType, models.EndEventType,
                                         models.CursorEventType)]
    assert set().union(*kinds) == sent
    assert sum(map(len, kinds)) == len(sent)


def test_every_error_code_has_its_exception() -> None:
    assert set(ERROR_CLASSES) == set(SCHEMAS["ErrorCode"]["enum"])


@pytest.mark.parametrize("code", SCHEMAS["ErrorCode"]["enum"])
def test_error_reply_raises_the_exception_of_its_code(code: str) -> None:
    """A code, not only its status, picks the exception: a 422 `schema_timeout` or
    `idempotency_key_reused` is no SchemaViolation."""
    status = STATUS_BY_CODE[code]
    response = httpx.Response(status, json={"error": {"code": code, "message": "why",
                                                      "details": {"limit": 1}}})
    error = error_from_response(response)
    assert type(error) is ERROR_CLASSES[code]
    assert isinstance(error, MempError)
    assert (error.code, error.status, error.message, error.details) == (code, status, "why",
                                                                        {"limit": 1})
    assert isinstance(error, SchemaViolation) == (code == "schema_violation")
