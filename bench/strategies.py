"""Cost of the conflict strategies and of JSON Schema validation on PUT:
`python -m bench.strategies --help`.

Starts redis-server and one broker on it, and gives each variant its own namespace and agent:
plain put (last-write-wins, broker timestamps, no schema), last-write-wins with client
timestamps, agent-priority (priorities configured), merge (each put changes 3 fields of a
stored object) and plain put with a 20-property schema registered. All write the same kind of
value (bench/profiles.py). The variants are measured back to back, round after round, and each
is reported as a share of plain put, in req/s and in server CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import profiles, replay, report
from bench.replay import Agent, Broker, Driver, build
from bench.servers import (
    failure_status,
    start_redis,
)

# The targets: what each variant may cost, as a share of plain put throughput.
MAX_COST = {"lww_ts": 0.15, "priority": 0.15, "schema": 0.15, "merge": 0.35}


@dataclass
class Variant:
    name: str
    label: str
    namespace: str
    agent: Agent | None = None
    bodies: list[tuple[int, bytes]] = field(default_factory=list)  # (key, value JSON)


VARIANTS = [
    Variant("plain", "plain put (lww)", "st-plain"),
    Variant("lww_ts", "lww, client timestamps", "st-lww-ts"),
    Variant("priority", "agent-priority", "st-priority"),
    Variant("merge", "merge, 3 fields/put", "st-merge"),
    Variant("schema", "put + schema (20 props)", "st-schema"),
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.strategies", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5, help="length of each phase (5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every variant this many times; medians are reported (3)")
    parser.add_argument("--connections", type=int, default=64,
                        help="concurrent keep-alive connections (64)")
    parser.add_argument("--keys", type=int, default=2000,
                        help="distinct keys per variant, all written before measuring (2000)")
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS),
                        help="comma-separated subset of " + ",".join(v.name for v in VARIANTS)
                        + " (plain is always measured)")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


def _path(variant: Variant, key: int) -> str:
    return f"/v1/namespaces/{variant.namespace}/memory/bench/key-{key:05d}"


def _configure(broker: Broker, variant: Variant, agent: Agent) -> None:
    """The namespace's configuration or schema, set with the admin key."""
    admin = broker.admin_key
    base = f"/v1/namespaces/{variant.namespace}"
    if variant.name == "priority":
        config = {"strategy": "agent-priority", "default_priority": 0, "priorities": [
            {"agent": agent.agent_id, "priority": 10}, {"agent": "gateway-*", "priority": 8},
            {"agent": "batch-*", "priority": 2}, {"agent": "crm-sync", "priority": 5}]}
        replay.call(broker, build("PUT", f"{base}/config", admin, config))
    elif variant.name == "merge":
        replay.call(broker, build("PUT", f"{base}/config", admin, {"strategy": "merge"}))
    elif variant.name == "schema":
        body = {"pattern": "bench/*", "schema": profiles.SCHEMA, "enforce": True}
        replay.call(broker, build("PUT", f"{base}/schemas/profile", admin, body))


def _prepare(broker: Broker, variant: Variant, keys: int, pool: int, seed: int) -> None:
    """Register the variant's agent, configure its namespace, write every key once with a full
    profile, and draw the values its measured PUTs send."""
    agent = replay.register(broker, variant.namespace, f"bench-{variant.name}")
    variant.agent = agent
    _configure(broker, variant, agent)
    rng = random.Random(seed)
    fill = [build("PUT", _path(variant, k), agent.token, {"value": profiles.profile(rng, k)})
            for k in range(keys)]
    print(f"  {variant.label}: writing {keys} keys", flush=True)
    replay.fill(broker, fill)
    for _ in range(pool):
        key = rng.randrange(keys)
        value = profiles.partial(rng) if variant.name == "merge" else profiles.profile(rng, key)
        variant.bodies.append((key, json.dumps(value, separators=(",", ":")).encode()))


def _requests(variant: Variant) -> list[bytes]:
    """The phase's PUTs. Client timestamps are the phase's start: later than every stored
    write, and equal among themselves, so each one is applied (ties go to the same agent)."""
    if variant.agent is None:
        raise RuntimeError(f"{variant.label}: no agent registered")
    stamp = b',"timestamp":%d' % int(time.time() * 1000) if variant.name == "lww_ts" else b""
    return [build("PUT", _path(variant, key), variant.agent.token,
                  b'{"value":' + value + stamp + b"}") for key, value in variant.bodies]


