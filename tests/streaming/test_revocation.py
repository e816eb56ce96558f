"""Open streams end when their right does (broker/streaming/revocation.py), over real HTTP: a
revoked key, a removed agent, a removed share and an expired JWT each end the streams they opened,
on every broker process, with a final `revoked` event that says why and carries a resumable
cursor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest
from starlette.routing import Route

from broker.mcp.mount import McpMount
from tests.support.brokers import ADMIN_KEY, Broker, BrokerProcess
from tests.support.mcp import open_session
from tests.support.streams import Stream

WITHIN = 2.0  # seconds a stream may outlive its right
JWT_SECRET = "revocation-test-secret-0123456789-abcdef"


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def open_stream(url: str, token: str, *subs: str) -> Stream:
        stream = Stream(f"{url}/v1/subscribe", [("sub", s) for s in subs],
                        {"Authorization": f"Bearer {token}"})
        opened.append(stream)
        return stream.wait_open()

    yield open_stream
    for stream in opened:
        stream.close()


def new_key(url: str, grants: list[dict[str, Any]], agent_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "t", "grants": grants}
    if agent_id:
        body["agent_id"] = agent_id
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        response = admin.post("/v1/keys", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def put(url: str, ns: str, key: str, value: Any, token: str = ADMIN_KEY) -> httpx.Response:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        return client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value})


def ended_by_revocation(stream: Stream, started: float) -> dict[str, Any]:
    """The final `revoked` event, which must arrive within WITHIN seconds of `started`, after
    which the broker closes the stream."""
    event = stream.wait_event(lambda e: e.event == "revoked", "the revoked event",
                              timeout=WITHIN - (time.monotonic() - started) + 0.5)
    assert time.monotonic() - started <= WITHIN + 0.5
    stream.ended.wait(timeout=WITHIN)
    assert stream.ended.is_set(), "the broker kept the stream open"
    assert stream.events[-1].event == "revoked"
    data: dict[str, Any] = event.data
    assert data["cursor"] == event.id
    return data


def test_revoking_a_key_ends_its_streams_on_every_process(
        broker_processes: Callable[..., list[BrokerProcess]], streams: Callable[..., Stream],
        ns: str) -> None:
    first, second = broker_processes(2)
    created = new_key(first.url, [{"namespace": ns, "permissions": ["read", "subscribe"]}])
    token = created["api_key"]
    on_second = streams(second.url, token, f"{ns}:*")
    on_first = streams(first.url, token, f"{ns}:*")
    other = streams(second.url, ADMIN_KEY, f"{ns}:*")
    assert put(first.url, ns, "k", 1).status_code == 201
    on_second.wait_key("k", 1)
    started = time.monotonic()
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        assert admin.delete(f"{first.url}/v1/keys/{created['key']['id']}").status_code == 204
    for stream in (on_first, on_second):
        assert ended_by_revocation(stream, started)["reason"] == "the API key was revoked"
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as client:
        for process in (first, second):
            refused = client.get(f"{process.url}/v1/namespaces/{ns}/memory/k")
            assert refused.status_code == 401, refused.text
    assert put(second.url, ns, "k", 2).status_code == 200
    other.wait_key("k", 2)  # streams of other credentials go on
    assert not other.ended.is_set()


def test_removing_an_agent_revokes_its_keys_and_ends_its_streams(
        broker: Broker, admin: httpx.Client, streams: Callable[..., Stream], ns: str) -> None:
    registered = admin.post("/v1/agents", json={"name": "doomed", "namespace": ns}).json()
    agent_id, token = registered["agent"]["id"], registered["credentials"]["api_key"]
    stream = streams(broker.url, token, f"{ns}:*")
    outsider = new_key(broker.url, [{"namespace": f"{ns}-other", "permissions": ["admin"]}])
    with broker.client(outsider["api_key"]) as other_admin:
        path = f"/v1/namespaces/{ns}/agents/{agent_id}"
        assert other_admin.delete(path).status_code == 403
    assert admin.get(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 200
    started = time.monotonic()
    assert admin.delete(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 204
    ended_by_revocation(stream, started)
    assert admin.get(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 404
    assert admin.delete(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 404
    assert put(broker.url, ns, "k", 1, token).status_code == 401
    listed = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert agent_id not in [a["id"] for a in listed]


def test_removing_a_share_ends_streams_that_followed_through_it(
        broker: Broker, admin: httpx.Client, streams: Callable[..., Stream], ns: str) -> None:
    config = f"/v1/namespaces/{ns}/config"
    share = {"namespace": f"{ns}-team*", "permissions": ["read", "subscribe"]}
    assert admin.put(config, json={"shares": [share]}).status_code == 200
    team = new_key(broker.url, [{"namespace": f"{ns}-team", "permissions": ["read",
                                                                           "subscribe"]}])
    stream = streams(broker.url, team["api_key"], f"{ns}:*", f"{ns}-team:*")
    assert put(broker.url, ns, "shared", 1).status_code == 201
    stream.wait_key("shared", 1)
    started = time.monotonic()
    assert admin.put(config, json={"shares": []}).status_code == 200
    data = ended_by_revocation(stream, started)
    assert ns in data["reason"]
    with broker.client(team["api_key"]) as client:
        assert client.get(f"/v1/namespaces/{ns}/memory/shared").status_code == 403


def test_a_stream_opened_with_a_jwt_ends_when_it_expires(
        broker_factory: Callable[..., Broker], streams: Callable[..., Stream], ns: str) -> None:
    broker = broker_factory("embedded", jwt_secret=JWT_SECRET)
    expires = int(time.time()) + 2
    token = jwt.encode({"sub": "short-lived", "exp": expires,
                        "grants": [{"namespace": ns, "permissions": ["subscribe"]}]},
                       JWT_SECRET, algorithm="HS256")
    stream = streams(broker.url, token, f"{ns}:*")
    assert put(broker.url, ns, "k", 1).status_code == 201
    stream.wait_key("k", 1)
    delay = expires - time.time()
    time.sleep(max(delay, 0))
    data = ended_by_revocation(stream, time.monotonic())
    assert data["reason"] == "the token expired"


def test_removing_an_agent_ends_the_streams_of_jwts_naming_it_on_every_process(
        broker_processes: Callable[..., list[BrokerProcess]], streams: Callable[..., Stream],
        ns: str) -> None:
    first, second = broker_processes(2, MEMP_JWT_SECRET=JWT_SECRET)
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        registered = admin.post(f"{first.url}/v1/agents",
                                json={"name": "doomed", "namespace": ns}).json()
    agent_id = registered["agent"]["id"]
    grants = [{"namespace": ns, "permissions": ["read", "write", "subscribe"]}]
    token = jwt.encode({"sub": agent_id, "exp": int(time.time()) + 600, "grants": grants},
                       JWT_SECRET, algorithm="HS256")
    bystander = jwt.encode({"sub": "bystander", "exp": int(time.time()) + 600,
                            "grants": grants}, JWT_SECRET, algorithm="HS256")
    on_first = streams(first.url, token, f"{ns}:*")
    on_second = streams(second.url, token, f"{ns}:*")
    other = streams(second.url, bystander, f"{ns}:*")
    assert put(second.url, ns, "k", 1, token).status_code == 201
    on_first.wait_key("k", 1)
    started = time.monotonic()
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        assert admin.delete(f"{first.url}/v1/namespaces/{ns}/agents/{agent_id}"
                            ).status_code == 204
    for stream in (on_first, on_second):
        assert ended_by_revocation(stream, started)["reason"] == "the agent was removed"
    for process in (first, second):
        refused = put(process.url, ns, "k", 3, token)
        assert refused.status_code == 401, refused.text
        assert "removed" in refused.json()["error"]["message"]
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as client:
            reopened = client.get(f"{process.url}/v1/subscribe", params={"sub": f"{ns}:*"})
            assert reopened.status_code == 401
    assert put(second.url, ns, "k", 2, bystander).status_code == 200  # other subjects go on
    other.wait_key("k", 2)
    assert not other.ended.is_set()


def test_a_removed_agent_cannot_be_bound_again(broker: Broker, admin: httpx.Client,
                                               ns: str) -> None:
    registered = admin.post("/v1/agents", json={"name": "gone", "namespace": ns}).json()
    agent_id = registered["agent"]["id"]
    assert admin.delete(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 204
    before = admin.get("/v1/keys").json()
    refused = admin.post("/v1/keys", json={"name": "revive", "agent_id": agent_id, "grants": [
        {"namespace": ns, "permissions": ["read"]}]})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["details"] == {"agent_id": agent_id}
    assert admin.get("/v1/keys").json() == before


@pytest.mark.parametrize("credential", ["api-key", "jwt"])
def test_an_mcp_session_ends_when_its_credential_does(
        broker_factory: Callable[..., Broker], ns: str, credential: str) -> None:
    broker = broker_factory("redis", jwt_secret=JWT_SECRET)
    with broker.client() as admin:
        registered = admin.post("/v1/agents", json={"name": "mcp", "namespace": ns}).json()
    agent_id = registered["agent"]["id"]
    token = registered["credentials"]["api_key"] if credential == "api-key" else jwt.encode(
        {"sub": agent_id, "exp": int(time.time()) + 600,
         "grants": [{"namespace": ns, "permissions": ["read", "subscribe"]}]},
        JWT_SECRET, algorithm="HS256")
    opened, ended = threading.Event(), threading.Event()
    statuses: list[int] = []
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        theirs = open_session(http, token)

        def follow() -> None:  # the session's standalone stream, until the broker ends it
            try:
                with httpx.stream("GET", f"{broker.url}/mcp", timeout=30,
                                  headers={**theirs, "Accept": "text/event-stream"}) as reply:
                    statuses.append(reply.status_code)
                    opened.set()
                    for _ in reply.iter_bytes():
                        pass
            except httpx.HTTPError:
                pass
            ended.set()

        threading.Thread(target=follow, daemon=True).start()
        assert opened.wait(10) and statuses == [200]
        time.sleep(0.3)
        assert not ended.is_set()
        started = time.monotonic()
        with broker.client() as admin:
            assert admin.delete(f"/v1/namespaces/{ns}/agents/{agent_id}").status_code == 204
        assert ended.wait(WITHIN + 0.5), "the session's stream outlived its credential"
        assert time.monotonic() - started <= WITHIN + 0.5
        listing = http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                            headers=theirs)
        assert listing.status_code == 401
        mount = next(r.endpoint for r in broker.app.routes
                     if isinstance(r, Route) and r.path == "/mcp")
        assert isinstance(mount, McpMount)
        server = mount.started
        assert server is not None
        assert theirs["mcp-session-id"] not in server.manager._server_instances
