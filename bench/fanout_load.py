"""The subscribers' side of the fan-out benchmark, run by `bench.fanout` as its own process.

Holds SSE streams over raw asyncio sockets with a minimal chunked-body and event-stream reader
(httpx would cost too much per stream at 5,000). Driven by JSON commands on stdin, one a line,
each answered by one JSON line on stdout:

    {"cmd": "open", "count": 1000, "filters": 100}
        open that many more streams (taking turns over --ports); answered once all are open;
        with `filters`, stream i asks for `filter=/bucket == i % filters`;
    {"cmd": "wait", "phase": "lat", "writes": 100, "timeout": 30}
        wait until every open stream has received the phase's `writes` events (or the timeout,
        or `quiet` seconds with no delivery), then answer with the phase's figures;
    {"cmd": "close"}    close every stream and forget the counts;
    {"cmd": "quit"}

Published values carry `"bench":"<phase>:<seq>:<time_ns>"`; latency is receive time minus that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import time
from collections import Counter, defaultdict
from typing import Any, cast

from bench.client import run

MARKER = b'"bench":"'


class Totals:
    """What all streams received, by phase."""

    def __init__(self) -> None:
        self.delivered: Counter[str] = Counter()
        self.latencies_us: defaultdict[str, list[int]] = defaultdict(list)
        self.first_ns: dict[str, int] = {}
        self.last_ns: dict[str, int] = {}
        self.duplicates: Counter[str] = Counter()
        self.special: Counter[str] = Counter()
        self.closed = 0


class Subscriber(asyncio.Protocol):
    """One SSE stream: HTTP head, chunked body, events; counts what it receives."""

    def __init__(self, request: bytes, totals: Totals) -> None:
        self.request = request
        self.totals = totals
        self.opened: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.raw = b""
        self.head_done = False
        self.payload_left = 0   # bytes of the current chunk still to come
        self.crlf_left = 0      # the CRLF after a chunk
        self.text = b""         # event-stream bytes not yet split into events
        self.counts: Counter[str] = Counter()
        self.seen: dict[str, bytearray] = {}  # per phase, one byte per sequence number
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.open:
            self.totals.closed += 1
        self.open = False
        if not self.opened.done():
            self.opened.set_result(0)

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        raw = self.raw + data
        if not self.head_done:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            status = int(raw[9:12])
            self.head_done = True
            self.open = status == 200
            self.opened.set_result(status)
            if not self.open:
                self.shut()
                return
            raw = raw[end + 4:]
        self.raw = b""
        body = self._dechunk(raw)
        if body:
            self._events(body, now)

    def _dechunk(self, raw: bytes) -> bytes:
        out = []
        pos, size = 0, len(raw)
        while pos < size:
            if self.crlf_left:
                step = min(self.crlf_left, size - pos)
                self.crlf_left -= step
                pos += step
                continue
            if self.payload_left:
                step = min(self.payload_left, size - pos)
                out.append(raw[pos:pos + step])
                self.payload_left -= step
                pos += step
                if not self.payload_left:
                    self.crlf_left = 2
                continue
            end = raw.find(b"\r\n", pos)
            if end < 0:
                self.raw = raw[pos:]
                break
            length = int(raw[pos:end].split(b";", 1)[0], 16)
            pos = end + 2
            if length == 0 and self.transport is not None:  # the server ended the stream
                self.transport.close()
                break
            self.payload_left = length
        return b"".join(out)

    def _events(self, body: bytes, now: int) -> None:
        text = (self.text + body).replace(b"\r\n", b"\n")
        blocks = text.split(b"\n\n")
        self.text = blocks.pop()
        totals = self.totals
        for block in blocks:
            at = block.find(MARKER)
            if at < 0:
                if block.startswith(b"event: ") or b"\nevent: " in block:
                    name = block.split(b"event: ", 1)[1].split(b"\n", 1)[0]
                    totals.special[name.decode(errors="replace")] += 1
                continue
            start = at + len(MARKER)
            phase, seq, sent = block[start:block.index(b'"', start)].decode().split(":")
            number = int(seq)
            seen = self.seen.setdefault(phase, bytearray())
            if number >= len(seen):
                seen.extend(bytes(number + 64 - len(seen)))
            if seen[number]:
                totals.duplicates[phase] += 1
                continue
            seen[number] = 1
            self.counts[phase] += 1
            totals.delivered[phase] += 1
            totals.latencies_us[phase].append((now - int(sent)) // 1000)
            totals.first_ns.setdefault(phase, now)
            totals.last_ns[phase] = now

    def shut(self) -> None:
        """Close the stream from this side (not counted as closed by the server)."""
        self.open = False
        if self.transport is not None:
            self.transport.close()


def _percentile(ordered: list[int], p: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(int(len(ordered) * p / 100), len(ordered) - 1)] / 1000


def _request(args: argparse.Namespace, query: str = "") -> bytes:
    path = f"/v1/subscribe?namespace={args.namespace}&pattern=*{query}"
    auth = f"Authorization: Bearer {args.token}\r\n" if args.token else ""
    return (f"GET {path} HTTP/1.1\r\nHost: {args.host}\r\nAccept: text/event-stream\r\n"
            f"{auth}\r\n").encode()


async def _open(args: argparse.Namespace, totals: Totals, count: int, filters: int = 0
                ) -> list[Subscriber]:
    """Open `count` streams, --connect-concurrency at a time, taking turns over the ports;
    returns those the server answered with 200."""
    loop = asyncio.get_running_loop()
    ports = [int(p) for p in args.ports.split(",")]
    requests = [_request(args, f"&filter=%2Fbucket%20%3D%3D%20{n}") for n in range(filters)]
    request = _request(args)
    gate = asyncio.Semaphore(args.connect_concurrency)
    subscribers: list[Subscriber] = []

    async def open_one(i: int) -> None:
        async with gate:
            subscriber = Subscriber(requests[i % filters] if filters else request, totals)
            try:
                await loop.create_connection(lambda: subscriber, args.host,
                                             ports[i % len(ports)])
                async with asyncio.timeout(60):
                    status = await subscriber.opened
            except (OSError, TimeoutError):
                subscriber.shut()
                return
            if status == 200:
                subscribers.append(subscriber)

    await asyncio.gather(*(open_one(i) for i in range(count)))
    return subscribers


async def _wait(subscribers: list[Subscriber], totals: Totals, command: dict[str, Any]
                ) -> dict[str, Any]:
    phase, writes = command["phase"], int(command["writes"])
    deadline = time.monotonic() + float(command.get("timeout", 60))
    quiet = float(command.get("quiet", 5))
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if all(s.counts[phase] >= writes for s in subscribers if s.open):
            break
        if totals.delivered[phase] != seen:
            seen, since = totals.delivered[phase], time.monotonic()
        elif time.monotonic() - since > quiet:
            break
        await asyncio.sleep(0.02)
    ordered = sorted(totals.latencies_us.pop(phase, []))
    return {
        "phase": phase, "delivered": totals.delivered[phase],
        "complete_streams": sum(1 for s in subscribers if s.counts[phase] >= writes),
        "open_streams": sum(1 for s in subscribers if s.open),
        "closed_streams": totals.closed, "duplicates": totals.duplicates[phase],
        "special_events": dict(totals.special),
        "first_ns": totals.first_ns.get(phase), "last_ns": totals.last_ns.get(phase),
        "p50_ms": _percentile(ordered, 50), "p90_ms": _percentile(ordered, 90),
        "p99_ms": _percentile(ordered, 99), "max_ms": ordered[-1] / 1000 if ordered else 0.0,
    }


def _say(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    totals = Totals()
    subscribers: list[Subscriber] = []
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        while line := await stdin.readline():
            command = json.loads(line)
            if command["cmd"] == "open":
                started = time.monotonic()
                opened = await _open(args, totals, int(command["count"]),
                                     int(command.get("filters", 0)))
                subscribers += opened
                _say({"opened": len(opened), "requested": command["count"],
                      "seconds": round(time.monotonic() - started, 3)})
            elif command["cmd"] == "wait":
                _say(await _wait(subscribers, totals, command))
            elif command["cmd"] == "close":
                for subscriber in subscribers:
                    subscriber.shut()
                subscribers, totals = [], Totals()
                _say({"closed": True})
            elif command["cmd"] == "quit":
                break
    finally:
        for subscriber in subscribers:
            subscriber.shut()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ports", required=True, help="comma-separated; streams take turns")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument("--token", default="")
    parser.add_argument("--max-subscribers", type=int, default=10_000,
                        help="raise the open-files limit for this many streams")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.max_subscribers + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    with contextlib.suppress(KeyboardInterrupt):
        run(lambda: _main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
