"""AMP search (broker/amp/search.py) over real HTTP on both stores: filters by type, owner,
status (stale only when asked, archived only when asked, deleted never), metadata equality and
creation time; text relevance ranking combined with decay; pagination with a cursor."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.storage import layout
from tests.support.amp import (
    DAY_MS,
    Amp,
    amp_broker,
    assert_posted_alone,
    iso,
    ms_of,
    now_ms,
    sync_redis,
    wait_posted,
)
from tests.support.brokers import BACKENDS, Broker


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Iterator[Amp]:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


def ulid_at(ms: int) -> str:
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = (ms << 80) | (uuid.uuid4().int >> 48)
    return "".join(alphabet[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def import_at(amp: Amp, created_ms: int, text: str = "imported", owner: str = "u-1",
              **changes: Any) -> str:
    """Import an active, non-decaying cell created at `created_ms`; returns its id."""
    cell = {"id": ulid_at(created_ms), "type": "semantic", "content": {"text": text},
            "identity": {"owner_id": owner, "owner_type": "user", "created_by": "agent-1"},
            "scoring": {"importance": 0.9, "decay_rate": 0.0},
            "lifecycle": {"created_at": iso(created_ms), "status": "active"}, **changes}
    response = amp.import_cells([cell])
    assert response.json() == {"imported": 1, "errors": []}, response.text
    return str(cell["id"])


def all_pages(amp: Amp, **body: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        result = amp.search(**body, **({"cursor": cursor} if cursor else {}))
        pages.append([hit["cell"]["id"] for hit in result["results"]])
        cursor = result["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50, "the cursor never ends"


# ---- filters ----


def test_filter_by_memory_types(amp: Amp) -> None:
    episodic = amp.create("an event", type="episodic")["id"]
    semantic = amp.create("a fact", type="semantic")["id"]
    procedural = amp.create("a procedure", type="procedural")["id"]
    assert set(amp.search_ids(types=["semantic"])) == {semantic}
    assert set(amp.search_ids(types=["episodic", "procedural"])) == {episodic, procedural}
    assert set(amp.search_ids()) == {episodic, semantic, procedural}
    assert amp.search_ids(types=[]) == []


def test_filter_by_owner(amp: Amp) -> None:
    user = amp.create("u", owner="sam")["id"]
    agent = amp.create("a", owner="sam", owner_type="agent")["id"]
    org = amp.create("o", owner="acme", owner_type="organization")["id"]
    amp.create("other", owner="samantha")
    assert set(amp.search_ids(owner_id="sam")) == {user, agent}
    assert set(amp.search_ids(owner_id="sam", owner_type="agent")) == {agent}
    assert set(amp.search_ids(owner_type="organization")) == {org}
    assert amp.search_ids(owner_id="nobody") == []
    assert amp.search_ids(owner_id="sam", query="other") == []
    assert set(amp.search_ids(owner_id="acme", owner_type="organization")) == {org}


def test_filter_by_status(amp: Amp) -> None:
    active = amp.create("active cell", scoring={"importance": 1.0, "decay_rate": 0.0})["id"]
    archived = amp.create("archived cell", scoring={"importance": 0.1})
    stale = amp.create("stale cell", scoring={"importance": 0.6})  # stale after 69.3 days
    start = ms_of(stale["lifecycle"]["created_at"])
    amp.run()
    amp.run(start + 31 * DAY_MS)
    amp.run(start + 70 * DAY_MS)
    assert amp.status(archived) == "archived"
    assert amp.status(stale) == "stale"

    assert amp.search_ids() == [active]
    assert set(amp.search_ids(include_stale=True)) == {active, stale["id"]}
    assert amp.search_ids(status=["stale"]) == [stale["id"]]
    assert amp.search_ids(status=["archived"]) == [archived["id"]]
    assert set(amp.search_ids(status=["active", "archived"])) == {active, archived["id"]}
    for body in ({"query": "cell"}, {"owner_id": "u-1"}):
        assert amp.search_ids(**body) == [active]
        assert set(amp.search_ids(include_stale=True, **body)) == {active, stale["id"]}
        assert amp.search_ids(status=["archived"], **body) == [archived["id"]]
    statuses = {h["cell"]["id"]: h["cell"]["lifecycle"]["status"]
                for h in amp.search(status=["active", "stale", "archived"])["results"]}
    assert statuses == {active: "active", stale["id"]: "stale", archived["id"]: "archived"}


def test_filter_by_metadata_equality(amp: Amp) -> None:
    def with_meta(metadata: dict[str, Any]) -> str:
        return str(amp.post_cell({"type": "semantic", "content": {"text": "m",
                                                                  "metadata": metadata},
                                  "identity": {"owner_id": "u-1", "owner_type": "user"}}
                                 ).json()["id"])

    tea = with_meta({"topic": "tea", "level": 2, "flags": {"hot": True}})
    coffee = with_meta({"topic": "coffee", "level": 2})
    one = with_meta({"topic": "tea", "level": 1, "active": True})
    text_two = with_meta({"topic": "tea", "level": "2"})
    bare = with_meta({})
    assert set(amp.search_ids(metadata={"topic": "tea"})) == {tea, one, text_two}
    assert set(amp.search_ids(metadata={"topic": "tea", "level": 2})) == {tea}
    assert set(amp.search_ids(metadata={"level": 2})) == {tea, coffee}
    assert set(amp.search_ids(metadata={"level": "2"})) == {text_two}
    assert set(amp.search_ids(metadata={"flags": {"hot": True}})) == {tea}
    assert amp.search_ids(metadata={"topic": None}) == []
    # JSON equality: true is not 1, and 1 is not true.
    assert set(amp.search_ids(metadata={"level": True})) == set()
    assert set(amp.search_ids(metadata={"active": 1})) == set()
    assert set(amp.search_ids(metadata={"active": True})) == {one}
    assert bare in amp.search_ids(metadata={})


def test_filter_by_creation_time(amp: Amp) -> None:
    now = now_ms()
    old = import_at(amp, now - 30 * DAY_MS, "old")
    middle = import_at(amp, now - 20 * DAY_MS, "middle")
    recent = import_at(amp, now - 10 * DAY_MS, "recent")
    fresh = amp.create("fresh")["id"]

    def between(after: int | None, before: int | None, **body: Any) -> set[str]:
        if after is not None:
            body["created_after"] = iso(after)
        if before is not None:
            body["created_before"] = iso(before)
        return set(amp.search_ids(**body))

    assert between(now - 25 * DAY_MS, None) == {middle, recent, fresh}
    assert between(None, now - 15 * DAY_MS) == {old, middle}
    assert between(now - 25 * DAY_MS, now - 15 * DAY_MS) == {middle}
    assert between(now - 20 * DAY_MS, now - 10 * DAY_MS) == {middle, recent}  # inclusive
    assert between(now - 9 * DAY_MS, now - 8 * DAY_MS) == set()
    assert between(now - 25 * DAY_MS, None, owner_id="u-1") == {middle, recent, fresh}
    assert between(now - 25 * DAY_MS, now - 15 * DAY_MS, query="middle old") == {middle}
    # The middle cell's time plus an hour on a UTC+02:00 clock: an hour before that cell.
    zoned = iso(now - 20 * DAY_MS + 3_600_000).replace("Z", "+02:00")
    assert set(amp.search_ids(created_after=zoned)) == {middle, recent, fresh}
    assert set(amp.search_ids(created_after=zoned.replace("+02:00", "Z"))) == {recent, fresh}


# ---- ranking ----


def test_a_cell_matching_more_query_words_ranks_first(amp: Amp) -> None:
    one = amp.create("the deploy checklist")["id"]
    both = amp.create("the deploy checklist for the container build")["id"]
    none = amp.create("unrelated gardening notes")["id"]
    hits = amp.search(query="container deploy")["results"]
    assert [h["cell"]["id"] for h in hits] == [both, one]
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert none not in amp.search_ids(query="container deploy")


def test_a_cell_matching_a_rarer_word_ranks_first(amp: Amp) -> None:
    for i in range(8):
        amp.create(f"python note {i}")
    common = amp.create("python")["id"]
    rare = amp.create("haskell")["id"]
    ranked = amp.search_ids(query="python haskell", limit=100)
    assert ranked[0] == rare
    assert ranked.index(common) > 0
    assert len(ranked) == 10


def test_a_word_repeated_in_a_cell_ranks_it_higher(amp: Amp) -> None:
    many = amp.create("tea tea tea tea with milk")["id"]
    once = amp.create("tea with milk")["id"]
    assert amp.search_ids(query="tea") == [many, once]


def test_relevance_is_combined_with_the_decay_score(amp: Amp) -> None:
    strong = amp.create("espresso preferences", scoring={"importance": 0.9})["id"]
    weak = amp.create("espresso preferences", scoring={"importance": 0.35})["id"]
    hits = amp.search(query="espresso")["results"]
    assert [h["cell"]["id"] for h in hits] == [strong, weak]
    by_id = {h["cell"]["id"]: h for h in hits}
    assert by_id[strong]["decay_score"] == pytest.approx(0.9, rel=1e-3)
    assert by_id[weak]["decay_score"] == pytest.approx(0.35, rel=1e-3)
    relevance = by_id[strong]["score"] / (0.2 + 0.8 * by_id[strong]["decay_score"])
    assert by_id[weak]["score"] == pytest.approx(relevance * (0.2 + 0.8 * 0.35), rel=1e-3)


def relevances(amp: Amp, agent: str, query: str) -> dict[str, float]:
    """Each hit's relevance: its score without the decay weight (which moves with the clock)."""
    return {h["cell"]["id"]: h["score"] / (0.2 + 0.8 * h["decay_score"])
            for h in amp.search(agent, query=query, limit=100)["results"]}


