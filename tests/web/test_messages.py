"""The protocol message endpoint (POST /v1/messages) over real HTTP, on both backends."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from broker.core.grammar import NAMESPACE_RE
from tests.support.brokers import Broker

ENVELOPE = {"memp", "type", "id", "reply_to", "timestamp", "namespace"}


def now_ms() -> int:
    return int(time.time() * 1000)


def message(kind: str, ns: str | None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"memp": "1.0", "type": kind, "id": f"m-{uuid.uuid4().hex}",
                            **fields}
    if ns is not None:
        body["namespace"] = ns
    return body


def send(client: httpx.Client, body: Any) -> httpx.Response:
    return client.post("/v1/messages", json=body)


def reply_to(client: httpx.Client, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    """Send one message, check the reply envelope and the HTTP status, return the reply."""
    response = send(client, body)
    assert response.status_code == status, response.text
    reply: dict[str, Any] = response.json()
    check_envelope(reply, body)
    return reply


def check_envelope(reply: dict[str, Any], sent: dict[str, Any]) -> None:
    assert set(reply) >= ENVELOPE
    assert reply["memp"] == "1.0"
    assert reply["type"] in ("ack", "result", "error")
    assert str(uuid.UUID(reply["id"])) == reply["id"]
    assert reply["id"] != sent.get("id")
    assert reply["reply_to"] == sent.get("id")
    assert isinstance(reply["timestamp"], int) and reply["timestamp"] > 0
    # Errors too: a reply names the namespace of the message it answers, when it is one.
    named = sent.get("namespace")
    valid = isinstance(named, str) and NAMESPACE_RE.fullmatch(named)
    assert reply["namespace"] == (named if valid else None)


def error_code(reply: dict[str, Any]) -> str:
    assert reply["type"] == "error"
    code: str = reply["error"]["code"]
    return code


# ---- every message type ----


def test_memory_put_get_delete_and_history(admin: httpx.Client, ns: str) -> None:
    put = reply_to(admin, message("memory.put", ns, key="customer/123",
                                  value={"plan": "pro", "acv": 12000}))
    assert put["type"] == "ack"
    entry = put["entry"]
    assert (entry["namespace"], entry["key"], entry["version"]) == (ns, "customer/123", 1)
    assert entry["value"] == {"plan": "pro", "acv": 12000}
    assert entry["agent_id"] == "admin" and entry["deleted"] is False
    assert put["warnings"] == []

    got = reply_to(admin, message("memory.get", ns, key="customer/123"))
    assert got["type"] == "result"
    assert got["entry"]["value"] == {"plan": "pro", "acv": 12000}
    assert got["entry"]["id"] == entry["id"]

    deleted = reply_to(admin, message("memory.delete", ns, key="customer/123"))
    assert deleted["type"] == "ack"
    assert deleted["entry"]["deleted"] is True and deleted["entry"]["version"] == 2
    gone = reply_to(admin, message("memory.get", ns, key="customer/123"), 404)
    assert error_code(gone) == "not_found"

    history = reply_to(admin, message("memory.history", ns, key="customer/123"))
    assert history["type"] == "result" and history["key"] == "customer/123"
    assert [v["version"] for v in history["versions"]] == [2, 1]
    assert history["versions"][1]["value"] == {"plan": "pro", "acv": 12000}
    limited = reply_to(admin, message("memory.history", ns, key="customer/123", limit=1))
    assert [v["version"] for v in limited["versions"]] == [2]


def test_memory_query_pages_by_pattern(admin: httpx.Client, ns: str) -> None:
    keys = [f"customer/{i}" for i in range(5)] + ["customer/1/notes", "agent/q"]
    for key in keys:
        reply_to(admin, message("memory.put", ns, key=key, value=key))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        fields: dict[str, Any] = {"pattern": "customer/*", "limit": 2}
        if cursor:
            fields["cursor"] = cursor
        page = reply_to(admin, message("memory.query", ns, **fields))
        assert page["type"] == "result"
        seen += [e["key"] for e in page["entries"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(k for k in keys if k.startswith("customer/"))
    assert pages >= 3
    middle = reply_to(admin, message("memory.query", ns, pattern="customer/*/notes"))
    assert [e["key"] for e in middle["entries"]] == ["customer/1/notes"]
    assert [e["value"] for e in middle["entries"]] == ["customer/1/notes"]


def test_agent_register_get_and_list(admin: httpx.Client, ns: str) -> None:
    registered = reply_to(admin, message("agent.register", ns, name="crm-bot",
                                         framework="langchain"))
    assert registered["type"] == "ack"
    agent = registered["agent"]
    assert uuid.UUID(agent["id"]).version == 4
    assert (agent["name"], agent["framework"], agent["namespace"]) == ("crm-bot", "langchain", ns)
    assert registered["credentials"]["agent_id"] == agent["id"]
    assert registered["credentials"]["api_key"].startswith("memp_sk_")

    got = reply_to(admin, message("agent.get", ns, agent=agent["id"]))
    assert got["type"] == "result" and got["agent"] == agent
    missing = reply_to(admin, message("agent.get", ns, agent=str(uuid.uuid4())), 404)
    assert error_code(missing) == "not_found"

    second = reply_to(admin, message("agent.register", ns, name="support-bot"))
    listed = reply_to(admin, message("agent.list", ns))
    assert listed["type"] == "result"
    assert [a["id"] for a in listed["agents"]] == [agent["id"], second["agent"]["id"]]
    assert listed["next_cursor"] is None
    first_page = reply_to(admin, message("agent.list", ns, limit=1))
    assert [a["id"] for a in first_page["agents"]] == [agent["id"]]
    rest = reply_to(admin, message("agent.list", ns, limit=1, cursor=first_page["next_cursor"]))
    assert [a["id"] for a in rest["agents"]] == [second["agent"]["id"]]


def test_the_reply_answers_a_message_without_an_id(admin: httpx.Client, ns: str) -> None:
    body = message("memory.put", ns, key="k", value=1)
    del body["id"]
    reply = reply_to(admin, body)
    assert reply["reply_to"] is None and reply["entry"]["version"] == 1


def test_memp_field_defaults_to_1_0(admin: httpx.Client, ns: str) -> None:
    body = message("memory.put", ns, key="k", value=1)
    del body["memp"]
    assert reply_to(admin, body)["type"] == "ack"


# ---- errors of a single message: the HTTP status follows the reply ----


def test_if_version_and_if_absent_fail_with_412(admin: httpx.Client, ns: str) -> None:
    reply_to(admin, message("memory.put", ns, key="cas", value="a"))
    stale = reply_to(admin, message("memory.put", ns, key="cas", value="b", if_version=7), 412)
    assert error_code(stale) == "precondition_failed"
    assert stale["error"]["details"]["current_version"] == 1
    exists = reply_to(admin, message("memory.put", ns, key="cas", value="b", if_absent=True), 412)
    assert error_code(exists) == "precondition_failed"
    stale_delete = reply_to(admin, message("memory.delete", ns, key="cas", if_version=3), 412)
    assert error_code(stale_delete) == "precondition_failed"
    assert reply_to(admin, message("memory.get", ns, key="cas"))["entry"]["value"] == "a"
    fresh = reply_to(admin, message("memory.put", ns, key="cas", value="b", if_version=1))
    assert fresh["entry"]["version"] == 2
    created = reply_to(admin, message("memory.put", ns, key="new", value=1, if_absent=True))
    assert created["entry"]["version"] == 1


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(message("memory.get", "NS", key="k"), 400, "invalid_namespace",
                     id="bad-namespace"),
        pytest.param(message("memory.get", None, key="k"), 400, "invalid_namespace",
                     id="no-namespace"),
        pytest.param(message("memory.put", "ok-ns", key="../x", value=1), 400, "invalid_key",
                     id="bad-key"),
        pytest.param(message("memory.put", "ok-ns", key="a//b", value=1), 400, "invalid_key",
                     id="empty-segment"),
        pytest.param(message("memory.put", "ok-ns", key="k" * 1025, value=1), 400,
                     "invalid_key", id="long-key"),
        pytest.param(message("memory.query", "ok-ns", pattern="a*/b"), 400, "invalid_pattern",
                     id="bad-pattern"),
        pytest.param(message("memory.put", "ok-ns", key="k", value=1, ttl_seconds=-1), 400,
                     "invalid_ttl", id="negative-ttl"),
        pytest.param(message("memory.put", "ok-ns", key="k", value=1,
                             timestamp=now_ms() + 3_600_000), 400, "invalid_timestamp",
                     id="future-timestamp"),
        pytest.param(message("memory.put", "ok-ns", key="k"), 400, "invalid_request",
                     id="missing-value"),
        pytest.param(message("memory.fly", "ok-ns"), 400, "invalid_request", id="unknown-type"),
        pytest.param(message("memory.get", "ok-ns", key="k", extra=1), 400, "invalid_request",
                     id="unknown-field"),
        pytest.param({**message("memory.get", "ok-ns", key="k"), "memp": "2.0"}, 400,
                     "invalid_request", id="protocol-version"),
        pytest.param({**message("memory.get", "ok-ns", key="k"), "id": "has space"}, 400,
                     "invalid_request", id="bad-message-id"),
        pytest.param(message("agent.register", "ok-ns", name=""), 400, "invalid_request",
                     id="register-empty-name"),
    ],
)
def test_bad_messages_get_their_documented_error(admin: httpx.Client, body: dict[str, Any],
                                                 status: int, code: str) -> None:
    if "namespace" in body:  # a fresh namespace per test, so no test sees another's data
        fresh = f"ok-{uuid.uuid4().hex[:8]}"
        body = {**body, "namespace": body["namespace"].replace("ok-ns", fresh)}
    response = send(admin, body)
    assert response.status_code == status, response.text
    reply = response.json()
    assert reply["type"] == "error" and reply["error"]["code"] == code
    assert set(reply["error"]) == {"code", "message", "details"}


def test_malformed_json_is_invalid_json_with_no_reply_to(admin: httpx.Client) -> None:
    response = admin.post("/v1/messages", content=b'{"type": "memory.get", ',
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    reply = response.json()
    assert reply["type"] == "error" and reply["error"]["code"] == "invalid_json"
    assert reply["reply_to"] is None


def test_wrong_content_type_and_missing_token(broker: Broker, admin: httpx.Client) -> None:
    wrong = admin.post("/v1/messages", content=b"{}", headers={"Content-Type": "text/plain"})
    assert wrong.status_code == 415
    assert wrong.json()["error"]["code"] == "unsupported_media_type"
    with broker.client(None) as anonymous:
        response = send(anonymous, message("memory.get", "ok", key="k"))
    assert response.status_code == 401


def test_a_token_for_one_namespace_is_forbidden_in_another(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    key = admin.post("/v1/keys", json={"grants": [
        {"namespace": ns, "permissions": ["read", "write"]}]}).json()["api_key"]
    with broker.client(key) as client:
        assert reply_to(client, message("memory.put", ns, key="k", value=1))["type"] == "ack"
        denied = reply_to(client, message("memory.get", f"{ns}-other", key="k"), 403)
        assert error_code(denied) == "forbidden"
        denied = reply_to(client, message("memory.put", f"{ns}-other", key="k", value=1), 403)
        assert error_code(denied) == "forbidden"
    untouched = reply_to(admin, message("memory.get", f"{ns}-other", key="k"), 404)
    assert error_code(untouched) == "not_found"


def test_an_agent_cannot_claim_to_be_another(broker: Broker, admin: httpx.Client,
                                            ns: str) -> None:
    me = reply_to(admin, message("agent.register", ns, name="me"))
    other = reply_to(admin, message("agent.register", ns, name="other"))
    with broker.client(me["credentials"]["api_key"]) as client:
        spoofed = reply_to(client, message("memory.put", ns, key="k", value=1,
                                           agent_id=other["agent"]["id"]), 403)
        assert error_code(spoofed) == "forbidden"
        honest = reply_to(client, message("memory.put", ns, key="k", value=2,
                                          agent_id=me["agent"]["id"]))
        assert honest["entry"]["agent_id"] == me["agent"]["id"]
        assert honest["entry"]["version"] == 1


# ---- batches ----


def test_batch_runs_in_order_with_one_reply_each(admin: httpx.Client, ns: str) -> None:
    batch = [
        message("memory.put", ns, key="k", value=1),
        message("memory.get", ns, key="k"),
        message("memory.put", ns, key="k", value=2, if_version=1),
        message("memory.get", ns, key="missing"),
        message("memory.put", ns, key="k", value=3, if_version=1),
        message("memory.get", ns, key="k"),
        message("memory.delete", ns, key="k"),
        message("memory.history", ns, key="k"),
        message("memory.query", ns, pattern="*"),
        message("agent.register", ns, name="batch-bot"),
        message("agent.list", ns),
    ]
    response = send(admin, batch)
    assert response.status_code == 200
    replies = response.json()
    assert len(replies) == len(batch)
    for reply, sent in zip(replies, batch, strict=True):
        check_envelope(reply, sent)
    assert [r["type"] for r in replies] == [
        "ack", "result", "ack", "error", "error", "result", "ack", "result", "result", "ack",
        "result"]
    assert replies[1]["entry"]["value"] == 1
    assert replies[2]["entry"]["version"] == 2
    assert replies[3]["error"]["code"] == "not_found"
    assert replies[4]["error"]["code"] == "precondition_failed"
    assert replies[5]["entry"]["value"] == 2
    assert replies[6]["entry"]["version"] == 3
    assert [v["version"] for v in replies[7]["versions"]] == [3, 2, 1]
    assert replies[8]["entries"] == []
    assert [a["id"] for a in replies[10]["agents"]] == [replies[9]["agent"]["id"]]


def test_batch_items_that_are_not_messages_get_error_replies(admin: httpx.Client,
                                                              ns: str) -> None:
    batch: list[Any] = [message("memory.put", ns, key="a", value=1), 42, {"type": "nope"},
                        message("memory.put", ns, key="b", value=2)]
    response = send(admin, batch)
    assert response.status_code == 200
    replies = response.json()
    assert [r["type"] for r in replies] == ["ack", "error", "error", "ack"]
    assert replies[1]["error"]["code"] == "invalid_request"
    assert replies[1]["reply_to"] is None
    assert reply_to(admin, message("memory.get", ns, key="b"))["entry"]["value"] == 2


def test_batch_over_the_limit_is_refused_whole(broker: Broker, admin: httpx.Client,
                                               ns: str) -> None:
    limit = broker.app.state.services.settings.max_batch
    batch = [message("memory.put", ns, key=f"k{i}", value=i) for i in range(limit + 1)]
    response = send(admin, batch)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.json()["error"]["details"]["limit"] == limit
    query = reply_to(admin, message("memory.query", ns, pattern="*"))
    assert query["entries"] == []
    full = send(admin, batch[:limit])
    assert full.status_code == 200 and len(full.json()) == limit


def test_empty_batch_is_invalid(admin: httpx.Client) -> None:
    response = send(admin, [])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


# ---- message ids make retries safe ----


def test_a_retried_put_is_applied_once_with_the_same_reply(admin: httpx.Client, ns: str) -> None:
    body = message("memory.put", ns, key="once", value={"n": 1})
    first = reply_to(admin, body)
    second = reply_to(admin, body)
    assert second["entry"] == first["entry"]
    assert {k: v for k, v in second.items() if k not in ("id", "timestamp")} == \
        {k: v for k, v in first.items() if k not in ("id", "timestamp")}
    history = reply_to(admin, message("memory.history", ns, key="once"))
    assert [v["version"] for v in history["versions"]] == [1]


def test_a_retried_put_does_not_undo_a_later_write(admin: httpx.Client, ns: str) -> None:
    body = message("memory.put", ns, key="k", value="first")
    reply_to(admin, body)
    reply_to(admin, message("memory.put", ns, key="k", value="second"))
    replay = reply_to(admin, body)
    assert replay["entry"]["version"] == 1
    current = reply_to(admin, message("memory.get", ns, key="k"))["entry"]
    assert (current["version"], current["value"]) == (2, "second")


def test_a_retried_delete_answers_like_the_first(admin: httpx.Client, ns: str) -> None:
    reply_to(admin, message("memory.put", ns, key="k", value=1))
    body = message("memory.delete", ns, key="k")
    first = reply_to(admin, body)
    second = reply_to(admin, body)
    assert second["type"] == "ack" and second["entry"] == first["entry"]
    history = reply_to(admin, message("memory.history", ns, key="k"))
    assert [v["version"] for v in history["versions"]] == [2, 1]


def test_a_retried_failure_answers_with_the_same_error(admin: httpx.Client, ns: str) -> None:
    reply_to(admin, message("memory.put", ns, key="k", value=1))
    body = message("memory.put", ns, key="k", value=2, if_version=5)
    first = reply_to(admin, body, 412)
    reply_to(admin, message("memory.put", ns, key="k", value=3))
    second = reply_to(admin, body, 412)
    assert second["error"] == first["error"]


def test_a_retried_register_creates_one_agent(admin: httpx.Client, ns: str) -> None:
    body = message("agent.register", ns, name="retry-bot")
    first = reply_to(admin, body)
    second = reply_to(admin, body)
    assert second["agent"] == first["agent"]
    assert second["credentials"] == first["credentials"]
    listed = reply_to(admin, message("agent.list", ns))
    assert [a["id"] for a in listed["agents"]] == [first["agent"]["id"]]


def test_a_retry_inside_one_batch_is_applied_once(admin: httpx.Client, ns: str) -> None:
    body = message("memory.put", ns, key="k", value=1)
    replies = send(admin, [body, body]).json()
    assert replies[0]["entry"] == replies[1]["entry"]
    assert reply_to(admin, message("memory.get", ns, key="k"))["entry"]["version"] == 1


def test_the_same_id_from_different_agents_is_independent(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    keys = [reply_to(admin, message("agent.register", ns, name=name))["credentials"]["api_key"]
            for name in ("alpha", "beta")]
    shared_id = f"shared-{uuid.uuid4().hex}"
    entries = []
    for api_key, value in zip(keys, ("from alpha", "from beta"), strict=True):
        with broker.client(api_key) as client:
            body = {**message("memory.put", ns, key="k", value=value), "id": shared_id}
            entries.append(reply_to(client, body)["entry"])
    assert [e["version"] for e in entries] == [1, 2]
    assert entries[0]["agent_id"] != entries[1]["agent_id"]
    current = reply_to(admin, message("memory.get", ns, key="k"))["entry"]
    assert current["value"] == "from beta"


# ---- the message timestamp is the write timestamp ----


def test_message_timestamp_orders_writes(admin: httpx.Client, ns: str) -> None:
    now = now_ms()
    written = reply_to(admin, message("memory.put", ns, key="lww", value="new", timestamp=now))
    assert written["entry"]["timestamp"] == now
    older = reply_to(admin, message("memory.put", ns, key="lww", value="old",
                                    timestamp=now - 1000), 409)
    assert error_code(older) == "write_conflict"
    winner = older["error"]["details"]["winner"]
    assert (winner["value"], winner["timestamp"], winner["version"]) == ("new", now, 1)
    stale_delete = reply_to(admin, message("memory.delete", ns, key="lww",
                                           timestamp=now - 500), 409)
    assert error_code(stale_delete) == "write_conflict"
    assert reply_to(admin, message("memory.get", ns, key="lww"))["entry"]["value"] == "new"
    newer = reply_to(admin, message("memory.put", ns, key="lww", value="newer",
                                    timestamp=now + 1))
    assert newer["entry"]["version"] == 2 and newer["entry"]["timestamp"] == now + 1


# ---- REST and messages are the same operations ----


def test_rest_writes_are_visible_to_messages(admin: httpx.Client, ns: str) -> None:
    rest = admin.put(f"/v1/namespaces/{ns}/memory/customer/1", json={"value": {"plan": "pro"}})
    assert rest.status_code == 201
    got = reply_to(admin, message("memory.get", ns, key="customer/1"))
    assert got["entry"] == rest.json()
    queried = reply_to(admin, message("memory.query", ns, pattern="customer/*"))
    rest_query = admin.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "customer/*"})
    assert queried["entries"] == rest_query.json()["entries"]
    admin.delete(f"/v1/namespaces/{ns}/memory/customer/1")
    assert error_code(reply_to(admin, message("memory.get", ns, key="customer/1"), 404)) == \
        "not_found"


def test_message_writes_are_visible_to_rest(admin: httpx.Client, ns: str) -> None:
    put = reply_to(admin, message("memory.put", ns, key="customer/2", value=[1, 2]))
    rest = admin.get(f"/v1/namespaces/{ns}/memory/customer/2")
    assert rest.status_code == 200
    assert rest.json() == put["entry"]
    assert rest.headers["etag"] == '"1"'
    cas = admin.put(f"/v1/namespaces/{ns}/memory/customer/2", json={"value": [3]},
                    headers={"If-Match": '"1"'})
    assert cas.status_code == 200
    reply_to(admin, message("memory.delete", ns, key="customer/2", if_version=2))
    assert admin.get(f"/v1/namespaces/{ns}/memory/customer/2").status_code == 404
    history = admin.get(f"/v1/namespaces/{ns}/history/customer/2").json()["versions"]
    assert [v["version"] for v in history] == [3, 2, 1]


def test_agents_are_shared_between_rest_and_messages(admin: httpx.Client, ns: str) -> None:
    by_rest = admin.post("/v1/agents", json={"name": "rest-bot", "namespace": ns}).json()
    by_message = reply_to(admin, message("agent.register", ns, name="message-bot"))
    assert reply_to(admin, message("agent.get", ns, agent=by_rest["agent"]["id"]))["agent"] == \
        by_rest["agent"]
    rest_get = admin.get(f"/v1/namespaces/{ns}/agents/{by_message['agent']['id']}")
    assert rest_get.json() == by_message["agent"]
    listed = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert [a["id"] for a in listed] == [by_rest["agent"]["id"], by_message["agent"]["id"]]


def test_rest_idempotency_key_and_message_id_share_one_retry_window(
    admin: httpx.Client, ns: str
) -> None:
    shared_id = f"op-{uuid.uuid4().hex}"
    rest = admin.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1},
                     headers={"Idempotency-Key": shared_id})
    retried = reply_to(admin, {**message("memory.put", ns, key="k", value=1), "id": shared_id})
    assert retried["entry"] == rest.json()
    assert admin.get(f"/v1/namespaces/{ns}/memory/k").json()["version"] == 1
