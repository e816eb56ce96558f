"""The audit log over real HTTP on both stores: what writes record, reading with filters and
as NDJSON, permissions, bad input, and the hash chain catching records altered or removed
directly in the store."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from broker.storage import layout
from tests.support.brokers import Broker, data_client
from tests.support.clients import assert_error, create_key

pytestmark = pytest.mark.usefixtures("broker")


def audit(client: httpx.Client, ns: str, **params: Any) -> httpx.Response:
    return client.get(f"/v1/namespaces/{ns}/audit", params=params)


def records(client: httpx.Client, ns: str, **params: Any) -> list[dict[str, Any]]:
    response = audit(client, ns, **params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["records"]
    return found


def verify(client: httpx.Client, ns: str) -> dict[str, Any]:
    response = client.get(f"/v1/namespaces/{ns}/audit/verify")
    assert response.status_code == 200, response.text
    verdict: dict[str, Any] = response.json()
    return verdict


def test_writes_are_recorded_newest_first_without_content(admin: httpx.Client, ns: str
                                                          ) -> None:
    path = f"/v1/namespaces/{ns}/memory/customer/1"
    secret = "the-secret-text-never-in-the-audit"
    assert admin.put(path, json={"value": {"note": secret}},
                     headers={"X-Request-ID": "req-123"}).status_code == 201
    assert admin.put(path, json={"value": {"note": "two"}}).status_code == 200
    assert admin.delete(path).status_code == 200
    found = records(admin, ns)
    assert [r["action"] for r in found] == ["delete", "put", "put"]
    delete, second, first = found
    assert first["key"] == "customer/1" and first["actor"] == "admin"
    assert (first["version_before"], first["version_after"]) == (0, 1)
    assert (second["version_before"], second["version_after"]) == (1, 2)
    assert (delete["version_before"], delete["version_after"]) == (2, 3)
    assert first["request_id"] == "req-123"
    assert first["content_hash"].startswith("sha256:") and delete["content_hash"] is None
    assert first["seq"] == 1 and second["prev"] == first["hash"]
    assert secret not in json.dumps(found)
    assert verify(admin, ns) == {"ok": True, "records": 3, "head": delete["hash"],
                                 "broken": None}


def test_filters_cursor_and_export(admin: httpx.Client, ns: str) -> None:
    for i in range(5):
        admin.put(f"/v1/namespaces/{ns}/memory/k/{i % 2}", json={"value": i})
    assert [r["key"] for r in records(admin, ns, key="k/1")] == ["k/1", "k/1"]
    assert records(admin, ns, action="delete") == []
    assert len(records(admin, ns, actor="admin")) == 5
    first = audit(admin, ns, limit=2).json()
    assert len(first["records"]) == 2 and first["next_cursor"]
    rest = records(admin, ns, cursor=first["next_cursor"])
    assert [r["seq"] for r in first["records"] + rest] == [5, 4, 3, 2, 1]
    newest = first["records"][0]["at"]
    assert [r["seq"] for r in records(admin, ns, since=str(newest + 60_000))] == []
    assert len(records(admin, ns, until="2100-01-01T00:00:00Z")) == 5
    exported = admin.get(f"/v1/namespaces/{ns}/audit",
                         headers={"Accept": "application/x-ndjson"})
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert [r["seq"] for r in lines] == [5, 4, 3, 2, 1]


def test_an_export_resumes_after_the_newest_record_it_got(admin: httpx.Client, broker: Broker,
                                                          ns: str) -> None:
    """`format=ndjson` exports every kept record; `after=<id>` of the newest one exported
    exports only what was appended since, so a scheduled export keeps what retention drops
    without gaps or repeats; the same needs `audit`."""
    for i in range(3):
        admin.put(f"/v1/namespaces/{ns}/memory/k{i}", json={"value": i})

    def export(**params: str) -> list[dict[str, Any]]:
        reply = audit(admin, ns, format="ndjson", **params)
        assert reply.headers["content-type"].startswith("application/x-ndjson"), reply.text
        return [json.loads(line) for line in reply.text.splitlines()]

    first = export()
    assert [r["seq"] for r in first] == [3, 2, 1]
    assert export(after=first[0]["id"]) == []
    for i in range(3, 5):
        admin.put(f"/v1/namespaces/{ns}/memory/k{i}", json={"value": i})
    since = export(after=first[0]["id"])
    assert [r["seq"] for r in since] == [5, 4] and since[-1]["prev"] == first[0]["hash"]
    assert [r["seq"] for r in export(after=first[-1]["id"])] == [5, 4, 3, 2]
    assert [r["seq"] for r in records(admin, ns, after=first[1]["id"])] == [5, 4, 3]
    assert [r["seq"] for r in export(after="0-0")] == [5, 4, 3, 2, 1]
    assert audit(admin, ns, format="json").json()["records"][0]["seq"] == 5
    token, _ = create_key(admin, (ns, ["read"]))
    with broker.client(token) as reader:
        assert_error(reader.get(f"/v1/namespaces/{ns}/audit", params={"format": "ndjson"}),
                     403, "forbidden")


def test_merge_records_conflict_paths_only(admin: httpx.Client, ns: str) -> None:
    admin.put(f"/v1/namespaces/{ns}/config", json={"strategy": "merge"})
    path = f"/v1/namespaces/{ns}/memory/doc"
    admin.put(path, json={"value": {"a": "base"}})
    admin.put(path, json={"value": {"a": "theirs-secret"}})
    admin.put(path, json={"value": {"a": "mine-secret"}, "base_version": 1})
    merge = records(admin, ns, action="merge")
    assert merge[0]["details"]["conflicts"] == ["/a"]
    assert "secret" not in json.dumps(merge)


@pytest.mark.parametrize("grants,status", [
    pytest.param(["read", "write", "subscribe"], 403, id="no-audit-permission"),
    pytest.param(["audit"], 200, id="audit-permission"),
    pytest.param(["admin"], 200, id="admin"),
])
def test_reading_needs_audit(admin: httpx.Client, broker: Broker, ns: str,
                             grants: list[str], status: int) -> None:
    admin.put(f"/v1/namespaces/{ns}/memory/a", json={"value": 1})
    token, _ = create_key(admin, (ns, grants))
    with broker.client(token) as client:
        for path in ("audit", "audit/verify"):
            response = client.get(f"/v1/namespaces/{ns}/{path}")
            assert response.status_code == status, response.text
        if status == 403:
            assert_error(audit(client, ns), 403, "forbidden")
            assert_error(client.get(f"/v1/namespaces/{ns}/audit",
                                    headers={"Accept": "application/x-ndjson"}),
                         403, "forbidden")


def test_other_tenant_and_revoked_keys_are_refused(admin: httpx.Client, broker: Broker,
                                                   ns: str) -> None:
    token, key_id = create_key(admin, (f"{ns}-other", ["audit"]))
    with broker.client(token) as client:
        assert_error(audit(client, ns), 403, "forbidden")
    token, key_id = create_key(admin, (ns, ["audit"]))
    assert admin.delete(f"/v1/keys/{key_id}").status_code == 204
    with broker.client(token) as client:
        assert_error(audit(client, ns), 401, "unauthorized")
    with broker.client(None) as client:
        assert_error(audit(client, ns), 401, "unauthorized")


@pytest.mark.parametrize("params", [
    pytest.param({"since": "yesterday"}, id="bad-since"),
    pytest.param({"until": "2024-01-01T00:00:00"}, id="naive-until"),
    pytest.param({"cursor": "../../x"}, id="bad-cursor"),
    pytest.param({"limit": "0"}, id="zero-limit"),
    pytest.param({"limit": "abc"}, id="bad-limit"),
    pytest.param({"key": "a//b"}, id="bad-key"),
    pytest.param({"actor": "x" * 300}, id="long-actor"),
    pytest.param({"after": "abc"}, id="bad-after"),
    pytest.param({"after": "1-" + "9" * 20}, id="after-past-the-id-range"),
    pytest.param({"after": "1-0\n"}, id="after-control-character"),
    pytest.param({"after": "*" * 128}, id="after-stars"),
    pytest.param({"format": "xml"}, id="bad-format"),
    pytest.param({"format": "ndjson\x00"}, id="format-control-character"),
])
def test_bad_parameters_are_400(admin: httpx.Client, ns: str, params: dict[str, str]) -> None:
    admin.put(f"/v1/namespaces/{ns}/memory/a", json={"value": 1})
    response = audit(admin, ns, **params)
    assert response.status_code == 400, response.text
    assert verify(admin, ns)["ok"] is True
    assert_error(admin.get("/v1/namespaces/BAD!/audit"), 400, "invalid_namespace")


def _stored(broker: Broker, ns: str) -> tuple[Any, list[tuple[bytes, dict[bytes, bytes]]]]:
    client = data_client(broker.app)
    return client, client.xrange(layout.audit(ns), "-", "+")


def _rewrite(client: Any, ns: str, stored: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
    """Replace the stream with these records, as someone with access to the store could."""
    client.delete(layout.audit(ns))
    for position, fields in stored:
        client.xadd(layout.audit(ns), fields, id=position)


def test_an_altered_record_is_detected(admin: httpx.Client, broker: Broker, ns: str) -> None:
    for i in range(4):
        admin.put(f"/v1/namespaces/{ns}/memory/k{i}", json={"value": i})
    client, stored = _stored(broker, ns)
    position, fields = stored[1]
    body = json.loads(fields[b"r"])
    body["actor"] = "someone-else"
    stored[1] = (position, {b"r": json.dumps(body).encode(), b"h": fields[b"h"]})
    _rewrite(client, ns, stored)
    verdict = verify(admin, ns)
    assert verdict["ok"] is False and verdict["broken"]["seq"] == 2
    assert verdict["broken"]["id"] == position.decode()


def test_an_altered_and_rehashed_record_breaks_the_next_link(admin: httpx.Client,
                                                             broker: Broker, ns: str) -> None:
    import hashlib

    for i in range(4):
        admin.put(f"/v1/namespaces/{ns}/memory/k{i}", json={"value": i})
    client, stored = _stored(broker, ns)
    position, fields = stored[1]
    body = fields[b"r"].replace(b'"admin"', b'"mallory"')
    stored[1] = (position, {b"r": body, b"h": hashlib.sha1(body).hexdigest().encode()})
    _rewrite(client, ns, stored)
    verdict = verify(admin, ns)
    assert verdict["ok"] is False and verdict["broken"]["seq"] == 3


@pytest.mark.parametrize("which", [pytest.param(0, id="first"), pytest.param(2, id="middle"),
                                   pytest.param(-1, id="newest")])
def test_a_removed_record_is_detected(admin: httpx.Client, broker: Broker, ns: str,
                                      which: int) -> None:
    for i in range(5):
        admin.put(f"/v1/namespaces/{ns}/memory/k{i}", json={"value": i})
    client, stored = _stored(broker, ns)
    client.xdel(layout.audit(ns), stored[which][0])
    verdict = verify(admin, ns)
    assert verdict["ok"] is False
    assert verdict["broken"]["seq"] == (5 if which == -1 else which + 1)


def test_configuration_schemas_keys_shares_and_agents_are_recorded(
        admin: httpx.Client, broker: Broker, ns: str) -> None:
    base = f"/v1/namespaces/{ns}"
    assert admin.put(f"{base}/config", json={"history_limit": 4}).status_code == 200
    assert admin.put(f"{base}/config", json={"shares": [
        {"namespace": "friends-*", "permissions": ["read"]}]}).status_code == 200
    assert admin.put(f"{base}/schemas/s1", json={"pattern": "a/*", "schema": {"type": "object"}}
                     ).status_code == 201
    assert admin.delete(f"{base}/schemas/s1").status_code == 204
    _, key_id = create_key(admin, (ns, ["read"]))
    assert admin.delete(f"/v1/keys/{key_id}").status_code == 204
    agent = admin.post("/v1/agents", json={"name": "a", "namespace": ns}).json()
    found = records(admin, ns)
    actions = [r["action"] for r in reversed(found)]
    assert actions == ["config", "config", "shares", "schema", "schema-delete", "key-create",
                       "key-revoke", "agent-register"]
    shares = next(r for r in found if r["action"] == "shares")
    assert shares["details"]["after"] == [{"namespace": "friends-*", "permissions": ["read"]}]
    assert found[0]["details"]["agent"] == agent["agent"]["id"]
    assert all(r["actor"] == "admin" for r in found)
    assert verify(admin, ns)["ok"] is True


def test_retention_drops_old_records_and_the_chain_still_verifies(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    handle = broker_factory("embedded", audit_retention_seconds=1, changelog_maxlen=2)
    with handle.client() as admin:
        for i in range(4):
            admin.put(f"/v1/namespaces/{ns}/memory/old/{i}", json={"value": i})
        time.sleep(1.2)
        admin.put(f"/v1/namespaces/{ns}/memory/new", json={"value": 1})
        deadline = time.monotonic() + 15
        while len(records(admin, ns)) > 1:
            assert time.monotonic() < deadline, records(admin, ns)
            time.sleep(0.1)
        [kept] = records(admin, ns)
        assert kept["key"] == "new" and kept["seq"] == 5
        assert verify(admin, ns) == {"ok": True, "records": 1, "head": kept["hash"],
                                     "broken": None}


def test_the_change_log_limits_never_trim_the_audit_log(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    handle = broker_factory("embedded", changelog_maxlen=10)
    with handle.client() as admin:
        for i in range(300):
            admin.put(f"/v1/namespaces/{ns}/memory/k/{i % 7}", json={"value": i})
        assert len(admin.get(f"/v1/namespaces/{ns}/audit", params={"limit": 1000}
                             ).json()["records"]) == 300
        assert verify(admin, ns)["records"] == 300


@pytest.mark.parametrize("params", [
    pytest.param({"cursor": "0-0"}, id="cursor-at-the-start"),
    pytest.param({"cursor": "0-5"}, id="cursor-low"),
    pytest.param({"since": "0001-01-01T00:00:00Z"}, id="since-year-1"),
    pytest.param({"until": "0001-01-01T00:00:00Z"}, id="until-year-1"),
    pytest.param({"since": "9999999999999999"}, id="since-far-ahead"),
    pytest.param({"until": "0", "since": "5"}, id="empty-range"),
])
def test_edge_ranges_are_empty_or_whole_pages_never_errors(admin: httpx.Client, ns: str,
                                                           params: dict[str, str]) -> None:
    admin.put(f"/v1/namespaces/{ns}/memory/a", json={"value": 1})
    response = audit(admin, ns, **params)
    assert response.status_code == 200, response.text
    assert len(response.json()["records"]) <= 1
    exported = admin.get(f"/v1/namespaces/{ns}/audit", params=params,
                         headers={"Accept": "application/x-ndjson"})
    assert exported.status_code == 200
    assert_error(audit(admin, ns, cursor=f"{2**64}-0"), 400, "invalid_request")


def test_an_expiry_is_recorded_by_the_system(admin: httpx.Client, ns: str) -> None:
    admin.put(f"/v1/namespaces/{ns}/memory/brief", json={"value": 1, "ttl_seconds": 1})
    deadline = time.monotonic() + 15
    while not (expired := records(admin, ns, action="expire")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert expired[0]["actor"] == "system" and expired[0]["key"] == "brief"
    assert (expired[0]["version_before"], expired[0]["version_after"]) == (1, 2)
    assert verify(admin, ns)["ok"] is True
