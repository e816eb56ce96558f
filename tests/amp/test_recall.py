"""Recall by meaning (`mode`, `min_score` on POST /amp/memories/search): the builtin embedder,
an OpenAI-compatible one (a stand-in on loopback), none, and an embedder that is down."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker.storage import layout
from tests.support.amp import NO_BACKGROUND_RUNS, Amp, error_of
from tests.support.brokers import BACKENDS, Broker, start_broker
from tests.support.clients import create_key
from tests.support.depth import arrays
from tests.support.embeddings import EmbeddingsStandIn
from tests.support.waiting import wait_until

FACTS = ["Ana is allergic to peanuts", "The deploy runs every Friday at noon",
         "Bob prefers window seats on flights", "The office wifi password rotates monthly",
         "Carla's daughter plays the cello"]


def start(backend: str, redis_url: str, **settings: Any) -> tuple[Broker, Amp]:
    namespace = f"r-{uuid.uuid4().hex[:10]}"
    broker = start_broker(backend, redis_url, amp_namespace=namespace,
                          amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS, **settings)
    return broker, Amp(broker.url, namespace, app=broker.app)


@pytest.fixture(scope="module", params=BACKENDS)
def amp(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Amp]:
    """One broker with the builtin embedder per store; tests keep to owners of their own."""
    broker, client = start(request.param, redis_url)
    yield client
    client.close()
    broker.stop()


def recall(amp: Amp, owner: str, query: str, **body: Any) -> list[str]:
    """The texts a search of `owner`'s cells returns, best first."""
    response = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "agent-1"},
                             json={"query": query, "owner_id": owner, **body})
    assert response.status_code == 200, response.text
    return [hit["cell"]["content"]["text"] for hit in response.json()["results"]]


def remembered(amp: Amp, texts: list[str] = FACTS) -> str:
    """A new owner with the texts as its cells, once every one is recallable by meaning."""
    owner = f"u-{uuid.uuid4().hex[:8]}"
    for text in texts:
        amp.create(text, owner=owner)
    wait_until(lambda: len(recall(amp, owner, "anything at all", mode="semantic"))
               == len(texts), "every cell embedded")
    return owner


@pytest.mark.parametrize(("question", "answer"), [
    pytest.param("what food could hurt Ana?", FACTS[0], id="allergy"),
    pytest.param("when do releases go out?", FACTS[1], id="deploy"),
    pytest.param("what instrument does the child practice?", FACTS[4], id="cello"),
])
def test_a_reworded_question_finds_its_answer_by_meaning(amp: Amp, question: str,
                                                         answer: str) -> None:
    owner = remembered(amp)
    assert recall(amp, owner, question, mode="semantic")[0] == answer
    assert recall(amp, owner, question)[0] == answer  # hybrid, the default


def test_keyword_mode_ranks_by_shared_words_only(amp: Amp) -> None:
    owner = remembered(amp)
    assert recall(amp, owner, "when do releases go out?", mode="keyword") == []
    assert recall(amp, owner, "peanuts", mode="keyword") == [FACTS[0]]


def test_hybrid_counts_a_word_share_only_from_the_keyword_floor(amp: Amp) -> None:
    """Hybrid relevance is 0.8 x cosine + 0.2 x word share, the share counting from 0.3: a
    cell holding 2 of a question's 9 words ranks by its cosine alone, one holding them all
    rises above it."""
    owner = remembered(amp, [FACTS[3], FACTS[0]])
    question = "does the office kitchen stock oat milk near the wifi router and printer?"

    def scores(mode: str, query: str) -> dict[str, float]:
        response = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "agent-1"},
                                 json={"query": query, "owner_id": owner, "mode": mode})
        assert response.status_code == 200, response.text
        return {hit["cell"]["content"]["text"]: hit["score"]
                for hit in response.json()["results"]}

    hybrid, semantic = scores("hybrid", question), scores("semantic", question)
    assert hybrid[FACTS[3]] == pytest.approx(0.8 * semantic[FACTS[3]], rel=1e-3)
    whole = scores("hybrid", FACTS[3])[FACTS[3]]
    assert whole > 0.8 * scores("semantic", FACTS[3])[FACTS[3]] + 0.1


