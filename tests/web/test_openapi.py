"""The contract: openapi.yaml names exactly the routes the broker serves, the broker serves the
document as shipped, and every status, header and body the running broker sends is one the
document declares for that operation."""

from __future__ import annotations

import functools
import re
import socket
import time
import typing
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from starlette.routing import BaseRoute, Mount, Route

from broker.amp import cells as amp
from broker.amp.duplicates import CreatedCell, NearDuplicate
from broker.amp.merge import MergeBody
from broker.amp.search import SearchBody, SearchHit
from broker.app import create_app
from broker.core import models
from broker.core.errors import STATUS_BY_CODE, MempError
from broker.core.grammar import compile_pattern, validate_key
from broker.runtime.settings import Settings
from broker.schemas.compile import SchemaBody, SchemaErrorDetail, SchemaRecord
from broker.services.agents import Registration
from broker.services.conflicts import STRATEGIES, Conflict
from broker.services.fields import decode_cursor, encode_cursor
from broker.services.limits import Limits
from broker.services.namespaces import (
    NamespaceConfig,
    PriorityRule,
    Share,
    StoredConfig,
    StrategyRule,
)
from broker.streaming.changes import ChangePayload
from broker.web.routes.amp import RunBody
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, load_yaml, start_broker

DOCUMENT = Path(__file__).resolve().parents[2] / "openapi.yaml"
BASE_URI = "urn:memp:openapi"
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
CUSTOMER = {"plan": "pro", "acv": 12000}


def escape(segment: str) -> str:
    """One JSON Pointer segment (RFC 6901)."""
    return segment.replace("~", "~0").replace("/", "~1")


def unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


class Contract:
    """The OpenAPI document, able to check a response (and a request body) against itself."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.registry: Registry[Any] = Registry().with_resource(
            BASE_URI, DRAFT202012.create_resource(document))
        self._templates: list[tuple[re.Pattern[str], str]] = [
            (re.compile(_template_regex(t)), t) for t in document["paths"]]

    def at(self, pointer: str) -> Any:
        node: Any = self.document
        for segment in pointer.lstrip("/").split("/"):
            node = node[int(segment)] if isinstance(node, list) else node[unescape(segment)]
        return node

    def follow(self, pointer: str) -> tuple[str, Any]:
        """The object at `pointer`, following OpenAPI `$ref`s; returns its own pointer too."""
        node = self.at(pointer)
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            assert ref.startswith("#/"), f"only local $refs are used, not {ref}"
            pointer = ref[1:]
            node = self.at(pointer)
        return pointer, node

    def validator(self, pointer: str) -> Draft202012Validator:
        return Draft202012Validator(
            {"$ref": f"{BASE_URI}#{pointer}"}, registry=self.registry,
            format_checker=Draft202012Validator.FORMAT_CHECKER)

    def errors(self, pointer: str, instance: Any) -> list[str]:
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                for e in self.validator(pointer).iter_errors(instance)]

    def template(self, path: str) -> str:
        """The path's template; a literal segment beats a parameter, as in the router
        (`/amp/memories/search` is not `/amp/memories/{id}`)."""
        found = [t for regex, t in self._templates if regex.fullmatch(path)]
        fewest = min((t.count("{") for t in found), default=0)
        found = [t for t in found if t.count("{") == fewest]
        assert len(found) == 1, f"{path} matches {found} in the document"
        return found[0]

    def operation_pointer(self, method: str, path: str) -> str:
        template = self.template(path)
        method = method.lower()
        assert method in self.document["paths"][template], \
            f"{method.upper()} {template} is not in the document"
        return f"/paths/{escape(template)}/{method}"

    def request_errors(self, request: httpx.Request) -> list[str]:
        """Schema errors of a JSON request body against the operation's requestBody."""
        op = self.operation_pointer(request.method, request.url.path)
        pointer, body = self.follow(f"{op}/requestBody")
        assert "application/json" in body["content"]
        return self.errors(f"{pointer}/content/application~1json/schema",
                           msgspec.json.decode(request.content))

    def check_stream(self, response: httpx.Response) -> dict[str, Any]:
        """Assert a 200 event stream is documented; returns its `x-events` map (event name to
        the schema pointer of its data)."""
        assert response.status_code == 200, response.read()
        op = self.operation_pointer(response.request.method, response.request.url.path)
        _, spec = self.follow(f"{op}/responses/200")
        assert response.headers["content-type"].split(";")[0] == "text/event-stream"
        events: dict[str, Any] = spec["content"]["text/event-stream"]["x-events"]
        return {name: ref["$ref"][1:] for name, ref in events.items()}

    def check(self, response: httpx.Response, status: int, *, refused_request: bool = False
              ) -> Any:
        """Assert the status, then that the document declares it for the operation, with this
        content type, these required headers and a body its schema accepts. Returns the body.

        A 2xx answer means the document must accept the request body too, unless
        `refused_request`: a request the document refuses though the broker answers 2xx (an
        import reports bad cells one by one), which the document must then refuse."""
        assert response.status_code == status, response.text
        request = response.request
        op = self.operation_pointer(request.method, request.url.path)
        declared = self.at(f"{op}/responses")
        assert str(status) in declared, \
            f"{request.method} {request.url.path}: status {status} is not documented"
        pointer, spec = self.follow(f"{op}/responses/{status}")
        for name in spec.get("headers", {}):
            header_pointer, header = self.follow(f"{pointer}/headers/{escape(name)}")
            value: Any = response.headers.get(name)
            if value is None:
                assert not header.get("required"), f"required header {name} is missing"
                continue
            if header["schema"].get("type") == "integer" and value.isdigit():
                value = int(value)
            problems = self.errors(f"{header_pointer}/schema", value)
            assert not problems, f"header {name}: {problems}"
        content = spec.get("content")
        if not content:
            assert response.content == b"", "the document declares no body"
            return None
        media = response.headers["content-type"].split(";", 1)[0].strip()
        assert media in content, f"{media} is not a documented media type ({list(content)})"
        body = response.json() if media.endswith("json") else \
            yaml.safe_load(response.text) if media.endswith("yaml") else response.text
        problems = self.errors(f"{pointer}/content/{escape(media)}/schema", body)
        assert not problems, f"{request.method} {request.url.path} {status}: {problems}"
        if 200 <= status < 300 and request.content and "requestBody" in self.at(op):
            request_problems = self.request_errors(request)
            if refused_request:
                assert request_problems, "the document accepts this request"
            else:
                assert not request_problems, f"accepted a request the document refuses: " \
                                             f"{request_problems}"
        return body


