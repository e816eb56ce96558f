"""Conflict strategies over real HTTP on both stores: last-write-wins, agent-priority and merge,
chosen per namespace and per key pattern through `PUT /v1/namespaces/{ns}/config`; then many
concurrent writers on two broker processes sharing one Redis."""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.brokers import ADMIN_KEY, Broker, BrokerProcess
from tests.support.clients import configure, error_of, get, put, put_ok, replayed_event

# ---- helpers (test_schemas.py and test_namespaces.py use them too) ----


def now_ms() -> int:
    return int(time.time() * 1000)


def agent_client(broker: Broker, admin: httpx.Client, ns: str, name: str
                 ) -> tuple[str, httpx.Client]:
    """Register an agent (POST /v1/agents); its id and a client using its own key."""
    response = admin.post("/v1/agents", json={"name": name, "namespace": ns})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["agent"]["id"], broker.client(body["credentials"]["api_key"])


def key_client(broker: Broker, admin: httpx.Client, ns: str, agent_id: str) -> httpx.Client:
    """A client whose key is bound to a chosen agent id (POST /v1/keys), for id patterns."""
    response = admin.post("/v1/keys", json={
        "name": agent_id, "agent_id": agent_id,
        "grants": [{"namespace": ns, "permissions": ["read", "write"]}]})
    assert response.status_code == 201, response.text
    return broker.client(response.json()["api_key"])


# ---- configuration takes effect at once ----


def test_strategy_change_takes_effect_on_the_next_write(admin: httpx.Client, ns: str) -> None:
    put_ok(admin, ns, "doc", {"a": 1})
    configure(admin, ns, strategy="merge")
    assert put_ok(admin, ns, "doc", {"b": 2})["value"] == {"a": 1, "b": 2}
    configure(admin, ns, strategy="last-write-wins")
    assert put_ok(admin, ns, "doc", {"c": 3})["value"] == {"c": 3}
    assert get(admin, ns, "doc")["value"] == {"c": 3}


# ---- last-write-wins ----


def test_lww_older_timestamp_gets_409_with_the_winner(admin: httpx.Client, ns: str) -> None:
    configure(admin, ns, strategy="last-write-wins")
    t = now_ms() - 10_000
    stored = put_ok(admin, ns, "k", "new", timestamp=t)
    assert stored["timestamp"] == t
    error = error_of(put(admin, ns, "k", "old", timestamp=t - 1), 409, "write_conflict")
    winner = error["details"]["winner"]
    assert (winner["value"], winner["version"], winner["timestamp"]) == ("new", 1, t)
    deleted = admin.delete(f"/v1/namespaces/{ns}/memory/k", params={"timestamp": t - 1})
    error_of(deleted, 409, "write_conflict")
    entry = get(admin, ns, "k")
    assert (entry["value"], entry["version"]) == ("new", 1)
    assert put_ok(admin, ns, "k", "newer", timestamp=t + 1)["version"] == 2


