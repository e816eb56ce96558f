"""Each broker process's in-memory vector index (broker/amp/nearest.py, vector_index.py), which
recall by meaning over every cell (no owner filter) ranks from: fed from the vector log so a
cell embedded through one process is recalled through another, rebuilt at start, and only ever
a source of candidates (deleted, purged, unreadable cells and another namespace's or model's
vectors never come back)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from broker.amp.nearest import NearestCells
from broker.amp.vector_index import VectorIndex
from broker.storage import layout
from tests.support.amp import NO_BACKGROUND_RUNS, Amp, TestClock, clocked_broker, iso
from tests.support.brokers import BACKENDS, Broker, data_client, start_broker
from tests.support.embeddings import EmbeddingsStandIn
from tests.support.waiting import wait_until

HOUR_MS, DAY_MS = 3_600_000, 86_400_000
FACTS = ["Ana is allergic to peanuts", "The deploy runs every Friday at noon",
         "Bob prefers window seats on flights", "Carla's daughter plays the cello"]


def start(backend: str, redis_url: str, namespace: str | None = None,
          **settings: Any) -> tuple[Broker, Amp]:
    namespace = namespace or f"n-{uuid.uuid4().hex[:10]}"
    broker = start_broker(backend, redis_url, amp_namespace=namespace,
                          amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS, **settings)
    return broker, Amp(broker.url, namespace, app=broker.app)


def index_of(amp: Amp) -> NearestCells:
    nearest = amp.app.state.services.amp_recall.index
    assert isinstance(nearest, NearestCells)
    return nearest


def holds(amp: Amp, *cell_ids: str) -> bool:
    """Whether the broker's vector index is ready and holds every cell named."""
    index = index_of(amp).index
    return index is not None and all(i in index for i in cell_ids)


def indexed_as_stored(amp: Amp, cell_id: str) -> bool:
    """Whether the broker's index holds the cell's vector as stored now."""
    stored = data_client(amp.app).hget(layout.amp_vector(amp.namespace, cell_id), "vec")
    index = index_of(amp).index
    if stored is None or index is None:
        return False
    nearest = index.nearest(np.frombuffer(stored, dtype=np.float32), 1)
    return nearest[0][0] == cell_id and nearest[0][1] > 0.9999


def recall(amp: Amp, query: str, agent: str = "agent-1", **body: Any) -> list[str]:
    """The ids a search over every cell (no owner filter) returns, best first."""
    response = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": agent},
                             json={"query": query, **body})
    assert response.status_code == 200, response.text
    return [hit["cell"]["id"] for hit in response.json()["results"]]


def create_all(amp: Amp, texts: list[str], **fields: Any) -> list[str]:
    return [str(amp.create(t, owner=f"u-{n}", **fields)["id"]) for n, t in enumerate(texts)]


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Amp]:
    """A broker on an AMP namespace of its own."""
    broker, client = start(request.param, redis_url)
    yield client
    client.close()
    broker.stop()


# ---- the index itself ----


def unit(*values: float) -> bytes:
    row = np.array(values, dtype=np.float32)
    return (row / np.linalg.norm(row)).astype(np.float32).tobytes()


def test_the_index_ranks_by_cosine_replaces_removes_and_reuses_rows() -> None:
    index = VectorIndex(2)
    index.put("east", unit(1, 0))
    index.put("north", unit(0, 1))
    index.put("north-east", unit(1, 1))
    query = np.frombuffer(unit(1, 0.1), dtype=np.float32)
    assert [i for i, _ in index.nearest(query, 3)] == ["east", "north-east", "north"]
    assert [i for i, _ in index.nearest(query, 1)] == ["east"]
    index.put("east", unit(-1, 0))  # a new vector for the same cell replaces the old
    assert [i for i, _ in index.nearest(query, 3)] == ["north-east", "north", "east"]
    index.remove("north-east")
    assert [i for i, _ in index.nearest(query, 3)] == ["north", "east"]
    assert not index.put("odd", unit(1, 0, 0))  # other dimensions: refused
    assert "odd" not in index
    assert len(index) == 2


def test_rows_are_taken_only_for_the_digest_given() -> None:
    index = VectorIndex(2)
    index.put("east", unit(1, 0), "d-east")
    index.put("north", unit(0, 1), "d-north")
    index.put("blank", unit(1, 1))  # a row of no known text
    rows, missing = index.rows(["north", "east", "blank", "gone", "east"],
                               ["d-north", "d-old", "", "d-gone", "d-east"])
    # east under an older digest, the row of no digest and a cell not held are not taken.
    assert missing == [1, 2, 3]
    expected = np.stack([np.frombuffer(unit(0, 1), dtype=np.float32),
                         np.zeros(2, dtype=np.float32), np.zeros(2, dtype=np.float32),
                         np.zeros(2, dtype=np.float32),
                         np.frombuffer(unit(1, 0), dtype=np.float32)])
    assert np.array_equal(rows, expected)
    index.remove("north")
    index.put("west", unit(-1, 0), "d-west")  # takes north's row, with its own digest
    assert index.rows(["north", "west"], ["d-north", "d-west"])[1] == [0]
    assert index.rows([], [])[0].shape == (0, 2)