def _template_regex(template: str) -> str:
    parts = re.split(r"(\{\w+\})", template)
    return "".join(
        (".+" if part == "{key}" else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts
    )


@functools.cache
def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(DOCUMENT.read_text())
    return loaded


@functools.cache
def _document_by_pure_pyyaml() -> dict[str, Any]:
    """The document as PyYAML's own (pure-Python) loader reads it: what the broker serves is
    checked against a reading other than the broker's."""
    loaded: dict[str, Any] = yaml.safe_load(DOCUMENT.read_text())
    return loaded


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Contract(_document())


def _walk(node: Any, pointer: str = "") -> Iterator[tuple[str, Any]]:
    yield pointer, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{pointer}/{escape(str(key))}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{pointer}/{index}")


# ---- the document against the code ----


def _served(routes: list[BaseRoute], prefix: str = "") -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for route in routes:
        if isinstance(route, Mount):
            pairs |= _served(list(route.routes), prefix + route.path)
            continue
        assert isinstance(route, Route), f"unexpected route type {type(route).__name__}"
        path = re.sub(r"\{(\w+)(?::\w+)?\}", r"{\1}", prefix + route.path)
        methods = route.methods or set()
        for method in methods:
            if method == "HEAD" and "GET" in methods:
                continue  # Starlette adds HEAD to every GET route by itself
            pairs.add((path, method))
    return pairs


def test_document_lists_exactly_the_routes_the_app_serves() -> None:
    app = create_app(Settings.from_env(environ={}))
    served = _served(list(app.routes))
    documented = {(path, method.upper()) for path, item in _document()["paths"].items()
                  for method in item if method in HTTP_METHODS}
    assert served, "the app serves no routes"
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"


def test_every_path_parameter_is_declared(contract: Contract) -> None:
    for template, item in contract.document["paths"].items():
        names = set(re.findall(r"\{(\w+)\}", template))
        base = f"/paths/{escape(template)}"
        for method in (m for m in item if m in HTTP_METHODS):
            pointers = [f"{base}/parameters/{i}" for i in range(len(item.get("parameters", [])))]
            pointers += [f"{base}/{method}/parameters/{i}"
                         for i in range(len(item[method].get("parameters", [])))]
            declared = [p for p in (contract.follow(q)[1] for q in pointers) if p["in"] == "path"]
            assert {p["name"] for p in declared} == names, f"{method.upper()} {template}"
            assert all(p.get("required") is True for p in declared), template


def test_every_ref_resolves_and_every_schema_is_valid(contract: Contract) -> None:
    refs = [node["$ref"] for _, node in _walk(contract.document)
            if isinstance(node, dict) and isinstance(node.get("$ref"), str)]
    assert len(refs) > 50
    for ref in refs:
        contract.follow(ref[1:])
    for schema in contract.document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_examples_match_their_schemas(contract: Contract) -> None:
    checked = 0
    for pointer, node in _walk(contract.document):
        if not isinstance(node, dict):
            continue
        if "schema" in node and "examples" in node and pointer.split("/")[-2] == "content":
            for name in node["examples"]:
                _, example = contract.follow(f"{pointer}/examples/{escape(name)}")
                assert not contract.errors(f"{pointer}/schema", example["value"]), (pointer, name)
                checked += 1
    for name, schema in contract.document["components"]["schemas"].items():
        for index, example in enumerate(schema.get("examples", [])):
            assert not contract.errors(f"/components/schemas/{name}", example), (name, index)
            checked += 1
    assert checked >= 10


def test_error_codes_are_the_brokers(contract: Contract) -> None:
    schemas = contract.document["components"]["schemas"]
    assert set(schemas["ErrorCode"]["enum"]) == set(STATUS_BY_CODE)
    for code, status in STATUS_BY_CODE.items():
        assert re.search(rf"`{code}`[^;]*\b{status}\b", schemas["ErrorCode"]["description"]), code


def test_permissions_and_strategies_are_the_brokers(contract: Contract) -> None:
    assert contract.at("/components/schemas/Permission")["enum"] == list(models.PERMISSIONS)
    share = contract.at("/components/schemas/Share/properties/permissions/items")
    assert set(share["enum"]) == {"read", "subscribe"}
    assert contract.at("/components/schemas/Strategy")["enum"] == list(STRATEGIES)


def _codes_allowed(contract: Contract, response: dict[str, Any]) -> set[str]:
    """Error codes a response's schema pins with `const` or `enum`."""
    codes: set[str] = set()
    for pointer, node in _walk(response):
        if pointer.endswith("/error/properties/code") and isinstance(node, dict):
            codes |= {node["const"]} if "const" in node else set(node.get("enum", []))
    return codes


def test_error_responses_sit_under_their_codes_status(contract: Contract) -> None:
    seen = 0
    for template, item in contract.document["paths"].items():
        for method in (m for m in item if m in HTTP_METHODS):
            for status in item[method]["responses"]:
                assert isinstance(status, str) and status.isdigit(), (template, status)
                _, response = contract.follow(
                    f"/paths/{escape(template)}/{method}/responses/{status}")
                for code in _codes_allowed(contract, response):
                    assert STATUS_BY_CODE[code] == int(status), (template, method, code)
                    seen += 1
    for name, response in contract.document["components"]["responses"].items():
        assert _codes_allowed(contract, response), f"{name} pins no error code"
    assert seen > 50


def test_message_types_are_the_brokers(contract: Contract) -> None:
    message = contract.document["components"]["schemas"]["Message"]
    mapping = message["discriminator"]["mapping"]
    assert set(mapping) == set(models.MESSAGE_TYPES)
    assert sorted(mapping.values()) == sorted(branch["$ref"] for branch in message["oneOf"])
    for kind, ref in mapping.items():
        assert contract.at(ref[1:])["properties"]["type"]["const"] == kind


STRUCTS: list[Any] = [
    pytest.param(models.Entry, "Entry", id="Entry"),
    pytest.param(ChangePayload, "ChangeEvent", id="ChangeEvent"),
    pytest.param(models.Agent, "Agent", id="Agent"),
    pytest.param(models.Grant, "Grant", id="Grant"),
    pytest.param(models.ApiKeyRecord, "ApiKeyRecord", id="ApiKeyRecord"),
    pytest.param(models.Credentials, "Credentials", id="Credentials"),
    pytest.param(models.Page, "Page", id="Page"),
    pytest.param(Registration, "Registration", id="Registration"),
    pytest.param(models.PutBody, "PutBody", id="PutBody"),
    pytest.param(models.RegisterBody, "RegisterBody", id="RegisterBody"),
    pytest.param(models.CreateKeyBody, "CreateKeyBody", id="CreateKeyBody"),
    pytest.param(models.RegisterMessage, "AgentRegisterMessage", id="agent.register"),
    pytest.param(models.AgentGetMessage, "AgentGetMessage", id="agent.get"),
    pytest.param(models.AgentListMessage, "AgentListMessage", id="agent.list"),
    pytest.param(models.PutMessage, "MemoryPutMessage", id="memory.put"),
    pytest.param(models.GetMessage, "MemoryGetMessage", id="memory.get"),
    pytest.param(models.QueryMessage, "MemoryQueryMessage", id="memory.query"),
    pytest.param(models.DeleteMessage, "MemoryDeleteMessage", id="memory.delete"),
    pytest.param(models.HistoryMessage, "MemoryHistoryMessage", id="memory.history"),
    pytest.param(NamespaceConfig, "NamespaceConfig", id="NamespaceConfig"),
    pytest.param(StoredConfig, "StoredConfig", id="StoredConfig"),
    pytest.param(StrategyRule, "StrategyRule", id="StrategyRule"),
    pytest.param(PriorityRule, "PriorityRule", id="PriorityRule"),
    pytest.param(Share, "Share", id="Share"),
    pytest.param(Limits, "Limits", id="Limits"),
    pytest.param(SchemaBody, "SchemaBody", id="SchemaBody"),
    pytest.param(SchemaRecord, "SchemaRecord", id="SchemaRecord"),
    pytest.param(SchemaErrorDetail, "SchemaErrorDetail", id="SchemaErrorDetail"),
    pytest.param(Conflict, "Conflict", id="Conflict"),
    pytest.param(models.Proposal, "Proposal", id="Proposal"),
    pytest.param(models.ProposalPage, "ProposalPage", id="ProposalPage"),
    pytest.param(models.ApproveBody, "ApproveBody", id="ApproveBody"),
    pytest.param(models.RejectBody, "RejectBody", id="RejectBody"),
    pytest.param(models.AuditRecord, "AuditRecord", id="AuditRecord"),
    pytest.param(models.AuditPage, "AuditPage", id="AuditPage"),
    pytest.param(models.AuditVerdict, "AuditVerdict", id="AuditVerdict"),
    pytest.param(models.ProposalListMessage, "ProposalListMessage", id="proposal.list"),
    pytest.param(models.ProposalGetMessage, "ProposalGetMessage", id="proposal.get"),
    pytest.param(models.ProposalApproveMessage, "ProposalApproveMessage",
                 id="proposal.approve"),
    pytest.param(models.ProposalRejectMessage, "ProposalRejectMessage", id="proposal.reject"),
]
AMP_STRUCTS: list[Any] = [
    pytest.param(amp.MemoryCell, "MemoryCell", id="MemoryCell"),
    pytest.param(amp.MemoryCell, "MemoryCellFields", id="MemoryCellFields"),
    pytest.param(amp.Content, "CellContent", id="CellContent"),
    pytest.param(amp.Identity, "CellIdentity", id="CellIdentity"),
    pytest.param(amp.Scoring, "CellScoring", id="CellScoring"),
    pytest.param(amp.Lifecycle, "CellLifecycle", id="CellLifecycle"),
    pytest.param(amp.AccessPolicy, "AccessPolicy", id="AccessPolicy"),
    pytest.param(amp.Provenance, "Provenance", id="Provenance"),
    pytest.param(amp.NewCell, "NewCell", id="NewCell"),
    pytest.param(amp.ContentPatch, "CellContentPatch", id="CellContentPatch"),
    pytest.param(amp.ScoringPatch, "CellScoringPatch", id="CellScoringPatch"),
    pytest.param(amp.LifecyclePatch, "CellLifecyclePatch", id="CellLifecyclePatch"),
    pytest.param(amp.CellPatch, "CellPatch", id="CellPatch"),
    pytest.param(amp.ImportBody, "CellImportBody", id="CellImportBody"),
    pytest.param(SearchBody, "CellSearchBody", id="CellSearchBody"),
    pytest.param(SearchHit, "CellSearchHit", id="CellSearchHit"),
    pytest.param(RunBody, "AmpRunBody", id="AmpRunBody"),
    pytest.param(MergeBody, "CellMergeBody", id="CellMergeBody"),
    pytest.param(CreatedCell, "CreatedMemoryCell", id="CreatedMemoryCell"),
    pytest.param(NearDuplicate, "NearDuplicate", id="NearDuplicate"),
]


@pytest.mark.parametrize(("struct", "component"), STRUCTS + AMP_STRUCTS)
def test_components_follow_the_wire_structs(contract: Contract, struct: Any,
                                            component: str) -> None:
    """Same field names as the msgspec Struct (or dataclass); required wherever it has no
    default."""
    schema = contract.at(f"/components/schemas/{component}")
    properties = set(schema.get("properties", {}))
    required = set(schema.get("required", []))
    for part in schema.get("allOf", []):
        _, base = contract.follow(part["$ref"][1:])
        properties |= set(base["properties"])
        required |= set(base.get("required", []))
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType | msgspec.inspect.DataclassType)
    fields = {f.encode_name for f in info.fields}
    mandatory = {f.encode_name for f in info.fields if f.required}
    if isinstance(info, msgspec.inspect.StructType) and info.tag_field is not None:
        fields.add(info.tag_field)
        mandatory.add(info.tag_field)
    assert properties == fields
    assert mandatory <= required
    if isinstance(info, msgspec.inspect.StructType) and info.forbid_unknown_fields:
        assert schema.get("additionalProperties") is False \
            or schema.get("unevaluatedProperties") is False


# Where the document is deliberately narrower than the Struct: the broker decodes these, then
# refuses them with 400 (search never returns deleted cells; the engine owns the status).
NARROWED = {("CellSearchBody", "status"), ("CellLifecyclePatch", "status")}


def _constraints(contract: Contract, node: Any) -> dict[str, Any]:
    """The validation keywords a property schema carries, through `$ref`, `allOf` and the
    non-null branch of a nullable `oneOf`."""
    found: dict[str, Any] = {}
    pending = [node]
    while pending:
        current = pending.pop()
        if "$ref" in current:
            pending.append(contract.at(current["$ref"][1:]))
        pending.extend(current.get("allOf", []))
        pending.extend(p for p in current.get("oneOf", []) if p.get("type") != "null")
        for keyword in ("minimum", "maximum", "minLength", "maxLength", "pattern", "enum",
                        "items"):
            if keyword in current:
                found.setdefault(keyword, current[keyword])
    return found


def _same_constraints(contract: Contract, where: str, kind: Any, schema: dict[str, Any]
                      ) -> None:
    """Every constraint msgspec enforces on `kind` is in the document's `schema`."""
    info = msgspec.inspect
    if isinstance(kind, info.UnionType):
        kinds = [t for t in kind.types if not isinstance(t, info.NoneType)]
        assert len(kinds) == 1, where
        kind = kinds[0]
    found = _constraints(contract, schema)
    expected: dict[str, object]
    if isinstance(kind, info.FloatType | info.IntType):
        expected = {"minimum": kind.ge, "maximum": kind.le}
    elif isinstance(kind, info.StrType):
        expected = {"minLength": kind.min_length, "maxLength": kind.max_length,
                    "pattern": kind.pattern.replace("\\Z", "$") if kind.pattern else None}
    else:
        expected = {}
    for keyword, value in expected.items():
        # The document may say more (a cell id is a ULID, checked after decoding), not less.
        assert value is None or found.get(keyword) == value, (where, keyword, found, value)
    if isinstance(kind, info.LiteralType):
        assert sorted(found.get("enum", [])) == sorted(map(str, kind.values)), where
    elif isinstance(kind, info.ListType):
        assert "items" in found, where
        _same_constraints(contract, f"{where}[]", kind.item_type, found["items"])