def test_lww_ties_break_by_agent_id_in_either_order(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    configure(admin, ns, strategy="last-write-wins")
    first_id, first = agent_client(broker, admin, ns, "first")
    second_id, second = agent_client(broker, admin, ns, "second")
    (low_id, low), (high_id, high) = sorted([(first_id, first), (second_id, second)],
                                            key=lambda pair: pair[0])
    t = now_ms() - 10_000
    with low, high:
        # the higher id wins a tie whether it writes first or second
        put_ok(low, ns, "tie/a", "low", timestamp=t)
        assert put_ok(high, ns, "tie/a", "high", timestamp=t)["agent_id"] == high_id
        put_ok(high, ns, "tie/b", "high", timestamp=t)
        error = error_of(put(low, ns, "tie/b", "low", timestamp=t), 409, "write_conflict")
        assert error["details"]["winner"]["agent_id"] == high_id
    for key in ("tie/a", "tie/b"):
        entry = get(admin, ns, key)
        assert (entry["value"], entry["agent_id"], entry["timestamp"]) == ("high", high_id, t)
    assert low_id < high_id


@pytest.mark.parametrize(
    ("ahead_ms", "status"),
    [
        pytest.param(3_600_000, 400, id="an-hour-ahead-refused"),
        pytest.param(120_000, 400, id="past-the-skew-refused"),
        pytest.param(20_000, 201, id="within-the-skew-accepted"),
    ],
)
def test_lww_future_timestamps(admin: httpx.Client, ns: str, ahead_ms: int, status: int) -> None:
    configure(admin, ns, strategy="last-write-wins")
    response = put(admin, ns, "f", 1, timestamp=now_ms() + ahead_ms)
    assert response.status_code == status, response.text
    if status == 400:
        error_of(response, 400, "invalid_timestamp")
        assert admin.get(f"/v1/namespaces/{ns}/memory/f").status_code == 404


def test_lww_broker_stamped_writes_always_apply_in_arrival_order(
    admin: httpx.Client, ns: str
) -> None:
    t = now_ms() + 20_000  # a client clock ahead of the broker's
    put_ok(admin, ns, "k", "client", timestamp=t)
    entry = put_ok(admin, ns, "k", "broker")
    assert entry["value"] == "broker" and entry["timestamp"] > t


# ---- agent-priority ----


@pytest.fixture
def ranked(broker: Broker, admin: httpx.Client, ns: str
           ) -> Iterator[dict[str, tuple[str, httpx.Client]]]:
    """Agents hi (10, by id), lo (1, by id), two bots (5, by pattern `bot-*`) and one with no
    configured priority (default 3)."""
    agents = {name: agent_client(broker, admin, ns, name) for name in ("hi", "lo", "plain")}
    suffix = uuid.uuid4().hex[:8]
    for name in ("bot-a", "bot-b"):
        agent_id = f"{name}-{suffix}"
        agents[name] = (agent_id, key_client(broker, admin, ns, agent_id))
    configure(admin, ns, strategy="agent-priority", default_priority=3, priorities=[
        {"agent": agents["hi"][0], "priority": 10},
        {"agent": agents["lo"][0], "priority": 1},
        {"agent": "bot-*", "priority": 5},
    ])
    yield agents
    for _, client in agents.values():
        client.close()


def test_priority_lower_cannot_overwrite_or_delete_higher(
    ranked: dict[str, tuple[str, httpx.Client]], admin: httpx.Client, ns: str
) -> None:
    hi_id, hi = ranked["hi"]
    _, lo = ranked["lo"]
    put_ok(hi, ns, "plan", "hi's plan")
    for attempt in (put(lo, ns, "plan", "lo's plan"),
                    put(lo, ns, "plan", "lo's plan", timestamp=now_ms() + 10_000),
                    lo.delete(f"/v1/namespaces/{ns}/memory/plan")):
        winner = error_of(attempt, 409, "write_conflict")["details"]["winner"]
        assert (winner["agent_id"], winner["value"]) == (hi_id, "hi's plan")
    entry = get(admin, ns, "plan")
    assert (entry["value"], entry["version"], entry["agent_id"]) == ("hi's plan", 1, hi_id)


def test_priority_higher_overwrites_lower_even_with_an_older_timestamp(
    ranked: dict[str, tuple[str, httpx.Client]], admin: httpx.Client, ns: str
) -> None:
    _, hi = ranked["hi"]
    _, lo = ranked["lo"]
    put_ok(lo, ns, "plan", "lo's plan", timestamp=now_ms())
    assert put_ok(hi, ns, "plan", "hi's plan", timestamp=now_ms() - 30_000)["version"] == 2
    deleted = hi.delete(f"/v1/namespaces/{ns}/memory/plan")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True


def test_priority_equal_falls_back_to_timestamps(
    ranked: dict[str, tuple[str, httpx.Client]], admin: httpx.Client, ns: str
) -> None:
    a_id, a = ranked["bot-a"]
    _, b = ranked["bot-b"]
    t = now_ms() - 10_000
    put_ok(a, ns, "k", "a", timestamp=t)
    winner = error_of(put(b, ns, "k", "b", timestamp=t - 1), 409, "write_conflict")
    assert winner["details"]["winner"]["agent_id"] == a_id
    assert put_ok(b, ns, "k", "b", timestamp=t + 1)["value"] == "b"
    assert get(admin, ns, "k")["value"] == "b"


def test_priority_unconfigured_agent_gets_the_default(
    ranked: dict[str, tuple[str, httpx.Client]], admin: httpx.Client, ns: str
) -> None:
    _, plain = ranked["plain"]
    _, lo = ranked["lo"]
    _, hi = ranked["hi"]
    _, bot = ranked["bot-a"]
    put_ok(lo, ns, "below", "lo")
    put_ok(hi, ns, "above", "hi")
    put_ok(bot, ns, "bots", "bot")
    assert put_ok(plain, ns, "below", "plain", timestamp=now_ms() - 30_000)["value"] == "plain"
    error_of(put(plain, ns, "above", "plain"), 409, "write_conflict")
    error_of(put(plain, ns, "bots", "plain"), 409, "write_conflict")
    # raising the default above every configured priority takes effect at once
    config = admin.get(f"/v1/namespaces/{ns}/config").json()
    configure(admin, ns, strategy="agent-priority", default_priority=20,
              priorities=config["priorities"])
    assert put_ok(plain, ns, "above", "plain")["value"] == "plain"
    assert get(admin, ns, "above")["value"] == "plain"


def test_priority_exact_id_beats_a_matching_pattern(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    with key_client(broker, admin, ns, f"bot-boss-{suffix}") as boss, \
            key_client(broker, admin, ns, f"bot-{suffix}") as bot:
        configure(admin, ns, strategy="agent-priority", priorities=[
            {"agent": "bot-*", "priority": 5}, {"agent": f"bot-boss-{suffix}", "priority": 1}])
        put_ok(bot, ns, "k", "bot")
        error_of(put(boss, ns, "k", "boss"), 409, "write_conflict")
        assert get(admin, ns, "k")["value"] == "bot"


# ---- merge ----


@pytest.mark.parametrize(
    ("arrays", "tags"),
    [pytest.param("replace", ["y"], id="arrays-replace"),
     pytest.param("append", ["x", "y"], id="arrays-append")],
)
def test_merge_without_base_is_a_plain_deep_merge(
    admin: httpx.Client, ns: str, arrays: str, tags: list[str]
) -> None:
    configure(admin, ns, strategy="merge", merge_arrays=arrays)
    put_ok(admin, ns, "c/1", {"profile": {"name": "Ann", "tags": ["x"]}, "n": 1})
    response = put(admin, ns, "c/1", {"profile": {"tags": ["y"], "city": "Oslo"}, "n": 2})
    assert response.status_code == 200
    assert "memp-warning" not in response.headers
    entry = response.json()
    expected = {"profile": {"name": "Ann", "tags": tags, "city": "Oslo"}, "n": 2}
    assert entry["value"] == expected and entry["version"] == 2
    assert "conflicts" not in entry
    assert get(admin, ns, "c/1")["value"] == expected


@pytest.fixture
def two_writers(broker: Broker, admin: httpx.Client, ns: str
                ) -> Iterator[tuple[tuple[str, httpx.Client], tuple[str, httpx.Client]]]:
    configure(admin, ns, strategy="merge")
    one, two = agent_client(broker, admin, ns, "one"), agent_client(broker, admin, ns, "two")
    yield one, two
    one[1].close()
    two[1].close()


def test_merge_with_base_version_flags_what_both_sides_changed(
    broker: Broker, admin: httpx.Client, ns: str,
    two_writers: tuple[tuple[str, httpx.Client], tuple[str, httpx.Client]],
) -> None:
    (one_id, one), (two_id, two) = two_writers
    base = put_ok(one, ns, "ticket", {"status": "open", "owner": "ann", "prio": 1})
    assert base["version"] == 1
    put_ok(two, ns, "ticket", {"status": "closed", "prio": 2})
    response = put(one, ns, "ticket", {"status": "pending", "owner": "ann", "prio": 2,
                                       "note": "x"}, base_version=1)
    assert response.status_code == 200, response.text
    assert "conflicts" in response.headers["memp-warning"]
    entry = response.json()
    assert entry["value"] == {"status": "pending", "owner": "ann", "prio": 2, "note": "x"}
    expected = [{"path": "/status", "base": "open", "stored": "closed", "incoming": "pending",
                 "stored_agent": two_id, "incoming_agent": one_id, "base_missing": False}]
    assert entry["conflicts"] == expected
    stored = get(admin, ns, "ticket")
    assert stored["conflicts"] == expected and stored["version"] == 3
    event = replayed_event(broker.url, ns, "ticket", 3)
    assert event["event"] == "put" and event["conflicts"] == expected
    # the next write without a conflict clears the flag
    assert "conflicts" not in put_ok(two, ns, "ticket", {"prio": 3})
    assert "conflicts" not in get(admin, ns, "ticket")


def test_merge_with_base_version_through_a_protocol_message(
    admin: httpx.Client, ns: str,
    two_writers: tuple[tuple[str, httpx.Client], tuple[str, httpx.Client]],
) -> None:
    (_, one), (_, two) = two_writers
    put_ok(one, ns, "m", {"a": 1, "b": 1})
    put_ok(two, ns, "m", {"a": 2})
    message = {"memp": "1.0", "type": "memory.put", "id": "m-1", "namespace": ns, "key": "m",
               "value": {"a": 3, "b": 1}, "base_version": 1}
    reply = one.post("/v1/messages", json=message)
    assert reply.status_code == 200, reply.text
    ack = reply.json()
    assert ack["type"] == "ack" and ack["warnings"] == ["conflicts"]
    assert [c["path"] for c in ack["entry"]["conflicts"]] == ["/a"]
    plain = one.post("/v1/messages", json={**message, "id": "m-2", "value": {"c": 1},
                                           "base_version": None})
    assert plain.json()["warnings"] == []


def test_merge_with_the_current_version_as_base_has_no_conflicts(
    admin: httpx.Client, ns: str,
    two_writers: tuple[tuple[str, httpx.Client], tuple[str, httpx.Client]],
) -> None:
    (_, one), (_, two) = two_writers
    put_ok(one, ns, "k", {"a": 1})
    put_ok(two, ns, "k", {"a": 2})
    entry = put_ok(one, ns, "k", {"a": 3}, base_version=2)
    assert entry["value"] == {"a": 3} and "conflicts" not in entry


def test_merge_same_change_on_both_sides_is_not_a_conflict(
    admin: httpx.Client, ns: str,
    two_writers: tuple[tuple[str, httpx.Client], tuple[str, httpx.Client]],
) -> None:
    (_, one), (_, two) = two_writers
    put_ok(one, ns, "k", {"a": 1, "b": 1})
    put_ok(two, ns, "k", {"a": 2})
    entry = put_ok(one, ns, "k", {"a": 2, "b": 5}, base_version=1)
    assert entry["value"] == {"a": 2, "b": 5} and "conflicts" not in entry


@pytest.mark.parametrize(
    ("history_limit", "expected"),
    [
        pytest.param(None, [{"path": "/a", "base": 1, "stored": 2, "incoming": 3,
                             "base_missing": False}], id="base-in-history-three-way"),
        pytest.param(1, [{"path": "/a", "base": None, "stored": 2, "incoming": 3,
                          "base_missing": True},
                         {"path": "/c", "base": None, "stored": 1, "incoming": 5,
                          "base_missing": True}], id="base-lost-every-differing-leaf"),
    ],
)
def test_merge_when_the_base_is_no_longer_in_history(
    admin: httpx.Client, ns: str, history_limit: int | None, expected: list[dict[str, Any]]
) -> None:
    configure(admin, ns, strategy="merge", history_limit=history_limit)
    put_ok(admin, ns, "k", {"a": 1, "b": 1, "c": 1})
    put_ok(admin, ns, "k", {"a": 2})
    put_ok(admin, ns, "k", {"b": 2})
    entry = put_ok(admin, ns, "k", {"a": 3, "b": 2, "c": 5, "d": 4}, base_version=1)
    assert entry["value"] == {"a": 3, "b": 2, "c": 5, "d": 4}
    found = [{k: c[k] for k in ("path", "base", "stored", "incoming", "base_missing")}
             for c in entry["conflicts"]]
    assert found == expected
    assert get(admin, ns, "k")["conflicts"] == entry["conflicts"]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param({"a": 1}, "text", id="string-over-object"),
        pytest.param("text", {"a": 1}, id="object-over-string"),
        pytest.param([1, 2], [3], id="array-over-array"),
        pytest.param({"a": 1}, None, id="null-over-object"),
    ],
)
def test_merge_non_object_values_replace_and_are_flagged(
    broker: Broker, admin: httpx.Client, ns: str, first: Any, second: Any
) -> None:
    configure(admin, ns, strategy="merge")
    put_ok(admin, ns, "k", first)
    response = put(admin, ns, "k", second)
    assert response.status_code == 200, response.text
    assert "conflicts" in response.headers["memp-warning"]
    entry = response.json()
    assert entry["value"] == second
    assert [(c["path"], c["stored"], c["incoming"]) for c in entry["conflicts"]] == [
        ("", first, second)]
    assert get(admin, ns, "k")["value"] == second
    assert replayed_event(broker.url, ns, "k", 2)["conflicts"] == entry["conflicts"]


