"""Agents over REST on both backends: register, get, list, and what the credentials may do."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.amp import TestClock, clocked_broker
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker

AGENT_FIELDS = {"id", "name", "framework", "namespace", "created_at", "last_seen"}


def now_ms() -> int:
    return int(time.time() * 1000)


def register(client: httpx.Client, ns: str, name: str = "my-agent", framework: str = "langchain",
             headers: dict[str, str] | None = None) -> httpx.Response:
    return client.post("/v1/agents", json={"name": name, "namespace": ns, "framework": framework},
                       headers=headers)


def registered(client: httpx.Client, ns: str, name: str = "my-agent") -> dict[str, Any]:
    response = register(client, ns, name)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def create_key(admin: httpx.Client, grants: list[dict[str, Any]]) -> str:
    response = admin.post("/v1/keys", json={"grants": grants, "name": "registrar"})
    assert response.status_code == 201, response.text
    api_key: str = response.json()["api_key"]
    return api_key


def list_all(client: httpx.Client, ns: str, limit: int) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        response = client.get(f"/v1/namespaces/{ns}/agents", params=params)
        assert response.status_code == 200, response.text
        pages.append(response.json()["agents"])
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return pages


def test_register_returns_the_agent_and_credentials(admin: httpx.Client, ns: str) -> None:
    before = now_ms()
    response = register(admin, ns, "support-bot", "crewai")
    after = now_ms()
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"agent", "credentials"}
    agent = body["agent"]
    assert set(agent) == AGENT_FIELDS
    parsed = uuid.UUID(agent["id"])
    assert parsed.version == 4 and str(parsed) == agent["id"]
    assert agent["name"] == "support-bot"
    assert agent["framework"] == "crewai"
    assert agent["namespace"] == ns
    assert before <= agent["created_at"] <= after
    assert agent["last_seen"] == agent["created_at"]
    credentials = body["credentials"]
    assert credentials["agent_id"] == agent["id"]
    assert credentials["api_key"].startswith("memp_sk_live_")
    assert credentials["key_id"].startswith("key_")


def test_framework_defaults_to_custom(admin: httpx.Client, ns: str) -> None:
    response = admin.post("/v1/agents", json={"name": "plain", "namespace": ns})
    assert response.status_code == 201
    assert response.json()["agent"]["framework"] == "custom"


def test_get_agent_returns_the_registered_record(admin: httpx.Client, ns: str) -> None:
    agent = registered(admin, ns)["agent"]
    response = admin.get(f"/v1/namespaces/{ns}/agents/{agent['id']}")
    assert response.status_code == 200
    assert response.json() == agent


@pytest.mark.parametrize(
    "agent_id",
    [
        pytest.param(str(uuid.uuid4()), id="unknown-uuid4"),
        pytest.param("not-an-agent", id="malformed"),
        pytest.param("00000000-0000-0000-0000-000000000000", id="nil-uuid"),
        pytest.param("x" * 300, id="long"),
    ],
)
def test_get_unknown_agent_is_404(admin: httpx.Client, ns: str, agent_id: str) -> None:
    registered(admin, ns)
    response = admin.get(f"/v1/namespaces/{ns}/agents/{agent_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_agent_is_not_found_through_another_namespace(admin: httpx.Client, ns: str) -> None:
    agent = registered(admin, ns)["agent"]
    response = admin.get(f"/v1/namespaces/{ns}-other/agents/{agent['id']}")
    assert response.status_code == 404


@pytest.mark.parametrize("backend", BACKENDS)
def test_agents_registered_in_one_millisecond_list_in_registration_order(
        backend: str, redis_url: str, ns: str) -> None:
    clock = TestClock()  # stands still: every registration arrives in the same millisecond
    with clocked_broker(backend, redis_url, f"{ns}-amp", clock) as broker:
        agents = [registered(broker.http, ns, f"agent-{i}")["agent"] for i in range(5)]
        # Each is stamped a millisecond after the one before, which orders the listing.
        assert [a["created_at"] for a in agents] == [clock.now + i for i in range(5)]
        listed = [a["id"] for page in list_all(broker.http, ns, 2) for a in page]
        assert listed == [a["id"] for a in agents]


def test_list_pages_through_agents_in_registration_order(admin: httpx.Client, ns: str) -> None:
    ids = [registered(admin, ns, f"agent-{i}")["agent"]["id"] for i in range(7)]
    pages = list_all(admin, ns, 3)
    assert [len(page) for page in pages] == [3, 3, 1]
    assert [a["id"] for page in pages for a in page] == ids
    assert [a["name"] for a in pages[1]] == ["agent-3", "agent-4", "agent-5"]
    everything = admin.get(f"/v1/namespaces/{ns}/agents").json()
    assert [a["id"] for a in everything["agents"]] == ids
    assert everything["next_cursor"] is None


def test_listing_an_empty_namespace(admin: httpx.Client, ns: str) -> None:
    response = admin.get(f"/v1/namespaces/{ns}/agents")
    assert response.status_code == 200
    assert response.json() == {"agents": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("params", "code"),
    [
        pytest.param({"cursor": "garbage"}, "invalid_request", id="foreign-cursor"),
        pytest.param({"limit": "0"}, "invalid_request", id="zero-limit"),
        pytest.param({"limit": "-1"}, "invalid_request", id="negative-limit"),
        pytest.param({"limit": "ten"}, "invalid_request", id="text-limit"),
    ],
)
def test_list_refuses_bad_paging(admin: httpx.Client, ns: str, params: dict[str, str],
                                 code: str) -> None:
    response = admin.get(f"/v1/namespaces/{ns}/agents", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


def test_idempotency_key_registers_once(admin: httpx.Client, ns: str) -> None:
    headers = {"Idempotency-Key": f"register-{uuid.uuid4().hex}"}
    first = register(admin, ns, headers=headers)
    second = register(admin, ns, headers=headers)
    assert first.status_code == 201
    assert second.status_code == first.status_code
    assert second.json() == first.json()
    other = admin.post("/v1/agents", json={"name": "my-agent", "namespace": ns,
                                           "framework": "langchain", "new": True},
                       headers={"Idempotency-Key": f"register-{uuid.uuid4().hex}"})
    assert other.status_code == 201
    assert other.json()["agent"]["id"] != first.json()["agent"]["id"]
    listed = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert [a["id"] for a in listed] == [first.json()["agent"]["id"],
                                         other.json()["agent"]["id"]]


def _grants_of(admin: httpx.Client, key_id: str) -> list[dict[str, Any]]:
    [record] = [k for k in admin.get("/v1/keys").json()["keys"] if k["id"] == key_id]
    grants: list[dict[str, Any]] = record["grants"]
    return grants


def test_registering_a_name_again_finds_the_agent_with_a_new_key_of_the_same_grants(
        admin: httpx.Client, ns: str) -> None:
    """Idempotent by name for the registering credential: the same agent, a new key with the
    first key's grants (the AMP grant included), and nothing else made; `new` makes another."""
    first = registered(admin, ns, "twice")
    again = register(admin, ns, "twice")
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["reused"] is True and "reused" not in first
    assert body["agent"] == {**first["agent"], "last_seen": body["agent"]["last_seen"]}
    assert body["credentials"]["api_key"] != first["credentials"]["api_key"]
    assert body["credentials"]["agent_id"] == first["agent"]["id"]
    grants = _grants_of(admin, first["credentials"]["key_id"])
    assert any(g["namespace"] == "amp" for g in grants), grants
    assert _grants_of(admin, body["credentials"]["key_id"]) == grants
    with httpx.Client(base_url=str(admin.base_url), headers={
            "Authorization": f"Bearer {body['credentials']['api_key']}"}) as agent:
        written = agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
        assert written.json()["agent_id"] == first["agent"]["id"]
    another = admin.post("/v1/agents", json={"name": "twice", "namespace": ns, "new": True})
    assert another.status_code == 201 and "reused" not in another.json()
    assert another.json()["agent"]["id"] != first["agent"]["id"]
    # the name still finds the first agent, not the one `new` made
    assert register(admin, ns, "twice").json()["agent"]["id"] == first["agent"]["id"]
    listed = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert [a["id"] for a in listed] == [first["agent"]["id"], another.json()["agent"]["id"]]


