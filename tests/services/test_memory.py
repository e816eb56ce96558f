"""Contract tests for memory entries over real HTTP, on both backends."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.support.brokers import Broker


def put(client: httpx.Client, ns: str, key: str, value: object, **body: object) -> httpx.Response:
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value, **body})


def test_put_then_get_round_trips_the_value(admin: httpx.Client, ns: str) -> None:
    created = put(admin, ns, "customer/123", {"plan": "pro", "acv": 12000})
    assert created.status_code == 201
    entry = created.json()
    assert entry["version"] == 1
    assert entry["namespace"] == ns and entry["key"] == "customer/123"
    got = admin.get(f"/v1/namespaces/{ns}/memory/customer/123")
    assert got.status_code == 200
    assert got.json()["value"] == {"plan": "pro", "acv": 12000}
    assert got.headers["etag"] == '"1"'
    assert got.json()["id"] == entry["id"]


def test_versions_rise_by_one_through_delete_and_recreate(admin: httpx.Client, ns: str) -> None:
    assert put(admin, ns, "k", 1).json()["version"] == 1
    assert put(admin, ns, "k", 2).json()["version"] == 2
    deleted = admin.delete(f"/v1/namespaces/{ns}/memory/k")
    assert deleted.status_code == 200 and deleted.json()["version"] == 3
    assert deleted.json()["deleted"] is True
    assert admin.get(f"/v1/namespaces/{ns}/memory/k").status_code == 404
    recreated = put(admin, ns, "k", 4)
    assert recreated.status_code == 201 and recreated.json()["version"] == 4


def test_delete_of_missing_key_is_404(admin: httpx.Client, ns: str) -> None:
    response = admin.delete(f"/v1/namespaces/{ns}/memory/nothing/here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_if_match_compare_and_set(admin: httpx.Client, ns: str) -> None:
    put(admin, ns, "cas", "a")
    stale = admin.put(f"/v1/namespaces/{ns}/memory/cas", json={"value": "b"},
                      headers={"If-Match": '"7"'})
    assert stale.status_code == 412
    assert stale.json()["error"]["details"]["current_version"] == 1
    fresh = admin.put(f"/v1/namespaces/{ns}/memory/cas", json={"value": "b"},
                      headers={"If-Match": '"1"'})
    assert fresh.status_code == 200 and fresh.json()["version"] == 2
    assert admin.get(f"/v1/namespaces/{ns}/memory/cas").json()["value"] == "b"


def test_create_only_refuses_an_existing_key(admin: httpx.Client, ns: str) -> None:
    first = admin.put(f"/v1/namespaces/{ns}/memory/once", json={"value": 1},
                      headers={"If-None-Match": "*"})
    assert first.status_code == 201
    again = admin.put(f"/v1/namespaces/{ns}/memory/once", json={"value": 2},
                      headers={"If-None-Match": "*"})
    assert again.status_code == 412
    assert admin.get(f"/v1/namespaces/{ns}/memory/once").json()["value"] == 1


def test_older_client_timestamp_loses_with_the_winner(admin: httpx.Client, ns: str) -> None:
    now = int(time.time() * 1000)
    assert put(admin, ns, "lww", "new", timestamp=now).status_code == 201
    old = put(admin, ns, "lww", "old", timestamp=now - 1000)
    assert old.status_code == 409
    error = old.json()["error"]
    assert error["code"] == "write_conflict"
    assert error["details"]["winner"]["value"] == "new"
    assert admin.get(f"/v1/namespaces/{ns}/memory/lww").json()["value"] == "new"


def test_far_future_timestamp_is_refused(admin: httpx.Client, ns: str) -> None:
    future = int(time.time() * 1000) + 3_600_000
    response = put(admin, ns, "f", 1, timestamp=future)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_timestamp"
    assert admin.get(f"/v1/namespaces/{ns}/memory/f").status_code == 404


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("customer/*", ["customer/1", "customer/1/notes", "customer/2"], id="prefix"),
        pytest.param("customer/1", ["customer/1"], id="exact"),
        pytest.param("customer/*/notes", ["customer/1/notes"], id="middle-star"),
        pytest.param("*", ["agent/q", "customer/1", "customer/1/notes", "customer/2"], id="all"),
        pytest.param("cust*", ["customer/1", "customer/1/notes", "customer/2"], id="stem"),
    ],
)
def test_query_patterns(admin: httpx.Client, ns: str, pattern: str, expected: list[str]) -> None:
    for key in ["customer/1", "customer/2", "customer/1/notes", "agent/q"]:
        put(admin, ns, key, key)
    response = admin.get(f"/v1/namespaces/{ns}/memory", params={"pattern": pattern})
    assert response.status_code == 200
    assert [e["key"] for e in response.json()["entries"]] == expected


def test_query_pages_through_everything_in_order(admin: httpx.Client, ns: str) -> None:
    keys = [f"item/{i:03d}" for i in range(25)]
    for key in reversed(keys):
        put(admin, ns, key, key)
    admin.delete(f"/v1/namespaces/{ns}/memory/item/007")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"pattern": "item/*", "limit": "10"}
        if cursor:
            params["cursor"] = cursor
        page = admin.get(f"/v1/namespaces/{ns}/memory", params=params).json()
        seen += [e["key"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [k for k in keys if k != "item/007"]


def test_query_scan_budget_is_a_setting(broker_factory: Callable[..., Broker], ns: str) -> None:
    """A page stops looking once it has examined MEMP_MAX_QUERY_SCAN keys (checked between
    batches of 256), matching or not, and says where it got to."""
    handle = broker_factory("embedded", max_query_scan=10)
    with handle.client() as admin:
        for start in range(0, 600, 100):
            batch = [{"memp": "1.0", "type": "memory.put", "namespace": ns,
                      "key": f"item/{i:03d}/draft", "value": i} for i in range(start, start + 100)]
            assert admin.post("/v1/messages", json=batch).status_code == 200
        put(admin, ns, "item/999/final", "last")
        pages = []
        cursor = None
        while True:
            params = {"pattern": "item/*/final", **({"cursor": cursor} if cursor else {})}
            page = admin.get(f"/v1/namespaces/{ns}/memory", params=params).json()
            pages.append([e["key"] for e in page["entries"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert len(pages) > 1 and pages[-1] == ["item/999/final"]
    assert all(page == [] for page in pages[:-1])


def test_history_keeps_recent_versions_newest_first(admin: httpx.Client, ns: str) -> None:
    for value in range(3):
        put(admin, ns, "h", value)
    admin.delete(f"/v1/namespaces/{ns}/memory/h")
    versions = admin.get(f"/v1/namespaces/{ns}/history/h").json()["versions"]
    assert [v["version"] for v in versions] == [4, 3, 2, 1]
    assert versions[0]["deleted"] is True
    assert [v["value"] for v in versions[1:]] == [2, 1, 0]


def test_ttl_entry_disappears_at_expiry_and_logs_an_expire(
    admin: httpx.Client, ns: str, broker: Broker
) -> None:
    put(admin, ns, "short", "soon gone", ttl_seconds=1)
    put(admin, ns, "long", "stays")
    assert admin.get(f"/v1/namespaces/{ns}/memory/short").status_code == 200
    time.sleep(1.05)
    assert admin.get(f"/v1/namespaces/{ns}/memory/short").status_code == 404
    keys = [e["key"] for e in admin.get(f"/v1/namespaces/{ns}/memory?pattern=*").json()["entries"]]
    assert keys == ["long"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        versions = admin.get(f"/v1/namespaces/{ns}/history/short").json()["versions"]
        if versions[0]["deleted"]:
            break
        time.sleep(0.05)
    assert versions[0]["version"] == 2 and versions[0]["deleted"] is True


def test_idempotency_key_applies_a_retry_once(admin: httpx.Client, ns: str) -> None:
    headers = {"Idempotency-Key": "retry-1"}
    first = admin.put(f"/v1/namespaces/{ns}/memory/once", json={"value": 1}, headers=headers)
    second = admin.put(f"/v1/namespaces/{ns}/memory/once", json={"value": 1}, headers=headers)
    assert first.json() == second.json()
    assert admin.get(f"/v1/namespaces/{ns}/memory/once").json()["version"] == 1


def test_cors_lets_a_configured_origin_read_etags(broker_factory) -> None:
    origin = "https://app.example"
    handle = broker_factory("embedded", cors_origins=origin)
    with handle.client() as client:
        preflight = client.options("/v1/namespaces/web/memory/k", headers={
            "Origin": origin, "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type, if-match"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        written = client.put("/v1/namespaces/web/memory/k", json={"value": 1},
                             headers={"Origin": origin})
        assert written.headers["access-control-allow-origin"] == origin
        assert "etag" in written.headers["access-control-expose-headers"].lower()
        other = client.get("/v1/namespaces/web/memory/k", headers={"Origin": "https://evil"})
        assert "access-control-allow-origin" not in other.headers
