"""`near_duplicates` on a create's reply: the same owner's cells that mean nearly the same, that
the agent may read and that are active or stale; null when the embedder could make the write
wait (not the builtin one, or not loaded); two processes creating and patching at once. The
owner's vectors come from the broker's vector index where it holds them with the digest stored,
else from Redis: the same list either way."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from broker.amp.embedding import text_digest
from broker.amp.nearest import NearestCells
from broker.storage import layout
from tests.support.amp import (
    NO_BACKGROUND_RUNS,
    Amp,
    created,
    run_threads,
    started_amp,
)
from tests.support.brokers import BACKENDS, BrokerProcess, data_client, start_broker
from tests.support.waiting import wait_until

CAT = "Ana has a grey cat named Nube who hates the vacuum cleaner"
SAME_CAT = "Ana's grey cat Nube hates the vacuum cleaner"
CAR = "Ana's car is a blue Toyota Corolla from 2016"
# A restatement long enough (near the 64 KiB a text may hold) that making its vector takes a
# while (~20 ms): a patch has time to land between a create's write and the storing of its
# vector.
LONG_SAME_CAT = " ".join([SAME_CAT] * 1400)
OTHERS = ["Ana drives a blue 2016 Toyota Corolla", "Ana works night shifts on Tuesdays"]


@pytest.fixture(scope="module", params=BACKENDS)
def amp(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Amp]:
    """One broker with the builtin embedder per store; tests keep to owners of their own."""
    with started_amp(request.param, redis_url) as client:
        yield client


def embedded(amp: Amp, owner: str, count: int, agent: str | None = None) -> None:
    """Wait until `count` of the owner's cells that `agent` may read have their vectors (the
    builtin model is then loaded too)."""
    def found() -> int:
        response = amp.search_response(agent, owner_id=owner, query="anything",
                                       mode="semantic",
                                       status=["active", "stale", "archived"])
        assert response.status_code == 200, response.text
        return len(response.json()["results"])

    wait_until(lambda: found() == count, "the owner's cells embedded")


def create(amp: Amp, text: str, owner: str, agent: str | None = None,
           **fields: Any) -> httpx.Response:
    return amp.post_cell({"type": "semantic", "content": {"text": text},
                          "identity": {"owner_id": owner, "owner_type": "user"}, **fields},
                         agent)


def test_a_restatement_lists_the_cell_it_restates(amp: Amp) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    cat = amp.create(CAT, owner=owner)
    for text in OTHERS:
        amp.create(text, owner=owner)
    embedded(amp, owner, 3)
    response = create(amp, SAME_CAT, owner)
    assert response.status_code == 201, response.text
    duplicates = response.json()["near_duplicates"]
    assert [d["id"] for d in duplicates] == [cat["id"]]
    assert 0.8 <= duplicates[0]["similarity"] <= 1.0
    # The reply is the cell as stored plus near_duplicates, which a read does not carry.
    cell = created(response)
    assert amp.stored(cell) == cell
    assert "near_duplicates" not in amp.read(cell["id"])
    # A text unlike any other lists none.
    assert create(amp, "Ana's favourite opera is Tosca", owner).json()["near_duplicates"] == []


def test_only_the_owners_readable_active_cells_are_listed(amp: Amp) -> None:
    owner, other = (f"u-{uuid.uuid4().hex[:8]}" for _ in range(2))
    amp.create(CAT, owner=other)  # another owner's
    private = amp.create(CAT, owner=owner, agent="agent-2")
    archived = amp.create(CAT, owner=owner)
    kept = amp.create(CAT, owner=owner)
    gone = amp.create(CAT, owner=owner)
    merged = amp.http.post("/amp/memories/merge", headers={"X-AMP-Agent-ID": "agent-1"},
                           json={"ids": [archived["id"], gone["id"]], "text": OTHERS[0]})
    assert merged.status_code == 201, merged.text
    embedded(amp, other, 1)
    embedded(amp, owner, 4)  # archived, kept, gone and the merged cell
    embedded(amp, owner, 1, agent="agent-2")
    duplicates = create(amp, SAME_CAT, owner).json()["near_duplicates"]
    assert [d["id"] for d in duplicates] == [kept["id"]]
    # agent-2 may read only its own cell.
    seen = create(amp, SAME_CAT, owner, agent="agent-2").json()["near_duplicates"]
    assert [d["id"] for d in seen] == [private["id"]]


def test_a_patched_cell_counts_by_its_new_text(amp: Amp) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    cell = amp.create(CAT, owner=owner)
    embedded(amp, owner, 1)
    assert amp.patch(cell["id"], {"content": {"text": OTHERS[0]}}).status_code == 200
    # Its old text's vector, until replaced, does not make it a duplicate of that text.
    assert create(amp, SAME_CAT, owner).json()["near_duplicates"] == []
    wait_until(lambda: cell["id"] in amp.search_ids(owner_id=owner, query=CAR,
                                                    mode="semantic", min_score=0.8),
               "the patched text embedded")
    again = create(amp, CAR, owner).json()["near_duplicates"]
    assert [d["id"] for d in again] == [cell["id"]]


def test_without_the_builtin_embedder_near_duplicates_is_null(redis_url: str) -> None:
    namespace = f"d-{uuid.uuid4().hex[:10]}"
    broker = start_broker(BACKENDS[0], redis_url, amp_namespace=namespace,
                          amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS, embedder="none")
    try:
        with Amp(broker.url, namespace, app=broker.app) as plain:
            owner = f"u-{uuid.uuid4().hex[:8]}"
            plain.create(CAT, owner=owner)
            response = create(plain, SAME_CAT, owner)
            assert response.status_code == 201, response.text
            assert response.json()["near_duplicates"] is None
    finally:
        broker.stop()


def test_two_processes_creating_while_cells_are_patched_keep_each_vector_current(
        broker_processes: Callable[..., list[BrokerProcess]], redis_url: str, ns: str) -> None:
    """Two broker processes on one Redis create restatements of one owner's cell at once,
    while a third client patches each new cell as soon as the index holds it (before its
    create may have stored its vector). Every create lists near duplicates (the restated cell
    is always there to list), only the owner's cells; once the embedder loops settle, every
    cell's vector is of its entry's current version and text: a create's vector, made before
    a patch, never overwrites the patch's nor takes the patched cell off the embedder loop's
    list."""
    if "redis" not in BACKENDS:
        pytest.skip("two broker processes share one Redis")
    # The embedder loops run seldom, so a patched cell still waits for them when the create's
    # late vector comes.
    first, second = broker_processes(2, MEMP_AMP_NAMESPACE=ns,
                                     MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS="3600",
                                     MEMP_AMP_EMBED_INTERVAL_SECONDS="0.5")
    one, two = Amp(first.url, ns), Amp(second.url, ns)
    store: Any = redis.Redis.from_url(redis_url, decode_responses=True)  # str replies
    owner = f"u-{uuid.uuid4().hex[:8]}"
    prefix = f"cells/user/{owner}/"
    try:
        cat = one.create(CAT, owner=owner)
        embedded(one, owner, 1)
        embedded(two, owner, 1)  # each process has its model loaded: near duplicates are on
        replies: list[dict[str, Any]] = []
        done = threading.Event()
        patched: set[str] = set()

        def creator(amp: Amp) -> None:
            for _ in range(12):
                response = create(amp, LONG_SAME_CAT, owner)
                assert response.status_code == 201, response.text
                replies.append(response.json())

        def patcher() -> None:
            while True:
                finished = done.is_set()
                for key in store.zrangebylex(layout.index(ns), f"[{prefix}", f"[{prefix}\xff"):
                    cell_id = key.rsplit("/", 1)[1]
                    if cell_id in patched or cell_id == cat["id"]:
                        continue
                    patched.add(cell_id)
                    answer = two.patch(cell_id, {"content": {"text": f"{CAR} ({cell_id})"}})
                    assert answer.status_code == 200, answer.text
                if finished:
                    return
                time.sleep(0.001)

        patching = threading.Thread(target=patcher)
        patching.start()
        try:
            run_threads([threading.Thread(target=creator, args=(amp,)) for amp in (one, two)])
        finally:
            done.set()
            patching.join(timeout=60)
        assert not patching.is_alive()
        assert len(replies) == 24 and patched == {r["id"] for r in replies}
        owned = {key.rsplit("/", 1)[1] for key in one.owner_keys(owner)}
        for reply in replies:
            listed = [d["id"] for d in reply["near_duplicates"]]
            assert listed and set(listed) <= owned - {reply["id"]}, reply["near_duplicates"]

        def current(cell_id: str) -> bool:
            entry = store.hmget(layout.entry(ns, prefix + cell_id), "ver", "val")
            vector = store.hmget(layout.amp_vector(ns, cell_id), "ver", "digest")
            text = json.loads(entry[1])["content"]["text"]
            return bool(vector == [entry[0], text_digest(text)])

        wait_until(lambda: all(current(cell_id) for cell_id in owned),
                   "every cell's vector of its current version and text")
        assert not store.sismember(layout.amp_unembedded(ns), cat["id"])
    finally:
        one.close()
        two.close()
        store.close()
def index_of(amp: Amp) -> NearestCells:
    nearest = amp.app.state.services.amp_recall.index
    assert isinstance(nearest, NearestCells)
    return nearest


def indexed(amp: Amp, *cell_ids: str) -> bool:
    """Whether the broker's vector index holds each cell's vector with the digest stored."""
    store = data_client(amp.app)
    digests = [(store.hget(layout.amp_vector(amp.namespace, i), "digest") or b"").decode()
               for i in cell_ids]
    nearest = index_of(amp)
    taken = nearest.rows(nearest.model, list(cell_ids), digests)
    return taken is not None and not taken[1]


def listed(response: httpx.Response) -> list[tuple[str, float]]:
    assert response.status_code == 201, response.text
    return [(d["id"], d["similarity"]) for d in response.json()["near_duplicates"]]


def test_the_index_and_the_stored_vectors_list_the_same(amp: Amp) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    cat = amp.create(CAT, owner=owner)
    others = [amp.create(text, owner=owner)["id"] for text in OTHERS]
    embedded(amp, owner, 3)
    wait_until(lambda: indexed(amp, cat["id"], *others), "the owner's cells indexed")
    first = create(amp, SAME_CAT, owner)
    from_index = listed(first)
    assert [i for i, _ in from_index] == [cat["id"]]
    nearest = index_of(amp)
    index, nearest.index = nearest.index, None  # as before the index is read in full
    try:
        from_store = listed(create(amp, SAME_CAT, owner))
    finally:
        nearest.index = index
    # The same similarity to the cat's cell; the first restatement (same text) is listed too.
    assert from_store == [(created(first)["id"], 1.0), *from_index]


def test_a_row_not_of_the_stored_vector_is_not_used(amp: Amp) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    cat = amp.create(CAT, owner=owner)
    car = amp.create(CAR, owner=owner)
    embedded(amp, owner, 2)
    wait_until(lambda: indexed(amp, cat["id"], car["id"]), "the owner's cells indexed")
    expected = listed(create(amp, SAME_CAT, owner))
    assert [i for i, _ in expected] == [cat["id"]]
    index = index_of(amp).index
    assert index is not None
    # The cat's row now holds the car's vector under an older text's digest, and the car's
    # row the cat's vector under none: neither is used, both vectors are read from Redis.
    store = data_client(amp.app)
    vectors = {i: store.hget(layout.amp_vector(amp.namespace, i), "vec")
               for i in (cat["id"], car["id"])}
    index.put(cat["id"], vectors[car["id"]], "an-older-text")
    index.put(car["id"], vectors[cat["id"]])
    again = listed(create(amp, SAME_CAT, owner))
    assert again[1:] == expected and again[0][1] == 1.0
    assert not np.array_equal(np.frombuffer(vectors[car["id"]], dtype=np.float32),
                              np.frombuffer(vectors[cat["id"]], dtype=np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_creates_vector_is_stored_with_the_write(backend: str, redis_url: str) -> None:
    """The call storing the new cell's vector runs after the cell's write (on one Redis, it
    leaves in the same round trip): the vector is there when the 201 is, though the background
    loop here waits an hour."""
    with started_amp(backend, redis_url, amp_embed_interval_seconds=3600) as slow:
        owner = f"u-{uuid.uuid4().hex[:8]}"
        # A search by meaning loads the builtin model (the loop would, but waits an hour).
        assert slow.search_response(owner_id=owner, query="cats", mode="semantic"
                                    ).status_code == 200
        # The process's first write notes its namespace first, a round trip of its own: the
        # vector's call may then run before the write, and the cell waits for the loop.
        slow.create(CAR, owner=owner)
        response = create(slow, CAT, owner)
        assert response.json()["near_duplicates"] == []
        cell_id = created(response)["id"]
        store = data_client(slow.app)
        assert store.hget(layout.amp_vector(slow.namespace, cell_id), "ver") == b"1"
        assert not store.sismember(layout.amp_unembedded(slow.namespace), cell_id)
        again = listed(create(slow, SAME_CAT, owner))
        assert [i for i, _ in again] == [cell_id]
