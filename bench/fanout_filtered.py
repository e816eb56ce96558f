"""The fan-out benchmark's `--filtered` parts: what a filter costs in the hub (in process), a
conflated consumer reading 10x slower than the writes, and their table. The filtered phase
itself runs in bench/fanout.py beside the unfiltered ones, on the same broker."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench import client
from bench.fanout_publish import BUCKETS, BrokerPublisher, bench_value, publish
from bench.servers import Processes

SLOW_RATE, SLOW_SECONDS, SLOW_KEYS = 200.0, 5.0, 64  # the publisher writes fanout/k-{seq % 64}
SLOW_VALUE_BYTES = 8192  # 8 MB in all: more than the socket buffers hold
EVENT_BYTES = SLOW_VALUE_BYTES + 500  # about one event: what the slow reader takes per read


def filter_costs(subscribers: int = 1000, changes: int = 300) -> dict[str, Any]:
    """Microseconds per change per subscriber: the filter alone, and the hub's whole offer
    (patterns, filter, noting the skip) to subscribers whose filter matches 1% of changes."""
    from broker.core.filters import compile_filter, compile_guarded
    from broker.core.grammar import compile_pattern
    from broker.services.visibility import Viewer
    from broker.streaming.changes import Change
    from broker.streaming.hub import Audience, Subscriber

    def made(seq: int) -> Change:
        value = bench_value("micro", seq, 256)
        return Change("bench", f"1-{seq}", "put", f"fanout/k-{seq % 64}", seq, value,
                      frame=value, agent="a", raw_value=value)

    async def measure() -> dict[str, Any]:
        filters = [compile_filter(f"/bucket == {n % BUCKETS}") for n in range(subscribers)]
        started = time.perf_counter()
        matched = sum(f(made(seq)) for seq in range(changes) for f in filters[:1])
        single = time.perf_counter() - started  # decoding each change once, one filter
        started = time.perf_counter()
        for seq in range(changes):
            change = made(seq)
            for accepts in filters:
                accepts(change)
        evaluation = time.perf_counter() - started
        offered = {}
        for indexed in (False, True):
            audience = Audience()
            for n in range(subscribers):
                accepts, guard = compile_guarded(f"/bucket == {n % BUCKETS}")
                audience.add(Subscriber({"bench": [compile_pattern("*")]}, 1000, Viewer(""),
                                        accepts=accepts, guard=guard if indexed else None))
            started = time.perf_counter()
            for seq in range(changes):
                audience.offer(made(seq))
            offered[indexed] = time.perf_counter() - started
        per = 1e6 / (changes * subscribers)
        return {"subscribers": subscribers, "changes": changes, "matched_by_one": matched,
                "decode_and_one_filter_us": round(single * 1e6 / changes, 3),
                "filter_us_per_subscriber": round(evaluation * per, 3),
                "offer_us_per_subscriber": round(offered[False] * per, 3),
                "indexed_offer_us_per_subscriber": round(offered[True] * per, 3)}

    return asyncio.run(measure())


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep or not size_line:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return bytes(out)


def _read_slowly(sock: socket.socket, slow_until: list[float], got: bytearray) -> None:
    """One read of about an event every 10/SLOW_RATE s while `slow_until` lies ahead, then as
    fast as the data comes, until 2 s pass without any."""
    sock.settimeout(2.0)
    while True:
        try:
            chunk = sock.recv(EVENT_BYTES if time.monotonic() < slow_until[0] else 1 << 16)
        except TimeoutError:
            if time.monotonic() >= slow_until[0]:
                return
            continue
        except OSError:
            return
        if not chunk:
            return
        got += chunk
        if time.monotonic() < slow_until[0]:
            time.sleep(10 / SLOW_RATE)


def slow_consumer(procs: Processes, cfg: Any, start: Callable[..., Any]) -> dict[str, Any]:
    """A `conflate=latest` stream read 10x slower than the writes: does it get the newest
    version of every key, without `overflow`?"""
    target = start(procs, cfg, "broker", 0)
    port = target.ports[0]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall((f"GET /v1/subscribe?namespace={target.namespace}&pattern=*&conflate=latest "
                  f"HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {target.token}\r\n"
                  "Accept: text/event-stream\r\n\r\n").encode())
    writes = round(SLOW_RATE * SLOW_SECONDS)
    got = bytearray()
    slow_until = [time.monotonic() + 3600.0]
    reader = threading.Thread(target=_read_slowly, args=(sock, slow_until, got), daemon=True)
    reader.start()
    time.sleep(0.5)
    publisher = BrokerPublisher("127.0.0.1", [port], target.namespace, target.token,
                                SLOW_VALUE_BYTES)
    sent = client.run(lambda: publish(publisher, "slow", writes, SLOW_RATE, 1))
    slow_until[0] = time.monotonic()
    reader.join(timeout=60)
    sock.close()
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for proc in target.procs:
        procs.stop(proc)
    _, _, body = bytes(got).partition(b"\r\n\r\n")
    text = _dechunk(body).decode(errors="replace")
    newest: dict[int, int] = {}
    events = 0
    for seq in re.findall(r'"bench":"slow:(\d+):', text):
        events += 1
        key = int(seq) % SLOW_KEYS
        newest[key] = max(newest.get(key, -1), int(seq))
    last = {k: max(s for s in range(writes) if s % SLOW_KEYS == k) for k in range(SLOW_KEYS)}
    conflated = re.search(r"^memp_events_conflated_total (\S+)$", metrics, re.MULTILINE)
    return {"writes": writes, "failed_writes": sent["failed"], "rate": SLOW_RATE,
            "keys": SLOW_KEYS, "events_received": events,
            "newest_of_every_key": newest == last,
            "keys_behind": sum(1 for k in last if newest.get(k) != last[k]),
            "overflow": "event: overflow" in text,
            "conflated": float(conflated[1]) if conflated else None,
            "queue_cap_keys": cfg.queue_size}


def filtered_table(results: dict[str, dict[str, Any]], extra: dict[str, Any]) -> str:
    """The filtered phase beside the unfiltered burst, the micro-benchmark, the slow reader."""
    lines = ["", "filtered (each stream's filter matches 1% of the writes) vs unfiltered, one "
             "broker process; the server's CPU less what the writes cost alone (write µs);",
             "budget = 1.5 x µs per unfiltered delivery (burst: batched; latency phase: one "
             "event per send, as filtered streams get them) x deliveries per write:",
             f"{'subs':>5} {'write µs':>8} | {'µs/delivery burst':>17} {'latency':>7} "
             f"{'x deliveries/write':>18} {'budgets':>13} | {'filtered µs/write':>17} "
             f"{'/budgets':>11} {'delivered':>17}"]
    for count, by_target in results.items():
        broker = by_target.get("broker")
        if not broker or "filtered" not in broker:
            continue
        filtered = broker["filtered"]
        alone = filtered["alone_us_per_write"]
        per_delivery = [(broker[p]["server_us_per_write"] - alone) / broker["streams"]
                        for p in ("burst", "latency")]
        fanned = broker["streams"] / BUCKETS
        budgets = [1.5 * d * fanned for d in per_delivery]
        cost = filtered["server_us_per_write"] - alone
        ratios = "/".join(f"{cost / b:.2f}x" if b > 0 else "-" for b in budgets)
        lines.append(f"{count:>5} {alone:>8.0f} | {per_delivery[0]:>17.2f} "
                     f"{per_delivery[1]:>7.2f} {fanned:>18.1f} "
                     f"{budgets[0]:>6.0f}/{budgets[1]:<6.0f} | {cost:>17.1f} {ratios:>11} "
                     f"{filtered['delivered']:>8}/{filtered['expected']:<8}")
        rounds = filtered.get("rounds_us_per_write")
        if rounds:
            lines.append("      rounds, µs per write alone / filtered (before subtracting): "
                         + ", ".join(f"{a:.0f}/{f:.0f}" for a, f in rounds))
    costs = extra.get("filter_costs")
    if costs:
        lines.append(f"filter evaluation: {costs['filter_us_per_subscriber']} µs per change per "
                     f"subscriber ({costs['subscribers']} subscribers, `/bucket == n`); the "
                     f"hub's whole offer {costs['offer_us_per_subscriber']} µs, "
                     f"{costs['indexed_offer_us_per_subscriber']} µs with the equality index; "
                     f"decoding a value once {costs['decode_and_one_filter_us']} µs")
    sends = extra.get("send_costs")
    if sends:
        lines.append(f"floor, no broker: {sends['events_per_round']} events at a time to "
                     f"{sends['sockets']} loopback sockets cost {sends['lone_us_per_event']} µs "
                     f"each written alone, {sends['batched_us_per_event']} µs written together: "
                     f"a write of its own adds {sends['write_us']} µs per lone event "
                     f"(bench/fanout_sends.py)")
    slow = extra.get("slow_consumer")
    if slow:
        lines.append(f"conflate=latest, read 10x slower than {slow['rate']:g} writes/s over "
                     f"{slow['keys']} keys: {slow['events_received']} events for "
                     f"{slow['writes']} writes, newest of every key: "
                     f"{'yes' if slow['newest_of_every_key'] else 'NO'}, overflow: "
                     f"{'YES' if slow['overflow'] else 'no'}, conflated {slow['conflated']:g}, "
                     f"queue cap {slow['queue_cap_keys']} keys")
    return "\n".join(lines)
