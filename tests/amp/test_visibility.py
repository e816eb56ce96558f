"""The AMP namespace belongs to AMP (broker/amp/visibility.py), over real HTTP on both stores.

Agents registered with MEMP read, write and subscribe on the AMP namespace act as hostile
tenants: through every MEMP path (REST, messages, query, history, snapshots, live events and
shares) they see only cells AMP's policy lets them read, never a deleted cell's content, and
they cannot write, delete, forge or revive a cell."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.amp import Amp, amp_broker, cell_key, iso, now_ms
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker
from tests.support.streams import Stream

WAIT = 15.0
DAY_MS = 86_400_000


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Iterator[Amp]:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def open_stream(amp: Amp, token: str, *, snapshot: bool = False,
                    last_event_id: str | None = None) -> Stream:
        params = [("namespace", amp.namespace), ("pattern", "cells/*")]
        if snapshot:
            params.append(("snapshot", "1"))
        headers = {"Authorization": f"Bearer {token}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        stream = Stream(f"{amp.url}/v1/subscribe", params, headers)
        opened.append(stream)
        return stream.wait_open()

    yield open_stream
    for stream in opened:
        stream.close()


class Tenant:
    """A registered agent of the AMP namespace: its id, its key, and clients for both APIs."""

    def __init__(self, amp: Amp, name: str) -> None:
        self.id, self.key = amp.register(name)
        self.amp = amp.as_token(self.key, self.id)
        self.memp = httpx.Client(base_url=amp.url, timeout=WAIT,
                                 headers={"Authorization": f"Bearer {self.key}"})
        self.namespace = amp.namespace

    def close(self) -> None:
        self.amp.close()
        self.memp.close()

    def get(self, cell: dict[str, Any]) -> httpx.Response:
        return self.memp.get(f"/v1/namespaces/{self.namespace}/memory/{cell_key(cell)}")

    def query(self, pattern: str = "cells/*") -> list[str]:
        response = self.memp.get(f"/v1/namespaces/{self.namespace}/memory",
                                 params={"pattern": pattern, "limit": 1000})
        assert response.status_code == 200, response.text
        return [e["key"] for e in response.json()["entries"]]

    def history(self, cell: dict[str, Any]) -> httpx.Response:
        return self.memp.get(f"/v1/namespaces/{self.namespace}/history/{cell_key(cell)}")

    def message(self, kind: str, **fields: Any) -> dict[str, Any]:
        response = self.memp.post("/v1/messages", json={
            "memp": "1.0", "type": kind, "namespace": self.namespace, **fields})
        reply: dict[str, Any] = response.json()
        return reply


@pytest.fixture
def tenants(amp: Amp) -> Iterator[Callable[[str], Tenant]]:
    made: list[Tenant] = []

    def tenant(name: str) -> Tenant:
        made.append(Tenant(amp, name))
        return made[-1]

    yield tenant
    for one in made:
        one.close()


def private_cell(owner: Tenant, text: str, **fields: Any) -> dict[str, Any]:
    return owner.amp.create(text, owner=owner.id, owner_type="agent", **fields)


def test_memp_reads_show_only_cells_the_reader_may_read(amp: Amp, tenants: Any) -> None:
    alice, mallory = tenants("alice"), tenants("mallory")
    secret = private_cell(alice, "alice's secret")
    public = private_cell(alice, "alice's public note", access_policy={"public": True})
    shared = private_cell(alice, "for mallory", access_policy={"readable_by": [mallory.id]})

    assert mallory.get(secret).status_code == 404
    assert mallory.history(secret).status_code == 404
    assert mallory.get(public).status_code == 200
    assert mallory.get(shared).json()["value"]["content"]["text"] == "for mallory"
    assert sorted(mallory.query()) == sorted([cell_key(public), cell_key(shared)])
    assert sorted(alice.query()) == sorted(map(cell_key, (secret, public, shared)))
    assert mallory.message("memory.get", key=cell_key(secret))["error"]["code"] == "not_found"
    assert mallory.message("memory.history", key=cell_key(secret))["type"] == "error"
    found = mallory.message("memory.query", pattern=f"cells/agent/{alice.id}/*")
    assert sorted(e["key"] for e in found["entries"]) == sorted(
        [cell_key(public), cell_key(shared)])
    assert "secret" not in json.dumps(found)
    assert alice.get(secret).json()["value"]["content"]["text"] == "alice's secret"


def test_history_shows_only_versions_the_reader_could_read(amp: Amp, tenants: Any) -> None:
    alice, mallory = tenants("alice"), tenants("mallory")
    cell = private_cell(alice, "private at first")
    assert alice.amp.patch(cell["id"], {"access_policy": {"public": True},
                                        "content": {"text": "now public"}}).status_code == 200
    versions = mallory.history(cell).json()["versions"]
    assert [v["value"]["content"]["text"] for v in versions] == ["now public"]
    assert len(alice.history(cell).json()["versions"]) == 2


def test_snapshots_and_events_carry_only_readable_cells(
        amp: Amp, tenants: Any, streams: Callable[..., Stream]) -> None:
    alice, mallory = tenants("alice"), tenants("mallory")
    before = private_cell(alice, "secret before")
    snapshot = streams(amp, mallory.key, snapshot=True)
    watcher = streams(amp, alice.key)
    live = streams(amp, mallory.key)
    snapshot.wait_event(lambda e: e.event == "snapshot-end", "the snapshot marker")
    assert [e.event for e in snapshot.events] == ["snapshot-end"]

    hidden = private_cell(alice, "secret during")
    assert alice.amp.patch(hidden["id"], {"content": {"text": "still secret"}}
                           ).status_code == 200
    visible = private_cell(alice, "public note", access_policy={"public": True})
    watcher.wait_key(cell_key(visible), 1)
    live.wait_key(cell_key(visible), 1)
    for stream in (live, snapshot):
        stream.wait_key(cell_key(visible), 1)
        assert [e.data["key"] for e in stream.changes()] == [cell_key(visible)]
        assert "secret" not in json.dumps([e.data for e in stream.events])
    assert {e.data["key"] for e in watcher.changes()} == {cell_key(hidden), cell_key(visible)}

    replay = streams(amp, mallory.key, last_event_id=f"{amp.namespace}:0-0")
    replay.wait_key(cell_key(visible), 1)
    assert [e.data["key"] for e in replay.changes()] == [cell_key(visible)]
    assert cell_key(before) not in json.dumps([e.data for e in replay.events])


@pytest.mark.parametrize("token", ["tenant", "admin"])
def test_no_token_writes_or_deletes_a_cell_through_memp(
        amp: Amp, tenants: Any, token: str) -> None:
    alice = tenants("alice")
    writer = tenants("mallory").memp if token == "tenant" else amp.http
    cell = private_cell(alice, "alice's secret")
    forged = {**cell, "access_policy": {"public": True, "readable_by": ["*"],
                                        "writable_by": ["*"]},
              "content": {"text": "forged", "metadata": {}}}
    path = f"/v1/namespaces/{amp.namespace}/memory/{cell_key(cell)}"
    for response in (writer.put(path, json={"value": forged}), writer.delete(path),
                     writer.put(f"/v1/namespaces/{amp.namespace}/memory/cells/new",
                                json={"value": forged})):
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["code"] == "forbidden" and error["details"]["use"] == "/amp"
    for kind, fields in (("memory.put", {"value": forged}), ("memory.delete", {})):
        reply = writer.post("/v1/messages", json={"memp": "1.0", "type": kind,
                                                  "namespace": amp.namespace,
                                                  "key": cell_key(cell), **fields})
        assert reply.status_code == 403 and reply.json()["error"]["details"]["use"] == "/amp"
    assert alice.amp.read(cell["id"])["content"]["text"] == "alice's secret"
    assert amp.stored(cell)["access_policy"]["public"] is False
    assert len(amp.history(cell)) == 1


def test_an_archived_cell_cannot_be_revived_and_a_deleted_one_is_shown_to_no_one(
        amp: Amp, tenants: Any, streams: Callable[..., Stream]) -> None:
    alice = tenants("alice")
    old = now_ms() - 400 * DAY_MS
    archived = {
        "id": "01HQ3Z8X9Y0000000000000001", "type": "semantic",
        "content": {"text": "an old public fact", "metadata": {}},
        "identity": {"owner_id": alice.id, "owner_type": "agent", "created_by": alice.id},
        "access_policy": {"public": True},
        "lifecycle": {"created_at": iso(old), "status": "archived"},
    }
    imported = amp.import_cells([archived])
    assert imported.json()["imported"] == 1, imported.text
    revived = {**archived, "lifecycle": {"created_at": iso(old), "status": "active"}}
    path = f"/v1/namespaces/{amp.namespace}/memory/{cell_key(archived)}"
    assert alice.memp.put(path, json={"value": revived}).status_code == 403
    assert amp.http.put(path, json={"value": revived}).status_code == 403
    assert amp.status(archived) == "archived"

    watcher = streams(amp, ADMIN_KEY)  # sees every cell AMP lets anyone read
    deleted = alice.amp.delete(archived["id"])
    assert deleted.status_code == 200, deleted.text
    gone = watcher.wait_event(lambda e: e.event == "delete", "the soft delete")
    assert gone.data["key"] == cell_key(archived)
    assert gone.data["value"] is None and gone.data["deleted"] is True
    for reader in (alice.memp, amp.http):
        assert reader.get(path).status_code == 404
        assert reader.get(path.replace("/memory/", "/history/")).status_code == 404
        listed = reader.get(f"/v1/namespaces/{amp.namespace}/memory",
                            params={"pattern": "cells/*"})
        assert "an old public fact" not in listed.text
    replay = streams(amp, ADMIN_KEY, last_event_id=f"{amp.namespace}:0-0")
    replay.wait_event(lambda e: e.event == "delete", "the soft delete, replayed")
    assert "an old public fact" not in json.dumps([e.data for e in replay.events
                                                   if e.event == "delete"])
    assert amp.status(archived) == "deleted"  # the tombstone is kept for its window


def test_a_share_of_the_amp_namespace_follows_the_cells_policy(
        amp: Amp, tenants: Any, ns: str) -> None:
    alice = tenants("alice")
    configured = amp.http.put(f"/v1/namespaces/{amp.namespace}/config", json={
        "shares": [{"namespace": f"{ns}-partner*", "permissions": ["read", "subscribe"]}]})
    assert configured.status_code == 200, configured.text
    key = amp.http.post("/v1/keys", json={
        "name": "partner", "agent_id": "partner-bot",
        "grants": [{"namespace": f"{ns}-partner", "permissions": ["read", "subscribe"]}]})
    assert key.status_code == 201, key.text
    secret = private_cell(alice, "alice's secret")
    for_partner = private_cell(alice, "for the partner",
                               access_policy={"readable_by": ["partner-*"]})
    with httpx.Client(base_url=amp.url, timeout=WAIT, headers={
            "Authorization": f"Bearer {key.json()['api_key']}"}) as partner:
        base = f"/v1/namespaces/{amp.namespace}/memory"
        assert partner.get(f"{base}/{cell_key(secret)}").status_code == 404
        assert partner.get(f"{base}/{cell_key(for_partner)}").status_code == 200
        listed = partner.get(base, params={"pattern": "cells/*"}).json()["entries"]
        assert [e["key"] for e in listed] == [cell_key(for_partner)]


def test_a_namespace_admin_elsewhere_reads_no_cell(amp: Amp, tenants: Any, ns: str) -> None:
    alice = tenants("alice")
    cell = private_cell(alice, "alice's secret")
    key = amp.http.post("/v1/keys", json={
        "name": "other admin", "grants": [{"namespace": f"{ns}-other", "permissions": ["admin"]}]})
    with httpx.Client(base_url=amp.url, timeout=WAIT, headers={
            "Authorization": f"Bearer {key.json()['api_key']}"}) as other:
        response = other.get(f"/v1/namespaces/{amp.namespace}/memory/{cell_key(cell)}")
        assert response.status_code == 403
        assert "secret" not in response.text
