"""memp.langgraph against a real broker: the behaviour LangGraph documents for `BaseStore` and
its in-memory store passes (items, search with filters and paging, namespace listing with
prefix, suffix, wildcards and depth, namespace validation, batches, TTL), through both the
sync and the async store, and two graph processes sharing memory."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, PutOp, SearchOp

from memp import MEMP, AsyncMEMP
from memp.langgraph import AsyncMempStore, MempStore
from tests.support.brokers import ADMIN_KEY, Broker
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class SyncFacade:
    """The async store behind the sync names, so one test body checks both stores."""

    def __init__(self, store: AsyncMempStore) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, f"a{name}")
        return lambda *args, **kwargs: self.loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.store.aclose())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def store(request: pytest.FixtureRequest, server: Broker, ns: str) -> Iterator[Any]:
    """A store on a fresh namespace: MempStore, or AsyncMempStore driven through a loop."""
    if request.param == "sync":
        with MempStore(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as sync:
            yield sync
        return
    facade = SyncFacade(AsyncMempStore(api_key=ADMIN_KEY, namespace=ns, base_url=server.url))
    try:
        yield facade
    finally:
        facade.close()


def test_put_get_delete(store: Any, ns: str, server: Broker) -> None:
    before = datetime.now(UTC)
    store.put(("users", "u-1"), "prefs", {"theme": "dark", "langs": ["py", "ts"]})
    item = store.get(("users", "u-1"), "prefs")
    assert (item.namespace, item.key, item.value) == (("users", "u-1"), "prefs",
                                                      {"theme": "dark", "langs": ["py", "ts"]})
    assert before.timestamp() - 1 <= item.created_at.timestamp() <= time.time() + 1
    store.put(("users", "u-1"), "prefs", {"theme": "light"})
    again = store.get(("users", "u-1"), "prefs")
    assert again.value == {"theme": "light"}
    assert again.created_at == item.created_at and again.updated_at >= item.updated_at
    assert store.get(("users", "u-1"), "missing") is None
    assert store.get(("users",), "prefs") is None
    store.delete(("users", "u-1"), "prefs")
    assert store.get(("users", "u-1"), "prefs") is None
    store.delete(("users", "u-1"), "prefs")  # deleting what is gone is no error
    # Labels and keys are any text but what LangGraph refuses: they are encoded in the key.
    store.put(("a/b", "*", "ü ?#%"), "../x y", {"ok": 1})
    assert store.get(("a/b", "*", "ü ?#%"), "../x y").value == {"ok": 1}
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as memp:
        assert memp.memory.get("a%2Fb/%2A/%C3%BC%20%3F%23%25/@..%2Fx%20y") == {"ok": 1}


def test_search_filters_and_pages(store: Any) -> None:
    for number in range(6):
        store.put(("docs", "team" if number % 2 else "user"), f"d{number}",
                  {"n": number, "kind": "report" if number < 3 else "note",
                   "meta": {"lang": "en" if number != 4 else "fr", "tags": ["a"]}})
    store.put(("other",), "x", {"n": 100})
    keys = [item.key for item in store.search(("docs",))]
    assert sorted(keys) == [f"d{n}" for n in range(6)]
    assert [i.key for i in store.search(("docs", "team"))] == ["d1", "d3", "d5"]
    assert {i.key for i in store.search(("docs",), filter={"kind": "report"})} == \
        {"d0", "d1", "d2"}
    assert {i.key for i in store.search((), filter={"n": {"$gte": 4}})} == {"d4", "d5", "x"}
    assert {i.key for i in store.search(("docs",), filter={"n": {"$gt": 1, "$lte": 3}})} == \
        {"d2", "d3"}
    assert {i.key for i in store.search(("docs",), filter={"n": {"$ne": 0},
                                                           "kind": {"$eq": "report"}})} == \
        {"d1", "d2"}
    assert [i.key for i in store.search(("docs",), filter={"meta": {"lang": "fr"}})] == ["d4"]
    assert len(store.search(("docs",), filter={"meta": {"tags": ["a"]}})) == 6
    assert store.search(("docs",), filter={"n": {"$lt": -1}}) == []
    every = [i.key for i in store.search(("docs",), limit=100)]
    assert [i.key for i in store.search(("docs",), limit=2)] == every[:2]
    assert [i.key for i in store.search(("docs",), limit=2, offset=2)] == every[2:4]
    assert [i.key for i in store.search(("docs",), limit=10, offset=5)] == every[5:]
    hit = store.search(("docs",), query="anything", limit=1)[0]  # no index: no ranking
    assert hit.score is None and hit.namespace[0] == "docs"
    assert store.search(("nothing",)) == []


NAMESPACES = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"),
              ("a", "c", "f"), ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"),
              ("admin", "users", "789")]


def test_list_namespaces(store: Any) -> None:
    assert store.list_namespaces() == []
    for number, namespace in enumerate(NAMESPACES):
        store.put(namespace, f"id_{number}", {"data": number})
    store.put(("a", "b", "c"), "second", {"data": "same namespace"})
    listed = store.list_namespaces
    assert listed() == sorted(NAMESPACES)
    assert listed(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d", "e"),
                                         ("a", "b", "d", "i"), ("a", "b", "f")]
    assert listed(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert listed(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert listed(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d"),
                                                      ("a", "b", "f")]
    assert listed(max_depth=2) == [("a", "b"), ("a", "c"), ("admin", "users"), ("b", "a"),
                                   ("users", "123"), ("users", "456")]
    assert listed(prefix=("a", "b"), limit=2) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert listed(prefix=("a", "b"), offset=2) == [("a", "b", "d", "i"), ("a", "b", "f")]
    assert listed(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert listed(suffix=("*", "f")) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert listed(prefix=("users", "*")) == [("users", "123"), ("users", "456", "settings")]
    assert listed(prefix=("*", "users"), suffix=("*", "settings")) == []
    assert listed(prefix=("nonexistent",)) == []
    assert listed(prefix=("users", "123")) == [("users", "123")]
    assert listed(prefix=("a", "b", "c", "d", "e")) == []


def test_list_namespaces_pages(store: Any) -> None:
    for number in range(20):
        store.put(("namespace", f"sub_{number:02d}"), f"id_{number:02d}", {"n": number})
    pages = [store.list_namespaces(prefix=("namespace",), limit=5, offset=start)
             for start in (0, 5, 15)]
    assert pages == [[("namespace", f"sub_{n:02d}") for n in range(start, start + 5)]
                     for start in (0, 5, 15)]


def test_namespaces_langgraph_refuses(store: Any) -> None:
    document = {"foo": "bar"}
    for bad in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            store.put(bad, "foo", document)
    # "langgraph" is refused only as the root label given to put; batches may use it.
    store.put(("foo", "langgraph", "foo"), "bar", document)
    assert store.get(("foo", "langgraph", "foo"), "bar").value == document
    store.batch([PutOp(("langgraph", "foo"), "bar", document)])
    assert store.search(("langgraph", "foo"))[0].value == document
    with pytest.raises(InvalidNamespaceError):  # ...but not labels with periods
        store.batch([PutOp(("the", "thing.about"), "bar", document)])


def test_a_batch_reads_first_then_applies_its_puts(store: Any) -> None:
    store.put(("b",), "k", {"v": 0})
    results = store.batch([
        PutOp(("b",), "k", {"v": 1}), GetOp(("b",), "k"), PutOp(("b",), "k", {"v": 2}),
        SearchOp(("b",)), ListNamespacesOp(), PutOp(("b",), "new", {"v": 3}),
        PutOp(("b",), "new", None)])
    assert results[0] is None and results[2] is None
    assert results[1].value == {"v": 0}
    assert [item.value for item in results[3]] == [{"v": 0}]
    assert results[4] == [("b",)]
    assert store.get(("b",), "k").value == {"v": 2}
    assert store.get(("b",), "new") is None


def test_ttl(store: Any, ns: str, server: Broker) -> None:
    store.put(("t",), "short", {"v": 1}, ttl=1 / 60)  # one second
    store.put(("t",), "kept", {"v": 2}, ttl=5)
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as memp:
        assert memp.memory.get_entry("t/@kept").ttl_seconds == 300
        version = memp.memory.get_entry("t/@kept").version
        store.get(("t",), "kept")  # a read starts the TTL again (refresh_on_read)
        assert memp.memory.get_entry("t/@kept").version == version + 1
        store.get(("t",), "kept", refresh_ttl=False)
        assert memp.memory.get_entry("t/@kept").version == version + 1
    deadline = time.monotonic() + 5
    while store.get(("t",), "short", refresh_ttl=False) is not None:
        assert time.monotonic() < deadline, "the item did not expire"
        time.sleep(0.1)
    assert [item.key for item in store.search(("t",), refresh_ttl=False)] == ["kept"]


def test_ttl_config_gives_a_default(server: Broker, ns: str) -> None:
    with MempStore(api_key=ADMIN_KEY, namespace=ns, base_url=server.url,
                   ttl={"default_ttl": 2, "refresh_on_read": False}) as store, \
            MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as memp:
        store.put(("t",), "k", {"v": 1})
        assert memp.memory.get_entry("t/@k").ttl_seconds == 120
        store.get(("t",), "k")
        assert memp.memory.get_entry("t/@k").version == 1


def test_stores_share_a_client_and_a_prefix(server: Broker, ns: str) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as memp:
        memp.memory.put("customer/1", {"not": "an item"})
        store = MempStore(memp, prefix="graphs/support")
        store.put(("users",), "u", {"v": 1})
        assert memp.memory.get("graphs/support/users/@u") == {"v": 1}
        assert store.list_namespaces() == [("users",)]
        assert MempStore(memp).list_namespaces() == [("graphs", "support", "users")]
        store.close()  # not its client
        assert memp.memory.get("customer/1") == {"not": "an item"}

    async def main() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as client:
            astore = AsyncMempStore(client, prefix="graphs/support")
            assert (await astore.aget(("users",), "u")).value == {"v": 1}  # type: ignore[union-attr]
            results = await asyncio.gather(*(astore.aput(("many",), f"k{n}", {"n": n})
                                             for n in range(5)))
            assert results == [None] * 5
            assert len(await astore.asearch(("many",))) == 5
            with pytest.raises(NotImplementedError):
                astore.get(("users",), "u")

    asyncio.run(main())


def run_example(server: Broker, namespace: str) -> Callable[..., subprocess.Popen[str]]:
    def start(*args: str) -> subprocess.Popen[str]:
        env = {**os.environ, "MEMP_BASE_URL": server.url, "MEMP_API_KEY": ADMIN_KEY,
               "MEMP_NAMESPACE": namespace}
        return subprocess.Popen([sys.executable, str(ROOT / "docs/examples/langgraph_team.py"),
                                 *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return start


def test_two_graph_processes_see_each_others_writes(server: Broker, ns: str) -> None:
    """docs/langgraph.md's example: each graph writes its agent's status to the store and
    waits for the other process's graph to write its own."""
    start = run_example(server, ns)
    alice, bob = start("alice", "bob"), start("bob", "alice")
    out_alice, err_alice = alice.communicate(timeout=60)
    out_bob, err_bob = bob.communicate(timeout=60)
    assert alice.returncode == 0, err_alice
    assert bob.returncode == 0, err_bob
    assert out_alice.splitlines() == ["alice heard: bob is working on the report",
                                      "alice sees: alice, bob"]
    assert out_bob.splitlines() == ["bob heard: alice is working on the report",
                                    "bob sees: alice, bob"]