def test_another_credential_or_a_removed_agent_registers_anew(admin: httpx.Client,
                                                               ns: str) -> None:
    first = registered(admin, ns, "shared-name")
    registrar = create_key(admin, [{"namespace": ns, "permissions": ["read", "write"]}])
    with httpx.Client(base_url=str(admin.base_url),
                      headers={"Authorization": f"Bearer {registrar}"}) as other:
        theirs = register(other, ns, "shared-name")
        assert theirs.status_code == 201 and theirs.json()["agent"]["id"] != first["agent"]["id"]
        assert register(other, ns, "shared-name").json()["agent"]["id"] == \
            theirs.json()["agent"]["id"]
    assert admin.delete(f"/v1/namespaces/{ns}/agents/{first['agent']['id']}").status_code == 204
    after = register(admin, ns, "shared-name")
    assert after.status_code == 201, after.text
    assert after.json()["agent"]["id"] not in (first["agent"]["id"], theirs.json()["agent"]["id"])
    assert register(admin, ns, "shared-name").json()["agent"]["id"] == after.json()["agent"]["id"]


@pytest.mark.parametrize("new", [pytest.param("yes", id="string"), pytest.param(1, id="number"),
                                 pytest.param(None, id="null"), pytest.param([True], id="list")])
def test_new_must_be_a_boolean(admin: httpx.Client, ns: str, new: Any) -> None:
    response = admin.post("/v1/agents", json={"name": "n", "namespace": ns, "new": new})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"] == []