def test_min_score_leaves_a_question_without_answer_empty(amp: Amp) -> None:
    owner = remembered(amp)
    probe = "quantum chromodynamics lecture notes"
    assert len(recall(amp, owner, probe, mode="semantic")) == len(FACTS)
    for mode in ("semantic", "hybrid"):
        assert recall(amp, owner, probe, mode=mode, min_score=0.2) == []
    assert recall(amp, owner, "when do releases go out?", mode="semantic",
                  min_score=0.15) == [FACTS[1]]


def test_a_patched_text_is_recalled_by_its_new_meaning(amp: Amp) -> None:
    owner = remembered(amp, ["Ana is allergic to peanuts"])
    cell_id = amp.search_ids(owner_id=owner)[0]
    changed = "Ana sings in the city choir on Sundays"
    assert amp.patch(cell_id, {"content": {"text": changed}}).status_code == 200
    wait_until(lambda: recall(amp, owner, "what music does Ana do?", mode="semantic",
                              min_score=0.2) == [changed], "the new text's vector")
    assert recall(amp, owner, "what food could hurt Ana?", mode="semantic",
                  min_score=0.3) == []


def test_only_readable_cells_are_recalled(amp: Amp) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    amp.create("Ana is allergic to peanuts", owner=owner,
               access_policy={"readable_by": ["agent-1"], "public": False})
    wait_until(lambda: recall(amp, owner, "food allergy", mode="semantic"), "embedded")
    for mode in ("semantic", "hybrid"):
        response = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "other"},
                                 json={"query": "food allergy", "owner_id": owner, "mode": mode})
        assert response.status_code == 200, response.text
        assert response.json()["results"] == []


def test_a_deleted_cell_leaves_no_vector(amp: Amp, redis_url: str) -> None:
    if amp.app.state.services.storage.embedded:
        pytest.skip("reads the vector's key in Redis")
    owner = remembered(amp, ["a cell on its way out"])
    cell_id = amp.search_ids(owner_id=owner)[0]
    store = redis.Redis.from_url(redis_url)
    key = layout.amp_vector(amp.namespace, cell_id)
    assert store.exists(key)
    far = 10 ** 13  # AMP's state machine: stale, then archived, then deleted
    amp.run(as_of=far)
    amp.run(as_of=far + 31 * 86_400_000)
    assert amp.delete(cell_id).status_code == 200, amp.delete(cell_id).text
    wait_until(lambda: not store.exists(key), "the vector gone")
    store.close()


@pytest.mark.parametrize(("body", "field"), [
    pytest.param({"mode": "fuzzy"}, "mode", id="unknown-mode"),
    pytest.param({"mode": ["semantic"]}, "mode", id="mode-not-a-string"),
    pytest.param({"min_score": 1.5}, "min_score", id="min-score-above-1"),
    pytest.param({"min_score": -0.01}, "min_score", id="min-score-below-0"),
    pytest.param({"min_score": 1e308}, "min_score", id="huge-min-score"),
    pytest.param({"min_score": "0.5"}, "min_score", id="min-score-a-string"),
    pytest.param({"min_score": {"a": {"b": [0.5]}}}, "min_score", id="min-score-nested"),
    pytest.param({"query": "peanuts " * 200}, "query", id="query-over-the-cap"),
    pytest.param({"query": "*" * 128}, "query", id="128-stars"),
    pytest.param({"query": "\x00\x01\x1b"}, "query", id="control-characters"),
])
def test_bad_recall_input_is_400_naming_the_field(amp: Amp, body: dict[str, Any],
                                                  field: str) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    amp.create("Ana is allergic to peanuts", owner=owner)
    response = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "agent-1"},
                             json={"query": "food", "owner_id": owner, **body})
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == field
    assert recall(amp, owner, "peanuts", mode="keyword") == ["Ana is allergic to peanuts"]