MEMORIES = {"allergy": {"text": "Ana is allergic to peanuts", "kind": "health"},
            "colour": {"text": "Ana's favourite colour is green", "kind": "taste"},
            "city": {"text": "Bob lives in Lisbon near the river", "kind": "place"},
            "meeting": {"text": "The team meets every Tuesday morning", "kind": "work"}}
HURT = "what food could hurt Ana?"


@pytest.fixture(params=["sync", "async"])
def indexed(request: pytest.FixtureRequest, server: Broker, ns: str) -> Iterator[Any]:
    """An indexing store acting as the AMP agent `graph-<ns>` (the admin key may act for it)."""
    options = {"api_key": ADMIN_KEY, "namespace": ns, "base_url": server.url,
               "prefix": "lg", "index": True, "agent": f"graph-{ns}"}
    if request.param == "sync":
        with MempStore(**options) as sync:
            yield sync
        return
    facade = SyncFacade(AsyncMempStore(**options))
    try:
        yield facade
    finally:
        facade.close()


def ranked(store: Any, query: str, **kwargs: Any) -> list[tuple[str, float]]:
    return [(item.key, item.score) for item in store.search(("people",), query=query, **kwargs)]


def recalled(store: Any, query: str, key: str) -> Callable[[], bool]:
    """The broker embeds new text in the background: wait until `key` ranks first."""
    return lambda: [hit for hit, _ in ranked(store, query, limit=1)] == [key]