def test_scores_come_only_from_cells_the_searcher_may_read(amp: Amp) -> None:
    """Word weights count the cells the searcher may read, so no score tells an agent how many
    private cells of others mention a word."""
    def own(text: str, agent: str) -> str:
        return str(amp.create(text, owner=agent, owner_type="agent", agent=agent)["id"])

    mine = own("the falcon nests on the tower", "agent-a")
    also_mine = own("a falcon and a kestrel", "agent-a")
    theirs = own("falcon sightings by the kestrel", "agent-b")
    query = "falcon kestrel"
    before = {agent: relevances(amp, agent, query) for agent in ("agent-a", "agent-b")}
    assert set(before["agent-a"]) == {mine, also_mine}
    assert set(before["agent-b"]) == {theirs}
    for i in range(30):  # another owner's private cells, with both words
        own(f"falcon falcon kestrel note {i}", "agent-c")
    own("a kestrel only", "agent-b")  # readable by agent-b alone
    assert relevances(amp, "agent-a", query) == pytest.approx(before["agent-a"], rel=1e-9)
    assert relevances(amp, "agent-c", query)  # agent-c ranks its own
    # What agent-a may read does count: a public cell with the word moves its weights.
    amp.create("kestrel kestrel", owner="agent-c", owner_type="agent", agent="agent-c",
               access_policy={"public": True})
    moved = relevances(amp, "agent-a", query)
    assert moved[mine] != pytest.approx(before["agent-a"][mine], rel=1e-6)