@pytest.mark.parametrize(("struct", "component"), AMP_STRUCTS)
def test_amp_components_carry_the_cells_constraints(contract: Contract, struct: Any,
                                                    component: str) -> None:
    """Scores, rates, names, owner ids, globs, text and limits: the same bounds, patterns and
    enums as the Structs in broker/amp."""
    schema = contract.at(f"/components/schemas/{component}")
    properties = dict(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        for name, prop in contract.follow(part["$ref"][1:])[1]["properties"].items():
            properties[name] = {"allOf": [prop, properties.get(name, {})]}
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    for field in info.fields:
        if (component, field.encode_name) not in NARROWED:
            _same_constraints(contract, f"{component}.{field.encode_name}", field.type,
                              properties[field.encode_name])


def _broker_structs() -> Iterator[type[msgspec.Struct]]:
    """Every msgspec Struct the broker defines, in every module of the package."""
    import importlib
    import pkgutil

    import broker

    for module_info in pkgutil.walk_packages(broker.__path__, "broker."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, msgspec.Struct) \
                    and value.__module__ == module.__name__:
                yield value


def test_every_struct_that_refuses_unknown_fields_is_checked() -> None:
    """A Struct that refuses unknown fields is a request body (or part of one): it belongs in
    STRUCTS or AMP_STRUCTS, where its component must say `additionalProperties: false`."""
    checked = {param.values[0] for param in STRUCTS + AMP_STRUCTS}
    strict = {struct for struct in _broker_structs()
              if msgspec.inspect.type_info(struct).forbid_unknown_fields}  # type: ignore[attr-defined]
    strict.discard(models.Message)  # the tagged base; every message type is listed
    # MCP tool arguments are no HTTP body: tools/list serves schemas generated from them.
    strict = {struct for struct in strict if struct.__module__ != "broker.mcp.tools"}
    assert strict - checked == set()


def _accepted(check: Callable[[str], object], text: str) -> bool:
    try:
        check(text)
    except MempError:
        return False
    return True


NAME_CHARACTERS = st.sampled_from(list("a./*\x01\x1f\x7f\x85\x9f\xa0é✓ "))


# No deadline: the first example reads openapi.yaml, seconds on a busy machine.
@settings(max_examples=3000, derandomize=True, database=None, deadline=None)
@given(text=st.text(NAME_CHARACTERS, max_size=12))
def test_key_and_pattern_grammars_are_the_brokers(text: str) -> None:
    """The document's Key and Pattern regexes accept exactly what the broker does (lengths,
    counted in bytes by the broker, aside)."""
    schemas = _document()["components"]["schemas"]
    for component, check in (("Key", validate_key), ("Pattern", compile_pattern)):
        documented = re.search(schemas[component]["pattern"], text) is not None
        assert documented == _accepted(check, text), (component, text)


# Built once, on first use (building it from the pattern costs more than drawing from it).
AMP_TIMES = st.deferred(lambda: st.from_regex(
    _document()["components"]["schemas"]["AmpTimeInput"]["pattern"], fullmatch=True,
).filter(lambda t: "\n" not in t))


@settings(max_examples=500, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(text=AMP_TIMES)
def test_amp_times_the_document_accepts_are_the_brokers(text: str) -> None:
    """Every time AmpTimeInput accepts parses, 29 February of common years aside (which the
    pattern cannot tell from leap years)."""
    assume("-02-29" not in text)
    amp.parse_time(text, "at")


def test_cursors_the_broker_issues_match_the_document() -> None:
    schemas = _document()["components"]["schemas"]
    for position in ("customer/123", "ünïcødé/✓", "a", "ab", "abc"):
        assert re.search(schemas["QueryCursor"]["pattern"], encode_cursor(position))
        assert decode_cursor(encode_cursor(position)) == position
    agent_cursor = f"{int(time.time() * 1000)}:{uuid.uuid4()}"
    assert re.search(schemas["AgentCursor"]["pattern"], agent_cursor)


def test_amp_enums_and_ids_are_the_cells(contract: Contract) -> None:
    schemas = contract.document["components"]["schemas"]
    assert schemas["MemoryType"]["enum"] == list(typing.get_args(amp.MemoryType))
    assert schemas["OwnerType"]["enum"] == list(typing.get_args(amp.OwnerType))
    assert schemas["CellStatus"]["enum"] == list(typing.get_args(amp.Status))
    searchable = contract.at("/components/schemas/CellSearchBody/properties/status/items")
    assert searchable["enum"] == [s for s in typing.get_args(amp.Status) if s != "deleted"]
    assert schemas["CellId"]["pattern"] == f"^{amp.ULID_RE.pattern}$"
    version = contract.at("/components/schemas/MemoryCellFields/properties/amp_version")
    assert version["const"] == amp.AMP_VERSION
    # What requests send is bounded; cells stored before the bound are returned as they are.
    bound = schemas["AccessPolicyInput"]["properties"]
    assert bound["readable_by"]["maxItems"] == bound["writable_by"]["maxItems"] \
        == amp.MAX_POLICY_GLOBS
    wide = {"writable_by": ["agent-1"] * (amp.MAX_POLICY_GLOBS + 1)}
    assert contract.errors("/components/schemas/AccessPolicyInput", wide)
    assert not contract.errors("/components/schemas/AccessPolicy", wide)
    for _ in range(20):
        assert not contract.errors("/components/schemas/CellId", amp.new_ulid())
    now = int(time.time() * 1000)
    for ms in (0, now, now + 400 * 86_400_000):
        assert not contract.errors("/components/schemas/AmpTime", amp.iso(ms))


# ---- the document as served ----


def test_broker_serves_the_document_as_shipped(broker: Broker, contract: Contract) -> None:
    with broker.client(token=None) as client:
        as_yaml = client.get("/openapi.yaml")
        as_json = client.get("/openapi.json")
    assert contract.check(as_yaml, 200) == _document_by_pure_pyyaml()
    assert as_yaml.text == DOCUMENT.read_text()
    assert contract.check(as_json, 200) == _document_by_pure_pyyaml()


def test_system_endpoints(broker: Broker, contract: Contract) -> None:
    with broker.client(token=None) as client:
        assert contract.check(client.get("/healthz"), 200) == {"status": "ok"}
        ready = contract.check(client.get("/readyz"), 200)
        assert ready["store"] == broker.backend
        assert "memp_http_request_duration_seconds" in contract.check(client.get("/metrics"), 200)


# ---- the running broker against the document ----


def entry_url(ns: str, key: str) -> str:
    return f"/v1/namespaces/{ns}/memory/{key}"


def config_url(ns: str) -> str:
    return f"/v1/namespaces/{ns}/config"


def schema_url(ns: str, schema_id: str | None = None) -> str:
    return f"/v1/namespaces/{ns}/schemas" + (f"/{schema_id}" if schema_id else "")


def key_for(admin: httpx.Client, contract: Contract, namespace: str,
            permissions: list[str]) -> str:
    """A new API key with these permissions on `namespace`."""
    grants = [{"namespace": namespace, "permissions": permissions}]
    created = contract.check(admin.post("/v1/keys", json={"grants": grants}), 201)
    api_key: str = created["api_key"]
    return api_key


def test_memory_resources(admin: httpx.Client, ns: str, contract: Contract) -> None:
    url = entry_url(ns, "customer/123")
    created = contract.check(admin.put(url, json={"value": CUSTOMER}), 201)
    assert created["version"] == 1 and created["value"] == CUSTOMER
    updated = admin.put(url, json={"value": {**CUSTOMER, "acv": 15000}, "ttl_seconds": 3600},
                        headers={"If-Match": '"1"', "Idempotency-Key": "contract-put-2"})
    assert contract.check(updated, 200)["version"] == 2
    assert updated.headers["etag"] == '"2"'
    got = admin.get(url)
    assert contract.check(got, 200)["value"] == {**CUSTOMER, "acv": 15000}
    assert got.headers["etag"] == '"2"'

    contract.check(admin.put(entry_url(ns, "customer/456"), json={"value": None}), 201)
    query = f"/v1/namespaces/{ns}/memory"
    first = contract.check(admin.get(query, params={"pattern": "customer/*", "limit": 1}), 200)
    assert [e["key"] for e in first["entries"]] == ["customer/123"]
    assert first["next_cursor"] is not None
    second = contract.check(admin.get(query, params={"pattern": "customer/*",
                                                     "cursor": first["next_cursor"]}), 200)
    assert [e["key"] for e in second["entries"]] == ["customer/456"]
    assert second["next_cursor"] is None

    deleted = contract.check(admin.delete(url), 200)
    assert deleted["deleted"] is True and deleted["value"] is None and deleted["version"] == 3
    history = contract.check(admin.get(f"/v1/namespaces/{ns}/history/customer/123"), 200)
    assert [v["version"] for v in history["versions"]] == [3, 2, 1]
    assert contract.check(admin.get(url), 404)["error"]["code"] == "not_found"
    assert contract.check(admin.delete(url), 404)["error"]["code"] == "not_found"
    assert contract.check(admin.put(url, json={"value": 1}), 201)["version"] == 4


def test_write_conditions_and_conflicts(admin: httpx.Client, ns: str, contract: Contract
                                        ) -> None:
    url = entry_url(ns, "customer/123")
    now = int(time.time() * 1000)
    contract.check(admin.put(url, json={"value": CUSTOMER, "timestamp": now}), 201)
    create_only = contract.check(
        admin.put(url, json={"value": 2}, headers={"If-None-Match": "*"}), 412)
    assert create_only["error"]["details"]["current"]["value"] == CUSTOMER
    stale = contract.check(admin.put(url, json={"value": 2}, headers={"If-Match": '"9"'}), 412)
    assert stale["error"]["details"]["current_version"] == 1
    missing = admin.put(entry_url(ns, "never"), json={"value": 2}, headers={"If-Match": '"1"'})
    assert contract.check(missing, 412)["error"]["details"] == {"current_version": 0}
    older = contract.check(admin.put(url, json={"value": 3, "timestamp": now - 1000}), 409)
    assert older["error"]["details"]["winner"]["value"] == CUSTOMER
    older_delete = admin.delete(url, params={"timestamp": now - 1000})
    assert contract.check(older_delete, 409)["error"]["code"] == "write_conflict"
    stale_delete = admin.delete(url, headers={"If-Match": '"5"'})
    assert contract.check(stale_delete, 412)["error"]["code"] == "precondition_failed"
    assert contract.check(admin.get(url), 200)["value"] == CUSTOMER


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "code"),
    [
        pytest.param("PUT", "memory/a//b", {"json": {"value": 1}}, "invalid_key", id="key"),
        pytest.param("PUT", "memory/k", {"json": {"value": 1, "timestamp": 2**52}},
                     "invalid_timestamp", id="future-timestamp"),
        pytest.param("PUT", "memory/k", {"content": b"{nope",
                                         "headers": {"content-type": "application/json"}},
                     "invalid_json", id="json"),
        pytest.param("PUT", "memory/k", {"json": {"value": 1}, "headers": {"If-Match": "*"}},
                     "invalid_request", id="if-match-star"),
        pytest.param("PUT", "memory/k", {"json": {"value": 1},
                                         "headers": {"Idempotency-Key": "no spaces"}},
                     "invalid_request", id="idempotency-key"),
        pytest.param("GET", "memory", {"params": {"pattern": "a*b/c"}}, "invalid_pattern",
                     id="pattern"),
        pytest.param("GET", "memory", {"params": {"limit": "many"}}, "invalid_request",
                     id="limit"),
        pytest.param("GET", "memory", {"params": {"cursor": "_w"}}, "invalid_request",
                     id="cursor"),
        pytest.param("GET", "agents", {"params": {"cursor": "bogus"}}, "invalid_request",
                     id="agent-cursor"),
        pytest.param("DELETE", "memory/k", {"params": {"timestamp": "soon"}}, "invalid_request",
                     id="delete-timestamp"),
        pytest.param("GET", "history/k", {"params": {"limit": "0"}}, "invalid_request",
                     id="history-limit"),
    ],
)
def test_bad_input_is_400(admin: httpx.Client, ns: str, contract: Contract, method: str,
                          path: str, kwargs: dict[str, Any], code: str) -> None:
    response = admin.request(method, f"/v1/namespaces/{ns}/{path}", **kwargs)
    assert contract.check(response, 400)["error"]["code"] == code


@pytest.mark.parametrize(
    ("body", "code"),
    [
        pytest.param({"value": 1, "ttl_seconds": 0}, "invalid_ttl", id="ttl-zero"),
        pytest.param({"value": 1, "ttl_seconds": -5}, "invalid_ttl", id="ttl-negative"),
        pytest.param({"value": 1, "timestamp": 0}, "invalid_timestamp", id="timestamp-zero"),
        pytest.param({"valu": 1}, "invalid_request", id="no-value"),
        pytest.param({"value": 1, "colour": "red"}, "invalid_request", id="unknown-field"),
        pytest.param({"value": 1, "ttl_seconds": "60"}, "invalid_request", id="ttl-string"),
    ],
)
def test_bad_put_bodies_are_400_and_refused_by_the_document(
    admin: httpx.Client, ns: str, contract: Contract, body: dict[str, Any], code: str
) -> None:
    response = admin.put(entry_url(ns, "k"), json=body)
    assert contract.check(response, 400)["error"]["code"] == code
    assert contract.request_errors(response.request), \
        "the document accepts a body the broker refuses"


def test_bad_namespace_is_400(admin: httpx.Client, contract: Contract) -> None:
    for path in ("/v1/namespaces/Bad_NS/memory/k", "/v1/namespaces/Bad_NS/memory",
                 "/v1/namespaces/Bad_NS/agents", config_url("Bad_NS"), schema_url("Bad_NS"),
                 schema_url("Bad_NS", "s")):
        assert contract.check(admin.get(path), 400)["error"]["code"] == "invalid_namespace"


def test_oversized_and_mistyped_bodies(admin: httpx.Client, ns: str, contract: Contract
                                       ) -> None:
    url = entry_url(ns, "big")
    big = admin.put(url, json={"value": "x" * (1024 * 1024 + 1)})
    assert contract.check(big, 413)["error"]["details"]["limit"] == 1024 * 1024
    text = admin.put(url, content=b'{"value": 1}', headers={"content-type": "text/plain"})
    assert contract.check(text, 415)["error"]["code"] == "unsupported_media_type"
    for path in ("/v1/agents", "/v1/keys", "/v1/messages"):
        response = admin.post(path, content=b"{}", headers={"content-type": "text/plain"})
        assert contract.check(response, 415)["error"]["code"] == "unsupported_media_type"
    assert contract.check(admin.get(url), 404)["error"]["code"] == "not_found"