def test_search_by_meaning(indexed: Any, server: Broker, ns: str) -> None:
    for key, value in MEMORIES.items():
        indexed.put(("people", "team" if key == "meeting" else "friends"), key, value)
    indexed.put(("elsewhere",), "allergy", MEMORIES["allergy"])
    wait_until(lambda: len(ranked(indexed, HURT)) == 4, "every item embedded")
    hits = indexed.search(("people",), query=HURT)
    assert hits[0].key == "allergy" and hits[0].namespace == ("people", "friends")
    assert hits[0].value == MEMORIES["allergy"]
    scores = [hit.score for hit in hits]
    assert all(0 <= score <= 1 for score in scores) and scores == sorted(scores, reverse=True)
    assert sorted(hit.key for hit in hits) == sorted(MEMORIES)  # the prefix's items, once
    assert ranked(indexed, "where does Bob live?")[0][0] == "city"
    # The filter and paging apply to the ranking; the namespace prefix narrows it.
    assert [key for key, _ in ranked(indexed, HURT, filter={"kind": {"$ne": "health"}})] == \
        [key for key, _ in ranked(indexed, HURT)[1:]]
    assert ranked(indexed, HURT, limit=2, offset=1) == ranked(indexed, HURT)[1:3]
    assert [i.key for i in indexed.search(("people", "team"), query=HURT)] == ["meeting"]
    # Without a query the store lists as before: key order, no score.
    plain = indexed.search(("people",))
    assert [i.key for i in plain] == ["allergy", "city", "colour", "meeting"]
    assert {i.score for i in plain} == {None}
    # Another process (its own client and store) sees the same items ranked the same.
    script = ("import json, sys\nfrom memp.langgraph import MempStore\n"
              "with MempStore(api_key=sys.argv[1], namespace=sys.argv[2], base_url=sys.argv[3],"
              " prefix='lg', index=True, agent=sys.argv[4]) as store:\n"
              "    print(json.dumps([[i.key, i.score] for i in store.search(('people',),"
              " query=sys.argv[5])]))")
    other = subprocess.run([sys.executable, "-c", script, ADMIN_KEY, ns, server.url,
                            f"graph-{ns}", HURT], capture_output=True, text=True, timeout=60,
                           check=True)
    assert [tuple(hit) for hit in json.loads(other.stdout)] == \
        [pytest.approx(hit) for hit in ranked(indexed, HURT)]


