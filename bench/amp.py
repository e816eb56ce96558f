"""AMP bridge benchmark: `python -m bench.amp --help`.

Starts redis-server and one broker, imports --cells cells spread over --owners owners through
POST /amp/import (batches over a few connections; the quick way to load, and what a migration
does), then measures, round after round: AMP create next to a plain MEMP put, AMP read next to a
plain MEMP get (at --connections and at one connection), search of one owner's cells with and
without a text query (one connection). Last, on a fresh redis-server and broker loaded with
exactly --cells cells the same way (the create phases added cells to the first), one lifecycle
pass with `as_of` three years ahead, so every cell goes stale.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from bench import amp_cells, replay, report
from bench.replay import Agent, Broker, Driver, build
from bench.servers import (
    Processes,
    cpu_since,
    cpu_snapshot,
    failure_status,
    start_redis,
)
from broker.storage import layout

NAMESPACE = "bench"  # the plain MEMP side; cells live in the broker's AMP namespace, `amp`
SEARCH_P50_MS = 20.0
WITHIN = 1.5
LIFECYCLE_SECONDS = 10.0
_YEAR_MS = 365 * 86_400_000
# (phase, MEMP or AMP operation, connections: "many" means --connections)
PHASES = (("put", "many"), ("create", "many"), ("get", "many"), ("read", "many"),
          ("put", "one"), ("create", "one"), ("get", "one"), ("read", "one"),
          ("search_owner", "one"), ("search_text", "one"))
LABELS = {"put": "MEMP put", "create": "AMP create", "get": "MEMP get", "read": "AMP read",
          "search_owner": "AMP search, owner", "search_text": "AMP search, owner + text"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.amp", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=100_000, help="cells imported (100000)")
    parser.add_argument("--owners", type=int, default=1000,
                        help="owners the cells are spread over, evenly (1000)")
    parser.add_argument("--batch", type=int, default=500, help="cells per import request (500)")
    parser.add_argument("--import-connections", type=int, default=4,
                        help="import requests in flight at once (4)")
    parser.add_argument("--keys", type=int, default=10_000,
                        help="MEMP keys written before measuring get (10000)")
    parser.add_argument("--seconds", type=int, default=5, help="length of each phase (5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every phase this many times; medians are reported (3)")
    parser.add_argument("--connections", type=int, default=64,
                        help="connections for the throughput phases (64)")
    parser.add_argument("--lifecycle-timeout", type=float, default=900.0,
                        help="seconds to wait for the lifecycle pass to answer (900)")
    parser.add_argument("--no-lifecycle", action="store_true", help="skip the lifecycle pass")
    parser.add_argument("--only-lifecycle", action="store_true",
                        help="run only the lifecycle pass (its own import, then the pass)")
    parser.add_argument("--profile-lifecycle", metavar="PATH",
                        help="record the broker under py-spy during the lifecycle pass, as a "
                        "speedscope profile written to PATH (needs py-spy)")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


class Workload:
    """The requests of every phase, built once."""

    def __init__(self, args: argparse.Namespace, amp: Agent, memp: Agent) -> None:
        self.args = args
        self.amp = amp
        self.memp = memp
        self.rng = random.Random(7)
        self.corpus = amp_cells.Corpus(self.rng)
        self.ids: list[str] = []
        self.samples: dict[str, list[str]] = {}  # owner -> content words of one of its cells
        self.pools: dict[str, list[bytes]] = {}

    def owner(self, n: int) -> str:
        return f"owner-{n:04d}"

    def import_batches(self, admin_key: str) -> list[bytes]:
        args, now = self.args, int(time.time() * 1000)
        headers = {"X-AMP-Agent-ID": self.amp.agent_id}
        batches, cells = [], []
        for n in range(args.cells):
            owner = self.owner(n % args.owners)
            cell, content = amp_cells.cell(self.rng, self.corpus, owner, self.amp.agent_id, now)
            self.ids.append(cell["id"])
            self.samples.setdefault(owner, content)
            cells.append(cell)
            if len(cells) == args.batch or n == args.cells - 1:
                batches.append(build("POST", "/amp/import", admin_key, {"cells": cells},
                                     headers))
                cells = []
        return batches

    def build_pools(self) -> None:
        rng, amp, memp = self.rng, self.amp, self.memp
        headers = {"X-AMP-Agent-ID": amp.agent_id}
        bodies = [amp_cells.new_cell(rng, self.corpus, f"writer-{n % 100:03d}")
                  for n in range(2000)]
        keys = self.args.keys
        self.pools["put"] = [
            build("PUT", f"/v1/namespaces/{NAMESPACE}/memory/bench/key-{rng.randrange(keys):05d}",
                  memp.token, {"value": body}) for body in bodies]
        self.pools["create"] = [build("POST", "/amp/memories", amp.token, body, headers)
                                for body in bodies]
        self.pools["get"] = [build("GET", f"/v1/namespaces/{NAMESPACE}/memory/bench/key-{k:05d}",
                                   memp.token) for k in range(keys)]
        self.pools["read"] = [build("GET", f"/amp/memories/{cell_id}", amp.token, None, headers)
                              for cell_id in rng.sample(self.ids, min(len(self.ids), 20_000))]
        owners = sorted(self.samples)
        self.pools["search_owner"] = [
            build("POST", "/amp/memories/search", amp.token,
                  {"owner_id": o, "owner_type": "user"}, headers) for o in owners]
        self.pools["search_text"] = [
            build("POST", "/amp/memories/search", amp.token,
                  {"owner_id": o, "owner_type": "user",
                   "query": amp_cells.query(rng, self.samples[o])}, headers)
            for o in owners]

    def prefill(self) -> list[bytes]:
        """Every MEMP key once, with a value the size of a stored cell."""
        bodies = [amp_cells.cell(self.rng, self.corpus, "owner-x", self.amp.agent_id,
                                 int(time.time() * 1000))[0] for _ in range(100)]
        return [build("PUT", f"/v1/namespaces/{NAMESPACE}/memory/bench/key-{k:05d}",
                      self.memp.token, {"value": bodies[k % len(bodies)]})
                for k in range(self.args.keys)]


def _import(broker: Broker, batches: list[bytes], connections: int) -> dict[str, Any]:
    """Send the import batches, `connections` at a time; fail on any refused cell."""
    def send(batch: bytes) -> int:
        reply = replay.call(broker, batch, (200,), timeout=600)
        if reply["errors"]:
            raise RuntimeError(f"import refused cells: {reply['errors'][:3]}")
        imported: int = reply["imported"]
        return imported

    before = cpu_snapshot(broker.watch)
    started = time.perf_counter()
    done = 0
    with ThreadPoolExecutor(connections) as pool:
        for count in pool.map(send, batches):
            done += count
            if done % 10_000 < count:
                print(f"    {done} cells", flush=True)
    seconds = time.perf_counter() - started
    return {"cells": done, "seconds": round(seconds, 2),
            "cells_per_s": round(done / seconds, 1), **_cpu(broker, before, done)}


def _cpu(broker: Broker, before: dict[str, float | None], count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, used in cpu_since(broker.watch, before).items():
        out[f"{name}_cpu_s"] = round(used, 2)
        out[f"{name}_us_per_cell"] = round(used * 1e6 / max(count, 1), 1)
    return out


def _start(procs: Processes) -> tuple[Broker, subprocess.Popen[bytes], str]:
    """redis-server and one broker; the periodic lifecycle engine stays out of the way (the
    pass is timed alone). Returns the broker, the Redis process and its URL."""
    redis_url, redis_proc = start_redis(procs)
    return replay.start_broker(procs, redis_url, redis_proc.pid,
                               f"bench-admin-{secrets.token_hex(16)}",
                               MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS="86400"), redis_proc, redis_url


def _wait_posted(redis_url: str, timeout: float = 600.0) -> float:
    """Wait until the broker's term poster has posted every imported cell's search terms (it
    works in the background; measuring meanwhile would charge its work to other phases).
    Returns the seconds waited."""
    client = redis.Redis.from_url(redis_url)
    started = time.perf_counter()
    try:
        while client.scard(layout.amp_unposted("amp")):
            if time.perf_counter() - started > timeout:
                raise RuntimeError("the broker did not post the imported cells' search terms")
            time.sleep(0.05)
    finally:
        client.close()
    return round(time.perf_counter() - started, 2)


def _lifecycle(procs: Processes, args: argparse.Namespace) -> dict[str, Any]:
    """One pass over exactly --cells cells (a fresh Redis and broker, loaded as the first
    was), as of three years ahead: every active cell's score is then below 0.3."""
    broker, _, redis_url = _start(procs)
    amp = replay.register(broker, "amp", "bench-amp")
    work = Workload(args, amp, amp)  # only the import is sent
    print(f"  lifecycle: importing {args.cells:,} cells into a fresh store", flush=True)
    _import(broker, work.import_batches(broker.admin_key), args.import_connections)
    _wait_posted(redis_url)
    print("  lifecycle pass", flush=True)
    stats = redis.Redis.from_url(redis_url)
    stats.config_resetstat()
    profiler = _profile(procs, broker, args.profile_lifecycle)
    as_of = amp_cells.iso(int(time.time() * 1000) + 3 * _YEAR_MS)
    before = cpu_snapshot(broker.watch)
    started = time.perf_counter()
    reply = replay.call(broker, build("POST", "/amp/lifecycle/run", broker.admin_key,
                                      {"as_of": as_of}), (200,), timeout=args.lifecycle_timeout)
    seconds = time.perf_counter() - started
    used = _cpu(broker, before, sum(reply["transitions"].values()))
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        try:
            profiler.wait(60)
        except subprocess.TimeoutExpired:
            raise RuntimeError("py-spy did not write its profile within 60 s") from None
    commands = _commandstats(stats)
    stats.close()
    return {"as_of": as_of, "seconds": round(seconds, 2), "transitions": reply["transitions"],
            "met": seconds < LIFECYCLE_SECONDS, **used, "redis_commands": commands}