def test_agents(admin: httpx.Client, ns: str, contract: Contract, broker: Broker) -> None:
    registered = contract.check(admin.post("/v1/agents", json={
        "name": "my-agent", "framework": "langchain", "namespace": ns}), 201)
    agent = registered["agent"]
    assert registered["credentials"]["agent_id"] == agent["id"]
    listed = contract.check(admin.get(f"/v1/namespaces/{ns}/agents"), 200)
    assert [a["id"] for a in listed["agents"]] == [agent["id"]]
    got = contract.check(admin.get(f"/v1/namespaces/{ns}/agents/{agent['id']}"), 200)
    assert got == {**agent, "last_seen": got["last_seen"]}
    missing = admin.get(f"/v1/namespaces/{ns}/agents/{uuid.uuid4()}")
    assert contract.check(missing, 404)["error"]["code"] == "not_found"
    bad = admin.post("/v1/agents", json={"name": "x", "namespace": ns, "framework": "Lang Chain"})
    assert contract.check(bad, 400)["error"]["code"] == "invalid_request"
    assert contract.request_errors(bad.request)

    with broker.client(registered["credentials"]["api_key"]) as as_agent:
        written = as_agent.put(entry_url(ns, "customer/123"), json={"value": CUSTOMER})
        assert contract.check(written, 201)["agent_id"] == agent["id"]
        other = f"{ns}-other"
        assert contract.check(as_agent.get(entry_url(other, "k")), 403)["error"]["code"] \
            == "forbidden"
        assert contract.check(as_agent.post("/v1/agents", json={
            "name": "x", "namespace": other}), 403)["error"]["code"] == "forbidden"


def test_keys(admin: httpx.Client, ns: str, contract: Contract, broker: Broker) -> None:
    grants = [{"namespace": ns, "permissions": ["read"]}]
    created = contract.check(admin.post("/v1/keys", json={"name": "reader", "grants": grants}),
                             201)
    key_id = created["key"]["id"]
    listed = contract.check(admin.get("/v1/keys"), 200)
    assert key_id in [k["id"] for k in listed["keys"]]
    with broker.client(created["api_key"]) as reader:
        contract.check(reader.get(f"/v1/namespaces/{ns}/memory"), 200)
        denied = reader.put(entry_url(ns, "k"), json={"value": 1})
        assert contract.check(denied, 403)["error"]["details"]["permission"] == "write"
        contract.check(reader.get("/v1/keys"), 403)
        contract.check(reader.get("/v1/subscribe", params={"namespace": ns}), 403)
        contract.check(reader.post("/v1/keys", json={"grants": grants}), 403)
        contract.check(reader.delete(f"/v1/keys/{key_id}"), 404)
        assert contract.check(admin.delete(f"/v1/keys/{key_id}"), 204) is None
        revoked = reader.get(f"/v1/namespaces/{ns}/memory")
        assert contract.check(revoked, 401)["error"]["code"] == "unauthorized"
    contract.check(admin.delete(f"/v1/keys/{key_id}"), 404)
    bad = admin.post("/v1/keys", json={"grants": [{"namespace": ns, "permissions": ["fly"]}]})
    assert contract.check(bad, 400)["error"]["code"] == "invalid_request"
    assert contract.request_errors(bad.request)
    empty = admin.post("/v1/keys", json={"grants": []})
    assert contract.check(empty, 400)["error"]["code"] == "invalid_request"
    assert contract.request_errors(empty.request)


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(None, id="missing"),
        pytest.param("memp_sk_live_forged", id="unknown-key"),
        pytest.param("not-a-token", id="garbage"),
    ],
)
def test_missing_or_bad_token_is_401(broker: Broker, ns: str, contract: Contract,
                                     token: str | None) -> None:
    with broker.client(token) as client:
        calls = [
            client.get(entry_url(ns, "k")),
            client.put(entry_url(ns, "k"), json={"value": 1}),
            client.get(f"/v1/namespaces/{ns}/memory"),
            client.get(f"/v1/namespaces/{ns}/agents"),
            client.post("/v1/messages", json={"type": "memory.get", "namespace": ns,
                                              "key": "k"}),
            client.get("/v1/keys"),
            client.delete("/v1/keys/key_0000000000000000"),
            client.get("/v1/subscribe", params={"namespace": ns}),
            client.get(config_url(ns)),
            client.put(config_url(ns), json={}),
            client.get(schema_url(ns)),
            client.get(schema_url(ns, "s")),
            client.put(schema_url(ns, "s"), json={"pattern": "*", "schema": {}}),
            client.delete(schema_url(ns, "s")),
            *amp_calls(client),
        ]
    for response in calls:
        body = contract.check(response, 401)
        assert body["error"]["code"] == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")


def amp_calls(client: httpx.Client, purge: bool = True) -> list[httpx.Response]:
    """One call to each AMP operation, acting as `agent-1` (purge is refused with 403 before
    the store is asked, on a broker without AMP_PURGE_RETENTION)."""
    acting_as = {"X-AMP-Agent-ID": "agent-1"}
    cell = f"/amp/memories/{UNKNOWN_CELL}"
    return [
        client.post("/amp/memories", json=new_cell("x"), headers=acting_as),
        client.post("/amp/memories/search", json={"query": "python"}, headers=acting_as),
        client.post("/amp/memories/merge", json={"ids": [UNKNOWN_CELL, OTHER_CELL],
                                                 "text": "x"}, headers=acting_as),
        client.get(cell, headers=acting_as),
        client.patch(cell, json={"scoring": {"importance": 1}}, headers=acting_as),
        client.delete(cell, headers=acting_as),
        client.post("/amp/lifecycle/run", json={}, headers=acting_as),
        *([client.post("/amp/purge", json={}, headers=acting_as)] if purge else []),
        client.post("/amp/import", json={"cells": [imported_cell(
            "x", created_at="2026-01-01T00:00:00Z")]}, headers=acting_as),
    ]


def message(ns: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"memp": "1.0", "type": kind, "namespace": ns, **fields}


def test_single_messages(admin: httpx.Client, ns: str, contract: Contract, broker: Broker
                         ) -> None:
    def send(body: Any, status: int) -> Any:
        return contract.check(admin.post("/v1/messages", json=body), status)

    put = send(message(ns, "memory.put", id="m-1", key="customer/123", value=CUSTOMER), 200)
    assert put["type"] == "ack" and put["reply_to"] == "m-1" and put["entry"]["version"] == 1
    assert send(message(ns, "memory.get", key="customer/123"), 200)["entry"]["value"] == CUSTOMER
    query = send(message(ns, "memory.query", pattern="customer/*"), 200)
    assert [e["key"] for e in query["entries"]] == ["customer/123"]
    history = send(message(ns, "memory.history", key="customer/123"), 200)
    assert [v["version"] for v in history["versions"]] == [1]
    registered = send(message(ns, "agent.register", name="my-agent", framework="crewai"), 200)
    agent_id = registered["agent"]["id"]
    assert send(message(ns, "agent.get", agent=agent_id), 200)["agent"]["id"] == agent_id
    assert [a["id"] for a in send(message(ns, "agent.list"), 200)["agents"]] == [agent_id]

    stale = send(message(ns, "memory.put", key="customer/123", value=1, if_version=7), 412)
    assert stale["type"] == "error" and stale["error"]["details"]["current_version"] == 1
    old = send(message(ns, "memory.put", key="customer/123", value=1, timestamp=1), 409)
    assert old["error"]["details"]["winner"]["value"] == CUSTOMER
    spoof = send(message(ns, "memory.put", key="k", value=1, agent_id=str(uuid.uuid4())), 403)
    assert spoof["error"]["code"] == "forbidden"
    big = send(message(ns, "memory.put", key="k", value="x" * (1024 * 1024 + 1)), 413)
    assert big["type"] == "error" and big["error"]["code"] == "payload_too_large"
    deleted = send(message(ns, "memory.delete", key="customer/123"), 200)
    assert deleted["type"] == "ack" and deleted["entry"]["deleted"] is True
    missing = send(message(ns, "memory.get", key="customer/123"), 404)
    assert missing["error"]["code"] == "not_found"

    for body, code in [
        (message(ns, "memory.get", key="a//b"), "invalid_key"),
        (message(ns, "memory.teleport", key="k"), "invalid_request"),
        ({"memp": "1.0", "type": "memory.get", "key": "k"}, "invalid_namespace"),
        (message(ns, "memory.get", key="k", memp="2.0"), "invalid_request"),
    ]:
        response = admin.post("/v1/messages", json=body)
        reply = contract.check(response, 400)
        assert reply["type"] == "error" and reply["error"]["code"] == code
        assert contract.request_errors(response.request), body
    garbage = admin.post("/v1/messages", content=b"{oops",
                         headers={"content-type": "application/json"})
    assert contract.check(garbage, 400)["error"]["code"] == "invalid_json"


def test_batches(admin: httpx.Client, ns: str, contract: Contract) -> None:
    batch = [
        message(ns, "memory.put", id="b-1", key="customer/123", value=CUSTOMER),
        message(ns, "memory.put", key="customer/123", value=2, if_absent=True),
        message(ns, "memory.get", key="customer/404"),
        message(ns, "memory.query", pattern="customer/*"),
    ]
    replies = contract.check(admin.post("/v1/messages", json=batch), 200)
    assert [r["type"] for r in replies] == ["ack", "error", "error", "result"]
    assert [r["error"]["code"] for r in replies if r["type"] == "error"] == [
        "precondition_failed", "not_found"]
    assert replies[0]["reply_to"] == "b-1"
    assert replies[3]["entries"][0]["value"] == CUSTOMER

    empty = admin.post("/v1/messages", json=[])
    assert contract.check(empty, 400)["error"]["code"] == "invalid_request"
    assert contract.request_errors(empty.request)
    too_many = [message(ns, "memory.get", key="k")] * 101
    over = admin.post("/v1/messages", json=too_many)
    assert contract.check(over, 413)["error"]["details"]["limit"] == 100
    assert contract.request_errors(over.request)
    broken = admin.post("/v1/messages", content=b"[{", headers={"content-type":
                                                                  "application/json"})
    assert contract.check(broken, 400)["error"]["code"] == "invalid_json"


# ---- namespace configuration, JSON Schemas, conflict strategies ----