@pytest.mark.parametrize("body", [
    pytest.param({}, id="everything"),
    pytest.param({"owner_id": "u-1"}, id="one-owner"),
    pytest.param({"types": ["semantic"]}, id="filtered"),
])
def test_without_a_query_cells_rank_by_decay_score(amp: Amp, body: dict[str, Any]) -> None:
    importances = [0.5, 0.9, 0.35, 0.7, 0.6]
    ids = {amp.create(f"cell {i}", scoring={"importance": v})["id"]: v
           for i, v in enumerate(importances)}
    hits = amp.search(**body)["results"]
    assert [ids[h["cell"]["id"]] for h in hits] == sorted(importances, reverse=True)
    for hit in hits:
        assert hit["decay_score"] == pytest.approx(ids[hit["cell"]["id"]], rel=1e-3)
        assert math.isfinite(hit["score"])


# ---- pagination ----


@pytest.mark.parametrize("body", [
    pytest.param({}, id="everything"),
    pytest.param({"owner_id": "u-page"}, id="one-owner"),
    pytest.param({"query": "page"}, id="query"),
    pytest.param({"types": ["episodic"]}, id="filtered"),
    pytest.param({"created_after": "2000-01-01T00:00:00Z"}, id="time-range"),
])
def test_pages_cover_every_match_once_in_rank_order(amp: Amp, body: dict[str, Any]) -> None:
    created = {}
    for i in range(25):
        importance = 0.3 + (i * 7 % 25) / 40
        cell = amp.create(f"page cell {i}", owner="u-page", type="episodic",
                          scoring={"importance": importance})
        created[cell["id"]] = importance
    amp.create("page cell private", owner="u-page", type="episodic", agent="someone-else")
    pages = all_pages(amp, limit=10, **body)
    assert [len(p) for p in pages] == [10, 10, 5]
    seen = [cell_id for page in pages for cell_id in page]
    assert sorted(seen) == sorted(created)
    assert [created[i] for i in seen] == sorted(created.values(), reverse=True)


