"""Fault benchmark: `python -m bench.faults --help`.

Starts, on loopback, a Sentinel group (1 primary, 1 replica, 3 sentinels) and a Redis Cluster
(3 primaries with a replica each) as tests/support/topologies.py does, and for each topology,
fault and `MEMP_WRITE_REPLICAS` value runs two `memp-broker serve` processes under writers
(each write with its own idempotency key, retried with it on the other broker until it is
acknowledged) and a held-open stream on the namespace whose primary fails. The fault: the
primary SIGKILLed, or SIGSTOPped until a replica took over and then SIGCONTed (a frozen VM).
Measured: acknowledged writes lost (the stored value of a key older than its last
acknowledged one), acknowledged writes missing (any acknowledged write the change log does not
hold once the run is over, read by replaying each namespace's log: a write lost and followed
by a newer one of the same key counts here, not under lost), writes answered 500, the longest
time without an acknowledged write on the failed shard and on the healthy ones (Cluster), the
stream's silent gaps (versions it skipped with no `reset` before them) and its resets, and a
stream resumed afterwards from a cursor of before the fault.

`--unfollowed` runs the brokers as they were before they followed Sentinel's word
(bench/unfollowed.py: redis-py's own Sentinel client, no `+switch-master`, no `ROLE` check), to
show the loss that cost: with `--write-replicas 0 --faults pause --burst 64` the brokers go on
writing to the paused primary once it resumes, until Sentinel demotes it, and those writes
vanish. `--burst N` sends N writes at once through each broker just before the fault and just
after the resume or restart, as bursty traffic does: the first burst leaves connections idle
in the brokers' pools through the fault, the second uses them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tests.support.brokers import ADMIN_KEY, ServeProcesses
from tests.support.loopback import Credentials
from tests.support.streams import Stream
from tests.support.topologies import RedisCluster, RedisSentinel

Topology = RedisCluster | RedisSentinel


@dataclass
class Outcome:
    status: int  # 0: no answer
    at: float
    space: str
    key: str
    value: int


@dataclass
class Figures:
    topology: str
    fault: str
    write_replicas: int
    followed: bool = True  # False: --unfollowed
    writes: int = 0
    acknowledged: int = 0
    lost: int = 0
    missing: int = 0  # acknowledged writes the final change log does not hold
    answered_500: int = 0
    gap_failed_s: float = 0.0
    gap_healthy_s: float | None = None
    stream_silent_gaps: int = 0
    stream_resets: int = 0
    resumed_silent_gaps: int = 0
    resumed_resets: int = 0
    failover_s: float = 0.0
    notes: list[str] = field(default_factory=list)


class Writers:
    """`count` writers, each writing its own key of one namespace (so one held up by the
    failed shard holds up no other), through both brokers; a write not acknowledged is sent
    again with its idempotency key on the other broker."""

    def __init__(self, urls: list[str], spaces: list[str], count: int) -> None:
        self.urls, self.spaces = urls, spaces
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                        for w in range(count)]

    def _run(self, writer: int) -> None:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(timeout=10, headers=headers) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                space, key = self.spaces[writer % len(self.spaces)], f"w{writer}"
                for attempt in range(100):
                    url = self.urls[(writer + n + attempt) % len(self.urls)]
                    try:
                        status = http.put(f"{url}/v1/namespaces/{space}/memory/{key}",
                                          json={"value": n},
                                          headers={"Idempotency-Key": f"{key}-{n}"}).status_code
                    except httpx.HTTPError:
                        status = 0
                    self.outcomes.append(Outcome(status, time.monotonic(), space, key, n))
                    if status in (200, 201) or self.stop.is_set():
                        break
                    time.sleep(0.05)
                time.sleep(0.005)

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def _burst(load: Writers, urls: list[str], space: str, count: int, tag: str) -> None:
    """`count` writes at once through each broker, each to a key of its own, with its own
    idempotency key, once; their outcomes join the writers'."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}

    def write(url: str, key: str) -> None:
        with httpx.Client(timeout=10, headers=headers) as http:
            try:
                status = http.put(f"{url}/v1/namespaces/{space}/memory/{key}",
                                  json={"value": 1},
                                  headers={"Idempotency-Key": f"{key}-1"}).status_code
            except httpx.HTTPError:
                status = 0
        load.outcomes.append(Outcome(status, time.monotonic(), space, key, 1))

    threads = [threading.Thread(target=write, args=(url, f"burst-{tag}-{b}-{i}"))
               for b, url in enumerate(urls) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)


