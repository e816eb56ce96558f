"""JSON Schemas over real HTTP on both stores: the registry (`/v1/namespaces/{ns}/schemas`), the
draft chosen by `$schema`, refusals, flagged and enforced violations, and cache invalidation
across broker processes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess
from tests.support.clients import error_of, get, put, put_ok, replayed_event
from tests.support.schemas import register, schema_path
from tests.support.waiting import wait_until

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"

CUSTOMER = {
    "type": "object",
    "required": ["plan"],
    "properties": {"plan": {"enum": ["free", "pro"]}, "acv": {"type": "integer"}},
}


def _nested(leaf: Any, name: str, depth: int) -> Any:
    for _ in range(depth):
        leaf = {name: leaf}
    return leaf


# ---- the registry ----


def test_register_list_get_replace_delete(admin: httpx.Client, ns: str) -> None:
    created = admin.put(schema_path(ns, "customer"),
                        json={"pattern": "customer/*", "schema": CUSTOMER})
    assert created.status_code == 201, created.text
    record = created.json()
    assert {k: record[k] for k in ("id", "namespace", "pattern", "schema", "enforce", "draft")} \
        == {"id": "customer", "namespace": ns, "pattern": "customer/*", "schema": CUSTOMER,
            "enforce": False, "draft": DRAFT2020}
    assert record["created_by"] == "admin" and record["created_at"] > 0
    register(admin, ns, "audit", "audit/*", True)
    listed = admin.get(schema_path(ns)).json()["schemas"]
    assert [s["id"] for s in listed] == ["audit", "customer"]
    assert admin.get(schema_path(ns, "customer")).json() == record
    replaced = admin.put(schema_path(ns, "customer"),
                         json={"pattern": "customer/*", "schema": {"type": "object"},
                               "enforce": True})
    assert replaced.status_code == 200
    assert admin.get(schema_path(ns, "customer")).json()["enforce"] is True
    assert admin.delete(schema_path(ns, "customer")).status_code == 204
    error_of(admin.get(schema_path(ns, "customer")), 404, "not_found")
    error_of(admin.delete(schema_path(ns, "customer")), 404, "not_found")
    assert [s["id"] for s in admin.get(schema_path(ns)).json()["schemas"]] == ["audit"]


@pytest.mark.parametrize(
    "schema_id",
    [pytest.param("Upper", id="upper-case"), pytest.param("-lead", id="leading-dash"),
     pytest.param("x" * 65, id="too-long"), pytest.param("a%20b", id="space")],
)
def test_bad_schema_id_is_400(admin: httpx.Client, ns: str, schema_id: str) -> None:
    response = admin.put(schema_path(ns, schema_id), json={"pattern": "*", "schema": {}})
    error_of(response, 400, "invalid_request")
    assert admin.get(schema_path(ns)).json()["schemas"] == []


def test_registering_needs_admin_reading_needs_read(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    register(admin, ns, "s", "*", {"type": "object"})
    key = admin.post("/v1/keys", json={"grants": [
        {"namespace": ns, "permissions": ["read", "write", "subscribe"]}]}).json()["api_key"]
    with broker.client(key) as writer:
        error_of(writer.put(schema_path(ns, "t"), json={"pattern": "*", "schema": {}}),
                 403, "forbidden")
        error_of(writer.delete(schema_path(ns, "s")), 403, "forbidden")
        assert [s["id"] for s in writer.get(schema_path(ns)).json()["schemas"]] == ["s"]
        assert writer.get(schema_path(ns, "s")).status_code == 200
    assert admin.get(schema_path(ns, "s")).status_code == 200


# ---- drafts ----

# (draft, schema, value, violates): each schema is valid under the draft named and validates the
# value differently under its neighbour, so the draft really is chosen by `$schema`.
DRAFT_CASES = [
    pytest.param(DRAFT4, {"const": 1}, 2, False, id="draft4-has-no-const"),
    pytest.param(DRAFT6, {"const": 1}, 2, True, id="draft6-const"),
    pytest.param(DRAFT4, {"maximum": 5, "exclusiveMaximum": True}, 5, True,
                 id="draft4-boolean-exclusive-maximum"),
    pytest.param(DRAFT6, {"if": {"type": "integer"}, "then": {"minimum": 10}}, 5, False,
                 id="draft6-has-no-if"),
    pytest.param(DRAFT7, {"if": {"type": "integer"}, "then": {"minimum": 10}}, 5, True,
                 id="draft7-if-then"),
    pytest.param(DRAFT7, {"$ref": "#/definitions/s", "maxLength": 1,
                          "definitions": {"s": {"type": "string"}}}, "abc", False,
                 id="draft7-ref-siblings-ignored"),
    pytest.param(DRAFT2019, {"$ref": "#/$defs/s", "maxLength": 1,
                             "$defs": {"s": {"type": "string"}}}, "abc", True,
                 id="draft2019-ref-siblings-apply"),
    pytest.param(DRAFT7, {"dependencies": {"a": ["b"]}}, {"a": 1}, True,
                 id="draft7-dependencies"),
    pytest.param(DRAFT2019, {"dependencies": {"a": ["b"]}}, {"a": 1}, False,
                 id="draft2019-has-no-dependencies"),
    pytest.param(DRAFT2019, {"items": [{"type": "string"}]}, [1], True,
                 id="draft2019-items-array"),
    pytest.param(DRAFT2019, {"prefixItems": [{"type": "string"}]}, [1], False,
                 id="draft2019-has-no-prefix-items"),
    pytest.param(DRAFT2020, {"prefixItems": [{"type": "string"}]}, [1], True,
                 id="draft2020-prefix-items"),
    pytest.param(None, {"prefixItems": [{"type": "string"}]}, [1], True,
                 id="default-is-2020-12"),
]


@pytest.mark.parametrize(("draft", "schema", "value", "violates"), DRAFT_CASES)
def test_draft_is_chosen_by_dollar_schema(
    admin: httpx.Client, ns: str, draft: str | None, schema: dict[str, Any], value: Any,
    violates: bool
) -> None:
    body = schema if draft is None else {"$schema": draft, **schema}
    record = register(admin, ns, "d", "k", body)
    assert record["draft"] == (draft or DRAFT2020).rstrip("#")
    entry = put_ok(admin, ns, "k", value)
    assert entry["schema_violation"] is violates
    assert ("schema_errors" in entry) is violates


@pytest.mark.parametrize(
    ("draft", "schema"),
    [
        pytest.param(DRAFT6, {"maximum": 5, "exclusiveMaximum": True}, id="draft6-boolean"),
        pytest.param(DRAFT2020, {"items": [{"type": "string"}]}, id="draft2020-items-array"),
        pytest.param(DRAFT4, {"type": "integer", "minimum": "0"}, id="draft4-string-minimum"),
    ],
)
def test_schema_valid_only_under_another_draft_is_refused(
    admin: httpx.Client, ns: str, draft: str, schema: dict[str, Any]
) -> None:
    response = admin.put(schema_path(ns, "s"),
                         json={"pattern": "*", "schema": {"$schema": draft, **schema}})
    error_of(response, 400, "invalid_schema")


# ---- refusals: nothing registered, nothing fetched ----


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "no-such-type"}, id="unknown-type"),
        pytest.param({"minimum": "five"}, id="string-minimum"),
        pytest.param({"required": "plan"}, id="required-not-a-list"),
        pytest.param({"properties": {"a": 5}}, id="subschema-not-a-schema"),
        pytest.param({"$ref": "#/$defs/missing"}, id="local-ref-to-nothing"),
        pytest.param({"$schema": "http://json-schema.org/draft-03/schema#"},
                     id="draft3-unsupported"),
        pytest.param({"$schema": "https://example.com/my-meta"}, id="custom-meta-unsupported"),
        pytest.param({"$schema": 7}, id="dollar-schema-not-a-string"),
        pytest.param({"$ref": "#"}, id="ref-to-itself"),
        pytest.param({"$defs": {"a": {"$ref": "#/$defs/b"},
                                "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
                      "$ref": "#/$defs/a"}, id="ref-loop"),
        pytest.param({"properties": {"a": {"$ref": "#/$defs/nope"}}}, id="nested-dangling-ref"),
        pytest.param({"properties": {"a": {"$ref": "#there"}}}, id="missing-anchor"),
        pytest.param({"$schema": DRAFT4, "properties": {"id": {"$ref": "#/definitions/x"}}},
                     id="draft4-dangling-ref"),
    ],
)
def test_invalid_schema_is_400_invalid_schema(admin: httpx.Client, ns: str, schema: Any) -> None:
    put_ok(admin, ns, "k", {"kept": True})
    response = admin.put(schema_path(ns, "bad"), json={"pattern": "*", "schema": schema})
    error_of(response, 400, "invalid_schema")
    error_of(admin.get(schema_path(ns, "bad")), 404, "not_found")
    entry = put_ok(admin, ns, "k", {"kept": True})
    assert entry["schema_violation"] is False


@pytest.mark.parametrize(
    "schema",
    [pytest.param(5, id="a-number"), pytest.param("object", id="a-string"),
     pytest.param([], id="an-array"), pytest.param(None, id="null")],
)
def test_schema_that_is_not_an_object_or_boolean_is_400(
    admin: httpx.Client, ns: str, schema: Any
) -> None:
    response = admin.put(schema_path(ns, "bad"), json={"pattern": "*", "schema": schema})
    error_of(response, 400, "invalid_request")  # the body's shape: see test_openapi.py
    error_of(admin.get(schema_path(ns, "bad")), 404, "not_found")


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}}, id="ref"),
        pytest.param({"$defs": {"n": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/l"}]},
                                "l": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                      "$ref": "#/$defs/n"}, id="recursive-through-items"),
        pytest.param({"$anchor": "top", "properties": {"a": {"$ref": "#top"}}}, id="anchor"),
        pytest.param({"$defs": {"a/b": {}, "c~d": {}},
                      "allOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}]},
                     id="escaped-pointers"),
        pytest.param({"$dynamicAnchor": "node", "items": {"$dynamicRef": "#node"}},
                     id="dynamic-anchor"),
        pytest.param({"$schema": DRAFT2019, "$recursiveAnchor": True,
                      "items": {"$recursiveRef": "#"}}, id="recursive-ref-2019"),
        pytest.param({"$schema": DRAFT4, "properties": {"id": {"type": "string"}},
                      "definitions": {"x": {"id": "#x", "type": "string"}},
                      "items": {"$ref": "#x"}}, id="draft4-id-anchor"),
        pytest.param({"$defs": {"inner": {"$id": "https://example.com/inner.json",
                                          "$defs": {"s": {"type": "string"}},
                                          "$ref": "#/$defs/s"}},
                      "items": {"$ref": "#/$defs/inner"}}, id="pointer-into-embedded-resource"),
    ],
)
def test_local_references_that_resolve_are_accepted(
    admin: httpx.Client, ns: str, schema: dict[str, Any]
) -> None:
    response = admin.put(schema_path(ns, "ok"), json={"pattern": "*", "schema": schema})
    assert response.status_code == 201, response.text
    put_ok(admin, ns, "k", {"a": {"a": 1}})


@pytest.mark.parametrize("enforce", [pytest.param(False, id="flagged"),
                                     pytest.param(True, id="enforced")])
def test_a_reference_loop_reached_only_by_some_values_never_breaks_a_write(
    admin: httpx.Client, ns: str, enforce: bool
) -> None:
    register(admin, ns, "loop", "*", {"properties": {"a": {"$ref": "#/properties/a"}}},
             enforce=enforce)
    assert put_ok(admin, ns, "fine", {"b": 1})["schema_violation"] is False
    response = put(admin, ns, "loops", {"a": 1})
    if enforce:
        error_of(response, 422, "schema_violation")
        return
    assert response.status_code == 201, response.text
    entry = response.json()
    assert entry["schema_violation"] is True
    assert [e["schema_id"] for e in entry["schema_errors"]] == ["loop"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_schema_nested_too_deeply_is_refused_never_a_500(
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    """Past MEMP_MAX_JSON_DEPTH the body is refused as such; at the highest limit the setting
    allows, a schema deeper than the meta-schema check reaches is `invalid_schema`."""
    with broker_factory(backend, max_json_depth=128).client() as admin:
        response = admin.put(schema_path(ns, "bad"),
                             json={"pattern": "*", "schema": _nested({}, "not", 126)})
        error_of(response, 400, "invalid_schema")
        response = admin.put(schema_path(ns, "bad"),
                             json={"pattern": "*", "schema": _nested({}, "not", 300)})
        assert error_of(response, 400, "invalid_request")["details"]["limit"] == "max_json_depth"
        error_of(admin.get(schema_path(ns, "bad")), 404, "not_found")


@pytest.mark.parametrize("backend", BACKENDS)
def test_deeply_nested_value_under_a_recursive_schema_never_breaks_a_write(
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    """The deepest value the highest MEMP_MAX_JSON_DEPTH lets a put carry, validated through a
    recursive `$ref` at every level."""
    with broker_factory(backend, max_json_depth=128).client() as admin:
        tree = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
                "$ref": "#/$defs/n"}
        register(admin, ns, "tree", "*", tree)
        assert put_ok(admin, ns, "shallow", _nested(1, "c", 20))["schema_violation"] is True
        entry = put_ok(admin, ns, "deep", _nested(1, "c", 127))
        assert entry["schema_violation"] is True
        assert [e["schema_id"] for e in entry["schema_errors"]] == ["tree"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param({"pattern": "a/**/b", "schema": {}}, 400, "invalid_pattern",
                     id="bad-pattern"),
        pytest.param({"schema": {}}, 400, "invalid_request", id="no-pattern"),
        pytest.param({"pattern": "*", "schema": {}, "extra": 1}, 400, "invalid_request",
                     id="unknown-field"),
        pytest.param({"pattern": "*", "schema": {}, "enforce": "yes"}, 400, "invalid_request",
                     id="enforce-not-bool"),
        pytest.param(b"{not json", 400, "invalid_json", id="not-json"),
    ],
)
def test_bad_schema_body_is_refused(
    admin: httpx.Client, ns: str, body: Any, status: int, code: str
) -> None:
    if isinstance(body, bytes):
        response = admin.put(schema_path(ns, "s"), content=body,
                             headers={"Content-Type": "application/json"})
    else:
        response = admin.put(schema_path(ns, "s"), json=body)
    error_of(response, status, code)
    assert admin.get(schema_path(ns)).json()["schemas"] == []


def test_non_json_content_type_is_415(admin: httpx.Client, ns: str) -> None:
    response = admin.put(schema_path(ns, "s"), content=b'{"pattern": "*", "schema": {}}',
                         headers={"Content-Type": "text/plain"})
    error_of(response, 415, "unsupported_media_type")


@pytest.fixture
def ref_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that would serve any schema, and records every request it gets."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda url: {"$ref": f"{url}/s.json"}, id="top-level"),
        pytest.param(lambda url: {"properties": {"a": {"$ref": f"{url}/s.json#/x"}}},
                     id="nested"),
        pytest.param(lambda url: {"$id": f"{url}/root.json", "$ref": "other.json"},
                     id="relative-to-remote-id"),
        pytest.param(lambda url: {"allOf": [{"$dynamicRef": f"{url}/s.json#meta"}]},
                     id="dynamic-ref"),
        pytest.param(lambda url: {"$schema": DRAFT2019, "$recursiveRef": f"{url}/s.json"},
                     id="recursive-ref"),
        pytest.param(lambda url: {"$schema": f"{url}/meta.json"}, id="remote-meta-schema"),
        pytest.param(lambda url: {"$schema": DRAFT7, "$ref": f"{url}/s.json"}, id="draft7"),
    ],
)
def test_remote_ref_is_refused_and_never_fetched(
    admin: httpx.Client, ns: str, ref_server: tuple[str, list[str]],
    build: Callable[[str], dict[str, Any]],
) -> None:
    url, requests = ref_server
    response = admin.put(schema_path(ns, "remote"), json={"pattern": "*", "schema": build(url)})
    error_of(response, 400, "invalid_schema")
    put_ok(admin, ns, "k", 5)
    error_of(admin.get(schema_path(ns, "remote")), 404, "not_found")
    assert requests == []


def test_schema_over_the_size_limit_is_413(
    broker: Broker, broker_factory: Callable[..., Broker], ns: str
) -> None:
    small = broker_factory(broker.backend, max_schema_bytes=2000)
    big = {"type": "object",
           "properties": {f"field{i}": {"type": "string", "maxLength": 10} for i in range(100)}}
    with small.client() as client:
        response = client.put(schema_path(ns, "big"), json={"pattern": "*", "schema": big})
        error = error_of(response, 413, "payload_too_large")
        assert error["details"]["limit"] == 2000
        error_of(client.get(schema_path(ns, "big")), 404, "not_found")
        fits = client.put(schema_path(ns, "small"), json={"pattern": "*", "schema": CUSTOMER})
        assert fits.status_code == 201, fits.text


# ---- validation of values ----


def test_violation_is_stored_flagged_with_errors_and_a_warning(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER)
    response = put(admin, ns, "customer/1", {"plan": "gold", "acv": "lots"})
    assert response.status_code == 201, response.text
    assert response.headers["memp-warning"] == "schema_violation"
    entry = response.json()
    assert entry["schema_violation"] is True
    assert entry["value"] == {"plan": "gold", "acv": "lots"}
    errors = sorted(entry["schema_errors"], key=lambda e: e["path"])
    assert [(e["schema_id"], e["path"]) for e in errors] == [("customer", "/acv"),
                                                             ("customer", "/plan")]
    assert all(isinstance(e["message"], str) and e["message"] for e in errors)
    stored = get(admin, ns, "customer/1")
    assert stored["schema_violation"] is True and stored["schema_errors"] == entry["schema_errors"]
    event = replayed_event(broker.url, ns, "customer/1", 1)
    assert event["schema_violation"] is True
    assert event["schema_errors"] == entry["schema_errors"]
    conforming = put(admin, ns, "customer/1", {"plan": "pro", "acv": 10})
    assert "memp-warning" not in conforming.headers
    assert conforming.json()["schema_violation"] is False
    assert "schema_errors" not in get(admin, ns, "customer/1")


def test_violation_warning_in_the_message_ack(admin: httpx.Client, ns: str) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER)
    message = {"memp": "1.0", "type": "memory.put", "id": "p-1", "namespace": ns,
               "key": "customer/2", "value": {"acv": 1}}
    reply = admin.post("/v1/messages", json=message)
    assert reply.status_code == 200, reply.text
    ack = reply.json()
    assert ack["type"] == "ack" and ack["warnings"] == ["schema_violation"]
    assert ack["entry"]["schema_errors"][0]["path"] == ""
    good = admin.post("/v1/messages", json={**message, "id": "p-2", "value": {"plan": "pro"}})
    assert good.json()["warnings"] == []


@pytest.mark.parametrize(
    ("schemas", "expected"),
    [
        pytest.param([("many", "*")], 10, id="one-schema-fifteen-errors"),
        pytest.param([("many", "*"), ("more", "k")], 10, id="two-schemas-thirty-errors"),
    ],
)
def test_errors_are_capped_at_ten(
    admin: httpx.Client, ns: str, schemas: list[tuple[str, str]], expected: int
) -> None:
    many = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(15)}}
    for schema_id, pattern in schemas:
        register(admin, ns, schema_id, pattern, many)
    entry = put_ok(admin, ns, "k", {f"f{i}": "x" for i in range(15)})
    assert entry["schema_violation"] is True
    assert len(entry["schema_errors"]) == expected
    assert all(e["path"].startswith("/f") for e in entry["schema_errors"])


def test_enforcing_schema_rejects_and_writes_nothing(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    put_ok(admin, ns, "customer/1", {"plan": "free", "legacy": True})
    register(admin, ns, "customer", "customer/*", CUSTOMER, enforce=True)
    response = put(admin, ns, "customer/1", {"plan": "gold"})
    error = error_of(response, 422, "schema_violation")
    assert [(e["schema_id"], e["path"]) for e in error["details"]["errors"]] == [
        ("customer", "/plan")]
    entry = get(admin, ns, "customer/1")
    assert (entry["value"], entry["version"]) == ({"plan": "free", "legacy": True}, 1)
    versions = admin.get(f"/v1/namespaces/{ns}/history/customer/1").json()["versions"]
    assert [v["version"] for v in versions] == [1]
    error_of(put(admin, ns, "customer/2", {"acv": 1}), 422, "schema_violation")
    error_of(admin.get(f"/v1/namespaces/{ns}/memory/customer/2"), 404, "not_found")
    assert put_ok(admin, ns, "customer/1", {"plan": "pro"})["version"] == 2


def test_enforcing_schema_judges_the_merged_value(admin: httpx.Client, ns: str) -> None:
    admin.put(f"/v1/namespaces/{ns}/config", json={"strategy": "merge"}).raise_for_status()
    register(admin, ns, "customer", "customer/*", CUSTOMER, enforce=True)
    put_ok(admin, ns, "customer/1", {"plan": "free"})
    assert put_ok(admin, ns, "customer/1", {"acv": 5})["value"] == {"plan": "free", "acv": 5}
    error_of(put(admin, ns, "customer/1", {"plan": "gold"}), 422, "schema_violation")
    assert get(admin, ns, "customer/1")["value"] == {"plan": "free", "acv": 5}


def test_several_schemas_matching_one_key_all_apply(admin: httpx.Client, ns: str) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER)
    register(admin, ns, "vip", "customer/vip/*", {"required": ["manager"]})
    register(admin, ns, "strict", "customer/vip/*",
             {"properties": {"acv": {"minimum": 1000}}}, enforce=True)
    entry = put_ok(admin, ns, "customer/vip/1", {"acv": 5000})
    assert sorted((e["schema_id"], e["path"]) for e in entry["schema_errors"]) == [
        ("customer", ""), ("vip", "")]
    rejected = error_of(put(admin, ns, "customer/vip/1", {"acv": 5}), 422, "schema_violation")
    assert sorted(e["schema_id"] for e in rejected["details"]["errors"]) == [
        "customer", "strict", "vip"]
    assert get(admin, ns, "customer/vip/1")["value"] == {"acv": 5000}
    fine = put_ok(admin, ns, "customer/vip/1", {"plan": "pro", "manager": "kim", "acv": 2000})
    assert fine["schema_violation"] is False


def test_schema_applies_only_to_keys_its_pattern_matches(admin: httpx.Client, ns: str) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER, enforce=True)
    for key in ("other/1", "customers", "customerx/1", "x/customer/1"):
        entry = put_ok(admin, ns, key, {"plan": "gold"})
        assert entry["schema_violation"] is False, key
    error_of(put(admin, ns, "customer/1", {"plan": "gold"}), 422, "schema_violation")


def test_schema_of_one_namespace_does_not_apply_in_another(
    admin: httpx.Client, ns: str
) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER, enforce=True)
    other = f"{ns}-other"
    assert put_ok(admin, other, "customer/1", {"plan": "gold"})["schema_violation"] is False


def test_deleting_a_schema_stops_validation_at_once(admin: httpx.Client, ns: str) -> None:
    register(admin, ns, "customer", "customer/*", CUSTOMER, enforce=True)
    error_of(put(admin, ns, "customer/1", {}), 422, "schema_violation")
    assert admin.delete(schema_path(ns, "customer")).status_code == 204
    assert put_ok(admin, ns, "customer/1", {})["schema_violation"] is False


def test_schema_change_through_one_process_applies_on_another(
    broker_processes: Callable[..., list[BrokerProcess]], ns: str
) -> None:
    # A long cache life: only the pub/sub invalidation can make process B notice in time.
    env = {"MEMP_NAMESPACE_CACHE_SECONDS": "3600"}
    a, b = broker_processes(2, **env)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=a.url, headers=headers, timeout=15) as on_a, \
            httpx.Client(base_url=b.url, headers=headers, timeout=15) as on_b:
        put_ok(on_b, ns, "customer/0", {})  # B has now cached the namespace: no schemas
        register(on_a, ns, "customer", "customer/*", CUSTOMER, enforce=True)

        def b_enforces() -> bool:
            response = put(on_b, ns, "customer/probe", {})
            assert response.status_code in (200, 201, 422), response.text
            return response.status_code == 422

        wait_until(b_enforces, "process B to enforce the new schema")
        assert on_a.delete(schema_path(ns, "customer")).status_code == 204
        wait_until(lambda: not b_enforces(), "process B to drop the deleted schema")
        on_a.put(f"/v1/namespaces/{ns}/config", json={"strategy": "merge"}).raise_for_status()

        def b_merges() -> bool:
            put_ok(on_b, ns, "doc", {"a": 1})
            return "a" in put_ok(on_b, ns, "doc", {"b": 2})["value"]

        wait_until(b_merges, "process B to use the new strategy")