def test_merge_keeps_conditions_and_create_only(admin: httpx.Client, ns: str) -> None:
    configure(admin, ns, strategy="merge")
    put_ok(admin, ns, "k", {"a": 1})
    stale = admin.put(f"/v1/namespaces/{ns}/memory/k", json={"value": {"b": 1}},
                      headers={"If-Match": '"5"'})
    assert error_of(stale, 412, "precondition_failed")["details"]["current_version"] == 1
    again = admin.put(f"/v1/namespaces/{ns}/memory/k", json={"value": {"b": 1}},
                      headers={"If-None-Match": "*"})
    error_of(again, 412, "precondition_failed")
    entry = get(admin, ns, "k")
    assert (entry["value"], entry["version"]) == ({"a": 1}, 1)


# ---- per-pattern rules, default TTL, history retention ----


def test_rules_pick_the_most_specific_pattern(
    broker: Broker, admin: httpx.Client, ns: str
) -> None:
    hi_id, hi = agent_client(broker, admin, ns, "hi")
    _, lo = agent_client(broker, admin, ns, "lo")
    with hi, lo:
        configure(admin, ns, strategy="last-write-wins", rules=[
            {"pattern": "doc/*", "strategy": "merge"},
            {"pattern": "doc/locked/*", "strategy": "agent-priority"},
            {"pattern": "doc/locked/open", "strategy": "last-write-wins"},
        ], priorities=[{"agent": hi_id, "priority": 10}])
        for key in ("doc/1", "note/1", "doc/locked/1", "doc/locked/open"):
            put_ok(hi, ns, key, {"a": 1})
        assert put_ok(lo, ns, "doc/1", {"b": 2})["value"] == {"a": 1, "b": 2}
        assert put_ok(lo, ns, "note/1", {"b": 2})["value"] == {"b": 2}
        error_of(put(lo, ns, "doc/locked/1", {"b": 2}), 409, "write_conflict")
        assert put_ok(lo, ns, "doc/locked/open", {"b": 2})["value"] == {"b": 2}
        assert get(admin, ns, "doc/locked/1")["value"] == {"a": 1}


