"""A message id is bound to its request (broker/services/idempotency.py), over real HTTP on both
stores: a retry of the same request replays the first reply, and the same id with another request
is a 422 that writes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.clients import configure, error_of

JSON = {"Content-Type": "application/json"}


def put(client: httpx.Client, ns: str, key: str, body: bytes | dict[str, Any], message_id: str
        ) -> httpx.Response:
    headers = {"Idempotency-Key": message_id}
    if isinstance(body, bytes):
        return client.put(f"/v1/namespaces/{ns}/memory/{key}", content=body,
                          headers={**headers, **JSON})
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", json=body, headers=headers)


def message(client: httpx.Client, ns: str, **fields: Any) -> dict[str, Any]:
    reply: dict[str, Any] = client.post("/v1/messages", json={
        "memp": "1.0", "namespace": ns, **fields}).json()
    return reply


@pytest.mark.parametrize("strategy", ["last-write-wins", "merge"])
def test_the_same_request_replays_and_another_request_is_refused(
        admin: httpx.Client, ns: str, strategy: str) -> None:
    configure(admin, ns, strategy=strategy)
    first = put(admin, ns, "k", {"value": {"plan": "pro"}}, "retry-1")
    assert first.status_code == 201, first.text
    spaced = put(admin, ns, "k", b'{"value":\n {"plan" :  "pro"}\r\n}', "retry-1")
    assert (spaced.status_code, spaced.json()) == (201, first.json())  # the same value
    for other in ({"value": {"plan": "free"}}, {"value": {"plan": "pro"}, "ttl_seconds": 60},
                  {"value": {"plan": "pro"}, "base_version": 1}):
        error = error_of(put(admin, ns, "k", other, "retry-1"), 422, "idempotency_key_reused")
        assert error["details"]["id"] == "retry-1"
    elsewhere = put(admin, ns, "other-key", {"value": {"plan": "pro"}}, "retry-1")
    error_of(elsewhere, 422, "idempotency_key_reused")
    deleted = admin.delete(f"/v1/namespaces/{ns}/memory/k",
                           headers={"Idempotency-Key": "retry-1"})
    error_of(deleted, 422, "idempotency_key_reused")
    stored = admin.get(f"/v1/namespaces/{ns}/memory/k").json()
    assert (stored["value"], stored["version"]) == ({"plan": "pro"}, 1)
    assert admin.get(f"/v1/namespaces/{ns}/memory/other-key").status_code == 404


def test_message_ids_are_bound_to_their_message(admin: httpx.Client, ns: str) -> None:
    ack = message(admin, ns, type="memory.put", id="m-1", key="k", value=1)
    assert ack["type"] == "ack"
    assert message(admin, ns, type="memory.put", id="m-1", key="k", value=1)["entry"] == \
        ack["entry"]
    batch = admin.post("/v1/messages", json=[
        {"memp": "1.0", "namespace": ns, "type": "memory.put", "id": "m-1", "key": "k",
         "value": 2},
        {"memp": "1.0", "namespace": ns, "type": "memory.delete", "id": "m-1", "key": "k"},
        {"memp": "1.0", "namespace": ns, "type": "memory.put", "id": "m-2", "key": "j",
         "value": 3}]).json()
    assert [r["type"] for r in batch] == ["error", "error", "ack"]
    assert {r["error"]["code"] for r in batch[:2]} == {"idempotency_key_reused"}
    stored = admin.get(f"/v1/namespaces/{ns}/memory/k").json()
    assert (stored["value"], stored["version"]) == (1, 1)


def test_a_registration_id_is_bound_to_its_agent(admin: httpx.Client, ns: str) -> None:
    def register(name: str) -> httpx.Response:
        return admin.post("/v1/agents", json={"name": name, "namespace": ns},
                          headers={"Idempotency-Key": "reg-1"})

    first = register("alpha")
    assert first.status_code == 201, first.text
    assert register("alpha").json()["agent"]["id"] == first.json()["agent"]["id"]
    error_of(register("beta"), 422, "idempotency_key_reused")
    agents = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    assert [a["name"] for a in agents] == ["alpha"]