def test_a_body_nested_1000_deep_is_refused(amp: Amp) -> None:
    body = b'{"query": "food", "mode": "semantic", "min_score": ' + arrays(1000) + b"}"
    response = amp.http.post("/amp/memories/search", content=body,
                             headers={"X-AMP-Agent-ID": "agent-1",
                                      "Content-Type": "application/json"})
    assert response.status_code == 400, response.text


def test_a_key_without_amp_of_another_tenant_or_revoked_is_refused(amp: Amp) -> None:
    owner = remembered(amp, ["Ana is allergic to peanuts"])
    admin = amp.http
    foreign, _ = create_key(admin, ("other-tenant", ["read", "write", "amp"]))
    reader, _ = create_key(admin, (amp.namespace, ["subscribe"]))
    revoked, revoked_id = create_key(admin, (amp.namespace, ["amp", "impersonate"]))
    assert admin.delete(f"/v1/keys/{revoked_id}").status_code in (200, 204)
    for token, status in ((foreign, 403), (reader, 403), (revoked, 401)):
        with amp.as_token(token) as caller:
            response = caller.http.post("/amp/memories/search",
                                        json={"query": "food", "mode": "semantic",
                                              "owner_id": owner})
            assert response.status_code == status, response.text


@pytest.fixture(scope="module")
def stand_in() -> Iterator[EmbeddingsStandIn]:
    server = EmbeddingsStandIn()
    yield server
    server.stop()


def test_without_an_embedder_semantic_is_400_and_hybrid_is_keyword(redis_url: str) -> None:
    broker, amp = start("embedded", redis_url, embedder="none")
    try:
        amp.create("Ana is allergic to peanuts", owner="u-1")
        response = amp.search_response(query="peanuts", mode="semantic")
        assert response.status_code == 400
        assert error_of(response)["details"]["field"] == "mode"
        assert "MEMP_EMBEDDER=none" in error_of(response)["message"]
        assert recall(amp, "u-1", "which nut must her meals avoid?") == []
        assert recall(amp, "u-1", "peanuts", mode="hybrid") == ["Ana is allergic to peanuts"]
    finally:
        amp.close()
        broker.stop()


def test_an_openai_compatible_embedder_is_called_with_its_key(
        stand_in: EmbeddingsStandIn, redis_url: str) -> None:
    broker, amp = start("embedded", redis_url, embedder="openai",
                        embeddings_url=stand_in.url, embeddings_model="stand-in-1",
                        embeddings_api_key="sk-test-123")
    try:
        owner = remembered(amp, ["Ana is allergic to peanuts", "The deploy runs on Friday"])
        assert recall(amp, owner, "is Ana allergic?", mode="semantic")[0] == \
            "Ana is allergic to peanuts"
        assert set(stand_in.authorizations) == {"Bearer sk-test-123"}
    finally:
        amp.close()
        broker.stop()


def test_while_the_embedder_is_down_writes_land_and_recall_degrades(
        stand_in: EmbeddingsStandIn, redis_url: str) -> None:
    broker, amp = start("embedded", redis_url, embedder="openai",
                        embeddings_url=stand_in.url, embeddings_model="stand-in-1")
    try:
        stand_in.down = True
        amp.create("Ana is allergic to peanuts", owner="u-1")
        response = amp.search_response(query="peanuts allergic", mode="hybrid")
        assert response.status_code == 200, response.text
        assert response.json()["degraded"] == "embedder_unavailable"
        assert [h["cell"]["content"]["text"] for h in response.json()["results"]] == \
            ["Ana is allergic to peanuts"]
        down = amp.search_response(query="peanuts", mode="semantic")
        assert down.status_code == 503
        assert error_of(down)["code"] == "unavailable"
        stand_in.down = False
        wait_until(lambda: recall(amp, "u-1", "is Ana allergic?", mode="semantic"),
                   "the cell embedded once the embedder is back")
        assert "degraded" not in amp.search_response(query="peanuts", mode="hybrid").json()
    finally:
        stand_in.down = False
        amp.close()
        broker.stop()