def _profile(procs: Processes, broker: Broker, path: str | None
             ) -> subprocess.Popen[bytes] | None:
    """py-spy recording the broker into `path` (speedscope format), when asked."""
    if path is None:
        return None
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        raise RuntimeError("--profile-lifecycle needs py-spy (pip install py-spy)")
    proc = procs.start("py-spy", [spy, "record", "--pid", str(broker.proc.pid), "--rate", "250",
                                  "--format", "speedscope", "--output", path])
    time.sleep(1.0)  # attached before the pass starts
    return proc


def _commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """Redis's per-command calls and µs since the reset, the busiest first (top 12)."""
    found = client.info("commandstats")
    rows = {name.removeprefix("cmdstat_"): {"calls": row["calls"], "usec": row["usec"]}
            for name, row in found.items()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["usec"])[:12])


def _measure(driver: Driver, broker: Broker, work: Workload, rounds: int, connections: int
             ) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {}
    for n in range(rounds):
        print(f"  round {n + 1}/{rounds}: {len(PHASES)} phases of {driver.seconds} s",
              flush=True)
        for phase, width in PHASES:
            name = f"{phase}@{connections}" if width == "many" else f"{phase}@1"
            samples.setdefault(name, []).append(
                driver.phase(broker, work.pools[phase], connections if width == "many" else 1))
    return {name: report.combine(rounds) for name, rounds in samples.items()}