def test_a_page_of_exactly_the_remaining_cells_has_no_next_cursor(amp: Amp) -> None:
    for i in range(4):
        amp.create(f"cell {i}")
    first = amp.search(limit=2)
    assert len(first["results"]) == 2 and first["next_cursor"]
    second = amp.search(limit=2, cursor=first["next_cursor"])
    assert len(second["results"]) == 2
    assert second["next_cursor"] is None
    assert amp.search(limit=4)["next_cursor"] is None


def test_search_results_carry_the_cell_and_its_scores(amp: Amp) -> None:
    cell = amp.create("shape check", scoring={"importance": 0.8, "confidence": 0.5})
    result = amp.search(query="shape")
    assert set(result) == {"results", "next_cursor"}
    (hit,) = result["results"]
    assert set(hit) == {"cell", "score", "decay_score"}
    assert hit["cell"]["id"] == cell["id"]
    assert hit["cell"]["content"] == cell["content"]
    assert hit["decay_score"] == pytest.approx(0.4, rel=1e-3)


def test_more_cells_than_one_request_ranks_are_paged_in_creation_order(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    """Over MAX_CANDIDATES cells with no owner or words to narrow them, search walks creation
    order, newest first; the pages still cover every match once. (On Redis only: the walk is
    the same code on both stores, and 5,000 imports take long on the embedded one.)"""
    with amp_broker(broker_factory, "redis", ns) as amp:
        walk_the_creation_order(amp)


def test_which_cells_a_search_ranks_never_depends_on_unreadable_ones(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    """More than MAX_CANDIDATES cells hold the word, all older than mine and private to
    another agent: mine is still ranked, since the cut is made among what I may read. (On
    Redis only, as above.)"""
    with amp_broker(broker_factory, "redis", ns) as amp:
        start = now_ms() - 10_000 * 60_000
        for first in range(0, 5_001, 250):
            cells = [{"id": ulid_at(start + i * 60_000), "type": "semantic",
                      "content": {"text": f"osprey sighting {i}"},
                      "identity": {"owner_id": "agent-c", "owner_type": "agent",
                                   "created_by": "agent-c"},
                      "lifecycle": {"created_at": iso(start + i * 60_000), "status": "active"}}
                     for i in range(first, min(first + 250, 5_001))]
            assert amp.import_cells(cells).json()["errors"] == []
        mine = amp.create("an osprey over the lake", owner="agent-a", owner_type="agent",
                          agent="agent-a")["id"]
        assert amp.search_ids("agent-a", query="osprey") == [mine]
        assert len(amp.search_ids("agent-c", query="osprey", limit=100)) == 100


def walk_the_creation_order(amp: Amp) -> None:
    now = now_ms()
    cells: list[dict[str, Any]] = []
    wanted: list[str] = []
    for i in range(5_030):
        kind = "procedural" if i % 170 == 0 else "semantic"
        created_ms = now - (5_030 - i) * 60_000
        cell = {"id": ulid_at(created_ms), "type": kind, "content": {"text": f"bulk {i}"},
                "identity": {"owner_id": f"o-{i % 50}", "owner_type": "user",
                             "created_by": "agent-1" if i % 340 else "someone-else"},
                "scoring": {"importance": 0.9, "decay_rate": 0.0},
                "lifecycle": {"created_at": iso(created_ms), "status": "active"}}
        cells.append(cell)
        if kind == "procedural" and i % 340:
            wanted.append(str(cell["id"]))
    for start in range(0, len(cells), 250):
        response = amp.import_cells(cells[start:start + 250])
        assert response.json()["errors"] == [], response.text
    pages = all_pages(amp, types=["procedural"], limit=4)
    assert all(len(page) <= 4 for page in pages)
    seen = [cell_id for page in pages for cell_id in page]
    assert seen == sorted(wanted, reverse=True)
    assert len(amp.search_ids(limit=100)) == 100


# ---- terms posted in the background ----


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_finds_cells_whose_terms_are_not_posted_yet(
        backend: str, broker_factory: Callable[..., Broker], redis_url: str, ns: str) -> None:
    # The term poster waits an hour here: every word is found through the unposted cells.
    with amp_broker(broker_factory, backend, ns, amp_post_interval_seconds=3600) as amp:
        cell = amp.create("the heron nests by the river")
        assert amp.search_ids(query="heron") == [cell["id"]]
        assert amp.patch(cell["id"], {"content": {"text": "the kestrel hovers"}}
                         ).status_code == 200
        assert amp.search_ids(query="kestrel") == [cell["id"]]
        assert amp.search_ids(query="heron") == []
        client = sync_redis(amp, redis_url)
        try:
            assert not client.smembers(layout.amp_term(ns, "kestrel"))
            assert client.smembers(layout.amp_unposted(ns)) == {cell["id"].encode()}
        finally:
            client.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rarer_word_ranks_first_before_any_term_is_posted(
        backend: str, broker_factory: Callable[..., Broker], ns: str) -> None:
    # Word weights count the unposted cells by their current text, as every other cell.
    with amp_broker(broker_factory, backend, ns, amp_post_interval_seconds=3600) as amp:
        common = [amp.create(f"python note {i}")["id"] for i in range(8)]
        rare = amp.create("haskell")["id"]
        alone = amp.create("python")["id"]
        ranked = amp.search_ids(query="python haskell", limit=100)
        assert ranked[0] == rare
        assert sorted(ranked[1:]) == sorted([*common, alone])


def test_cells_another_process_wrote_are_posted_by_an_idle_poster(
        broker_factory: Callable[..., Broker], redis_url: str, ns: str) -> None:
    # The writer's own poster waits an hour; the other broker's was never rung by a write of
    # its own, and still posts the cell at its next idle look (a second at most).
    with amp_broker(broker_factory, "redis", ns, amp_post_interval_seconds=3600) as writer, \
            amp_broker(broker_factory, "redis", ns) as idle:
        cell = writer.create("the heron nests by the river")
        assert_posted_alone(writer, redis_url, "heron", cell["id"])
        assert idle.search_ids(query="heron") == [cell["id"]]


def test_posting_takes_out_the_words_a_record_from_an_older_broker_had(
        amp: Amp, redis_url: str) -> None:
    # Older brokers posted terms as they wrote and kept no `posted` list: the record's terms
    # are what the term sets hold.
    cell = amp.create("the owl hunts at night")
    client = sync_redis(amp, redis_url)
    try:
        wait_posted(client, amp.namespace)
        assert client.hdel(layout.amp_cell(amp.namespace, cell["id"]), "posted") == 1
        assert amp.patch(cell["id"], {"content": {"text": "the lark sings at dawn"}}
                         ).status_code == 200
        wait_posted(client, amp.namespace)
        for word, held in (("owl", False), ("night", False), ("lark", True), ("at", True)):
            assert client.sismember(layout.amp_term(amp.namespace, word), cell["id"]) == held
    finally:
        client.close()
    assert amp.search_ids(query="owl") == []
    assert amp.search_ids(query="lark") == [cell["id"]]