def test_agent_key_writes_are_attributed_to_the_agent(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    body = registered(admin, ns)
    with broker.client(body["credentials"]["api_key"]) as agent:
        put = agent.put(f"/v1/namespaces/{ns}/memory/customer/123",
                        json={"value": {"plan": "pro", "acv": 12000}})
        assert put.status_code == 201
        assert put.json()["agent_id"] == body["agent"]["id"]
        got = agent.get(f"/v1/namespaces/{ns}/memory/customer/123")
        assert got.json()["agent_id"] == body["agent"]["id"]
        me = agent.get(f"/v1/namespaces/{ns}/agents/{body['agent']['id']}")
        assert me.status_code == 200 and me.json()["id"] == body["agent"]["id"]


def test_last_seen_follows_the_agents_requests(
    broker: Broker, broker_factory: Callable[..., Broker], ns: str
) -> None:
    quick = broker_factory(broker.backend, last_seen_flush_seconds=0.05)
    with quick.client() as admin:
        body = registered(admin, ns)
        agent_id = body["agent"]["id"]
        with quick.client(body["credentials"]["api_key"]) as agent:
            written = agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}).json()
        seen_at = written["updated_at"]
        assert seen_at >= body["agent"]["created_at"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            current = admin.get(f"/v1/namespaces/{ns}/agents/{agent_id}").json()
            if current["last_seen"] >= seen_at:
                break
            time.sleep(0.02)
        assert current["last_seen"] == seen_at
        assert current["created_at"] == body["agent"]["created_at"]


@pytest.mark.parametrize(
    "permissions",
    [
        pytest.param(["read", "write"], id="read-write"),
        pytest.param(["admin"], id="admin"),
    ],
)
def test_agent_credentials_cannot_do_more_than_the_registrar(
    broker: Broker, admin: httpx.Client, permissions: list[str]
) -> None:
    ns = f"acme-{uuid.uuid4().hex[:10]}"
    registrar = create_key(admin, [{"namespace": "acme-*", "permissions": permissions}])
    with broker.client(registrar) as client:
        body = registered(client, ns)
        assert register(client, f"other-{ns}").status_code == 403
    with broker.client(body["credentials"]["api_key"]) as agent:
        assert agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}).status_code == 201
        assert agent.get(f"/v1/namespaces/{ns}/memory/k").status_code == 200
        denied = agent.put(f"/v1/namespaces/other-{ns}/memory/k", json={"value": 1})
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "forbidden"
        new_key = agent.post("/v1/keys", json={"grants": [
            {"namespace": ns, "permissions": ["read"]}]})
        assert new_key.status_code == 403
        assert agent.get("/v1/keys").status_code == 403


