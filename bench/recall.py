"""Recall benchmark: `python -m bench.recall --help`.

Starts redis-server and one broker (the builtin embedder), creates the labelled memories of
bench/recall_corpus.py through POST /amp/memories, waits until every one has its vector, then
asks every labelled question in each mode (`keyword`, `semantic`, `hybrid`) of the owner's
cells, and again of all cells (where a question naming its owner only by a pronoun names them:
the corpus's `NAMED`), and reports Recall@5 per kind of question, beside Reciprocal Rank Fusion
(k = 60) of the keyword and semantic rankings computed here, for comparison. Then `min_score`:
how many no-answer probes come back empty, and what it costs the answered questions. Last,
recall latency over HTTP (one connection, sequential) at the corpus's size and, with --cells,
after importing that many more cells; and the broker's CPU per create with the embedder and
with MEMP_EMBEDDER=none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import secrets
import statistics
import sys
import time
from typing import Any

import httpx
import redis

from bench import amp_cells, replay
from bench.recall_corpus import MEMORIES, QUESTIONS, asked
from bench.servers import (
    Processes,
    cpu_since,
    cpu_snapshot,
    end_run,
    failure_status,
    start_redis,
    start_run,
)
from broker.storage import layout

AGENT = "bench-agent"
KINDS = ("reworded", "exact", "several")
FLOORS = (0.2, 0.3, 0.4)
RRF_K = 60


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000,
                        help="cells imported for the latency at scale; 0 skips it (10000)")
    parser.add_argument("--owners", type=int, default=100,
                        help="owners the imported cells are spread over (100)")
    parser.add_argument("--requests", type=int, default=300,
                        help="searches per latency figure (300)")
    parser.add_argument("--creates", type=int, default=1000,
                        help="creates per CPU-per-create figure; 0 skips it (1000)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


class Session:
    """The broker over HTTP, acting as one agent with the admin key."""

    def __init__(self, broker: replay.Broker) -> None:
        self.broker = broker
        self.http = httpx.Client(base_url=f"http://{replay.HOST}:{broker.port}", timeout=600,
                                 headers={"Authorization": f"Bearer {broker.admin_key}",
                                          "X-AMP-Agent-ID": AGENT})

    def create(self, owner: str, owner_type: str, text: str) -> str:
        reply = self.http.post("/amp/memories", json={
            "type": "semantic", "content": {"text": text},
            "identity": {"owner_id": owner, "owner_type": owner_type}})
        if reply.status_code != 201:
            raise RuntimeError(f"create: {reply.status_code} {reply.text[:300]}")
        cell_id: str = reply.json()["id"]
        return cell_id

    def search(self, **body: Any) -> list[str]:
        reply = self.http.post("/amp/memories/search", json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"search: {reply.status_code} {reply.text[:300]}")
        return [hit["cell"]["id"] for hit in reply.json()["results"]]


def _settled(redis_url: str, timeout: float = 900.0, namespace: str = "amp") -> float:
    """Wait until every cell has its search terms posted and its vector stored."""
    client = redis.Redis.from_url(redis_url)
    started = time.perf_counter()
    try:
        while client.scard(layout.amp_unposted(namespace)) or \
                client.scard(layout.amp_unembedded(namespace)):
            if time.perf_counter() - started > timeout:
                raise RuntimeError("the broker did not embed the cells in time")
            time.sleep(0.02)
    finally:
        client.close()
    return time.perf_counter() - started


def _rrf(*rankings: list[str]) -> list[str]:
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, cell_id in enumerate(ranking):
            scores[cell_id] = scores.get(cell_id, 0.0) + 1 / (RRF_K + rank + 1)
    return sorted(scores, key=lambda i: -scores[i])


def _recall_at_5(ranked: list[str], answers: set[str]) -> float:
    return len(answers & set(ranked[:5])) / len(answers)


def accuracy(session: Session, ids: dict[str, str], owner_filter: bool) -> dict[str, Any]:
    """Recall@5 per kind and mode (and RRF), and what each min_score floor does."""
    found: dict[str, dict[str, list[float]]] = {}
    probes: dict[float, list[bool]] = {f: [] for f in FLOORS}
    kept: dict[float, list[float]] = {f: [] for f in FLOORS}
    for kind, owner, text, labels in QUESTIONS:
        scope = {"owner_id": owner} if owner_filter else {}
        question = asked(text, owner_filter)
        ranked = {mode: session.search(query=question, mode=mode, limit=100, **scope)
                  for mode in ("keyword", "semantic", "hybrid")}
        ranked["rrf"] = _rrf(ranked["keyword"], ranked["semantic"])
        answers = {ids[label] for label in labels}
        for floor in FLOORS:
            hits = session.search(query=question, mode="hybrid", min_score=floor, limit=5,
                                  **scope)
            if answers:
                kept[floor].append(_recall_at_5(hits, answers))
            else:
                probes[floor].append(not hits)
        if not answers:
            continue
        for mode, ranking in ranked.items():
            found.setdefault(mode, {}).setdefault(kind, []).append(
                _recall_at_5(ranking, answers))
    table = {mode: {kind: round(statistics.mean(per[kind]), 3) for kind in KINDS}
             | {"all": round(statistics.mean([v for k in KINDS for v in per[k]]), 3)}
             for mode, per in found.items()}
    floors = {str(f): {"probes_empty": round(statistics.mean(probes[f]), 3),
                       "answered_recall_at_5": round(statistics.mean(kept[f]), 3)}
              for f in FLOORS}
    return {"recall_at_5": table, "min_score": floors}


def latency(session: Session, bodies: list[dict[str, Any]], count: int) -> dict[str, float]:
    """p50 and p99 (ms) of `count` searches sent one after another."""
    for body in bodies[:20]:
        with contextlib.suppress(RuntimeError):
            session.search(**body)  # warm
    times, errors = [], 0
    for n in range(count):
        started = time.perf_counter()
        try:
            session.search(**bodies[n % len(bodies)])
        except RuntimeError:
            errors += 1  # counted, and its time too: a timeout is what the caller waited
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"p50_ms": round(times[len(times) // 2], 2),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
            **({"errors": errors} if errors else {})}


def _latencies(session: Session, owners: list[str], questions: list[str], count: int,
               unowned: list[str] | None = None) -> dict[str, Any]:
    """Latency per mode with an owner filter (`questions` of `owners`) and without one
    (`unowned`, by default the same questions)."""
    out: dict[str, Any] = {}
    for mode in ("keyword", "semantic", "hybrid"):
        with_owner = [{"query": q, "mode": mode, "owner_id": o, "limit": 5}
                      for q, o in zip(questions, owners, strict=True)]
        without = [{"query": q, "mode": mode, "limit": 5} for q in unowned or questions]
        out[mode] = {"owner": latency(session, with_owner, count),
                     "no_owner": latency(session, without, count)}
        print(f"  {mode}: {json.dumps(out[mode])}", flush=True)
    return out


def _import(session: Session, cells: int, owners: int) -> tuple[list[str], list[str]]:
    """Import `cells` made-up cells; returns sample owners and queries from their words."""
    rng = random.Random(11)
    corpus = amp_cells.Corpus(rng)
    now = int(time.time() * 1000)
    batch: list[dict[str, Any]] = []
    samples: dict[str, list[str]] = {}
    for n in range(cells):
        owner = f"owner-{n % owners:05d}"
        cell, content = amp_cells.cell(rng, corpus, owner, AGENT, now)
        samples.setdefault(owner, content)
        batch.append(cell)
        if len(batch) == 500 or n == cells - 1:
            reply = session.http.post("/amp/import", json={"cells": batch})
            if reply.status_code != 200 or reply.json()["errors"]:
                raise RuntimeError(f"import: {reply.status_code} {reply.text[:300]}")
            batch = []
    owner_list = sorted(samples)
    return owner_list, [amp_cells.query(rng, samples[o]) for o in owner_list]


def create_cpu(procs: Processes, redis_url: str, count: int, batch: int = 100
               ) -> dict[str, float]:
    """Server CPU per create (µs, embedding included) with the builtin embedder and none: two
    brokers up together, each on an AMP namespace of its own, taking batches of creates in
    turn (who goes first alternating), so that load from elsewhere on a shared machine falls
    on both alike."""
    brokers = {embedder: replay.start_broker(
        procs, redis_url, None, f"bench-{secrets.token_hex(16)}", MEMP_EMBEDDER=embedder,
        MEMP_AMP_NAMESPACE=f"amp-{embedder}", MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS="86400")
        for embedder in ("none", "builtin")}
    sessions = {embedder: Session(broker) for embedder, broker in brokers.items()}
    for embedder, session in sessions.items():
        for n in range(50):
            session.create(f"warm-{n}", "user", "a warm up memory about tea")
        _settled(redis_url, namespace=f"amp-{embedder}")
    used = dict.fromkeys(brokers, 0.0)
    for turn, start in enumerate(range(0, count, batch)):
        order = list(brokers) if turn % 2 == 0 else list(reversed(brokers))
        for embedder in order:
            before = cpu_snapshot(brokers[embedder].watch)
            for n in range(start, min(start + batch, count)):
                sessions[embedder].create(f"cpu-{n % 50}", "user", f"note {n}: the customer "
                                          f"asked about invoice {n * 7} and refunds")
            _settled(redis_url, namespace=f"amp-{embedder}")
            used[embedder] += cpu_since(brokers[embedder].watch, before)["server"]
    out = {embedder: round(seconds * 1e6 / count, 1) for embedder, seconds in used.items()}
    for embedder, broker in brokers.items():
        sessions[embedder].http.close()
        procs.stop(broker.proc)
    out["ratio"] = round(out["builtin"] / out["none"], 2)
    return out


def run(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    redis_url, redis_proc = start_redis(procs)
    broker = replay.start_broker(procs, redis_url, redis_proc.pid,
                                 f"bench-admin-{secrets.token_hex(16)}",
                                 MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS="86400")
    session = Session(broker)
    ids = {label: session.create(owner, owner_type, text)
           for label, owner, owner_type, text in MEMORIES}
    waited = _settled(redis_url)
    print(f"{len(ids)} memories created; all embedded {waited * 1000:.0f} ms after the last "
          "create", flush=True)
    results: dict[str, Any] = {
        "memories": len(MEMORIES), "questions": len(QUESTIONS),
        "owner": accuracy(session, ids, owner_filter=True),
        "no_owner": accuracy(session, ids, owner_filter=False)}
    questions = [q for _, _, q, _ in QUESTIONS]
    owners = [o for _, o, _, _ in QUESTIONS]
    named = [asked(q, owner_filter=False) for q in questions]
    results["latency_corpus"] = _latencies(session, owners, questions, args.requests, named)
    if args.cells:
        started = time.perf_counter()
        owner_list, queries = _import(session, args.cells, args.owners)
        imported = time.perf_counter() - started
        embedded = _settled(redis_url)
        results["scale"] = {"cells": args.cells + len(MEMORIES), "owners": args.owners,
                            "import_s": round(imported, 1),
                            "embedded_after_import_s": round(embedded, 1),
                            **_latencies(session, owner_list, queries, args.requests)}
    session.http.close()
    procs.stop(broker.proc)
    if args.creates:
        redis_url2, _ = start_redis(procs)
        results["create_cpu_us"] = create_cpu(procs, redis_url2, args.creates)
    return results


def _print(results: dict[str, Any]) -> None:
    print(f"\n{results['memories']} memories, {results['questions']} questions")
    for scope in ("owner", "no_owner"):
        print(f"\nRecall@5, {'owner filter' if scope == 'owner' else 'all cells'}:")
        print(f"  {'mode':<10}" + "".join(f"{k:>10}" for k in (*KINDS, "all")))
        for mode, row in results[scope]["recall_at_5"].items():
            print(f"  {mode:<10}" + "".join(f"{row[k]:>10.3f}" for k in (*KINDS, "all")))
        print("  hybrid min_score: floor -> probes empty, answered Recall@5")
        for floor, row in results[scope]["min_score"].items():
            print(f"    {floor}: {row['probes_empty']:.2f}, {row['answered_recall_at_5']:.3f}")
    for name in ("latency_corpus", "scale"):
        if name in results:
            print(f"\nlatency ({name}): " + json.dumps(results[name]))
    if "create_cpu_us" in results:
        print(f"\ncreate CPU per create (µs): {results['create_cpu_us']}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    procs = start_run()
    try:
        results = run(args, procs)
    except Exception as exc:
        print(f"bench.recall failed: {exc}", file=sys.stderr)
        return failure_status(exc)
    finally:
        end_run(procs)
    _print(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
