"""Namespace configuration over real HTTP on both stores (`/v1/namespaces/{ns}/config`): who may
read and change it, what is recorded, If-Match revisions, refusal of bad input with nothing
changed, and shares that let other namespaces read and subscribe."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.brokers import Broker
from tests.support.clients import error_of, get, put, put_ok, replayed_event


def config_path(ns: str) -> str:
    return f"/v1/namespaces/{ns}/config"


def new_key(admin: httpx.Client, *grants: tuple[str, list[str]]) -> tuple[str, str]:
    """An API key with the given (namespace glob, permissions) grants: (api_key, key id)."""
    response = admin.post("/v1/keys", json={
        "name": "test", "grants": [{"namespace": n, "permissions": p} for n, p in grants]})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["api_key"], body["key"]["id"]


def subscribe_status(broker: Broker, token: str, ns: str) -> int:
    """The status GET /v1/subscribe answers with, without reading the stream."""
    with httpx.Client(base_url=broker.url, timeout=15) as client, client.stream(
            "GET", "/v1/subscribe", params={"namespace": ns, "pattern": "*"},
            headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status_code


# ---- reading and changing the configuration ----


def test_default_configuration(admin: httpx.Client, ns: str) -> None:
    response = admin.get(config_path(ns))
    assert response.status_code == 200
    assert response.headers["etag"] == '"0"'
    assert response.json() == {
        "strategy": "last-write-wins", "rules": [], "priorities": [], "default_priority": 0,
        "merge_arrays": "replace", "history_limit": None, "default_ttl_seconds": None,
        "shares": [], "limits": {}, "allow_self_approval": False, "namespace": ns,
        "revision": 0, "updated_at": None, "updated_by": None,
    }


def test_put_records_who_when_and_the_revision(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    before = int(time.time() * 1000)
    first = admin.put(config_path(ns), json={"strategy": "merge"})
    assert first.status_code == 200, first.text
    assert first.headers["etag"] == '"1"'
    stored = first.json()
    assert (stored["strategy"], stored["revision"], stored["updated_by"]) == ("merge", 1, "admin")
    assert before - 1000 <= stored["updated_at"] <= int(time.time() * 1000) + 1000
    token, key_id = new_key(admin, (ns, ["admin"]))
    with broker.client(token) as ns_admin:
        second = ns_admin.put(config_path(ns), json={"strategy": "agent-priority",
                                                     "default_priority": 4})
        assert second.status_code == 200, second.text
        assert (second.json()["revision"], second.json()["updated_by"]) == (2, key_id)
        got = ns_admin.get(config_path(ns))
        assert got.json() == second.json() and got.headers["etag"] == '"2"'
    # a PUT replaces the whole configuration: what it leaves out returns to the default
    third = admin.put(config_path(ns), json={}).json()
    assert (third["strategy"], third["default_priority"], third["revision"]) == (
        "last-write-wins", 0, 3)


def test_if_match_revision(admin: httpx.Client, ns: str) -> None:
    created = admin.put(config_path(ns), json={"strategy": "merge"},
                        headers={"If-Match": '"0"'})
    assert created.status_code == 200 and created.json()["revision"] == 1
    changed = admin.put(config_path(ns), json={"strategy": "agent-priority"},
                        headers={"If-Match": created.headers["etag"]})
    assert changed.status_code == 200 and changed.json()["revision"] == 2
    stale = admin.put(config_path(ns), json={"strategy": "last-write-wins"},
                      headers={"If-Match": '"1"'})
    assert error_of(stale, 412, "precondition_failed")["details"]["current_revision"] == 2
    error_of(admin.put(config_path(ns), json={}, headers={"If-Match": "soon"}), 400,
             "invalid_request")
    current = admin.get(config_path(ns)).json()
    assert (current["strategy"], current["revision"]) == ("agent-priority", 2)


def test_configuration_is_per_namespace(admin: httpx.Client, ns: str) -> None:
    admin.put(config_path(ns), json={"strategy": "merge"}).raise_for_status()
    other = f"{ns}-other"
    assert admin.get(config_path(other)).json()["strategy"] == "last-write-wins"
    put_ok(admin, other, "k", {"a": 1})
    assert put_ok(admin, other, "k", {"b": 1})["value"] == {"b": 1}


@pytest.mark.parametrize(
    "grants",
    [
        pytest.param([("{ns}", ["read", "write", "subscribe"])], id="everything-but-admin"),
        pytest.param([("{ns}-other", ["admin"])], id="admin-elsewhere"),
        pytest.param([("{ns}x*", ["admin"])], id="admin-glob-not-matching"),
    ],
)
def test_configuration_needs_admin_on_the_namespace(
    broker: Broker, admin: httpx.Client, ns: str, grants: list[tuple[str, list[str]]]
) -> None:
    admin.put(config_path(ns), json={"strategy": "merge"}).raise_for_status()
    token, _ = new_key(admin, *[(n.format(ns=ns), p) for n, p in grants])
    with broker.client(token) as client:
        error_of(client.get(config_path(ns)), 403, "forbidden")
        error_of(client.put(config_path(ns), json={"strategy": "agent-priority"}), 403,
                 "forbidden")
    with broker.client(None) as anonymous:
        error_of(anonymous.get(config_path(ns)), 401, "unauthorized")
        error_of(anonymous.put(config_path(ns), json={}), 401, "unauthorized")
    current = admin.get(config_path(ns)).json()
    assert (current["strategy"], current["revision"]) == ("merge", 1)


def test_registered_agent_is_not_a_namespace_admin(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    registered = admin.post("/v1/agents", json={"name": "a", "namespace": ns}).json()
    with broker.client(registered["credentials"]["api_key"]) as agent:
        error_of(agent.put(config_path(ns), json={"strategy": "merge"}), 403, "forbidden")


def test_admin_glob_grant_may_configure(broker: Broker, admin: httpx.Client, ns: str) -> None:
    token, _ = new_key(admin, (f"{ns[:6]}*", ["admin"]))
    with broker.client(token) as client:
        assert client.put(config_path(ns), json={"strategy": "merge"}).status_code == 200


# ---- bad input: a clear 4xx, nothing changed ----

BAD_CONFIGS = [
    pytest.param({"strategy": "newest"}, 400, "invalid_request", id="unknown-strategy"),
    pytest.param({"strategy": 5}, 400, "invalid_request", id="strategy-not-a-string"),
    pytest.param({"strategy": "Merge"}, 400, "invalid_request", id="strategy-wrong-case"),
    pytest.param({"rules": [{"pattern": "doc/*", "strategy": "nope"}]}, 400, "invalid_request",
                 id="rule-unknown-strategy"),
    pytest.param({"rules": [{"pattern": "a/**/b", "strategy": "merge"}]}, 400,
                 "invalid_pattern", id="rule-double-star"),
    pytest.param({"rules": [{"pattern": "", "strategy": "merge"}]}, 400, "invalid_pattern",
                 id="rule-empty-pattern"),
    pytest.param({"rules": [{"pattern": "a//b", "strategy": "merge"}]}, 400, "invalid_pattern",
                 id="rule-empty-segment"),
    pytest.param({"rules": [{"pattern": "a*b/c", "strategy": "merge"}]}, 400, "invalid_pattern",
                 id="rule-star-mid-segment"),
    pytest.param({"rules": [{"strategy": "merge"}]}, 400, "invalid_request",
                 id="rule-without-pattern"),
    pytest.param({"priorities": [{"agent": "a", "priority": "high"}]}, 400, "invalid_request",
                 id="priority-a-string"),
    pytest.param({"priorities": [{"agent": "a", "priority": 1.5}]}, 400, "invalid_request",
                 id="priority-a-float"),
    pytest.param({"priorities": [{"priority": 3}]}, 400, "invalid_request",
                 id="priority-without-agent"),
    pytest.param({"priorities": [{"agent": "", "priority": 3}]}, 400, "invalid_request",
                 id="priority-empty-agent"),
    pytest.param({"priorities": [{"agent": "a" * 201, "priority": 3}]}, 400, "invalid_request",
                 id="priority-agent-too-long"),
    pytest.param({"priorities": {"a": 1}}, 400, "invalid_request", id="priorities-an-object"),
    pytest.param({"priorities": [{"agent": "a", "priority": 1, "x": 1}]}, 400,
                 "invalid_request", id="priority-unknown-field"),
    pytest.param({"default_priority": "low"}, 400, "invalid_request", id="default-priority"),
    pytest.param({"merge_arrays": "zip"}, 400, "invalid_request", id="merge-arrays"),
    pytest.param({"history_limit": -1}, 400, "invalid_request", id="history-negative"),
    pytest.param({"history_limit": 1_000_000}, 400, "invalid_request", id="history-huge"),
    pytest.param({"default_ttl_seconds": 0}, 400, "invalid_ttl", id="ttl-zero"),
    pytest.param({"default_ttl_seconds": -5}, 400, "invalid_ttl", id="ttl-negative"),
    pytest.param({"default_ttl_seconds": 10**12}, 400, "invalid_ttl", id="ttl-over-the-max"),
    pytest.param({"shares": [{"namespace": "b-*", "permissions": ["write"]}]}, 400,
                 "invalid_request", id="share-write"),
    pytest.param({"shares": [{"namespace": "B A", "permissions": ["read"]}]}, 400,
                 "invalid_namespace", id="share-bad-namespace"),
    pytest.param({"shares": [{"namespace": "", "permissions": ["read"]}]}, 400,
                 "invalid_namespace", id="share-empty-namespace"),
    pytest.param({"shares": [{"namespace": "Acme-*", "permissions": ["read"]}]}, 400,
                 "invalid_namespace", id="share-uppercase-namespace"),
    pytest.param({"shares": [{"namespace": "ácme", "permissions": ["read"]}]}, 400,
                 "invalid_namespace", id="share-non-ascii-namespace"),
    pytest.param({"shares": [{"namespace": "a" * 64, "permissions": ["read"]}]}, 400,
                 "invalid_namespace", id="share-long-namespace"),
    pytest.param({"shares": [{"namespace": "b-*", "permissions": []}]}, 400,
                 "invalid_request", id="share-no-permissions"),
    pytest.param({"strategi": "merge"}, 400, "invalid_request", id="unknown-field"),
    pytest.param({"revision": 9}, 400, "invalid_request", id="revision-is-not-settable"),
    pytest.param({"updated_by": "mallory"}, 400, "invalid_request", id="updated-by-not-settable"),
    pytest.param([], 400, "invalid_request", id="an-array"),
    pytest.param(b"null", 400, "invalid_request", id="null"),
    pytest.param(b'"merge"', 400, "invalid_request", id="a-string"),
    pytest.param(b"strategy=merge", 400, "invalid_json", id="not-json"),
    pytest.param(b'{"strategy": "merge"', 400, "invalid_json", id="truncated-json"),
    pytest.param(b"", 400, "invalid_json", id="empty-body"),
    pytest.param(b'{"strategy": "merge", "rules": [' + b" " * 300_000 + b"]}", 413,
                 "payload_too_large", id="too-large"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_CONFIGS)
def test_bad_configuration_is_refused_and_changes_nothing(
    admin: httpx.Client, ns: str, body: Any, status: int, code: str
) -> None:
    previous = admin.put(config_path(ns), json={
        "strategy": "merge", "priorities": [{"agent": "a", "priority": 2}],
        "rules": [{"pattern": "log/*", "strategy": "last-write-wins"}]}).json()
    put_ok(admin, ns, "doc", {"a": 1})
    if isinstance(body, bytes):
        response = admin.put(config_path(ns), content=body,
                             headers={"Content-Type": "application/json"})
    else:
        response = admin.put(config_path(ns), json=body)
    error = error_of(response, status, code)
    assert error["message"]
    assert admin.get(config_path(ns)).json() == previous
    entry = get(admin, ns, "doc")
    assert (entry["value"], entry["version"]) == ({"a": 1}, 1)
    assert put_ok(admin, ns, "doc", {"b": 2})["value"] == {"a": 1, "b": 2}  # still merging


def test_history_limit_ceiling_is_a_setting(broker_factory: Callable[..., Broker],
                                            ns: str) -> None:
    handle = broker_factory("embedded", max_history_limit=5, history_limit=3)
    with handle.client() as admin:
        error = error_of(admin.put(config_path(ns), json={"history_limit": 6}), 400,
                         "invalid_request")
        assert "between 0 and 5" in error["message"]
        assert admin.put(config_path(ns), json={"history_limit": 5}).status_code == 200


def test_configuration_body_must_be_json(admin: httpx.Client, ns: str) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = admin.put(config_path(ns), content=b'{"strategy": "merge"}',
                             headers=headers)
        error_of(response, 415, "unsupported_media_type")
    assert admin.get(config_path(ns)).json()["revision"] == 0


def test_large_priority_numbers_still_order_writers(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    hi = admin.post("/v1/agents", json={"name": "hi", "namespace": ns}).json()
    lo = admin.post("/v1/agents", json={"name": "lo", "namespace": ns}).json()
    admin.put(config_path(ns), json={"strategy": "agent-priority", "priorities": [
        {"agent": hi["agent"]["id"], "priority": 2**62},
        {"agent": lo["agent"]["id"], "priority": -(2**62)}]}).raise_for_status()
    with broker.client(hi["credentials"]["api_key"]) as high, \
            broker.client(lo["credentials"]["api_key"]) as low:
        put_ok(high, ns, "k", "high")
        error_of(put(low, ns, "k", "low"), 409, "write_conflict")


# ---- shares ----


@pytest.fixture
def team(broker: Broker, admin: httpx.Client) -> Iterator[tuple[str, httpx.Client, str]]:
    """A namespace `b-...` and a client whose key is granted on it only (read, write,
    subscribe): (namespace, client, token)."""
    namespace = f"b-{uuid.uuid4().hex[:10]}"
    token, _ = new_key(admin, (namespace, ["read", "write", "subscribe"]))
    with broker.client(token) as client:
        yield namespace, client, token


def test_without_a_share_other_namespaces_are_forbidden(
    broker: Broker, admin: httpx.Client, ns: str, team: tuple[str, httpx.Client, str]
) -> None:
    _, client, token = team
    put_ok(admin, ns, "doc/1", {"a": 1})
    error_of(client.get(f"/v1/namespaces/{ns}/memory/doc/1"), 403, "forbidden")
    error_of(client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}), 403,
             "forbidden")
    assert subscribe_status(broker, token, ns) == 403


def test_share_grants_read_and_subscribe_but_never_write(
    broker: Broker, admin: httpx.Client, ns: str, team: tuple[str, httpx.Client, str]
) -> None:
    team_ns, client, token = team
    put_ok(admin, ns, "doc/1", {"a": 1})
    admin.put(config_path(ns), json={"shares": [
        {"namespace": "b-*", "permissions": ["read", "subscribe"]}]}).raise_for_status()
    assert client.get(f"/v1/namespaces/{ns}/memory/doc/1").json()["value"] == {"a": 1}
    page = client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "doc/*"}).json()
    assert [e["key"] for e in page["entries"]] == ["doc/1"]
    history = client.get(f"/v1/namespaces/{ns}/history/doc/1").json()["versions"]
    assert [v["version"] for v in history] == [1]
    event = replayed_event(broker.url, ns, "doc/1", 1, token=token)
    assert event["event"] == "put" and event["value"] == {"a": 1}
    error_of(put(client, ns, "doc/1", {"a": 2}), 403, "forbidden")
    error_of(put(client, ns, "doc/2", {"a": 2}), 403, "forbidden")
    error_of(client.delete(f"/v1/namespaces/{ns}/memory/doc/1"), 403, "forbidden")
    error_of(client.get(config_path(ns)), 403, "forbidden")
    error_of(client.put(config_path(ns), json={}), 403, "forbidden")
    error_of(client.put(f"/v1/namespaces/{ns}/schemas/s", json={"pattern": "*", "schema": {}}),
             403, "forbidden")
    entry = get(admin, ns, "doc/1")
    assert (entry["value"], entry["version"]) == ({"a": 1}, 1)
    # the key's own namespace is unaffected
    assert put(client, team_ns, "mine", 1).status_code == 201


def test_read_only_share_does_not_allow_subscribing(
    broker: Broker, admin: httpx.Client, ns: str, team: tuple[str, httpx.Client, str]
) -> None:
    _, client, token = team
    put_ok(admin, ns, "doc/1", 1)
    admin.put(config_path(ns), json={"shares": [
        {"namespace": "b-*", "permissions": ["read"]}]}).raise_for_status()
    assert client.get(f"/v1/namespaces/{ns}/memory/doc/1").status_code == 200
    assert subscribe_status(broker, token, ns) == 403


@pytest.mark.parametrize(
    ("share", "grants", "allowed"),
    [
        pytest.param("c-*", ["read", "write", "subscribe"], False, id="share-to-other-glob"),
        pytest.param("b-*", ["write"], False, id="grant-without-read"),
        pytest.param("b-*", ["admin"], True, id="grant-with-admin"),
        pytest.param("{team}", ["read"], True, id="share-to-exact-namespace"),
        pytest.param("b-other", ["read"], False, id="share-to-another-exact-namespace"),
    ],
)
def test_share_applies_only_to_what_it_names(
    broker: Broker, admin: httpx.Client, ns: str, share: str, grants: list[str], allowed: bool
) -> None:
    team_ns = f"b-{uuid.uuid4().hex[:10]}"
    token, _ = new_key(admin, (team_ns, grants))
    put_ok(admin, ns, "doc/1", 1)
    admin.put(config_path(ns), json={"shares": [
        {"namespace": share.format(team=team_ns), "permissions": ["read", "subscribe"]}]}
    ).raise_for_status()
    with broker.client(token) as client:
        response = client.get(f"/v1/namespaces/{ns}/memory/doc/1")
    assert response.status_code == (200 if allowed else 403), response.text


def test_removing_a_share_takes_effect_at_once(
    broker: Broker, admin: httpx.Client, ns: str, team: tuple[str, httpx.Client, str]
) -> None:
    _, client, token = team
    put_ok(admin, ns, "doc/1", 1)
    admin.put(config_path(ns), json={"shares": [
        {"namespace": "b-*", "permissions": ["read", "subscribe"]}]}).raise_for_status()
    assert client.get(f"/v1/namespaces/{ns}/memory/doc/1").status_code == 200
    admin.put(config_path(ns), json={"shares": []}).raise_for_status()
    error_of(client.get(f"/v1/namespaces/{ns}/memory/doc/1"), 403, "forbidden")
    assert subscribe_status(broker, token, ns) == 403