def test_a_read_only_token_cannot_register(broker: Broker, admin: httpx.Client) -> None:
    ns = f"acme-{uuid.uuid4().hex[:10]}"
    reader = create_key(admin, [{"namespace": "acme-*", "permissions": ["read"]}])
    with broker.client(reader) as client:
        response = register(client, ns)
    assert response.status_code == 403
    assert admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"] == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        pytest.param({"name": "a", "namespace": "Bad NS"}, "invalid_namespace", id="namespace"),
        pytest.param({"name": "a", "namespace": "n" * 64}, "invalid_namespace",
                     id="namespace-64"),
        pytest.param({"name": "", "namespace": "ok"}, "invalid_request", id="empty-name"),
        pytest.param({"name": "a\nb", "namespace": "ok"}, "invalid_request",
                     id="unprintable-name"),
        pytest.param({"name": "a" * 201, "namespace": "ok"}, "invalid_request", id="long-name"),
        pytest.param({"name": "a", "namespace": "ok", "framework": "Lang Chain"},
                     "invalid_request", id="framework"),
        pytest.param({"namespace": "ok"}, "invalid_request", id="missing-name"),
        pytest.param({"name": "a", "namespace": "ok", "role": "admin"}, "invalid_request",
                     id="unknown-field"),
        pytest.param({"name": 5, "namespace": "ok"}, "invalid_request", id="name-not-text"),
    ],
)
def test_register_refuses_bad_input(admin: httpx.Client, body: dict[str, Any],
                                    code: str) -> None:
    response = admin.post("/v1/agents", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


def test_register_refuses_malformed_json_and_missing_token(broker: Broker,
                                                            admin: httpx.Client) -> None:
    bad = admin.post("/v1/agents", content=b"{not json",
                     headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    with broker.client(None) as anonymous:
        response = anonymous.post("/v1/agents", json={"name": "a", "namespace": "ok"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("wire", ["rest", "message"])
def test_a_registration_retried_after_a_503_creates_one_agent(
        broker_factory: Callable[..., Broker], ns: str, wire: str) -> None:
    """A 503 that came after the write was applied (here: no replica confirmed it) and a retry
    under the same Idempotency-Key (or message id) make one agent, with working credentials."""
    unconfirmed = broker_factory("redis", write_replicas=1, write_replicas_timeout_ms=100)
    healthy = broker_factory("redis")
    message_id = f"register-{uuid.uuid4().hex}"

    def attempt(broker: Broker) -> tuple[int, dict[str, Any]]:
        with broker.client() as client:
            if wire == "rest":
                reply = register(client, ns, headers={"Idempotency-Key": message_id})
                return reply.status_code, reply.json()
            reply = client.post("/v1/messages", json={
                "memp": "1.0", "type": "agent.register", "id": message_id, "namespace": ns,
                "name": "my-agent", "framework": "langchain"})
            body = reply.json()
            if "agent" in body:  # the reply's envelope differs per reply; its content not
                body = {"agent": body["agent"], "credentials": body["credentials"]}
            return reply.status_code, body

    status, failed = attempt(unconfirmed)  # some of its writes landed before the 503
    assert status == 503, failed
    status, first = attempt(healthy)
    assert status in (200, 201), first
    assert attempt(healthy) == (status, first)
    with healthy.client() as admin:
        listed = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert [a["id"] for a in listed] == [first["agent"]["id"]]
    assert listed[0]["created_at"] == first["agent"]["created_at"]
    with healthy.client(first["credentials"]["api_key"]) as agent:
        written = agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
        assert written.status_code == 201, written.text
        assert written.json()["agent_id"] == first["agent"]["id"]


def test_one_registration_sent_to_two_processes_at_once_creates_one_agent(
        broker_processes: Callable[..., list[Any]], ns: str) -> None:
    processes = broker_processes(2)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}",
               "Idempotency-Key": f"register-{uuid.uuid4().hex}"}
    body = {"name": "twin", "namespace": ns}

    def send(url: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/agents", json=body, headers=headers, timeout=15)

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(send, [p.url for p in processes] * 4))
    assert {r.status_code for r in replies} == {201}
    assert len({r.text for r in replies}) == 1
    listed = httpx.get(f"{processes[0].url}/v1/namespaces/{ns}/agents",
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["agents"]
    assert [a["id"] for a in listed] == [replies[0].json()["agent"]["id"]]


def test_one_name_registered_on_two_processes_at_once_makes_one_agent(
        broker_processes: Callable[..., list[Any]], ns: str) -> None:
    """No message id: the name alone makes the registrations one agent (each gets a key)."""
    processes = broker_processes(2)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"name": "racer", "namespace": ns}

    def send(url: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/agents", json=body, headers=headers, timeout=15)

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(send, [p.url for p in processes] * 4))
    assert sorted(r.status_code for r in replies) == [200] * 7 + [201], [r.text for r in replies]
    assert len({r.json()["agent"]["id"] for r in replies}) == 1
    assert len({r.json()["credentials"]["api_key"] for r in replies}) == 8
    listed = httpx.get(f"{processes[0].url}/v1/namespaces/{ns}/agents",
                       headers=headers).json()["agents"]
    assert [a["id"] for a in listed] == [replies[0].json()["agent"]["id"]]