def _longest_gap(outcomes: list[Outcome], spaces: set[str], start: float, end: float) -> float:
    times = sorted(o.at for o in outcomes
                   if o.space in spaces and o.status in (200, 201) and start <= o.at <= end)
    points = [start, *times, end]
    return max(b - a for a, b in itertools.pairwise(points))


def _stream_gaps(stream: Stream) -> tuple[int, int]:
    """Versions skipped with no reset before them, and resets."""
    last: dict[str, int] = {}
    gaps = resets = 0
    for event in list(stream.events):
        if event.event == "reset":
            resets += 1
            last.clear()
        elif event.event in ("put", "delete") and isinstance(event.data, dict):
            key, version = event.data["key"], event.data["version"]
            if key in last and version != last[key] + 1:
                gaps += 1
            last[key] = version
    return gaps, resets


def _logged_values(url: str, space: str, headers: dict[str, str]) -> set[tuple[str, int]]:
    """(key, value) of every put the namespace's change log holds: its whole log, replayed
    from the start by a stream, read until nothing more arrives for a second."""
    stream = Stream(f"{url}/v1/subscribe", [("sub", f"{space}:*")],
                    {**headers, "Last-Event-ID": f"{space}:0-0"}).wait_open()
    try:
        seen = -1
        while seen != len(stream.events):
            seen = len(stream.events)
            time.sleep(1.0)
        return {(e.data["key"], e.data["value"]) for e in list(stream.events)
                if e.event == "put" and isinstance(e.data, dict)}
    finally:
        stream.close()