def test_namespace_config(admin: httpx.Client, ns: str, contract: Contract, broker: Broker
                          ) -> None:
    initial = admin.get(config_url(ns))
    defaults = contract.check(initial, 200)
    assert initial.headers["etag"] == '"0"'
    assert (defaults["revision"], defaults["strategy"], defaults["updated_by"]) == (
        0, "last-write-wins", None)

    friends = f"{ns}-friends-*"
    config = {
        "strategy": "last-write-wins",
        "rules": [{"pattern": "profile/*", "strategy": "merge"},
                  {"pattern": "policy/*", "strategy": "agent-priority"}],
        "priorities": [{"agent": "admin", "priority": 10}, {"agent": "key_*", "priority": 1}],
        "merge_arrays": "append",
        "history_limit": 32,
        "shares": [{"namespace": friends, "permissions": ["read"]}],
    }
    saved = admin.put(config_url(ns), json=config, headers={"If-Match": '"0"'})
    stored = contract.check(saved, 200)
    assert saved.headers["etag"] == '"1"'
    assert stored == {**defaults, **config, "revision": 1, "updated_at": stored["updated_at"],
                      "updated_by": "admin"}
    got = admin.get(config_url(ns))
    assert contract.check(got, 200) == stored and got.headers["etag"] == '"1"'

    stale = admin.put(config_url(ns), json={}, headers={"If-Match": '"0"'})
    assert contract.check(stale, 412)["error"]["details"]["current_revision"] == 1
    star = admin.put(config_url(ns), json={}, headers={"If-Match": "*"})
    assert contract.check(star, 400)["error"]["code"] == "invalid_request"
    huge = admin.put(config_url(ns), json={"rules": [], "padding": "x" * (256 * 1024)})
    assert contract.check(huge, 413)["error"]["details"]["limit"] == 256 * 1024
    mistyped = admin.put(config_url(ns), content=b"{}", headers={"content-type": "text/plain"})
    assert contract.check(mistyped, 415)["error"]["code"] == "unsupported_media_type"
    for body, code in [
        ({"strategy": "coin-flip"}, "invalid_request"),
        ({"colour": "red"}, "invalid_request"),
        ({"history_limit": 5000}, "invalid_request"),
        ({"priorities": [{"agent": "", "priority": 1}]}, "invalid_request"),
        ({"default_ttl_seconds": 0}, "invalid_ttl"),
        ({"shares": [{"namespace": "Bad NS", "permissions": ["read"]}]}, "invalid_namespace"),
        ({"shares": [{"namespace": "x", "permissions": ["write"]}]}, "invalid_request"),
    ]:
        refused = admin.put(config_url(ns), json=body)
        assert contract.check(refused, 400)["error"]["code"] == code, body
        assert contract.request_errors(refused.request), body
    bad_rule = admin.put(config_url(ns), json={"rules": [{"pattern": "a*b/c",
                                                          "strategy": "merge"}]})
    assert contract.check(bad_rule, 400)["error"]["code"] == "invalid_pattern"
    assert contract.check(admin.get(config_url(ns)), 200)["revision"] == 1

    with broker.client(key_for(admin, contract, ns, ["read", "write", "subscribe"])) as user:
        assert contract.check(user.get(config_url(ns)), 403)["error"]["code"] == "forbidden"
        assert contract.check(user.put(config_url(ns), json={}), 403)["error"]["code"] \
            == "forbidden"
    # the share: a token granted only on a friend namespace may read here, not write
    contract.check(admin.put(entry_url(ns, "facts/sky"), json={"value": "blue"}), 201)
    with broker.client(key_for(admin, contract, f"{ns}-friends-x", ["read"])) as friend:
        assert contract.check(friend.get(entry_url(ns, "facts/sky")), 200)["value"] == "blue"
        contract.check(friend.get(schema_url(ns)), 200)
        contract.check(friend.put(entry_url(ns, "facts/sky"), json={"value": "red"}), 403)
        contract.check(friend.get(config_url(ns)), 403)


CUSTOMER_SCHEMA = {"type": "object", "required": ["plan"],
                   "properties": {"plan": {"enum": ["free", "pro"]}}}


def test_schema_registry(admin: httpx.Client, ns: str, contract: Contract, broker: Broker
                         ) -> None:
    assert contract.check(admin.get(schema_url(ns)), 200) == {"schemas": []}
    body = {"pattern": "customer/*", "schema": CUSTOMER_SCHEMA}
    created = contract.check(admin.put(schema_url(ns, "customer"), json=body), 201)
    assert (created["id"], created["enforce"], created["created_by"]) == (
        "customer", False, "admin")
    assert created["draft"] == "https://json-schema.org/draft/2020-12/schema"
    draft7 = {**CUSTOMER_SCHEMA, "$schema": "http://json-schema.org/draft-07/schema#"}
    replaced = contract.check(
        admin.put(schema_url(ns, "customer"), json={**body, "schema": draft7}), 200)
    assert replaced["draft"] == "http://json-schema.org/draft-07/schema"
    assert contract.check(admin.get(schema_url(ns, "customer")), 200) == replaced
    assert contract.check(admin.get(schema_url(ns)), 200) == {"schemas": [replaced]}
    contract.check(admin.put(schema_url(ns, "anything"),
                             json={"pattern": "*", "schema": True}), 201)

    for schema_id, bad, code in [
        ("customer", {**body, "schema": {"type": 12}}, "invalid_schema"),
        ("customer", {**body, "schema": {"$ref": "https://example.com/s.json"}},
         "invalid_schema"),
        ("customer", {**body, "schema": {"$schema": "https://example.com/my-draft"}},
         "invalid_schema"),
        ("customer", {**body, "pattern": "a*b/c"}, "invalid_pattern"),
        ("customer", {"schema": CUSTOMER_SCHEMA}, "invalid_request"),
        ("customer", {**body, "schema": "object"}, "invalid_request"),
        ("Not_An_Id", body, "invalid_request"),
    ]:
        refused = admin.put(schema_url(ns, schema_id), json=bad)
        assert contract.check(refused, 400)["error"]["code"] == code, bad
    remote = admin.put(schema_url(ns, "customer"),
                       json={**body, "schema": {"$ref": "https://example.com/s.json"}})
    assert contract.check(remote, 400)["error"]["details"]["refs"] == [
        "https://example.com/s.json"]
    garbage = admin.put(schema_url(ns, "customer"), content=b"{",
                        headers={"content-type": "application/json"})
    assert contract.check(garbage, 400)["error"]["code"] == "invalid_json"
    big = admin.put(schema_url(ns, "big"),
                    json={**body, "schema": {"description": "x" * (64 * 1024)}})
    assert contract.check(big, 413)["error"]["details"]["limit"] == 64 * 1024
    mistyped = admin.put(schema_url(ns, "big"), content=b"{}",
                         headers={"content-type": "text/plain"})
    assert contract.check(mistyped, 415)["error"]["code"] == "unsupported_media_type"
    assert contract.check(admin.get(schema_url(ns, "big")), 404)["error"]["code"] == "not_found"
    assert contract.check(admin.get(schema_url(ns, "Not_An_Id")), 400)["error"]["code"] \
        == "invalid_request"

    with broker.client(key_for(admin, contract, ns, ["read", "write"])) as user:
        assert contract.check(user.get(schema_url(ns)), 200)["schemas"][1] == replaced
        contract.check(user.get(schema_url(ns, "customer")), 200)
        assert contract.check(user.put(schema_url(ns, "customer"), json=body), 403)[
            "error"]["code"] == "forbidden"
        contract.check(user.delete(schema_url(ns, "customer")), 403)
    with broker.client(key_for(admin, contract, f"{ns}-other", ["admin"])) as stranger:
        contract.check(stranger.get(schema_url(ns)), 403)
        contract.check(stranger.get(schema_url(ns, "customer")), 403)

    assert contract.check(admin.delete(schema_url(ns, "anything")), 204) is None
    assert contract.check(admin.delete(schema_url(ns, "customer")), 204) is None
    assert contract.check(admin.delete(schema_url(ns, "customer")), 404)["error"]["code"] \
        == "not_found"
    assert contract.check(admin.get(schema_url(ns, "customer")), 404)["error"]["code"] \
        == "not_found"
    assert contract.check(admin.get(schema_url(ns)), 200) == {"schemas": []}


def test_schema_validation_of_writes(admin: httpx.Client, ns: str, contract: Contract
                                     ) -> None:
    contract.check(admin.put(schema_url(ns, "customer"),
                             json={"pattern": "customer/*", "schema": CUSTOMER_SCHEMA}), 201)
    written = admin.put(entry_url(ns, "customer/7"), json={"value": {"plan": "gold"}})
    entry = contract.check(written, 201)
    assert written.headers["memp-warning"] == "schema_violation"
    assert entry["schema_violation"] is True and entry["value"] == {"plan": "gold"}
    assert [(e["schema_id"], e["path"]) for e in entry["schema_errors"]] == [
        ("customer", "/plan")]
    got = admin.get(entry_url(ns, "customer/7"))
    assert contract.check(got, 200)["schema_errors"] == entry["schema_errors"]
    assert got.headers["memp-warning"] == "schema_violation"
    fine = admin.put(entry_url(ns, "customer/8"), json={"value": {"plan": "pro"}})
    assert "schema_errors" not in contract.check(fine, 201)
    assert "memp-warning" not in fine.headers

    def send(body: Any, status: int) -> Any:
        return contract.check(admin.post("/v1/messages", json=body), status)

    flagged = send(message(ns, "memory.put", key="customer/9", value={"plan": 1}), 200)
    assert flagged["warnings"] == ["schema_violation"]
    assert flagged["entry"]["schema_errors"][0]["path"] == "/plan"
    assert send(message(ns, "memory.put", key="customer/9", value={"plan": "free"}),
                200)["warnings"] == []

    contract.check(admin.put(schema_url(ns, "order"), json={
        "pattern": "order/*", "enforce": True,
        "schema": {"type": "object", "required": ["total"],
                   "properties": {"total": {"type": "number", "exclusiveMinimum": 0}}}}), 201)
    refused = contract.check(admin.put(entry_url(ns, "order/1"), json={"value": {}}), 422)
    assert refused["error"]["code"] == "schema_violation"
    assert [e["schema_id"] for e in refused["error"]["details"]["errors"]] == ["order"]
    assert contract.check(admin.get(entry_url(ns, "order/1")), 404)["error"]["code"] \
        == "not_found"
    reply = send(message(ns, "memory.put", key="order/1", value={"total": -1}), 422)
    assert reply["type"] == "error" and reply["error"]["details"]["errors"][0]["path"] \
        == "/total"
    batch = contract.check(admin.post("/v1/messages", json=[
        message(ns, "memory.put", key="order/1", value={"total": 0})]), 200)
    assert batch[0]["error"]["code"] == "schema_violation"
    assert contract.check(admin.put(entry_url(ns, "order/1"), json={"value": {"total": 5}}),
                          201)["schema_violation"] is False


def test_merge_flags_conflicts(admin: httpx.Client, ns: str, contract: Contract,
                               broker: Broker) -> None:
    contract.check(admin.put(config_url(ns), json={
        "rules": [{"pattern": "profile/*", "strategy": "merge"}]}), 200)
    url = entry_url(ns, "profile/42")
    contract.check(admin.put(url, json={"value": {"plan": "free", "seats": 5}}), 201)
    moved = contract.check(admin.put(url, json={"value": {"plan": "pro"}, "base_version": 1}),
                           200)
    assert moved["value"] == {"plan": "pro", "seats": 5} and "conflicts" not in moved
    late = admin.put(url, json={"value": {"plan": "enterprise", "seats": 12},
                                "base_version": 1})
    merged = contract.check(late, 200)
    assert late.headers["memp-warning"] == "conflicts"
    assert merged["value"] == {"plan": "enterprise", "seats": 12}
    assert merged["conflicts"] == [{
        "path": "/plan", "base": "free", "stored": "pro", "incoming": "enterprise",
        "stored_agent": "admin", "incoming_agent": "admin", "base_missing": False}]
    got = admin.get(url)
    assert contract.check(got, 200)["conflicts"] == merged["conflicts"]
    assert got.headers["memp-warning"] == "conflicts"

    ack = contract.check(admin.post("/v1/messages", json=message(
        ns, "memory.put", key="profile/42", value={"plan": "team"}, base_version=99)), 200)
    assert ack["warnings"] == ["conflicts"]
    assert [(c["path"], c["base"], c["base_missing"]) for c in ack["entry"]["conflicts"]] == [
        ("/plan", None, True)]
    plain = contract.check(admin.put(url, json={"value": {"seats": 20}}), 200)
    assert plain["value"] == {"plan": "team", "seats": 20} and "conflicts" not in plain
    replaced = contract.check(admin.put(url, json={"value": [1, 2], "base_version": 5}), 200)
    assert [(c["path"], c["stored"], c["incoming"]) for c in replaced["conflicts"]] == [
        ("", {"plan": "team", "seats": 20}, [1, 2])]
    bad_base = admin.put(url, json={"value": {}, "base_version": 0})
    assert contract.check(bad_base, 400)["error"]["code"] == "invalid_request"
    assert contract.request_errors(bad_base.request)

    params = {"namespace": ns, "pattern": "profile/*", "snapshot": "true"}
    with broker.client() as listener, listener.stream("GET", "/v1/subscribe",
                                                      params=params) as stream:
        schemas = contract.check_stream(stream)
        snapshot = read_events(stream.iter_lines(), "snapshot-end")
    assert snapshot[0][2]["conflicts"] == replaced["conflicts"]
    check_events(contract, schemas, snapshot)


