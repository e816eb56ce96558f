"""Fair share on the AMP bridge (docs/limits.md): cell writes (create, patch, delete, import)
are held to the AMP namespace's rates and quotas and to each acting agent's own rate, like
MEMP writes; the lifecycle engine's own transitions are not. Both stores, and two broker
processes sharing one budget. Rates are tiny (SLOW) so no bucket refills during a test."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.amp import DAY_MS, Amp, amp_broker, amp_processes, error_of, now_ms
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess
from tests.support.limits import SLOW, assert_rate_limited, set_limits, usage


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Iterator[Amp]:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


def agent_client(amp: Amp, agent: str = "agent-1") -> Amp:
    """A client acting as `agent` with a key bound to no agent that may use AMP for others
    (a gateway): held to every rate, unlike the broker's admin key."""
    return amp.as_token(amp.new_key(["amp", "impersonate", "read"]), agent)


def new_cell(text: str = "the user prefers tea", owner: str = "u-1") -> dict[str, Any]:
    return {"type": "semantic", "content": {"text": text},
            "identity": {"owner_id": owner, "owner_type": "user"},
            "access_policy": {"writable_by": ["*"], "readable_by": ["*"]}}


def imported(index: int) -> dict[str, Any]:
    return {"id": f"01HQ3Z8X9Y00000000000000{index:02d}", "amp_version": "0.1.0",
            "type": "semantic", "content": {"text": f"imported {index}"},
            "identity": {"owner_id": "team", "owner_type": "organization"},
            "lifecycle": {"created_at": "2025-03-01T10:00:00.000Z", "status": "active"}}


def test_cell_writes_over_the_namespace_rate_get_429_and_write_nothing(amp: Amp) -> None:
    archived = {**imported(1), "access_policy": {"writable_by": ["*"]},
                "lifecycle": {"created_at": "2025-03-01T10:00:00.000Z", "status": "archived"}}
    assert amp.import_cells([archived]).json()["imported"] == 1
    set_limits(amp.http, amp.namespace, writes_per_second=SLOW, write_burst=2)
    with agent_client(amp) as gateway:
        first = gateway.post_cell(new_cell("one"))
        assert first.status_code == 201, first.text
        assert gateway.post_cell(new_cell("two")).status_code == 201
        refused = gateway.post_cell(new_cell("three"))
        assert_rate_limited(refused, "namespace", "writes_per_second")
        cell = first.json()
        before = amp.stored(cell)
        assert_rate_limited(gateway.patch(cell["id"], {"content": {"text": "changed"}}),
                            "namespace", "writes_per_second")
        kept = amp.stored(archived)
        assert_rate_limited(gateway.delete(archived["id"]), "namespace", "writes_per_second")
        assert amp.stored(cell) == before and amp.stored(archived) == kept  # nothing written
    assert usage(amp.http, amp.namespace)["keys"] == 3
    # The broker's admin key is exempt from rates, as on MEMP paths.
    assert amp.post_cell(new_cell("admin's")).status_code == 201


def test_every_acting_agent_has_its_own_rate(broker_factory: Callable[..., Broker],
                                             ns: str) -> None:
    with amp_broker(broker_factory, "embedded", ns, agent_writes_per_second=SLOW,
                    agent_write_burst=1) as amp, agent_client(amp, "agent-a") as a, \
            agent_client(amp, "agent-b") as b:
        assert a.post_cell(new_cell("a1")).status_code == 201
        assert_rate_limited(a.post_cell(new_cell("a2")), "agent", "writes_per_second")
        assert b.post_cell(new_cell("b1")).status_code == 201  # b's own bucket
        assert usage(amp.http, ns)["keys"] == 2


def test_cell_writes_are_held_to_max_keys_and_max_bytes(amp: Amp) -> None:
    cell = amp.create("short")
    set_limits(amp.http, amp.namespace, max_keys=1)
    refused = amp.post_cell(new_cell("one too many"))  # quotas hold for the admin key too
    assert refused.status_code == 429, refused.text
    assert error_of(refused)["code"] == "quota_exceeded"
    assert error_of(refused)["details"] == {"limit": "max_keys", "max": 1, "used": 1,
                                            "requested": 1}
    assert "retry-after" not in refused.headers
    used = usage(amp.http, amp.namespace)
    set_limits(amp.http, amp.namespace, max_keys=1, max_bytes=used["bytes"] + 3)
    before = amp.stored(cell)
    grown = amp.patch(cell["id"], {"content": {"text": "much longer than it was"}})
    assert grown.status_code == 429, grown.text
    assert error_of(grown)["details"]["limit"] == "max_bytes"
    assert amp.stored(cell) == before
    assert usage(amp.http, amp.namespace) == used
    # A patch that does not grow passes; a soft delete is held to no quota.
    assert amp.patch(cell["id"], {"content": {"text": "shrt"}}).status_code == 200
    assert usage(amp.http, amp.namespace)["keys"] == 1