def run_one(topology: Topology, kind: str, fault: str, replicas: int, writers: int,
            hold: float, run: int, followed: bool = True, burst: int = 0) -> Figures:
    figures = Figures(kind, fault, replicas, followed)
    serve = ServeProcesses(topology.url)
    first, second = serve.start(2, {"MEMP_WRITE_REPLICAS": str(replicas),
                                    "MEMP_WRITE_REPLICAS_TIMEOUT_MS": "500"},
                                module="broker.cli" if followed else "bench.unfollowed")
    spaces = [f"fault-{kind}-{fault}-{replicas}-{run}-{i}" for i in range(6)]
    doomed = spaces[0]
    healthy: set[str] = set()
    slot = 0
    if isinstance(topology, RedisCluster):
        slot = topology.slot_of("{" + doomed + "}")
        doomed_port = topology.primary_for(slot).port
        healthy = {s for s in spaces[1:]
                   if topology.primary_for(topology.slot_of("{" + s + "}")).port != doomed_port}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    held = Stream(f"{first.url}/v1/subscribe", [("sub", f"{doomed}:*")], headers).wait_open()
    try:
        with Writers([first.url, second.url], spaces, writers) as load:
            time.sleep(2.0)
            if burst:
                _burst(load, [first.url, second.url], doomed, burst, "before")
            cursor = next((e.id for e in reversed(list(held.events)) if e.id), None)
            started = time.monotonic()
            if isinstance(topology, RedisCluster):
                victim = (topology.kill_primary(slot) if fault == "kill"
                          else topology.pause_primary(slot))
                figures.failover_s = topology.wait_promoted()
            else:
                victim = (topology.kill_primary() if fault == "kill"
                          else topology.pause_primary())
                figures.failover_s = topology.wait_failover()
            if fault == "pause":
                time.sleep(hold)  # the deposed primary comes back after the promotion
                topology.resume(victim)
            else:
                time.sleep(hold)
                topology.heal()
            if burst:
                _burst(load, [first.url, second.url], doomed, burst, "after")
            time.sleep(2.0)
            ended = time.monotonic()
        outcomes = load.outcomes
        figures.writes = len(outcomes)
        figures.answered_500 = sum(o.status >= 500 and o.status != 503 for o in outcomes)
        figures.gap_failed_s = round(_longest_gap(outcomes, {doomed}, started, ended), 2)
        if healthy:
            figures.gap_healthy_s = round(_longest_gap(outcomes, healthy, started, ended), 2)
        acknowledged: dict[tuple[str, str], int] = {}
        for o in outcomes:
            if o.status in (200, 201):
                pair = (o.space, o.key)
                acknowledged[pair] = max(o.value, acknowledged.get(pair, 0))
        figures.acknowledged = sum(o.status in (200, 201) for o in outcomes)
        with httpx.Client(base_url=second.url, timeout=10, headers=headers) as http:
            for (space, key), value in acknowledged.items():
                reply = http.get(f"/v1/namespaces/{space}/memory/{key}")
                stored = reply.json()["value"] if reply.status_code == 200 else 0
                if stored < value:
                    figures.lost += 1
                    figures.notes.append(f"{space}/{key}: stored {stored}, acknowledged {value}")
        acked = {(o.space, o.key, o.value) for o in outcomes if o.status in (200, 201)}
        for space in spaces:
            logged = _logged_values(second.url, space, headers)
            gone = sorted((key, value) for s, key, value in acked
                          if s == space and (key, value) not in logged)
            figures.missing += len(gone)
            figures.notes += [f"{space}/{key}: acknowledged {value}, not in the log"
                              for key, value in gone[:10]]
        time.sleep(1.0)  # the held stream catches up
        figures.stream_silent_gaps, figures.stream_resets = _stream_gaps(held)
        if cursor is not None:
            resumed = Stream(f"{second.url}/v1/subscribe", [("sub", f"{doomed}:*")],
                             {**headers, "Last-Event-ID": cursor}).wait_open()
            time.sleep(2.0)
            figures.resumed_silent_gaps, figures.resumed_resets = _stream_gaps(resumed)
            resumed.close()
    finally:
        held.close()
        serve.stop()
        topology.heal()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default="sentinel,cluster")
    parser.add_argument("--faults", default="kill,pause")
    parser.add_argument("--write-replicas", default="0,1")
    parser.add_argument("--writers", type=int, default=12,
                        help="writer threads, spread over 6 namespaces (12)")
    parser.add_argument("--hold", type=float, default=2.0,
                        help="seconds between the promotion and the resume or restart (2)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each combination (1)")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--burst", type=int, default=0,
                        help="writes sent at once through each broker before the fault and "
                             "after the resume or restart (0)")
    parser.add_argument("--unfollowed", action="store_true",
                        help="brokers that do not follow Sentinel's word (bench/unfollowed.py): "
                             "the loss before they did")
    args = parser.parse_args()
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="memp-faults-") as work:
        for kind in args.topologies.split(","):
            group: Topology = (
                RedisCluster(Path(work) / kind, credentials=Credentials()) if kind == "cluster"
                else RedisSentinel(Path(work) / kind, credentials=Credentials(),
                                   quick_discovery=True))
            with group:
                for fault in args.faults.split(","):
                    for replicas in (int(r) for r in args.write_replicas.split(",")):
                        for run in range(args.runs):
                            figures = run_one(group, kind, fault, replicas, args.writers,
                                              args.hold, run, not args.unfollowed,
                                              args.burst)
                            results.append(figures)
                            print(_row(figures), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))


def _row(f: Figures) -> str:
    healthy = "-" if f.gap_healthy_s is None else f"{f.gap_healthy_s:.2f}"
    unfollowed = "" if f.followed else " unfollowed"
    return (f"{f.topology:8}{unfollowed} {f.fault:5} WRITE_REPLICAS={f.write_replicas}  "
            f"writes {f.writes:5}  acked {f.acknowledged:5}  lost {f.lost:3}  "
            f"missing {f.missing:4}  "
            f"500s {f.answered_500:2}  gap failed {f.gap_failed_s:5.2f} s  healthy {healthy:>5} s  "
            f"stream gaps {f.stream_silent_gaps} resets {f.stream_resets}  "
            f"resumed gaps {f.resumed_silent_gaps} resets {f.resumed_resets}  "
            f"failover {f.failover_s:.1f} s")


if __name__ == "__main__":
    main()