def test_agent_priority_conflicts(admin: httpx.Client, ns: str, contract: Contract,
                                  broker: Broker) -> None:
    contract.check(admin.put(config_url(ns), json={
        "rules": [{"pattern": "policy/*", "strategy": "agent-priority"}],
        "priorities": [{"agent": "admin", "priority": 10}]}), 200)
    url = entry_url(ns, "policy/refunds")
    contract.check(admin.put(url, json={"value": {"max": 100}}), 201)
    registered = contract.check(admin.post("/v1/agents", json={
        "name": "junior", "namespace": ns}), 201)
    with broker.client(registered["credentials"]["api_key"]) as junior:
        lost = contract.check(junior.put(url, json={"value": {"max": 1000}}), 409)
        assert lost["error"]["code"] == "write_conflict"
        assert lost["error"]["details"]["winner"]["value"] == {"max": 100}
        assert contract.check(junior.delete(url), 409)["error"]["details"]["winner"][
            "agent_id"] == "admin"
        reply = contract.check(junior.post("/v1/messages", json=message(
            ns, "memory.put", key="policy/refunds", value={"max": 1})), 409)
        assert reply["type"] == "error" and reply["error"]["code"] == "write_conflict"
        contract.check(junior.put(entry_url(ns, "notes/1"), json={"value": "mine"}), 201)
    assert contract.check(admin.put(url, json={"value": {"max": 50}}), 200)["version"] == 2


def test_unknown_method_and_path(admin: httpx.Client, ns: str, contract: Contract) -> None:
    response = admin.patch(entry_url(ns, "k"), json={"value": 1})
    assert response.status_code == 405
    problems = contract.errors("/components/responses/MethodNotAllowed/content/"
                               "application~1json/schema", response.json())
    assert not problems
    allow = response.headers["allow"]
    assert not contract.errors("/components/headers/Allow/schema", allow), allow
    assert {"GET", "PUT", "DELETE"} <= set(allow.split(", "))
    unknown = admin.get("/v1/nowhere")
    assert unknown.status_code == 404
    assert not contract.errors("/components/responses/NotFound/content/application~1json/schema",
                               unknown.json())