@pytest.mark.parametrize("strategy", [pytest.param(s, id=s) for s in
                                      ("last-write-wins", "agent-priority", "merge")])
def test_default_ttl_applies_when_the_write_names_none(
    admin: httpx.Client, ns: str, strategy: str
) -> None:
    configure(admin, ns, strategy=strategy, default_ttl_seconds=120)
    implicit = put_ok(admin, ns, "implicit", {"a": 1})
    assert implicit["ttl_seconds"] == 120
    assert implicit["expires_at"] == implicit["updated_at"] + 120_000
    explicit = put_ok(admin, ns, "explicit", {"a": 1}, ttl_seconds=30)
    assert explicit["ttl_seconds"] == 30
    assert explicit["expires_at"] == explicit["updated_at"] + 30_000
    assert get(admin, ns, "implicit")["ttl_seconds"] == 120


@pytest.mark.parametrize(
    ("history_limit", "versions"),
    [pytest.param(2, [5, 4], id="two"), pytest.param(0, [], id="none-kept"),
     pytest.param(None, [5, 4, 3, 2, 1], id="broker-default")],
)
def test_history_limit_overrides_the_broker_setting(
    admin: httpx.Client, ns: str, history_limit: int | None, versions: list[int]
) -> None:
    configure(admin, ns, history_limit=history_limit)
    for n in range(5):
        put_ok(admin, ns, "h", n)
    found = admin.get(f"/v1/namespaces/{ns}/history/h").json()["versions"]
    assert [v["version"] for v in found] == versions