def verdicts(results: dict[str, Any], connections: int) -> dict[str, Any]:
    """AMP against plain MEMP in the same run: throughput (by server CPU per request, steadier
    than req/s on a shared machine; req/s shown too) and latency at one connection."""
    out: dict[str, Any] = {}
    for amp, memp in (("create", "put"), ("read", "get")):
        many_a, many_m = results[f"{amp}@{connections}"], results[f"{memp}@{connections}"]
        one_a, one_m = results[f"{amp}@1"], results[f"{memp}@1"]
        cpu_a = many_a["cpu_us_per_request"].get("server")
        cpu_m = many_m["cpu_us_per_request"].get("server")
        cpu_factor = cpu_a / cpu_m if cpu_a and cpu_m else None
        rps_factor = many_m["rps"] / many_a["rps"] if many_a["rps"] else None
        latency_factor = one_a["p50_ms"] / one_m["p50_ms"] if one_m["p50_ms"] else None
        throughput = cpu_factor if cpu_factor is not None else rps_factor
        out[amp] = {"vs": memp, "cpu_factor": _round(cpu_factor), "rps_factor": _round(rps_factor),
                    "p50_at_1_factor": _round(latency_factor),
                    "met": throughput is not None and latency_factor is not None
                    and throughput <= WITHIN and latency_factor <= WITHIN}
    for phase in ("search_owner", "search_text"):
        p50 = results[f"{phase}@1"]["p50_ms"]
        out[phase] = {"p50_ms": p50, "met": p50 < SEARCH_P50_MS}
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def table(results: dict[str, Any], checks: dict[str, Any], loaded: dict[str, Any],
          lifecycle: dict[str, Any] | None, connections: int) -> str:
    head = (f"{'':<26} {'req/s':>7} {'p50ms':>7} {'p99ms':>8}   {'server µs/req':>13} "
            f"{'redis µs/req':>12} {'server busy':>11} {'errors':>6}")
    lines = [head, "-" * len(head)]
    for width in (connections, 1):
        for phase, label in LABELS.items():
            r = results.get(f"{phase}@{width}")
            if r is None:
                continue
            cpu = r["cpu_us_per_request"]
            lines.append(
                f"{label + f' @{width}':<26} {r['rps']:>7,.0f} {r['p50_ms']:>7.2f} "
                f"{r['p99_ms']:>8.2f}   {cpu.get('server', 0):>13.0f} {cpu.get('redis', 0):>12.0f} "
                f"{r['cpu_core_share'].get('server', 0):>11.0%} {r['errors']:>6}")
    lines += ["", f"import: {loaded['cells']:,} cells in {loaded['seconds']:.1f} s "
              f"({loaded['cells_per_s']:,.0f} cells/s; {_per_cell(loaded)}); search terms "
              f"all posted {loaded.get('terms_posted_after_s', 0):.1f} s later"]
    if lifecycle is not None:
        lines.append(lifecycle_line(lifecycle))
    for amp in ("create", "read"):
        c = checks[amp]
        lines.append(f"target, AMP {amp} within {WITHIN}x of MEMP {c['vs']}: server CPU/req "
                     f"{_x(c['cpu_factor'])} (req/s {_x(c['rps_factor'])}), p50 @1 "
                     f"{_x(c['p50_at_1_factor'])} {report.verdict(c['met'])}")
    for phase in ("search_owner", "search_text"):
        c = checks[phase]
        lines.append(f"target, {LABELS[phase]}: p50 {c['p50_ms']:.2f} ms (< {SEARCH_P50_MS:.0f} "
                     f"ms) {report.verdict(c['met'])}")
    for name, r in results.items():
        if r["errors"]:
            lines.append(f"ERRORS {name}: non-2xx {r['non2xx']}, socket {r['socket_errors']}")
    return "\n".join(lines)


