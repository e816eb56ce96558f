"""Fan-out benchmark of the MEMP broker against its floor: `python -m bench.fanout --help`.

Starts redis-server, then for each subscriber count and each target a fresh server: the floor
(bench/fanout_floor.py: a bare sse-starlette app fanning the same Redis Stream out through one
queue per subscriber), the broker (`memp-broker serve`), and with --workers K the broker as K
processes on one Redis with the streams split between them. A separate load process
(bench/fanout_load.py) holds the SSE streams; this one publishes through the broker's PUT (for
the floor, an XADD of a record of the same size) with a timestamp in each value: first --rate
writes/s for --seconds (latency), then a burst (delivery throughput). Server RSS comes from
/proc/<pid>/status, with no stream open and with every stream open and idle.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import client, report
from bench.fanout_filtered import filter_costs, filtered_table, slow_consumer
from bench.fanout_publish import BUCKETS, BrokerPublisher, FloorPublisher, Publisher, publish
from bench.fanout_report import table, verdicts
from bench.fanout_sends import send_costs
from bench.servers import (
    Processes,
    clean_env,
    cpu_since,
    cpu_snapshot,
    end_run,
    failure_status,
    free_port,
    need_redis_server,
    start_redis,
    start_run,
    wait_started,
)

HOST = "127.0.0.1"
WARM_STREAMS, WARM_WRITES = 10, 3
BURST_LANES = 8  # concurrent publisher connections during the burst
ALONE_WRITES = 2000  # writes no stream follows, beside the filtered phase's


@dataclass
class Config:
    counts: list[int]
    targets: list[str]
    seconds: float
    rate: float
    burst_deliveries: int
    burst_rate: float
    value_bytes: int
    queue_size: int
    filtered: bool = False
    redis_url: str = ""
    admin_key: str = field(default_factory=lambda: f"bench-admin-{secrets.token_hex(16)}")


@dataclass
class Target:
    """A running target: one or more server processes, their ports, and the streams' token."""

    name: str
    namespace: str
    procs: list[subprocess.Popen[bytes]]
    ports: list[int]
    token: str = ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", default="100,1000,5000",
                        help="comma-separated subscriber counts (default 100,1000,5000)")
    parser.add_argument("--targets", default="floor,broker",
                        help="comma-separated subset of floor,broker (default both)")
    parser.add_argument("--workers", type=int, default=1,
                        help="also run the broker as this many processes (>= 2) on one Redis, "
                             "the streams split between them (default 1: not run)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="length of the latency phase (default 5)")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="writes per second in the latency phase (default 20)")
    parser.add_argument("--burst-deliveries", type=int, default=100_000,
                        help="events to deliver in the throughput burst: writes = this / "
                             "subscribers, at least 10 (default 100000)")
    parser.add_argument("--burst-rate", type=float, default=1000.0,
                        help="writes per second the burst is published at (default 1000)")
    parser.add_argument("--value-bytes", type=int, default=256,
                        help="size of each written JSON value (default 256, minimum 64)")
    parser.add_argument("--queue-size", type=int, default=0,
                        help="per-subscriber queue bound, MEMP_SUBSCRIBER_QUEUE_SIZE (default: "
                             "enough for the largest burst, so the measured load never overflows)")
    parser.add_argument("--filtered", action="store_true",
                        help="also run, on the broker, a phase where each subscriber's filter "
                             "matches 1%% of the writes, a filter evaluation micro-benchmark, "
                             "and a conflated consumer reading 10x slower than the writes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


# ---- processes ----


class Load:
    """The load process (bench/fanout_load.py), spoken to one JSON line at a time."""

    def __init__(self, procs: Processes, target: Target, most: int) -> None:
        argv = [sys.executable, "-m", "bench.fanout_load", "--host", HOST,
                "--ports", ",".join(map(str, target.ports)), "--namespace", target.namespace,
                "--token", target.token, "--max-subscribers", str(most)]
        self.procs = procs
        self.proc = procs.start("load", argv, clean_env(), capture=True, stdin=True)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        if self.proc.stdin is None or self.proc.stdout is None:
            raise RuntimeError("the load process has no pipes")
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()
        noise = []
        while line := self.proc.stdout.readline():
            if line.startswith(b"{"):
                answer: dict[str, Any] = json.loads(line)
                return answer
            noise.append(line.decode(errors="replace"))
        raise RuntimeError(f"the load process exited ({self.proc.wait()}):\n" + "".join(noise))

    def stop(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"cmd": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.procs.stop(self.proc)


def _processes(name: str) -> int:
    return int(name.rpartition("-x")[2]) if "-x" in name else 1


def _start(procs: Processes, cfg: Config, name: str, count: int) -> Target:
    target = Target(name, f"fanout-{name}-{count}", [], [])
    for n in range(_processes(name)):
        port = free_port()
        if name == "floor":
            argv = [sys.executable, "-m", "uvicorn", "--factory", "bench.fanout_floor:create_app",
                    "--host", HOST, "--port", str(port), "--loop", "uvloop", "--http",
                    "httptools", "--no-access-log", "--log-level", "warning"]
            env = clean_env(BENCH_REDIS_URL=cfg.redis_url, BENCH_NAMESPACE=target.namespace,
                            BENCH_QUEUE_SIZE=str(cfg.queue_size))
        else:
            # At log level warning, serve turns the access log off; uvicorn picks uvloop and
            # httptools when installed.
            argv = [sys.executable, "-m", "broker.cli", "serve", "--host", HOST, "--port",
                    str(port), "--log-level", "warning"]
            env = clean_env(MEMP_REDIS_URL=cfg.redis_url, MEMP_ADMIN_KEY=cfg.admin_key,
                            MEMP_SUBSCRIBER_QUEUE_SIZE=str(cfg.queue_size))
        proc = procs.start(f"{name}-{n}", argv, env)
        wait_started(procs, proc, port, name)
        target.procs.append(proc)
        target.ports.append(port)
    if name != "floor":
        # An agent's API key (read, write, subscribe on the run's namespace) drives the broker.
        target.token = client.register_agent(HOST, target.ports[0], cfg.admin_key,
                                             target.namespace)["api_key"]
    return target


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/status (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


# ---- one measurement ----


def _phase(cfg: Config, target: Target, load: Load, publisher: Publisher, watch: dict[str, int],
           phase: str, writes: int, rate: float, lanes: int, streams: int,
           per_stream: int | None = None) -> dict[str, Any]:
    """Publish one phase, wait for the streams to receive it (`per_stream` events each: all
    the writes, unless filtered), and sum it up."""
    per_stream = writes if per_stream is None else per_stream
    before = cpu_snapshot(watch)
    sent = client.run(lambda: publish(publisher, phase, writes, rate, lanes))
    got = load.ask({"cmd": "wait", "phase": phase, "writes": per_stream, "quiet": 5,
                    "timeout": 30 + 2 * writes / rate + streams * per_stream / 10_000})
    cpu = cpu_since(watch, before)
    # From the first write to the last delivery: the time the fan-out took.
    seconds = (got["last_ns"] - sent["start_ns"]) / 1e9 if got["last_ns"] else 0.0
    server_cpu = sum(v for k, v in cpu.items() if k.startswith("server"))
    delivered = got["delivered"]
    return {
        "writes": writes, "rate": rate, "failed_writes": sent["failed"],
        "publish_seconds": sent["publish_seconds"],
        "expected": streams * per_stream, "delivered": delivered,
        "complete_streams": got["complete_streams"], "closed_streams": got["closed_streams"],
        "duplicates": got["duplicates"], "special_events": got["special_events"],
        "seconds": round(seconds, 3),
        "deliveries_per_s": round(delivered / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": got["p50_ms"], "p90_ms": got["p90_ms"], "p99_ms": got["p99_ms"],
        "max_ms": got["max_ms"],
        "server_us_per_delivery": round(server_cpu * 1e6 / delivered, 2) if delivered else None,
        "server_us_per_write": round(server_cpu * 1e6 / writes, 1),
        "cpu_core_share": {k: round(v / seconds, 3) for k, v in cpu.items()} if seconds else {},
    }


def _measure(procs: Processes, cfg: Config, name: str, count: int, redis_pid: int
             ) -> dict[str, Any]:
    target = _start(procs, cfg, name, count)
    load = Load(procs, target, count)
    publisher: Publisher = (
        FloorPublisher(cfg.redis_url, target.namespace, cfg.value_bytes) if name == "floor"
        else BrokerPublisher(HOST, target.ports, target.namespace, target.token, cfg.value_bytes))
    watch = {f"server{n}": p.pid for n, p in enumerate(target.procs)}
    watch.update(redis=redis_pid, load=load.proc.pid)

    def rss() -> int:
        return sum(rss_kib(p.pid) for p in target.procs)

    try:
        # Warm up (first stream, first write, the reader) so one-time costs are not counted
        # per subscriber, then close those streams and take the baseline.
        load.ask({"cmd": "open", "count": WARM_STREAMS})
        _phase(cfg, target, load, publisher, watch, "warm", WARM_WRITES, 20.0, 1, WARM_STREAMS)
        load.ask({"cmd": "close"})
        time.sleep(1.0)
        rss_none = rss()
        opened = load.ask({"cmd": "open", "count": count})
        streams = opened["opened"]
        time.sleep(1.0)
        rss_idle = rss()
        print(f"  {name}: {streams}/{count} streams open in {opened['seconds']:.1f} s; "
              f"latency phase", flush=True)
        latency = _phase(cfg, target, load, publisher, watch, "lat",
                         max(1, round(cfg.rate * cfg.seconds)), cfg.rate, 1, count)
        burst_writes = _burst_writes(cfg, count)
        print(f"  {name}: burst of {burst_writes} writes", flush=True)
        burst = _phase(cfg, target, load, publisher, watch, "burst", burst_writes,
                       cfg.burst_rate, BURST_LANES, count)
        rss_after = rss()
        filtered = None
        if cfg.filtered and name == "broker":
            load.ask({"cmd": "close"})
            load.ask({"cmd": "open", "count": count, "filters": BUCKETS})
            writes = BUCKETS * max(1, min(burst_writes, 50))
            print(f"  {name}: filtered phase of {writes} writes, each stream matching 1%, "
                  f"in rounds between as many writes no stream follows", flush=True)
            filtered = _filtered(cfg, target, load, publisher, watch, writes, count)
        for proc in target.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited while measured:\n{procs.log_tail(proc)}")
    finally:
        load.stop()
        for proc in target.procs:
            procs.stop(proc)
    return {
        "subscribers": count, "streams": streams, "processes": len(target.procs),
        "connect_seconds": opened["seconds"],
        "rss_kib": {"none": rss_none, "idle": rss_idle, "after_burst": rss_after},
        "kib_per_subscriber": round((rss_idle - rss_none) / count, 2),
        "latency": latency, "burst": burst,
        **({"filtered": filtered} if filtered else {}),
    }


def _filtered(cfg: Config, target: Target, load: Load, publisher: Publisher,
              watch: dict[str, int], writes: int, streams: int, rounds: int = 2
              ) -> dict[str, Any]:
    """The filtered phase in `rounds`, each after as many writes to a namespace no stream
    follows: what a write costs the server alone (HTTP, Lua, change log), which the fan-out's
    part is told apart from, measured beside it so that a load that drifts (a shared machine)
    weighs on both alike."""
    other = f"{target.namespace}-alone"
    token = client.register_agent(HOST, target.ports[0], cfg.admin_key, other)["api_key"]
    alone_publisher = BrokerPublisher(HOST, target.ports, other, token, cfg.value_bytes)
    step = writes // rounds
    parts: dict[str, list[dict[str, Any]]] = {"alone": [], "filtered": []}
    for n in range(rounds):
        parts["alone"].append(_phase(cfg, target, load, alone_publisher, watch, f"alone{n}",
                                     ALONE_WRITES // rounds, cfg.burst_rate, BURST_LANES, 0, 0))
        parts["filtered"].append(_phase(cfg, target, load, publisher, watch, f"filtered{n}",
                                        step, cfg.burst_rate, BURST_LANES, streams,
                                        step // BUCKETS))

    def total(phases: list[dict[str, Any]], name: str) -> Any:
        return sum(p[name] for p in phases)

    def per_write(phases: list[dict[str, Any]]) -> float:
        return round(float(total(phases, "server_us_per_write")) / len(phases), 1)

    done = parts["filtered"]
    return {
        "writes": total(done, "writes"), "rounds": rounds, "rate": cfg.burst_rate,
        "failed_writes": total(done, "failed_writes") + total(parts["alone"], "failed_writes"),
        "expected": total(done, "expected"), "delivered": total(done, "delivered"),
        "complete_streams": min(p["complete_streams"] for p in done),
        "closed_streams": max(p["closed_streams"] for p in done),
        "duplicates": total(done, "duplicates"), "special_events": done[-1]["special_events"],
        "p50_ms": max(p["p50_ms"] for p in done), "p99_ms": max(p["p99_ms"] for p in done),
        "server_us_per_write": per_write(done),
        "alone_us_per_write": per_write(parts["alone"]),
        "rounds_us_per_write": [[a["server_us_per_write"], f["server_us_per_write"]]
                                for a, f in zip(parts["alone"], done, strict=True)],
    }


def _burst_writes(cfg: Config, count: int) -> int:
    return max(10, math.ceil(cfg.burst_deliveries / count))


# ---- main ----


def _config(args: argparse.Namespace) -> Config:
    try:
        counts = [int(c) for c in args.subscribers.split(",") if c.strip()]
    except ValueError:
        raise SystemExit("bench: --subscribers is a comma-separated list of numbers") from None
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("bench: --subscribers needs counts >= 1")
    if not targets or set(targets) - {"floor", "broker"}:
        raise SystemExit(f"bench: --targets is a subset of floor,broker, not {args.targets!r}")
    if args.workers < 1 or args.value_bytes < 64 or min(args.seconds, args.rate,
                                                         args.burst_rate) <= 0:
        raise SystemExit("bench: --workers >= 1, --value-bytes >= 64; --seconds, --rate and "
                         "--burst-rate > 0")
    need_redis_server()
    targets = [t for t in ("floor", "broker") if t in targets]
    if args.workers > 1:
        targets.append(f"broker-x{args.workers}")
    cfg = Config(counts=counts, targets=targets, seconds=args.seconds, rate=args.rate,
                 burst_deliveries=args.burst_deliveries, burst_rate=args.burst_rate,
                 value_bytes=args.value_bytes, queue_size=args.queue_size,
                 filtered=args.filtered)
    if not cfg.queue_size:
        most = max(max(_burst_writes(cfg, c) for c in counts), round(args.rate * args.seconds))
        cfg.queue_size = max(1000, 2 * most)
    return cfg


def _raise_open_files(wanted: int) -> None:
    """Servers inherit the limit: each stream is a socket in the server and in the load."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if min(wanted, hard) < wanted:
        print(f"bench: the open-files limit is {hard}; streams beyond it will fail",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cfg = _config(args)
    _raise_open_files(max(cfg.counts) + 1024)
    procs = start_run()
    results: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    load_before = os.getloadavg()[0]
    print(f"bench: {','.join(map(str, cfg.counts))} subscribers; {cfg.rate:g} writes/s for "
          f"{cfg.seconds:g} s, then a {cfg.burst_deliveries}-delivery burst at "
          f"{cfg.burst_rate:g} writes/s; {cfg.value_bytes}-byte values; queues of "
          f"{cfg.queue_size}; {os.cpu_count()} CPUs, load average {load_before:.2f}", flush=True)
    try:
        cfg.redis_url, redis_proc = start_redis(procs)
        for count in cfg.counts:
            for name in cfg.targets:
                print(f"{count} subscribers, {name}:", flush=True)
                results.setdefault(str(count), {})[name] = _measure(procs, cfg, name, count,
                                                                    redis_proc.pid)
        if cfg.filtered:
            print("filter evaluation, in process; a conflated consumer 10x slower than the "
                  "writes; the kernel's cost of a write per lone event:", flush=True)
            extra = {"filter_costs": filter_costs(),
                     "slow_consumer": slow_consumer(procs, cfg, _start),
                     "send_costs": send_costs(max(cfg.counts))}
    except (KeyboardInterrupt, RuntimeError, OSError) as exc:
        return failure_status(exc)
    finally:
        end_run(procs)

    checks = verdicts(results)
    print()
    print(table(results, checks))
    if cfg.filtered:
        print(filtered_table(results, extra))
    if args.json:
        document = {
            "config": {"subscribers": cfg.counts, "targets": cfg.targets,
                       "seconds": cfg.seconds, "rate": cfg.rate,
                       "burst_deliveries": cfg.burst_deliveries, "burst_rate": cfg.burst_rate,
                       "value_bytes": cfg.value_bytes, "queue_size": cfg.queue_size},
            "machine": report.machine(load_before, python=platform.python_version()),
            "results": results,
            "targets": checks,
            **({"filtered": extra} if cfg.filtered else {}),
        }
        report.write_json(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