def _measure(driver: Driver, broker: Broker, variants: list[Variant], rounds: int,
             connections: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for n in range(rounds):
        order = variants[n % len(variants):] + variants[:n % len(variants)]
        print(f"  round {n + 1}/{rounds}, {driver.seconds} s each: "
              + ", ".join(v.label for v in order), flush=True)
        for variant in order:
            samples[variant.name].append(driver.phase(broker, _requests(variant), connections))
    return {name: report.combine(rounds) for name, rounds in samples.items()}


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """Each variant against plain put: req/s and server-CPU ratios, and its target (judged on
    CPU per request, which a busy machine disturbs far less than req/s)."""
    plain = results["plain"]
    plain_cpu = plain["cpu_us_per_request"].get("server")
    out: dict[str, Any] = {}
    for name, r in results.items():
        entry: dict[str, Any] = {
            "rps_ratio": round(r["rps"] / plain["rps"], 3) if plain["rps"] else None}
        cpu = r["cpu_us_per_request"].get("server")
        entry["cpu_ratio"] = round(plain_cpu / cpu, 3) if plain_cpu and cpu else None
        if name in MAX_COST:
            entry["max_cost"] = MAX_COST[name]
            ratio = entry["cpu_ratio"] if entry["cpu_ratio"] is not None else entry["rps_ratio"]
            entry["cost"] = round(1 - ratio, 3) if ratio is not None else None
            entry["met"] = entry["cost"] is not None and entry["cost"] < MAX_COST[name]
        out[name] = entry
    return out


def table(results: dict[str, Any], checks: dict[str, Any], labels: dict[str, str]) -> str:
    head = (f"{'':<24} {'put/s':>7} {'%plain':>6} {'p50ms':>7} {'p99ms':>7}   "
            f"{'server µs/req':>13} {'%plain cpu':>10} {'redis µs/req':>12} {'server busy':>11} "
            f"{'errors':>6}")
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        check = checks[name]
        cpu = r["cpu_us_per_request"]
        lines.append(
            f"{labels[name]:<24} {r['rps']:>7,.0f} {_pct(check['rps_ratio']):>6} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}   {cpu.get('server', 0):>13.0f} "
            f"{_pct(check['cpu_ratio']):>10} {cpu.get('redis', 0):>12.0f} "
            f"{r['cpu_core_share'].get('server', 0):>11.0%} {r['errors']:>6}")
    lines.append("")
    for name, check in checks.items():
        if "max_cost" in check and check["cost"] is not None:
            lines.append(f"target, {labels[name]}: costs {check['cost']:.0%} of plain put by "
                         f"server CPU ({1 - (check['rps_ratio'] or 0):.0%} by req/s); "
                         f"< {check['max_cost']:.0%} {'met' if check['met'] else 'MISSED'}")
    for name, r in results.items():
        if r["errors"]:
            lines.append(f"ERRORS {labels[name]}: non-2xx {r['non2xx']}, "
                         f"socket {r['socket_errors']}")
    return "\n".join(lines)


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = {n.strip() for n in args.variants.split(",") if n.strip()} | {"plain"}
    variants = [v for v in VARIANTS if v.name in chosen]
    if chosen - {v.name for v in VARIANTS}:
        raise SystemExit(f"bench: unknown variants {sorted(chosen - {v.name for v in VARIANTS})}")
    if min(args.seconds, args.rounds, args.connections, args.keys) < 1:
        raise SystemExit("bench: --seconds, --rounds, --connections and --keys must be >= 1")
    loadgen, procs, driver = replay.start_run(args.load_generator, args.seconds)
    load_before = os.getloadavg()[0]
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"bench.strategies: {args.connections} connections, {args.rounds} rounds of "
          f"{args.seconds} s per variant, {args.keys} keys each, load generator {loadgen}, "
          f"{os.cpu_count()} CPUs, load average {load_before:.2f}", flush=True)
    try:
        redis_url, redis_proc = start_redis(procs)
        broker = replay.start_broker(procs, redis_url, redis_proc.pid,
                                     f"bench-admin-{secrets.token_hex(16)}")
        for seed, variant in enumerate(variants):
            _prepare(broker, variant, args.keys, max(args.keys, 4000), seed)
        results = _measure(driver, broker, variants, args.rounds, args.connections)
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failure_status(exc)
    finally:
        replay.end_run(procs, driver)

    checks = verdicts(results)
    labels = {v.name: v.label for v in variants}
    print()
    print(table(results, checks, labels))
    if args.json:
        document = {
            "config": {"seconds": args.seconds, "rounds": args.rounds,
                       "connections": args.connections, "keys": args.keys,
                       "load_generator": loadgen, "variants": [v.name for v in variants],
                       "schema": profiles.SCHEMA},
            "machine": report.machine(load_before, versions=replay.versions()),
            "started_at": started_at,
            "results": results,
            "vs_plain": checks,
        }
        report.write_json(args.json, document)
    return 1 if any(r["errors"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