def lifecycle_line(lifecycle: dict[str, Any]) -> str:
    return (f"lifecycle pass as of {lifecycle['as_of']}: {lifecycle['transitions']} in "
            f"{lifecycle['seconds']:.1f} s ({_per_cell(lifecycle)}); "
            f"< {LIFECYCLE_SECONDS:.0f} s {report.verdict(lifecycle['met'])}")


def _per_cell(figures: dict[str, Any]) -> str:
    return (f"server {figures.get('server_us_per_cell', 0):.0f} µs/cell, "
            f"redis {figures.get('redis_us_per_cell', 0):.0f} µs/cell")


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if min(args.cells, args.owners, args.batch, args.import_connections, args.keys,
           args.seconds, args.rounds, args.connections) < 1 or args.owners > args.cells:
        raise SystemExit("bench: every count must be >= 1, and --owners <= --cells")
    if args.only_lifecycle and args.no_lifecycle:
        raise SystemExit("bench: --only-lifecycle and --no-lifecycle exclude each other")
    loadgen, procs, driver = replay.start_run(args.load_generator, args.seconds)
    load_before = os.getloadavg()[0]
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"bench.amp: {args.cells:,} cells over {args.owners:,} owners, {args.connections} "
          f"connections, {args.rounds} rounds of {args.seconds} s per phase, load generator "
          f"{loadgen}, {os.cpu_count()} CPUs, load average {load_before:.2f}", flush=True)
    if args.only_lifecycle:
        return _only_lifecycle(procs, driver, args, load_before)
    lifecycle = None
    try:
        broker, redis_proc, redis_url = _start(procs)
        work = Workload(args, replay.register(broker, "amp", "bench-amp"),
                        replay.register(broker, NAMESPACE, "bench-memp"))
        batches = work.import_batches(broker.admin_key)
        print(f"  importing {args.cells:,} cells in {len(batches)} batches", flush=True)
        loaded = _import(broker, batches, args.import_connections)
        loaded["terms_posted_after_s"] = _wait_posted(redis_url)
        del batches
        print(f"  writing {args.keys} MEMP keys", flush=True)
        replay.fill(broker, work.prefill())
        work.build_pools()
        results = _measure(driver, broker, work, args.rounds, args.connections)
        if not args.no_lifecycle:
            procs.stop(broker.proc)
            procs.stop(redis_proc)
            lifecycle = _lifecycle(procs, args)
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failure_status(exc)
    finally:
        replay.end_run(procs, driver)

    checks = verdicts(results, args.connections)
    print()
    print(table(results, checks, loaded, lifecycle, args.connections))
    if args.json:
        report.write_json(args.json, {
            "config": {k: v for k, v in vars(args).items() if k != "json"}
            | {"load_generator": loadgen},
            "machine": report.machine(load_before, versions=replay.versions()),
            "started_at": started_at,
            "import": loaded,
            "results": results,
            "lifecycle": lifecycle,
            "targets": checks,
        })
    return 1 if any(r["errors"] for r in results.values()) else 0


def _only_lifecycle(procs: Processes, driver: Driver, args: argparse.Namespace,
                    load_before: float) -> int:
    """`--only-lifecycle`: the lifecycle pass alone, with Redis's busiest commands."""
    try:
        lifecycle = _lifecycle(procs, args)
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failure_status(exc)
    finally:
        replay.end_run(procs, driver)
    print()
    print(lifecycle_line(lifecycle))
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for name, row in lifecycle["redis_commands"].items():
        print(f"  redis {name:<12} {row['calls']:>9,} calls {row['usec'] / 1e6:>7.2f} s")
    if args.profile_lifecycle:
        print(f"profile: {args.profile_lifecycle} (open it in https://www.speedscope.app)")
    if args.json:
        report.write_json(args.json, {
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "machine": report.machine(load_before, versions=replay.versions()),
            "lifecycle": lifecycle})
    return 0 if lifecycle["met"] else 1

if __name__ == "__main__":
    sys.exit(main())
