"""Cluster benchmark: `python -m bench.cluster --help`.

Starts, on loopback, one redis-server and a Redis Cluster of 3 primaries with a replica each
(tests/support/topologies.py), and two `memp-broker serve` processes on each of three targets: the
one Redis, the cluster, and the cluster with `MEMP_WRITE_REPLICAS=1`. Each target is driven
with PUTs and GETs spread over --namespaces namespaces (which the cluster spreads over its
shards), half the connections to each of its two brokers, round after round with the order
of targets rotating; the figures are medians, side by side with the one Redis's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import client, cluster_report, replay, report
from bench.replay import REPLAY_SCRIPT, Broker, build, call
from bench.servers import (
    Processes,
    cpu_since,
    cpu_snapshot,
    failure_status,
    own_cpu,
    run_wrk,
    start_redis,
)
from broker.storage import layout
from tests.support.topologies import RedisCluster

HOST = "127.0.0.1"
TARGETS = {"redis": "one Redis", "cluster": "cluster",
           "cluster-wait1": "cluster, WRITE_REPLICAS=1"}
# (phase, method, connections: None means --connections, split over the brokers)
PHASES = (("put", "PUT", None), ("get", "GET", None), ("put_c1", "PUT", 1))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=64,
                        help="namespaces the keys are spread over (64)")
    parser.add_argument("--keys", type=int, default=4000,
                        help="distinct keys over all namespaces, all filled first (4000)")
    parser.add_argument("--brokers", type=int, default=2,
                        help="broker processes per target (2)")
    parser.add_argument("--seconds", type=int, default=5, help="length of each phase (5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every phase of every target this many times (3)")
    parser.add_argument("--connections", type=int, default=64,
                        help="connections for the throughput phases, over all brokers (64)")
    parser.add_argument("--value-bytes", type=int, default=256,
                        help="size of each stored JSON value (256)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


@dataclass
class Target:
    """One target's brokers, the token they are driven with and the processes whose CPU each
    phase is charged with (name -> pid; names start with broker, primary or replica)."""

    name: str
    brokers: list[Broker]
    watch: dict[str, int]
    token: str = ""
    pools: dict[str, list[bytes]] = field(default_factory=dict)


def namespace(n: int) -> str:
    return f"n-{n:03d}"


def _paths(args: argparse.Namespace) -> list[str]:
    return [f"/v1/namespaces/{namespace(k % args.namespaces)}/memory/bench/key-{k:05d}"
            for k in range(args.keys)]


def _agent_token(broker: Broker, namespaces: int) -> str:
    """An agent registered in the first namespace, and a key bound to it granting read and
    write on every benchmark namespace (`n-*`)."""
    agent = replay.register(broker, namespace(0), "bench")
    reply = call(broker, build("POST", "/v1/keys", broker.admin_key, {
        "name": "bench", "agent_id": agent.agent_id,
        "grants": [{"namespace": "n-*", "permissions": ["read", "write"]}]}), (201,))
    token: str = reply["api_key"]
    return token


def _start_target(procs: Processes, args: argparse.Namespace, name: str, redis_url: str,
                  data: dict[str, int], admin_key: str) -> Target:
    env = {"MEMP_WRITE_REPLICAS": "1"} if name == "cluster-wait1" else {}
    brokers = [replay.start_broker(procs, redis_url, None, admin_key, **env)
               for _ in range(args.brokers)]
    watch = {f"broker-{n}": b.proc.pid for n, b in enumerate(brokers)} | data
    target = Target(name, brokers, watch, _agent_token(brokers[0], args.namespaces))
    body = client.put_body(args.value_bytes)
    paths = _paths(args)
    target.pools = {"PUT": [build("PUT", p, target.token, body) for p in paths],
                    "GET": [build("GET", p, target.token) for p in paths]}
    print(f"  {TARGETS[name]}: writing {args.keys} keys over {args.namespaces} namespaces",
          flush=True)
    replay.fill(brokers[0], target.pools["PUT"])
    return target


# ---- measuring ----


def _drive(procs: Processes, loadgen: str, seconds: int, pool: Path, ports: list[int],
           requests: list[bytes], connections: list[int]) -> list[dict[str, Any]]:
    """Load each port with its share of connections at once; each load's raw figures."""
    if loadgen == "wrk":
        def one(port: int, conns: int) -> dict[str, Any]:
            return run_wrk(procs, REPLAY_SCRIPT, f"http://{HOST}:{port}", conns, seconds,
                           [str(pool)])
        with ThreadPoolExecutor(len(ports)) as pool_threads:
            return list(pool_threads.map(one, ports, connections))

    async def both() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(client.load(HOST, port, requests, conns, seconds)
                                           for port, conns in zip(ports, connections,
                                                                  strict=True))))
    result: list[dict[str, Any]] = client.run(both)
    return result