def test_history_reads_every_version_a_namespace_keeps_beyond_the_broker_default(
    admin: httpx.Client, ns: str
) -> None:
    configure(admin, ns, history_limit=40)
    for n in range(30):  # the broker's default keeps 16
        put_ok(admin, ns, "long", n)
    found = admin.get(f"/v1/namespaces/{ns}/history/long", params={"limit": 100}).json()
    assert [v["version"] for v in found["versions"]] == list(range(30, 0, -1))


# ---- two broker processes, many concurrent writers ----

WRITERS = 8
WRITES_PER_WRITER = 25


def run_writers(urls: list[str], job: Callable[[int, list[httpx.Client]], Any]) -> list[Any]:
    """Run `job(writer, clients)` for every writer at once; clients[i % 2] is process i % 2."""
    start = threading.Barrier(WRITERS)

    def run(writer: int) -> Any:
        pair = [httpx.Client(base_url=u, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                             timeout=60) for u in urls]
        try:
            start.wait(timeout=30)
            return job(writer, pair)
        finally:
            for client in pair:
                client.close()

    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        return [f.result(timeout=240) for f in [pool.submit(run, w) for w in range(WRITERS)]]


@pytest.fixture
def processes(broker_processes: Callable[..., list[BrokerProcess]]) -> list[str]:
    return [b.url for b in broker_processes(2)]