def test_recall_follows_changes(indexed: Any) -> None:
    indexed.put(("people",), "allergy", {"text": "Ana likes jazz"})
    indexed.put(("people",), "city", MEMORIES["city"])
    indexed.put(("people",), "hidden", MEMORIES["allergy"], index=False)
    indexed.put(("people",), "fields", {"text": "Ana cannot eat shellfish", "n": 1},
                index=["missing"])
    # Text past what a cell holds is cut to its first 16 K characters, not refused.
    indexed.put(("people",), "long", {"text": "Carla plays the cello " * 5000,
                                      "deep": {"a": [{"b": "and the violin"}]}})
    wait_until(recalled(indexed, "where does Bob live?", "city"), "the city recalled")
    assert {key for key, _ in ranked(indexed, "Ana")} <= {"allergy", "city", "long"}
    wait_until(recalled(indexed, "who plays music?", "long"), "a long item recalled")
    indexed.put(("people",), "allergy", MEMORIES["allergy"])  # new text, new meaning
    wait_until(recalled(indexed, HURT, "allergy"), "the changed item recalled by meaning")
    indexed.delete(("people",), "allergy")
    assert "allergy" not in [key for key, _ in ranked(indexed, HURT)]
    after = [key for key, _ in ranked(indexed, "Bob Lisbon")]
    assert after[0] == "city" and set(after) <= {"city", "long"}
    # Hostile queries: no error, nothing but the store's items; one with no word ranks
    # nothing, so the items come as without a query.
    for hostile in ("\x00\x1f\u202e Bob", "%2F@ ../ Bob" * 50, "Bob " * 2000):
        assert {key for key, _ in ranked(indexed, hostile)} <= {"city", "long"}
    assert ranked(indexed, "*" * 128) == [(key, None) for key in ("city", "fields", "hidden",
                                                                  "long")]
    indexed.put(("people",), "city", MEMORIES["city"], index=False)  # unlinked
    assert [key for key, _ in ranked(indexed, "Bob Lisbon")] == ["long"]
    assert {i.key for i in indexed.search(("people",))} == {"city", "fields", "hidden", "long"}