def merge(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of loads run side by side as one: requests and errors summed, the longest
    duration, and each latency percentile the worse of the loads'."""
    merged: dict[str, Any] = {
        "requests": sum(r["requests"] for r in raws),
        "duration_us": max(r["duration_us"] for r in raws),
        **{k: max(r[k] for r in raws) for k in ("p50_us", "p90_us", "p99_us", "max_us")},
        "socket_errors": {}, "non2xx": {}}
    for raw in raws:
        for group in ("socket_errors", "non2xx"):
            for key, count in raw[group].items():
                merged[group][key] = merged[group].get(key, 0) + count
    return merged


def _grouped(used: dict[str, float]) -> dict[str, float]:
    """CPU seconds per process, summed by role (brokers, primaries, replicas)."""
    groups: dict[str, float] = {}
    for name, seconds in used.items():
        role = {"broker": "brokers", "primary": "primaries", "replica": "replicas"}[
            name.split("-", 1)[0]]
        groups[role] = groups.get(role, 0.0) + seconds
    return groups


def _phase(procs: Processes, args: argparse.Namespace, loadgen: str, pool_dir: Path,
           target: Target, method: str, connections: int | None) -> dict[str, Any]:
    requests = target.pools[method]
    pool = pool_dir / "pool.bin"
    if loadgen == "wrk":
        pool.write_bytes(b"".join(b"%d\n" % len(r) + r for r in requests))
    brokers = target.brokers if connections is None else target.brokers[:1]
    total = args.connections if connections is None else connections
    shares = [total // len(brokers) + (n < total % len(brokers)) for n in range(len(brokers))]
    before = cpu_snapshot(target.watch)
    load_before = own_cpu()
    raws = _drive(procs, loadgen, args.seconds, pool, [b.port for b in brokers], requests,
                  shares)
    cpu = {"loadgen": own_cpu() - load_before} | _grouped(cpu_since(target.watch, before))
    for broker in target.brokers:
        if broker.proc.poll() is not None:
            raise RuntimeError(f"a broker of {TARGETS[target.name]} exited:\n"
                               f"{procs.log_tail(broker.proc)}")
    return report.phase_result(merge(raws), cpu)


def _at_rest(targets: list[Target], seconds: float) -> dict[str, dict[str, float]]:
    """The share of a core each target's roles use with no load (background loops, Redis's
    timers, the cluster bus): charged to every request of a slow phase, it is subtracted
    where the summary derives a shard's ceiling."""
    watch = {f"{t.name}/{name}": pid for t in targets for name, pid in t.watch.items()}
    before = cpu_snapshot(watch)
    time.sleep(seconds)
    used = cpu_since(watch, before)
    return {t.name: {role: round(cpu / seconds, 4) for role, cpu in _grouped(
        {name.split("/", 1)[1]: cpu for name, cpu in used.items()
         if name.startswith(f"{t.name}/")}).items()} for t in targets}


def _measure(procs: Processes, args: argparse.Namespace, loadgen: str,
             targets: list[Target]) -> dict[str, Any]:
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        t.name: {p[0]: [] for p in PHASES} for t in targets}
    with tempfile.TemporaryDirectory(prefix="memp-bench-pools-") as pool_dir:
        for n in range(args.rounds):
            order = targets[n % len(targets):] + targets[:n % len(targets)]
            for phase, method, connections in PHASES:
                print(f"  round {n + 1}/{args.rounds}: {phase}, {args.seconds} s each: "
                      + ", ".join(TARGETS[t.name] for t in order), flush=True)
                for target in order:
                    samples[target.name][phase].append(_phase(
                        procs, args, loadgen, Path(pool_dir), target, method, connections))
    return {name: {phase: report.combine(rounds) for phase, rounds in by_phase.items()}
            for name, by_phase in samples.items()}


# ---- the cluster ----


def _cluster_roles(cluster: RedisCluster) -> dict[str, int]:
    """The cluster's processes named by role, as each says of itself, and port
    (primary-7001, replica-7004)."""
    return {f"{'primary' if p.info('replication')['role'] == 'master' else 'replica'}-{p.port}":
            p.pid for p in cluster.processes if p.pid is not None}


def shards_of(cluster: RedisCluster, namespaces: int) -> dict[int, int]:
    """How many of the benchmark's namespaces each primary (by port) holds."""
    nodes = [n for n in cluster.nodes() if n.primary and n.slots]
    spread = {n.port: 0 for n in nodes}
    for k in range(namespaces):
        slot = cluster.slot_of(layout.changelog(namespace(k)))
        spread[next(n.port for n in nodes if n.owns(slot))] += 1
    return spread


# ---- main ----


def _check(args: argparse.Namespace, targets: list[str]) -> None:
    if not targets or set(targets) - set(TARGETS):
        raise SystemExit(f"bench: --targets is a subset of {','.join(TARGETS)}, "
                         f"not {args.targets!r}")
    if min(args.namespaces, args.keys, args.brokers, args.seconds, args.rounds) < 1 \
            or args.value_bytes < 11 or args.keys < args.namespaces \
            or args.connections < args.brokers or args.namespaces > 1000:
        raise SystemExit("bench: --namespaces (1-1000), --keys (at least --namespaces), "
                         "--brokers, --seconds and --rounds must be >= 1, --connections at "
                         "least --brokers, --value-bytes >= 11")


def _run(procs: Processes, args: argparse.Namespace, loadgen: str, names: list[str],
         started: Callable[[RedisCluster], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    admin_key = f"bench-admin-{secrets.token_hex(16)}"
    targets: list[Target] = []
    layout_info: dict[str, Any] = {}
    if "redis" in names:
        redis_url, redis_proc = start_redis(procs)
        targets.append(_start_target(procs, args, "redis", redis_url,
                                     {"primary-single": redis_proc.pid}, admin_key))
    if {"cluster", "cluster-wait1"} & set(names):
        print("  starting a Redis Cluster: 3 primaries, 3 replicas", flush=True)
        # A node timeout long enough that a starved node is not failed over mid-run.
        cluster = RedisCluster(primaries=3, replicas=1, node_timeout_ms=5000)
        started(cluster)
        cluster.start()
        roles = _cluster_roles(cluster)
        layout_info["namespaces_per_primary"] = shards_of(cluster, args.namespaces)
        for name in ("cluster", "cluster-wait1"):
            if name in names:
                targets.append(_start_target(procs, args, name, cluster.url, roles, admin_key))
    print(f"  at rest, {args.seconds} s", flush=True)
    layout_info["at_rest_cores"] = _at_rest(targets, args.seconds)
    return _measure(procs, args, loadgen, targets), layout_info


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [t for t in TARGETS if t in {t.strip() for t in args.targets.split(",")}]
    _check(args, [t.strip() for t in args.targets.split(",") if t.strip()])
    loadgen, procs, driver = replay.start_run(args.load_generator, args.seconds)
    clusters: list[RedisCluster] = []
    load_before = os.getloadavg()[0]
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"bench: {args.brokers} brokers per target, {args.connections} connections, "
          f"{args.rounds} rounds of {args.seconds} s, {args.keys} keys over {args.namespaces} "
          f"namespaces, load generator {loadgen}, {os.cpu_count()} CPUs, load average "
          f"{load_before:.2f}", flush=True)
    try:
        results, layout_info = _run(procs, args, loadgen, names, clusters.append)
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failure_status(exc)
    finally:
        replay.end_run(procs, driver)
        for cluster in clusters:
            cluster.stop()
    print()
    print(cluster_report.table(results, layout_info))
    if args.json:
        report.write_json(args.json, {
            "config": {k: getattr(args, k) for k in ("namespaces", "keys", "brokers", "seconds",
                                                     "rounds", "connections", "value_bytes")}
            | {"load_generator": loadgen},
            "machine": report.machine(load_before, versions=replay.versions()),
            "started_at": started_at, "layout": layout_info, "results": results,
            "summary": cluster_report.summary(results, layout_info)})
    errors = sum(p["errors"] for r in results.values() for p in r.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