def test_stress_merge_loses_no_writer_field(processes: list[str], ns: str) -> None:
    with httpx.Client(base_url=processes[0], headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=30) as admin:
        configure(admin, ns, strategy="merge")

        def writer(w: int, pair: list[httpx.Client]) -> list[int]:
            statuses = []
            for i in range(WRITES_PER_WRITER):
                response = put(pair[(w + i) % 2], ns, "shared", {f"w{w}": {"n": i}})
                statuses.append(response.status_code)
                assert response.status_code in (200, 201), response.text
                assert "conflicts" not in response.json()
            return statuses

        results = run_writers(processes, writer)
        assert sum(len(r) for r in results) == WRITERS * WRITES_PER_WRITER
        final = get(admin, ns, "shared")
    assert final["value"] == {f"w{w}": {"n": WRITES_PER_WRITER - 1} for w in range(WRITERS)}
    assert final["version"] == WRITERS * WRITES_PER_WRITER


def test_fifty_concurrent_merge_writers_on_two_processes_all_land(
        processes: list[str], ns: str) -> None:
    """Every merge is applied: none is refused under contention, none is lost."""
    writers, writes = 50, 20
    start = threading.Barrier(writers)
    with httpx.Client(base_url=processes[0], headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=30) as admin:
        configure(admin, ns, strategy="merge")

        def writer(w: int) -> list[int]:
            with httpx.Client(base_url=processes[w % 2], timeout=60,
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
                start.wait(timeout=30)
                return [put(client, ns, "hot", {f"w{w}": i}).status_code for i in range(writes)]

        with ThreadPoolExecutor(max_workers=writers) as pool:
            statuses = [code for f in [pool.submit(writer, w) for w in range(writers)]
                        for code in f.result(timeout=240)]
        final = get(admin, ns, "hot")
    assert sorted(set(statuses)) in ([200], [200, 201]), sorted(set(statuses))
    assert final["value"] == {f"w{w}": writes - 1 for w in range(writers)}
    assert final["version"] == writers * writes


def test_stress_lww_newest_timestamp_survives(processes: list[str], ns: str) -> None:
    total = WRITERS * WRITES_PER_WRITER
    base = now_ms() - 60_000
    offsets = list(range(total))
    random.Random(7).shuffle(offsets)
    plan = [offsets[w::WRITERS] for w in range(WRITERS)]

    def writer(w: int, pair: list[httpx.Client]) -> list[tuple[int, int, dict[str, Any]]]:
        done = []
        for i, offset in enumerate(plan[w]):
            response = put(pair[(w + i) % 2], ns, "lww", {"w": w, "ts": base + offset},
                           timestamp=base + offset)
            assert response.status_code in (200, 201, 409), response.text
            done.append((base + offset, response.status_code, response.json()))
        return done

    with httpx.Client(base_url=processes[1], headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=30) as admin:
        configure(admin, ns, strategy="last-write-wins")
        outcomes = [o for result in run_writers(processes, writer) for o in result]
        final = get(admin, ns, "lww")
    newest = base + total - 1
    assert final["timestamp"] == newest and final["value"]["ts"] == newest
    applied = sorted((body["version"], ts) for ts, status, body in outcomes if status != 409)
    refused = [(ts, body) for ts, status, body in outcomes if status == 409]
    # every applied write is newer than the one it replaced; every refused one lost to a newer
    assert [v for v, _ in applied] == list(range(1, len(applied) + 1))
    assert all(a[1] < b[1] for a, b in itertools.pairwise(applied))
    assert refused, "no write arrived after a newer one: the test exercised nothing"
    for ts, body in refused:
        assert body["error"]["code"] == "write_conflict"
        assert body["error"]["details"]["winner"]["timestamp"] > ts
    assert final["version"] == len(applied)