def test_an_indexed_store_needs_an_agent(server: Broker, ns: str) -> None:
    with pytest.raises(ValueError, match="agent"):
        MempStore(api_key=ADMIN_KEY, namespace=ns, base_url=server.url, index=True)


def test_agents_share_a_store_through_its_owner(server: Broker, ns: str) -> None:
    """Graphs running as two agents: cells owned by the first, shared with the second through
    `readers`; a third agent, not among them, recalls nothing (AMP's policy)."""
    clients = [MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) for _ in range(3)]
    with clients[0], clients[1], clients[2]:
        for number, client in enumerate(clients):
            client.register(f"graph-{number}")
        first, second = (client.agent.id for client in clients[:2] if client.agent)
        one = MempStore(clients[0], index=True, readers=[second])
        two = MempStore(clients[1], index=True, owner=first, readers=[second])
        outsider = MempStore(clients[2], index=True, owner=first)
        one.put(("people",), "allergy", MEMORIES["allergy"])
        two.put(("people",), "city", MEMORIES["city"])
        wait_until(recalled(two, HURT, "allergy"), "the first agent's item recalled")
        wait_until(recalled(one, "where does Bob live?", "city"), "the second's recalled")
        # The second agent updates the item's cell the first one made (one cell per item).
        two.put(("people",), "allergy", {"text": "Ana must never eat shellfish"})
        cells = clients[0].amp.search(owner_id=first, owner_type="agent",
                                      metadata={"langgraph_item": "people/@allergy"}).results
        assert [(hit.cell.content.text, hit.cell.identity.created_by) for hit in cells] == \
            [("Ana must never eat shellfish", first)]
        assert outsider.search(("people",), query=HURT) == []
        assert len(outsider.search(("people",))) == 2  # MEMP's grants, not AMP's, for items