def test_the_index_grows_past_its_first_rows_and_finds_each_vector() -> None:
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((3000, 16)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    index = VectorIndex(16)
    for n, row in enumerate(rows):
        index.put(f"c{n}", row.tobytes())
    for n in range(0, 3000, 2):
        index.remove(f"c{n}")
    for n in range(0, 1000, 2):  # removed rows are used again
        index.put(f"d{n}", rows[n].tobytes())
    assert len(index) == 2000
    for n in (1, 999, 2999):
        assert index.nearest(rows[n], 1)[0][0] == f"c{n}"
    assert index.nearest(rows[500], 1)[0][0] == "d500"
    assert index.nearest(rows[1500], 1)[0][0] != "c1500"


# ---- over HTTP, on each store ----


def test_a_reworded_question_over_every_cell_finds_its_answer_from_the_index(
        amp: Amp) -> None:
    ids = create_all(amp, FACTS)
    wait_until(lambda: holds(amp, *ids), "every cell in the vector index")
    for mode in ("semantic", "hybrid"):
        assert recall(amp, "what food could hurt Ana?", mode=mode)[0] == ids[0]
        assert recall(amp, "what instrument does the child practice?", mode=mode)[0] == ids[3]
        assert recall(amp, "what food could hurt Ana?", mode=mode, min_score=0.99) == []


def test_cells_an_agent_may_not_read_or_not_in_the_asked_status_never_come_back(
        amp: Amp) -> None:
    private = str(amp.create("Ana is allergic to peanuts", owner="u-1", access_policy={
        "readable_by": ["agent-1"], "public": False})["id"])
    shared = str(amp.create("Ana cannot eat nuts of any kind", owner="u-1",
                            access_policy={"public": True})["id"])
    wait_until(lambda: holds(amp, private, shared), "both cells in the vector index")
    for mode in ("semantic", "hybrid"):
        assert set(recall(amp, "what food could hurt Ana?", mode=mode)) == {private, shared}
        assert recall(amp, "what food could hurt Ana?", agent="other", mode=mode) == [shared]
        assert recall(amp, "what food could hurt Ana?", mode=mode, status=["archived"]) == []
        assert recall(amp, "what food could hurt Ana?", mode=mode, types=["episodic"]) == []


def test_pages_of_a_search_over_every_cell_hold_each_cell_once(amp: Amp) -> None:
    texts = [f"note {n}: the team met about the quarterly budget and travel" for n in range(12)]
    ids = create_all(amp, texts)
    wait_until(lambda: holds(amp, *ids), "every cell in the vector index")
    for mode in ("semantic", "hybrid"):
        seen: list[str] = []
        cursor = None
        while True:
            body: dict[str, Any] = {"query": "budget meeting", "mode": mode, "limit": 5}
            page = amp.search(**body, **({"cursor": cursor} if cursor else {}))
            seen += [hit["cell"]["id"] for hit in page["results"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids)


def test_another_namespaces_cells_never_enter_the_index_nor_a_recall(
        redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two namespaces on one Redis")
    first, one = start("redis", redis_url)
    second, two = start("redis", redis_url)
    try:
        mine = create_all(one, FACTS[:1])
        theirs = create_all(two, FACTS[1:2] + FACTS[:1])
        wait_until(lambda: holds(one, *mine) and holds(two, *theirs), "both indexes fed")
        assert not any(i in (index_of(one).index or ()) for i in theirs)
        assert recall(one, "what food could hurt Ana?", mode="semantic") == mine
        assert recall(one, "when do releases go out?", mode="hybrid") == mine
    finally:
        for amp, broker in ((one, first), (two, second)):
            amp.close()
            broker.stop()


# ---- several processes ----


def test_a_cell_written_through_one_broker_is_recalled_through_another_until_deleted(
        redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two brokers share one Redis")
    first, one = start("redis", redis_url)
    second, two = start("redis", redis_url, one.namespace)
    try:
        wait_until(lambda: index_of(two).ready, "the second broker's index read")
        ids = create_all(one, FACTS)
        wait_until(lambda: holds(two, *ids), "the cells in the other broker's index")
        for mode in ("semantic", "hybrid"):
            assert recall(two, "what food could hurt Ana?", mode=mode)[0] == ids[0]
        changed = "Bob sings in the city choir on Sundays"
        assert one.patch(ids[2], {"content": {"text": changed}}).status_code == 200
        wait_until(lambda: recall(two, "what music does Bob make?", mode="semantic")[0]
                   == ids[2], "the patched text recalled by meaning through the other broker")
        wait_until(lambda: indexed_as_stored(two, ids[2]), "the new vector in the other index")
        far = 10 ** 13  # AMP's state machine: stale, then archived, then deleted
        one.run(as_of=far)
        one.run(as_of=far + 31 * DAY_MS)
        assert one.delete(ids[0]).status_code == 200
        for mode in ("semantic", "hybrid"):  # at once: the index only proposes candidates
            found = recall(two, "what food could hurt Ana?", mode=mode, status=["archived"])
            assert ids[0] not in found
            assert set(found) <= set(ids[1:])
        wait_until(lambda: ids[0] not in (index_of(two).index or ()),
                   "the deleted cell's vector gone from the other broker's index")
    finally:
        for amp, broker in ((one, first), (two, second)):
            amp.close()
            broker.stop()


def test_a_broker_started_later_reads_every_vector_into_its_index(redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two brokers share one Redis")
    first, one = start("redis", redis_url)
    try:
        ids = create_all(one, FACTS)
        wait_until(lambda: holds(one, *ids), "every cell embedded")
        second, two = start("redis", redis_url, one.namespace)
        try:
            wait_until(lambda: holds(two, *ids), "the later broker's index read")
            metrics = two.http.get("/metrics").text
            assert f"memp_amp_vector_index_cells {len(ids)}.0" in metrics
            assert recall(two, "where does Bob like to sit?", mode="semantic")[0] == ids[2]
        finally:
            two.close()
            second.stop()
    finally:
        one.close()
        first.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_purged_cell_leaves_the_index(backend: str, redis_url: str) -> None:
    clock = TestClock()
    with clocked_broker(backend, redis_url, f"n-{uuid.uuid4().hex[:10]}", clock,
                        amp_purge_retention=True) as amp:
        doomed = str(amp.create("Ana is allergic to peanuts", owner="u-1",
                                expires_at=iso(clock.now + HOUR_MS))["id"])
        kept = str(amp.create("Ana cannot eat nuts of any kind", owner="u-1")["id"])
        wait_until(lambda: holds(amp, doomed, kept), "both cells in the vector index")
        clock.advance(HOUR_MS)
        amp.run()
        assert amp.delete(doomed).status_code == 200
        clock.advance(30 * DAY_MS + 1)
        assert amp.purge().json() == {"purged": [doomed]}
        wait_until(lambda: doomed not in (index_of(amp).index or ()), "the purged cell gone")
        assert kept in (index_of(amp).index or ())
        for mode in ("semantic", "hybrid"):
            assert recall(amp, "what food could hurt Ana?", mode=mode) == [kept]


@pytest.fixture(scope="module")
def stand_in() -> Iterator[EmbeddingsStandIn]:
    server = EmbeddingsStandIn()
    yield server
    server.stop()


def test_after_a_model_switch_the_index_holds_only_the_new_models_vectors(
        stand_in: EmbeddingsStandIn, redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("brokers in turn on one Redis")
    first, before = start("redis", redis_url)
    ids = create_all(before, FACTS)
    wait_until(lambda: holds(before, *ids), "every cell embedded by the builtin model")
    before.close()
    first.stop()
    stand_in.down = True  # the new model cannot embed yet: the builtin vectors stay stored
    second, after = start("redis", redis_url, before.namespace, embedder="openai",
                          embeddings_url=stand_in.url, embeddings_model="stand-in-3")
    try:
        wait_until(lambda: index_of(after).ready, "the index read")
        assert len(index_of(after).index or ()) == 0
        stand_in.down = False
        wait_until(lambda: holds(after, *ids), "every cell embedded by the new model")
        index = index_of(after).index
        assert index is not None and index.dims == 32  # the stand-in's vectors alone
        assert recall(after, "peanuts allergic", mode="semantic")[0] == ids[0]
    finally:
        stand_in.down = False
        after.close()
        second.stop()


def test_a_follower_that_missed_trimmed_records_reads_every_vector_again(amp: Amp) -> None:
    first = create_all(amp, FACTS[:2])
    wait_until(lambda: holds(amp, *first), "the first cells in the vector index")
    store = data_client(amp.app)
    store.xtrim(layout.amp_vector_log(amp.namespace), maxlen=0)  # as if it fell far behind
    store.delete(layout.amp_vector(amp.namespace, first[0]))  # a removal only a reread finds
    later = create_all(amp, FACTS[2:3])
    wait_until(lambda: holds(amp, first[1], *later) and first[0] not in
               (index_of(amp).index or ()), "every vector read again")


def test_many_nearer_cells_an_agent_may_not_read_never_hide_the_ones_it_may(amp: Amp) -> None:
    private = {"readable_by": ["agent-1"], "public": False}
    # Spread over owners: each create lists its owner's near duplicates, which for one owner
    # holding all 420 restatements made the creates cost as much as the rest of the test.
    hidden = [str(amp.create(f"Ana is allergic to peanuts, note {n}", owner=f"u-h{n % 42}",
                             access_policy=private)["id"]) for n in range(420)]
    shared = str(amp.create("Ana should avoid some nuts", owner="u-2",
                            access_policy={"public": True})["id"])
    wait_until(lambda: holds(amp, shared, *hidden), "every cell in the vector index")
    for mode in ("semantic", "hybrid"):
        assert recall(amp, "Ana is allergic to peanuts", agent="other", mode=mode) == [shared]
        assert recall(amp, "Ana is allergic to peanuts", mode=mode, limit=3)[0] in hidden