@pytest.fixture
def broker_without_redis() -> Iterator[Broker]:
    """A broker whose Redis is a port nobody listens on: held bound without listening, so no
    server (not even this broker's own HTTP port) can take it meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        handle = start_broker("redis", f"redis://127.0.0.1:{held.getsockname()[1]}/0")
        yield handle
        handle.stop()


def test_store_down_is_503_with_retry_after(broker_without_redis: Broker, contract: Contract
                                            ) -> None:
    ns = "down"
    with broker_without_redis.client(ADMIN_KEY) as client:
        contract.check(client.get("/healthz"), 200)
        for response in [
            client.get("/readyz"),
            client.put(entry_url(ns, "k"), json={"value": 1}),
            client.get(entry_url(ns, "k")),
            client.delete(entry_url(ns, "k")),
            client.get(f"/v1/namespaces/{ns}/memory"),
            client.get(f"/v1/namespaces/{ns}/agents"),
            client.post("/v1/messages", json=message(ns, "memory.get", key="k")),
            client.get(config_url(ns)),
            client.put(config_url(ns), json={}),
            client.get(schema_url(ns)),
            client.get(schema_url(ns, "s")),
            client.put(schema_url(ns, "s"), json={"pattern": "*", "schema": {}}),
            client.delete(schema_url(ns, "s")),
            *amp_calls(client, purge=False),
        ]:
            assert contract.check(response, 503)["error"]["code"] == "unavailable"
        batch = client.post("/v1/messages", json=[message(ns, "memory.get", key="k")])
        replies = contract.check(batch, 200)
        assert [r["error"]["code"] for r in replies] == ["unavailable"]


def test_a_redis_url_that_names_an_http_server_is_503_not_500(contract: Contract) -> None:
    http_server = start_broker("embedded", "")
    misdirected = start_broker("redis", f"redis://{http_server.url.removeprefix('http://')}/0")
    try:
        with misdirected.client(ADMIN_KEY) as client:
            for response in [client.put(entry_url("lost", "k"), json={"value": 1}),
                             client.get(entry_url("lost", "k")), *amp_calls(client, purge=False)]:
                assert contract.check(response, 503)["error"]["code"] == "unavailable"
            assert contract.check(client.get("/readyz"), 503)["error"]["code"] == "unavailable"
    finally:
        misdirected.stop()
        http_server.stop()


def read_events(lines: Iterator[str], until: str) -> list[tuple[str | None, str, Any]]:
    """(id, event, data) of the SSE events up to and including the first `until` event."""
    events: list[tuple[str | None, str, Any]] = []
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "event" in fields:
                events.append((fields.get("id"), fields["event"],
                               msgspec.json.decode(fields.get("data", "null"))))
                if fields["event"] == until:
                    return events
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
    raise AssertionError(f"the stream ended before a {until!r} event: {events}")


def check_events(contract: Contract, schemas: dict[str, str],
                 events: list[tuple[str | None, str, Any]]) -> None:
    for event_id, name, data in events:
        assert name in schemas, f"event {name!r} is not documented"
        assert not contract.errors(schemas[name], data), (name, data)
        if name != "snapshot":
            assert not contract.errors("/components/schemas/StreamCursor", event_id), event_id


def test_subscription_stream(admin: httpx.Client, ns: str, contract: Contract,
                             broker: Broker) -> None:
    contract.check(admin.put(entry_url(ns, "customer/123"), json={"value": CUSTOMER}), 201)
    params = {"namespace": ns, "pattern": "customer/*", "snapshot": "true"}
    with broker.client() as listener, listener.stream("GET", "/v1/subscribe",
                                                      params=params) as stream:
        schemas = contract.check_stream(stream)
        lines = stream.iter_lines()
        snapshot = read_events(lines, "snapshot-end")
        assert [(name, data.get("key")) for _, name, data in snapshot] == [
            ("snapshot", "customer/123"), ("snapshot-end", None)]
        contract.check(admin.put(entry_url(ns, "customer/123"), json={"value": 2}), 200)
        contract.check(admin.delete(entry_url(ns, "customer/123")), 200)
        live = read_events(lines, "delete")
    assert [(name, data["version"]) for _, name, data in live] == [("put", 2), ("delete", 3)]
    check_events(contract, schemas, snapshot + live)

    resume = {"Last-Event-ID": str(live[0][0])}
    with broker.client() as listener, listener.stream(
            "GET", "/v1/subscribe", params={"sub": f"{ns}:customer/*"}, headers=resume) as stream:
        replayed = read_events(stream.iter_lines(), "delete")
    assert [(name, data["version"]) for _, name, data in replayed] == [("delete", 3)]
    check_events(contract, contract.check_stream(stream), replayed)


def test_filtered_subscription_stream(admin: httpx.Client, ns: str, contract: Contract,
                                      broker: Broker) -> None:
    params = {"namespace": ns, "filter": 'key == "b"', "conflate": "latest", "max_rate": "100"}
    with broker.client() as listener, listener.stream("GET", "/v1/subscribe",
                                                      params=params) as stream:
        schemas = contract.check_stream(stream)
        lines = stream.iter_lines()
        contract.check(admin.put(entry_url(ns, "b"), json={"value": 1}), 201)
        contract.check(admin.put(entry_url(ns, "a"), json={"value": 2}), 201)
        events = read_events(lines, "progress")
    assert [name for _, name, _ in events] == ["put", "progress"]
    check_events(contract, schemas, events)


@pytest.mark.parametrize(
    ("params", "headers", "code"),
    [
        pytest.param({}, {}, "invalid_request", id="nothing-to-follow"),
        pytest.param({"sub": "no-colon"}, {}, "invalid_request", id="sub-shape"),
        pytest.param({"namespace": "Bad_NS"}, {}, "invalid_namespace", id="namespace"),
        pytest.param({"namespace": "ok", "pattern": "a*b/c"}, {}, "invalid_pattern",
                     id="pattern"),
        pytest.param({"namespace": "ok"}, {"Last-Event-ID": "yesterday"}, "invalid_request",
                     id="cursor"),
        pytest.param({"namespace": "ok", "filter": "/a =="}, {}, "invalid_request",
                     id="filter"),
        pytest.param({"namespace": "ok", "conflate": "oldest"}, {}, "invalid_request",
                     id="conflate"),
        pytest.param({"namespace": "ok", "max_rate": "0"}, {}, "invalid_request",
                     id="max-rate"),
    ],
)
def test_bad_subscriptions_are_400(admin: httpx.Client, contract: Contract,
                                   params: dict[str, str], headers: dict[str, str],
                                   code: str) -> None:
    response = admin.get("/v1/subscribe", params=params, headers=headers)
    assert contract.check(response, 400)["error"]["code"] == code


# ---- the AMP bridge ----

AGENT_HEADER = "X-AMP-Agent-ID"
DAY_MS = 86_400_000
UNKNOWN_CELL = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
OTHER_CELL = "01ARZ3NDEKTSV4RRFFQ69G5FAW"


def amp_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_cell(text: str, owner: str = "u-7", **fields: Any) -> dict[str, Any]:
    return {"type": "semantic", "content": {"text": text},
            "identity": {"owner_id": owner, "owner_type": "user"}, **fields}


def imported_cell(text: str, **lifecycle: Any) -> dict[str, Any]:
    """A full cell from another system, with its own id and times."""
    return {"id": amp.new_ulid(now_ms() - 400 * DAY_MS), "amp_version": amp.AMP_VERSION,
            "type": "episodic", "content": {"text": text, "metadata": {"origin": "legacy"}},
            "identity": {"owner_id": "u-9", "owner_type": "user", "session_id": "s-1"},
            "scoring": {"importance": 0.7, "confidence": 0.8, "decay_rate": 0.02,
                        "access_count": 3},
            "lifecycle": lifecycle,
            "access_policy": {"readable_by": [], "writable_by": [], "public": True},
            "provenance": {"source_type": "import", "source_ref": "legacy-db",
                           "extraction_method": "dump"}}


@pytest.fixture(params=BACKENDS)
def amp_broker(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
               ns: str) -> Broker:
    """A broker whose AMP namespace is `ns`, with purge enabled and no periodic lifecycle pass
    (the tests run passes as of the times they choose)."""
    handle: Broker = broker_factory(request.param, amp_namespace=ns, amp_purge_retention=True,
                                    amp_lifecycle_interval_seconds=3600.0,
                                    max_request_bytes=1024 * 1024)
    return handle


def acting(broker: Broker, token: str = ADMIN_KEY, agent: str | None = None) -> httpx.Client:
    """A client with this token, naming `agent` in X-AMP-Agent-ID (none when None)."""
    client = broker.client(token)
    if agent is not None:
        client.headers[AGENT_HEADER] = agent
    return client


@pytest.fixture
def agent_1(amp_broker: Broker) -> Iterator[httpx.Client]:
    """The admin key acting as `agent-1`."""
    with acting(amp_broker, agent="agent-1") as client:
        yield client


def test_amp_cells(agent_1: httpx.Client, contract: Contract) -> None:
    expires = amp_time(now_ms() + 10 * DAY_MS)
    body = new_cell("The user prefers Python for backend development",
                    content={"text": "The user prefers Python for backend development",
                             "metadata": {"topic": "languages"}},
                    identity={"owner_id": "u-7", "owner_type": "user", "session_id": "s-42"},
                    scoring={"importance": 0.8, "confidence": 0.9},
                    access_policy={"readable_by": ["agent-team-*"]},
                    provenance={"source_type": "chat", "source_ref": "session/s-42"})
    created = contract.check(agent_1.post("/amp/memories", json=body), 201)
    cell_id = created["id"]
    assert created["identity"]["created_by"] == "agent-1"
    assert created["lifecycle"]["status"] == "active"
    assert created["scoring"]["access_count"] == 0
    url = f"/amp/memories/{cell_id}"

    read = contract.check(agent_1.get(url), 200)
    assert read["scoring"]["access_count"] == 1 and read["lifecycle"]["last_accessed_at"]
    patched = contract.check(agent_1.patch(url, json={
        "content": {"text": "The user prefers Python 3.13 for backend development"},
        "scoring": {"importance": 0.9, "decay_rate": 0.02},
        "access_policy": {"readable_by": ["agent-team-*"], "writable_by": ["agent-2"]},
        "expires_at": expires}), 200)
    assert patched["content"] == {"text": "The user prefers Python 3.13 for backend development",
                                  "metadata": {"topic": "languages"}}
    assert patched["lifecycle"]["expires_at"] == expires
    later = amp_time(now_ms() + 20 * DAY_MS)
    moved = contract.check(agent_1.patch(url, json={"lifecycle": {"expires_at": later},
                                                    "content": {"metadata": {"topic": "py"}}}),
                           200)
    assert moved["lifecycle"]["expires_at"] == later
    assert contract.check(agent_1.patch(url, json={}), 200)["id"] == cell_id

    def search(**query: Any) -> dict[str, Any]:
        found: dict[str, Any] = contract.check(
            agent_1.post("/amp/memories/search", json=query), 200)
        return found

    hits = search(query="python backend")["results"]
    assert [h["cell"]["id"] for h in hits] == [cell_id]
    assert hits[0]["cell"]["scoring"]["access_count"] == 1
    others = [contract.check(agent_1.post("/amp/memories", json=new_cell(f"note {i}")), 201)["id"]
              for i in range(2)]
    first = search(owner_id="u-7", owner_type="user", types=["semantic"], include_stale=True,
                   limit=2)
    assert len(first["results"]) == 2 and first["next_cursor"] is not None
    rest = search(owner_id="u-7", limit=2, cursor=first["next_cursor"])
    assert rest["next_cursor"] is None
    assert {h["cell"]["id"] for h in first["results"] + rest["results"]} == {cell_id, *others}
    everything = search(limit=100)
    assert {h["cell"]["id"] for h in everything["results"]} == {cell_id, *others}
    walked = search(limit=1)
    assert len(walked["results"]) == 1
    assert search(metadata={"topic": "py"}, created_after=amp_time(now_ms() - DAY_MS),
                  created_before=amp_time(now_ms() + DAY_MS))["results"][0]["cell"]["id"] \
        == cell_id
    assert search(status=["archived", "stale"]) == {"results": [], "next_cursor": None}
    merged = contract.check(agent_1.post("/amp/memories/merge", json={
        "ids": others, "text": "notes 0 and 1", "metadata": {"topic": "notes"}}), 201)
    assert merged["provenance"]["source_ref"] == ",".join(others)
    again = contract.check(agent_1.post("/amp/memories/merge", json={
        "ids": [others[0], cell_id], "text": "x"}), 409)
    assert again["error"]["details"] == {"field": "ids[0]", "id": others[0],
                                         "status": "archived"}
    contract.check(agent_1.post("/amp/memories/merge", json={
        "ids": [cell_id, UNKNOWN_CELL], "text": "x"}), 404)
    contract.check(agent_1.post("/amp/memories/merge", json={"ids": [cell_id], "text": "x"}),
                   400)


def test_amp_lifecycle_delete_import_and_purge(agent_1: httpx.Client, contract: Contract
                                               ) -> None:
    def post(path: str, body: Any, status: int, **kwargs: Any) -> Any:
        return contract.check(agent_1.post(path, json=body), status, **kwargs)

    start = now_ms()
    fading = post("/amp/memories", new_cell("fades in about fifty days"), 201)["id"]
    expiring = post("/amp/memories", new_cell("gone tomorrow",
                                              expires_at=amp_time(start + DAY_MS)), 201)["id"]
    lasting = post("/amp/memories", new_cell("never fades", scoring={
        "importance": 1, "decay_rate": 0}), 201)["id"]
    quiet = {"expired": 0, "stale": 0, "active": 0, "archived": 0}
    assert post("/amp/lifecycle/run", {}, 200) == {"transitions": quiet}
    stale_at = amp_time(start + 400 * DAY_MS)
    assert post("/amp/lifecycle/run", {"as_of": stale_at}, 200) == {
        "transitions": {**quiet, "expired": 1, "stale": 1}}
    stale = post("/amp/memories/search", {"status": ["stale"]}, 200)["results"]
    assert [(h["cell"]["id"], h["cell"]["lifecycle"]["stale_since"]) for h in stale] == [
        (fading, stale_at)]
    assert post("/amp/lifecycle/run", {"as_of": amp_time(start + 431 * DAY_MS)}, 200) == {
        "transitions": {**quiet, "archived": 1}}
    archived = post("/amp/memories/search", {"status": ["archived"]}, 200)["results"]
    assert {h["cell"]["id"] for h in archived} == {fading, expiring}

    conflict = contract.check(agent_1.patch(f"/amp/memories/{fading}",
                                            json={"scoring": {"importance": 1}}), 409)
    assert conflict["error"]["details"]["status"] == "archived"
    active = contract.check(agent_1.delete(f"/amp/memories/{lasting}"), 409)
    assert active["error"]["details"]["status"] == "active"
    deleted = contract.check(agent_1.delete(f"/amp/memories/{fading}"), 200)
    assert deleted["lifecycle"]["status"] == "deleted" and deleted["lifecycle"]["deleted_at"]
    for response in (agent_1.get(f"/amp/memories/{fading}"),
                     agent_1.patch(f"/amp/memories/{fading}", json={}),
                     agent_1.delete(f"/amp/memories/{fading}")):
        assert contract.check(response, 404)["error"]["code"] == "not_found"

    refused = post("/amp/purge", {"ids": [fading, UNKNOWN_CELL]}, 412)["error"]["details"]
    assert set(refused["refused"]) == {fading, UNKNOWN_CELL}
    assert post("/amp/purge", {"ids": [lasting]}, 412)["error"]["details"]["refused"][lasting]
    ahead = post("/amp/purge", {"as_of": amp_time(now_ms() + DAY_MS)}, 400)
    assert ahead["error"]["details"]["field"] == "as_of"
    assert post("/amp/purge", {}, 200) == {"purged": []}

    long_ago = {"created_at": "2020-01-01T00:00:00Z", "status": "deleted",
                "deleted_at": "2020-02-01T00:00:00+01:00"}
    old, older = imported_cell("deleted long ago", **long_ago), imported_cell("older", **long_ago)
    kept = imported_cell("kept as it was", created_at="2025-12-31T23:00:00-01:00",
                         last_updated_at="2026-01-02T00:00:00.000Z")
    assert post("/amp/import", {"cells": [old, older, kept]}, 200) == {
        "imported": 3, "errors": []}
    got = contract.check(agent_1.get(f"/amp/memories/{kept['id']}"), 200)
    assert got["lifecycle"]["created_at"] == "2026-01-01T00:00:00.000Z"
    assert got["identity"]["created_by"] == "agent-1"
    assert (got["scoring"]["access_count"], got["provenance"]) == (4, kept["provenance"])
    result = post("/amp/import", {"cells": [
        kept,
        imported_cell("deleted, but when?", created_at="2020-01-01T00:00:00Z",
                      status="deleted"),
        imported_cell("created when?"),
        imported_cell("fine", created_at="2026-01-01T00:00:00Z"),
    ]}, 200)
    assert result["imported"] == 1
    assert [(e["index"], e["error"]["code"], e["error"]["details"].get("field"))
            for e in result["errors"]] == [
        (0, "precondition_failed", None), (1, "invalid_request", "lifecycle.deleted_at"),
        (2, "invalid_request", "lifecycle.created_at")]
    assert result["errors"][0]["id"] == kept["id"]
    # Cells the document refuses are reported one by one, not refused as a request.
    not_ulid = {**imported_cell("x", created_at="2026-01-01T00:00:00Z"), "id": "cell-1"}
    other_version = {**imported_cell("y", created_at="2026-01-01T00:00:00Z"),
                     "amp_version": "9.9.9"}
    bad = post("/amp/import", {"cells": [not_ulid, other_version]}, 200, refused_request=True)
    assert bad["imported"] == 0
    assert [(e["id"], e["error"]["details"]["field"]) for e in bad["errors"]] == [
        ("cell-1", "id"), (other_version["id"], "amp_version")]

    assert post("/amp/purge", {"ids": [old["id"]]}, 200) == {"purged": [old["id"]]}
    gone = post("/amp/purge", {"ids": [old["id"]]}, 412)["error"]["details"]["refused"]
    assert list(gone) == [old["id"]]
    assert post("/amp/purge", {"as_of": amp_time(now_ms() - DAY_MS)}, 200) == {
        "purged": [older["id"]]}


def test_amp_acting_agent_and_access(amp_broker: Broker, agent_1: httpx.Client, ns: str,
                                     contract: Contract) -> None:
    cell = contract.check(agent_1.post("/amp/memories", json=new_cell("private")), 201)
    url = f"/amp/memories/{cell['id']}"
    with amp_broker.client() as admin:
        for response in (admin.post("/amp/memories", json=new_cell("who?")), admin.get(url),
                         admin.post("/amp/memories/search", json={}),
                         admin.get(url, headers={AGENT_HEADER: "not an agent"})):
            refused = contract.check(response, 400)["error"]
            assert refused["details"]["field"] == AGENT_HEADER
        stranger = {AGENT_HEADER: "agent-2"}
        for response in (admin.get(url, headers=stranger),
                         admin.patch(url, json={"scoring": {"importance": 1}}, headers=stranger),
                         admin.delete(url, headers=stranger)):
            assert contract.check(response, 403)["error"]["code"] == "forbidden"
        found = admin.post("/amp/memories/search", json={}, headers=stranger)
        assert contract.check(found, 200)["results"] == []
        forged = admin.post("/amp/memories", headers=stranger, json=new_cell(
            "forged", identity={"owner_id": "u-7", "owner_type": "user",
                                "created_by": "agent-1"}))
        assert contract.check(forged, 403)["error"]["details"]["field"] == "identity.created_by"

        registered = contract.check(admin.post("/v1/agents", json={
            "name": "amp-agent", "namespace": ns}), 201)
        agent_key = registered["credentials"]["api_key"]
        gateway_key = key_for(admin, contract, ns, ["amp", "impersonate"])
        reader_key = contract.check(admin.post("/v1/keys", json={
            "grants": [{"namespace": ns, "permissions": ["amp"]}], "agent_id": "agent-1"}),
            201)["api_key"]
        memp_only_key = contract.check(admin.post("/v1/keys", json={
            "grants": [{"namespace": ns, "permissions": ["read", "write"]}],
            "agent_id": "agent-1"}), 201)["api_key"]
        outsider_key = key_for(admin, contract, f"{ns}-other", ["admin"])
    with amp_broker.client(agent_key) as agent:
        own = contract.check(agent.post("/amp/memories", json=new_cell("mine")), 201)
        assert own["identity"]["created_by"] == registered["agent"]["id"]
        contract.check(agent.get(f"/amp/memories/{own['id']}"), 200)
        posing = agent.get(url, headers={AGENT_HEADER: "agent-1"})
        assert contract.check(posing, 403)["error"]["details"]["agent_id"] == "agent-1"
        for path in ("/amp/lifecycle/run", "/amp/purge", "/amp/import"):
            denied = contract.check(agent.post(path, json={"cells": []} if "import" in path
                                               else {}), 403)
            assert denied["error"]["details"]["permission"] == "admin"
    with amp_broker.client(gateway_key) as gateway:
        acted = gateway.post("/amp/memories", json=new_cell("for agent-9"),
                             headers={AGENT_HEADER: "agent-9"})
        assert contract.check(acted, 201)["identity"]["created_by"] == "agent-9"
        unbound = gateway.post("/amp/memories", json=new_cell("for whom?"))
        assert contract.check(unbound, 400)["error"]["details"]["field"] == AGENT_HEADER
        unsure = gateway.get(url)
        assert contract.check(unsure, 400)["error"]["details"]["field"] == AGENT_HEADER
        contract.check(gateway.get(url, headers={AGENT_HEADER: "agent-1"}), 200)
    with acting(amp_broker, reader_key) as reader:  # a key bound to agent-1
        assert contract.check(reader.get(url), 200)["id"] == cell["id"]
        posing = reader.get(url, headers={AGENT_HEADER: "agent-2"})
        assert contract.check(posing, 403)["error"]["details"]["agent_id"] == "agent-2"
    with acting(amp_broker, memp_only_key) as memp_only:  # MEMP read and write: no AMP
        for response in (memp_only.get(url),
                         memp_only.post("/amp/memories", json=new_cell("no"))):
            assert contract.check(response, 403)["error"]["details"]["permission"] == "amp"
    with acting(amp_broker, outsider_key, "agent-1") as outsider:
        assert contract.check(outsider.get(url), 403)["error"]["details"]["permission"] \
            == "amp"
        contract.check(outsider.post("/amp/memories/search", json={}), 403)

    missing = f"/amp/memories/{UNKNOWN_CELL}"
    for response in (agent_1.get(missing), agent_1.patch(missing, json={}),
                     agent_1.delete(missing)):
        assert contract.check(response, 404)["error"]["code"] == "not_found"


AMP_BAD_BODIES: list[tuple[str, str, Any, str | None, bool]] = [
    # (method, path, body, details.field, whether the document refuses the body too)
    ("POST", "/amp/memories", new_cell("x", scoring={"importance": 2}), "scoring.importance",
     True),
    ("POST", "/amp/memories", {**new_cell("x"), "type": "dream"}, "type", True),
    ("POST", "/amp/memories", new_cell("x", identity={"owner_id": "u", "owner_type": "robot"}),
     "identity.owner_type", True),
    ("POST", "/amp/memories", new_cell("x", identity={"owner_id": "..", "owner_type": "user"}),
     "identity.owner_id", True),
    ("POST", "/amp/memories", new_cell("x", colour="red"), "colour", True),
    ("POST", "/amp/memories", {"type": "semantic", "identity": {"owner_id": "u",
                                                                "owner_type": "user"}},
     "content", True),
    ("POST", "/amp/memories", new_cell("x", access_policy={"readable_by": ["a b"]}),
     "access_policy.readable_by[0]", True),
    ("POST", "/amp/memories", new_cell("x" * (64 * 1024 + 1)), "content.text", True),
    ("POST", "/amp/memories", [], None, True),
    ("POST", "/amp/memories", new_cell("x", expires_at="tomorrow"), "expires_at", True),
    ("POST", "/amp/memories", new_cell("x", expires_at="2020-01-01T00:00:00Z"), "expires_at",
     False),
    ("PATCH", "{cell}", {"lifecycle": {"status": "active"}}, "lifecycle.status", True),
    ("PATCH", "{cell}", {"scoring": {"decay_rate": -1}}, "scoring.decay_rate", True),
    ("PATCH", "{cell}", {"scoring": {"access_count": 9}}, "scoring.access_count", True),
    ("PATCH", "{cell}", {"expires_at": "2020-01-01T00:00:00Z"}, "expires_at", False),
    ("POST", "/amp/memories/search", {"status": ["deleted"]}, "status", True),
    ("POST", "/amp/memories/search", {"limit": 0}, "limit", True),
    ("POST", "/amp/memories/search", {"types": ["dream"]}, "types[0]", True),
    ("POST", "/amp/memories/search", {"cursor": "abc"}, "cursor", True),
    ("POST", "/amp/memories/search", {"query": "!!!"}, "query", False),
    ("POST", "/amp/memories/search", {"created_after": "soon"}, "created_after", True),
    ("POST", "/amp/lifecycle/run", {"as_of": "soon"}, "as_of", True),
    ("POST", "/amp/lifecycle/run", {"ids": "all"}, "ids", True),
    ("POST", "/amp/purge", {"when": "now"}, "when", True),
    ("POST", "/amp/import", {"cells": {}}, "cells", True),
    ("POST", "/amp/import", {}, "cells", True),
]


def test_amp_bad_input(amp_broker: Broker, agent_1: httpx.Client, contract: Contract) -> None:
    cell = contract.check(agent_1.post("/amp/memories", json=new_cell("target")), 201)
    for method, path, body, field, document_refuses in AMP_BAD_BODIES:
        target = path.replace("{cell}", f"/amp/memories/{cell['id']}")
        response = agent_1.request(method, target, json=body)
        refused = contract.check(response, 400)["error"]
        assert (refused["code"], refused["details"].get("field")) == ("invalid_request",
                                                                      field), (path, body)
        assert bool(contract.request_errors(response.request)) == document_refuses, (path, body)
    for response in (agent_1.get("/amp/memories/not-a-ulid"),
                     agent_1.get("/amp/memories/01arz3ndektsv4rrffq69g5fav"),
                     agent_1.delete("/amp/memories/81ARZ3NDEKTSV4RRFFQ69G5FAV")):
        assert contract.check(response, 400)["error"]["details"]["field"] == "id"
    for path in ("/amp/memories", "/amp/memories/search", "/amp/lifecycle/run", "/amp/purge",
                 "/amp/import", f"/amp/memories/{cell['id']}"):
        method = "PATCH" if path.endswith(cell["id"]) else "POST"
        garbage = agent_1.request(method, path, content=b"{",
                                  headers={"content-type": "application/json"})
        assert contract.check(garbage, 400)["error"]["code"] == "invalid_json"
        mistyped = agent_1.request(method, path, content=b"{}",
                                   headers={"content-type": "text/plain"})
        assert contract.check(mistyped, 415)["error"]["code"] == "unsupported_media_type"
        if not path.endswith("import"):
            big = agent_1.request(method, path, json={"padding": "x" * (256 * 1024)})
            assert contract.check(big, 413)["error"]["details"]["limit"] == 256 * 1024
    huge = agent_1.post("/amp/import", json={"cells": [], "padding": "x" * (1024 * 1024)})
    assert contract.check(huge, 413)["error"]["details"]["limit"] == 1024 * 1024
    assert contract.check(agent_1.get(f"/amp/memories/{cell['id']}"), 200)["content"] == \
        cell["content"]


def test_amp_purge_is_403_unless_enabled(admin: httpx.Client, contract: Contract) -> None:
    for body in ({}, {"ids": [UNKNOWN_CELL]}):
        refused = contract.check(admin.post("/amp/purge", json=body), 403)
        assert refused["error"]["code"] == "forbidden"


def test_fair_share(admin: httpx.Client, ns: str, contract: Contract, broker: Broker) -> None:
    contract.check(admin.put(f"/v1/namespaces/{ns}/config", json={"limits": {
        "writes_per_second": 0.001, "write_burst": 1, "max_keys": 5}}), 200)
    contract.check(admin.get(f"/v1/namespaces/{ns}/usage"), 200)
    response = admin.post("/v1/agents", json={"name": "limited", "namespace": ns})
    with broker.client(response.json()["credentials"]["api_key"]) as agent:
        contract.check(agent.put(entry_url(ns, "a"), json={"value": 1}), 201)
        contract.check(agent.put(entry_url(ns, "b"), json={"value": 1}), 429)
        message = {"memp": "1.0", "type": "memory.put", "namespace": ns, "key": "c",
                   "value": 1}
        contract.check(agent.post("/v1/messages", json=message), 429)
        contract.check(agent.post("/v1/messages", json=[message, message]), 200)
        contract.check(agent.get(entry_url(ns, "a")), 200)
    contract.check(admin.put(f"/v1/namespaces/{ns}/config", json={"limits": {"max_keys": 1}}),
                   200)
    contract.check(admin.put(entry_url(ns, "d"), json={"value": 1}), 429)


def test_proposals_and_audit_follow_the_document(admin: httpx.Client, ns: str,
                                                 contract: Contract) -> None:
    config = admin.put(config_url(ns), json={
        "rules": [{"pattern": "facts/*", "approval": "required"}], "allow_self_approval": True})
    contract.check(config, 200)
    gated = admin.put(f"/v1/namespaces/{ns}/memory/facts/a", json={"value": {"x": 1}})
    proposal = contract.check(gated, 202)
    base = f"/v1/namespaces/{ns}/proposals"
    contract.check(admin.get(base, params={"status": "pending"}), 200)
    contract.check(admin.get(f"{base}/{proposal['id']}"), 200)
    contract.check(admin.get(f"{base}/prop_nope"), 404)
    approved = contract.check(admin.post(f"{base}/{proposal['id']}/approve"), 200)
    assert approved["entry"]["proposal_id"] == proposal["id"]
    again = contract.check(admin.post(f"{base}/{proposal['id']}/approve"), 409)
    assert again["error"]["details"]["proposal"]["status"] == "approved"
    second = contract.check(admin.put(f"/v1/namespaces/{ns}/memory/facts/a",
                                      json={"value": {"x": 2}}), 202)
    admin.put(config_url(ns), json={"allow_self_approval": True})  # ungated: the key moves
    contract.check(admin.put(f"/v1/namespaces/{ns}/memory/facts/a", json={"value": 3}), 200)
    moved = contract.check(admin.post(f"{base}/{second['id']}/approve"), 409)
    assert moved["error"]["details"]["current_version"] == 2
    deleting = contract.check(admin.delete(f"/v1/namespaces/{ns}/memory/facts/a",
                                           params={"approval_required": "true"}), 202)
    contract.check(admin.post(f"{base}/{deleting['id']}/reject", json={"reason": "no"}), 200)
    contract.check(admin.post(f"{base}/{deleting['id']}/reject", content=b"{",
                              headers={"content-type": "application/json"}), 400)
    records = contract.check(admin.get(f"/v1/namespaces/{ns}/audit"), 200)["records"]
    assert records[0]["action"] == "reject"
    contract.check(admin.get(f"/v1/namespaces/{ns}/audit", params={"since": "x"}), 400)
    assert contract.check(admin.get(f"/v1/namespaces/{ns}/audit/verify"), 200)["ok"] is True

    def send(body: Any) -> Any:
        return contract.check(admin.post("/v1/messages", json=body), 200)

    pending = send(message(ns, "memory.put", key="facts/m", value=1, approval_required=True))
    assert pending["status"] == "pending_approval"
    pid = pending["proposal"]["id"]
    assert send(message(ns, "proposal.list"))["proposals"]
    assert send(message(ns, "proposal.get", proposal=pid))["proposal"]["id"] == pid
    assert send(message(ns, "proposal.approve", proposal=pid))["entry"]["version"] == 1
    other = send(message(ns, "memory.delete", key="facts/m", approval_required=True))
    assert send(message(ns, "proposal.reject", proposal=other["proposal"]["id"], reason="r"))[
        "proposal"]["status"] == "rejected"