def test_after_a_model_switch_cells_are_embedded_again_never_mixed(
        stand_in: EmbeddingsStandIn, redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two brokers share one Redis")
    first, before = start("redis", redis_url)
    owner = remembered(before, ["Ana is allergic to peanuts", "The deploy runs on Friday"])
    before.close()
    first.stop()
    stand_in.down = True  # the new model cannot embed yet: no builtin vector may be used
    second = start_broker("redis", redis_url, amp_namespace=before.namespace,
                          amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS,
                          embedder="openai", embeddings_url=stand_in.url,
                          embeddings_model="stand-in-2")
    after = Amp(second.url, before.namespace, app=second.app)
    try:
        assert after.search_response(query="peanuts", owner_id=owner,
                                     mode="semantic").status_code == 503
        stand_in.down = False
        assert recall(after, owner, "is Ana allergic?", mode="semantic") in (
            [], ["Ana is allergic to peanuts", "The deploy runs on Friday"])
        wait_until(lambda: len(recall(after, owner, "is Ana allergic?", mode="semantic")) == 2,
                   "every cell embedded by the new model")
        assert recall(after, owner, "is Ana allergic?", mode="semantic")[0] == \
            "Ana is allergic to peanuts"
    finally:
        stand_in.down = False
        after.close()
        second.stop()


def test_two_brokers_on_one_redis_embed_together_and_recall_the_same(redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two brokers share one Redis")
    first, one = start("redis", redis_url)
    second = start_broker("redis", redis_url, amp_namespace=one.namespace,
                          amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS)
    two = Amp(second.url, one.namespace, app=second.app)
    try:
        owner = f"u-{uuid.uuid4().hex[:8]}"
        for at, text in enumerate(FACTS):
            (one if at % 2 else two).create(text, owner=owner)
        def embedded(amp: Amp) -> bool:
            return len(recall(amp, owner, "anything", mode="semantic")) == len(FACTS)

        wait_until(lambda: embedded(one) and embedded(two),
                   "every cell embedded, seen by each broker")
        for question in ("what food could hurt Ana?", "when do releases go out?"):
            assert recall(one, owner, question) == recall(two, owner, question)
        cell_id = two.search_ids(owner_id=owner, query="peanuts")[0]
        changed = "Ana sings in the city choir on Sundays"
        assert one.patch(cell_id, {"content": {"text": changed}}).status_code == 200
        wait_until(lambda: recall(two, owner, "what music does Ana do?", mode="semantic")[0]
                   == changed, "the patched text recalled through the other broker")
    finally:
        one.close()
        two.close()
        first.stop()
        second.stop()


def test_a_text_changed_without_an_embedder_is_embedded_again_later(redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("brokers in turn on one Redis")
    first, before = start("redis", redis_url)
    owner = remembered(before, ["Ana is allergic to peanuts"])
    cell_id = before.search_ids(owner_id=owner)[0]
    before.close()
    first.stop()
    store = redis.Redis.from_url(redis_url)
    key = layout.amp_vector(before.namespace, cell_id)
    plain = start_broker("redis", redis_url, amp_namespace=before.namespace,
                         amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS, embedder="none")
    with Amp(plain.url, before.namespace, app=plain.app) as keyword_only:
        changed = "Ana sings in the city choir on Sundays"
        assert keyword_only.patch(cell_id, {"content": {"text": changed}}).status_code == 200
        wait_until(lambda: not store.exists(key), "the old text's vector dropped")
    plain.stop()
    again = start_broker("redis", redis_url, amp_namespace=before.namespace,
                         amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS)
    with Amp(again.url, before.namespace, app=again.app) as after:
        wait_until(lambda: recall(after, owner, "what music does Ana do?", mode="semantic")
                   == [changed], "the new text embedded once an embedder is back")
    again.stop()
    store.close()


def test_many_candidates_are_ranked_by_meaning_as_if_all_were_loaded(
        amp: Amp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Semantic search loads cells by falling similarity, at most 200 at a time (16 here),
    only as far as the page needs: its pages must be the full ranking's (every cell here
    decays alike, so the ranking is by cosine, computed here with the same model)."""
    from broker.amp import search
    from broker.amp.embedders import _wordllama

    monkeypatch.setattr(search, "_EAGER", 16)

    owner = f"u-{uuid.uuid4().hex[:8]}"
    topics = ["peanut allergy", "Friday deploys", "window seats", "cello lessons",
              "tomato garden", "tax returns", "golf handicap", "night shifts"]
    texts = [f"Note {n}: {topics[n % len(topics)]} came up again in meeting {n * 7}"
             for n in range(230)]
    for text in texts:
        amp.create(text, owner=owner)
    wait_until(lambda: len(recall(amp, owner, "anything", mode="semantic", limit=100,
                                  cursor="200")) == 30, "every cell embedded", timeout=60)
    question = "which musical instrument is being studied?"
    model = _wordllama()
    rows = model.embed([question, *texts], norm=True)
    cosine = rows[1:] @ rows[0]
    expected = [texts[i] for i in sorted(range(len(texts)), key=lambda i: -cosine[i])]
    first = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "agent-1"},
                          json={"query": question, "owner_id": owner, "mode": "semantic",
                                "limit": 10}).json()
    second = recall(amp, owner, question, mode="semantic", limit=10,
                    cursor=first["next_cursor"])
    ranked = [hit["cell"]["content"]["text"] for hit in first["results"]] + second
    assert ranked == expected[:20]


def test_with_an_owner_filter_semantic_ranks_the_owners_cells_alone_by_cosine(amp: Amp) -> None:
    """Semantic search with `owner_id` scores the owner's cells and loads them a few at a time
    (four times the page's hits): one page at a time, the hits must be the owner's cells in
    exact cosine order to the end, and another owner's cells with the very same texts (the
    same cosines) must never appear."""
    from broker.amp.embedders import _wordllama

    owner, other = (f"u-{uuid.uuid4().hex[:8]}" for _ in range(2))
    topics = ["peanut allergy", "Friday deploys", "window seats", "cello lessons",
              "tomato garden", "tax returns", "golf handicap", "night shifts", "rent increase",
              "marathon training", "visa renewal", "broken laptop"]
    texts = [f"Note {n}: {topic} came up again in meeting {n * 7}"
             for n, topic in enumerate(topics)]  # each with a cosine above 0 to the question
    for text in texts:
        amp.create(text, owner=owner)
        amp.create(text, owner=other)
    wait_until(lambda: all(len(recall(amp, who, "anything", mode="semantic")) == len(texts)
                           for who in (owner, other)), "every cell embedded")
    question = "which musical instrument is being studied?"
    rows = _wordllama().embed([question, *texts], norm=True)
    cosine = rows[1:] @ rows[0]
    expected = [texts[i] for i in sorted(range(len(texts)), key=lambda i: -cosine[i])]
    ranked: list[str] = []
    cursor = None
    for _ in texts:
        page = amp.http.post("/amp/memories/search", headers={"X-AMP-Agent-ID": "agent-1"},
                             json={"query": question, "owner_id": owner, "mode": "semantic",
                                   "limit": 1, **({"cursor": cursor} if cursor else {})}).json()
        assert [hit["cell"]["identity"]["owner_id"] for hit in page["results"]] == [owner]
        ranked += [hit["cell"]["content"]["text"] for hit in page["results"]]
        cursor = page["next_cursor"]
    assert ranked == expected
    assert cursor is None
