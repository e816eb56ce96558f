"""Noisy-neighbour benchmark of fair share: `python -m bench.noisy --help`.

Starts redis-server and one broker on it. Tenant B (its own namespace and agent) writes
--b-writes puts/s and --b-reads gets/s, paced, while tenant A floods writes to its namespace
with wrk at --a-connections connections, as fast as wrk can send them. Three phases of
--seconds each: B alone (quiet), B beside A's flood with no limit, and B beside A's flood with
A's namespace limited to --a-limit writes/s. Prints B's p50 and p99 latency and B's 429s per
phase, and A's admitted and refused writes; the target is B's p99 with A limited within 2x its
quiet p99, and no 429 for B.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench import client, replay, report
from bench.servers import (
    Processes,
    end_run,
    failure_status,
    need_redis_server,
    run_wrk,
    start_redis,
    start_run,
)

HOST = "127.0.0.1"
WRK_SCRIPT = Path(__file__).with_name("wrk.lua")
P99_FACTOR_TARGET = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.noisy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="length of each phase (10)")
    parser.add_argument("--a-connections", type=int, default=64,
                        help="wrk connections flooding tenant A (64)")
    parser.add_argument("--a-limit", type=float, default=100.0,
                        help="tenant A's writes_per_second in the limited phase (100)")
    parser.add_argument("--b-writes", type=float, default=20.0, help="tenant B's puts/s (20)")
    parser.add_argument("--b-reads", type=float, default=50.0, help="tenant B's gets/s (50)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


async def _tenant_b(url: str, token: str, namespace: str, writes: float, reads: float,
                    seconds: float) -> dict[str, Any]:
    """B's paced load, each request on a schedule of its own (a late answer never delays the
    next send): latencies in ms and the statuses seen."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30,
                                 limits=limits) as http:
        path = f"/v1/namespaces/{namespace}/memory/b/key"
        assert (await http.put(path, json={"value": 0})).status_code in (200, 201)

        async def one(method: str, n: int) -> None:
            started = time.perf_counter()
            if method == "PUT":
                response = await http.put(path, json={"value": {"n": n, "text": "x" * 200}})
            else:
                response = await http.get(path)
            latencies.append((time.perf_counter() - started) * 1000)
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1

        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        schedule = sorted([(i / writes, "PUT") for i in range(int(seconds * writes))]
                          + [(i / reads, "GET") for i in range(int(seconds * reads))])
        for n, (at, method) in enumerate(schedule):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(method, n)))
        await asyncio.gather(*tasks)
    latencies.sort()
    return {"requests": len(latencies), "statuses": statuses,
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
            "max_ms": round(latencies[-1], 2)}


def _phase(procs: Processes, url: str, a: dict[str, str], b: dict[str, str], flood: bool,
           args: argparse.Namespace) -> dict[str, Any]:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        flooding = pool.submit(run_wrk, procs, WRK_SCRIPT, url, args.a_connections,
                               args.seconds, ["PUT", a["namespace"], "1000", "256", a["token"]]
                               ) if flood else None
        if flooding is not None:
            time.sleep(0.5)  # let the flood get going before B starts measuring
        seconds = args.seconds - 1 if flood else args.seconds
        b_result = asyncio.run(_tenant_b(url, b["token"], b["namespace"], args.b_writes,
                                         args.b_reads, seconds))
        a_result = flooding.result() if flooding is not None else None
    result: dict[str, Any] = {"b": b_result}
    if a_result is not None:
        refused = sum(a_result["non2xx"].values())
        seconds_run = a_result["duration_us"] / 1e6
        result["a"] = {"requests_per_s": round(a_result["requests"] / seconds_run, 1),
                       "admitted_per_s": round((a_result["requests"] - refused) / seconds_run, 1),
                       "non2xx": a_result["non2xx"]}
    return result


def _set_limit(url: str, admin_key: str, namespace: str, limit: float | None) -> None:
    limits = {} if limit is None else {"writes_per_second": limit}
    response = httpx.put(f"{url}/v1/namespaces/{namespace}/config", json={"limits": limits},
                         headers={"Authorization": f"Bearer {admin_key}"})
    response.raise_for_status()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    need_redis_server()
    procs = start_run()
    admin_key = f"bench-admin-{secrets.token_hex(16)}"
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {}
    try:
        redis_url, _ = start_redis(procs)
        broker = replay.start_broker(procs, redis_url, None, admin_key)
        url = f"http://{HOST}:{broker.port}"
        tenants = {}
        for name in ("tenant-a", "tenant-b"):
            credentials = client.register_agent(HOST, broker.port, admin_key, name)
            tenants[name] = {"namespace": name, "token": credentials["api_key"]}
        a, b = tenants["tenant-a"], tenants["tenant-b"]
        for phase, flood, limit in (("quiet", False, None), ("flood", True, None),
                                    ("flood, A limited", True, args.a_limit)):
            _set_limit(url, admin_key, a["namespace"], limit)
            print(f"  {phase}: {args.seconds} s", flush=True)
            results[phase] = _phase(procs, url, a, b, flood, args)
    except (KeyboardInterrupt, RuntimeError, httpx.HTTPError) as exc:
        return failure_status(exc)
    finally:
        end_run(procs)
    quiet = results["quiet"]["b"]["p99_ms"]
    print(f"\nB: {args.b_writes:g} puts/s and {args.b_reads:g} gets/s; A floods puts at "
          f"{args.a_connections} connections; A's limit {args.a_limit:g} writes/s\n")
    print(f"{'phase':<18} {'B p50 ms':>9} {'B p99 ms':>9} {'x quiet':>8} {'B 429s':>7} "
          f"{'A sent/s':>9} {'A admitted/s':>13}")
    for phase, r in results.items():
        a_part = r.get("a", {})
        print(f"{phase:<18} {r['b']['p50_ms']:>9.2f} {r['b']['p99_ms']:>9.2f} "
              f"{r['b']['p99_ms'] / quiet:>8.1f} {r['b']['statuses'].get('429', 0):>7} "
              f"{a_part.get('requests_per_s', 0):>9,.0f} {a_part.get('admitted_per_s', 0):>13,.0f}")
    limited = results["flood, A limited"]["b"]
    met = limited["p99_ms"] <= P99_FACTOR_TARGET * quiet and not limited["statuses"].get("429")
    print(f"\ntarget: B's p99 with A limited within {P99_FACTOR_TARGET:g}x quiet and no 429 "
          f"for B: {report.verdict(met)}")
    if args.json:
        report.write_json(args.json, {
            "config": vars(args), "machine": report.machine(load_before),
            "results": results, "met": met})
    return 0


if __name__ == "__main__":
    sys.exit(main())