def test_an_import_crossing_a_limit_stores_the_cells_before_it(amp: Amp) -> None:
    set_limits(amp.http, amp.namespace, max_keys=2)
    response = amp.import_cells([imported(i) for i in range(4)])
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["imported"] == 2
    assert [(e["index"], e["error"]["code"], e["error"]["details"]["limit"])
            for e in report["errors"]] == [(2, "quota_exceeded", "max_keys"),
                                           (3, "quota_exceeded", "max_keys")]
    assert usage(amp.http, amp.namespace)["keys"] == 2
    # A namespace admin (not the broker's admin key) is held to the rates too: the refused
    # cells carry rate_limited and the response the longest Retry-After.
    set_limits(amp.http, amp.namespace, writes_per_second=SLOW, write_burst=1)
    with amp.as_token(amp.new_key(["admin"]), "migrator") as namespace_admin:
        response = namespace_admin.import_cells([imported(i) for i in range(10, 13)])
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["imported"] == 1
    assert [e["error"]["code"] for e in report["errors"]] == ["rate_limited"] * 2
    assert int(response.headers["retry-after"]) >= 1
    assert usage(amp.http, amp.namespace)["keys"] == 3


def test_cell_reads_and_searches_are_held_to_the_read_rate(amp: Amp) -> None:
    """AMP reads take read tokens like MEMP gets: a refused read neither reads nor counts an
    access, and malformed input takes no token."""
    cell = amp.create("tea for two", access_policy={"readable_by": ["*"]})
    set_limits(amp.http, amp.namespace, reads_per_second=SLOW, read_burst=2)
    with agent_client(amp) as gateway:
        assert gateway.get(cell["id"]).status_code == 200
        assert gateway.search_response(query="tea").status_code == 200
        assert_rate_limited(gateway.get(cell["id"]), "namespace", "reads_per_second")
        assert_rate_limited(gateway.search_response(query="tea"), "namespace",
                            "reads_per_second")
        assert gateway.get("not-a-ulid").status_code == 400  # bad input: no token needed
    # One counted access before, this one now (the admin key is exempt): the refused read
    # counted none.
    assert amp.read(cell["id"])["scoring"]["access_count"] == 2


def test_the_lifecycle_engine_is_not_held_to_the_limits(amp: Amp) -> None:
    """The engine's transitions are the broker's own work: a tenant over its rate and at its
    quotas still has its cells go stale and get archived on time."""
    cell = amp.create("fading", scoring={"importance": 0.2, "confidence": 0.5,
                                         "decay_rate": 1.0})
    used = usage(amp.http, amp.namespace)
    set_limits(amp.http, amp.namespace, writes_per_second=SLOW, write_burst=1,
               max_keys=used["keys"], max_bytes=used["bytes"])
    with agent_client(amp) as gateway:
        assert gateway.post_cell(new_cell()).status_code == 429  # quota: and no tokens left
    assert amp.run(now_ms() + 2 * DAY_MS)["stale"] == 1
    assert amp.stored(cell)["lifecycle"]["status"] == "stale"


def test_refusals_and_unauthorised_writes_change_nothing(amp: Amp) -> None:
    cell = amp.create("kept")
    set_limits(amp.http, amp.namespace, writes_per_second=SLOW, write_burst=1)
    before = amp.stored(cell)
    no_amp = amp.as_token(amp.new_key(["read"]), "agent-1")
    made = amp.http.post("/v1/keys", json={"name": "to revoke", "grants": [
        {"namespace": amp.namespace, "permissions": ["amp", "impersonate"]}]}).json()
    assert amp.http.delete(f"/v1/keys/{made['key']['id']}").status_code in (200, 204)
    with no_amp, amp.as_token(made["api_key"], "agent-1") as revoked:
        assert no_amp.post_cell(new_cell()).status_code == 403
        assert no_amp.patch(cell["id"], {"content": {"text": "x"}}).status_code == 403
        assert revoked.post_cell(new_cell()).status_code == 401
        assert revoked.patch(cell["id"], {"content": {"text": "x"}}).status_code == 401
    with agent_client(amp) as gateway:
        # Hostile: a malformed body and a claimed broker identity take no token.
        assert gateway.http.post("/amp/memories", content=b"{nope",
                                 headers={"X-AMP-Agent-ID": "agent-1",
                                          "Content-Type": "application/json"}
                                 ).status_code == 400
        assert gateway.post_cell(new_cell(), agent="admin").status_code in (400, 403)
        assert gateway.post_cell(new_cell("the one write")).status_code == 201
        assert gateway.post_cell(new_cell("over")).status_code == 429
    assert amp.stored(cell) == before
    assert usage(amp.http, amp.namespace)["keys"] == 2


def _create(url: str, token: str, text: str) -> int:
    with httpx.Client(base_url=url, timeout=15,
                      headers={"Authorization": f"Bearer {token}",
                               "X-AMP-Agent-ID": "agent-1"}) as client:
        return client.post("/amp/memories", json=new_cell(text)).status_code


def test_two_processes_share_one_amp_budget(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    brokers = amp_processes(broker_processes, ns)
    with Amp(brokers[0].url, ns) as amp:
        set_limits(amp.http, ns, writes_per_second=SLOW, write_burst=5)
        token = amp.new_key(["amp", "impersonate"])
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _create(brokers[i % 2].url, token, f"c{i}"),
                                  range(16)))
        assert codes.count(201) == 5 and codes.count(429) == 11
        set_limits(amp.http, ns, max_keys=8)  # 5 cells stored: room for exactly 3 more
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _create(brokers[i % 2].url, ADMIN_KEY, f"q{i}"),
                                  range(12)))
        assert codes.count(201) == 3 and codes.count(429) == 9
        assert usage(amp.http, ns)["keys"] == 8
