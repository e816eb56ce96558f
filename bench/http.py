"""HTTP benchmark of the MEMP broker against its floor: `python -m bench.http --help`.

Starts redis-server (unless --redis-url) and up to four uvicorn processes: the floor
(bench/floor.py), the broker on that Redis, the broker on that Redis with fair-share limits in
force (target `limited`: namespace rates, quotas and per-agent rates all set far above the load,
so every request pays for the checks and none is refused) and the broker on its embedded store.
It fills --keys keys in each, then drives PUTs and GETs over HTTP from wrk (or
bench/client.py) one target at a time, phase by phase, for --rounds rounds, and prints the
median figures side by side with the ratio to the floor. Measuring the targets back to back,
round after round, keeps a busy machine's noise from landing on one target only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import client, report
from bench.replay import measure_phase
from bench.report import FLOOR_SERVERS, TARGETS
from bench.servers import (
    Processes,
    choose_loadgen,
    clean_env,
    failure_status,
    free_port,
    need_redis_server,
    run_wrk,
    signals_held,
    start_redis,
    start_run,
    wait_started,
)

HOST = "127.0.0.1"
WRK_SCRIPT = Path(__file__).with_name("wrk.lua")


@dataclass
class Config:
    seconds: int
    rounds: int
    connections: int
    value_bytes: int
    keys: int
    namespace: str
    loadgen: str
    workers: int = 2
    redis_url: str = ""
    own_redis: bool = True
    admin_key: str = field(default_factory=lambda: f"bench-admin-{secrets.token_hex(16)}")


@dataclass
class Server:
    """One running target: its process, port, and the token its requests carry."""

    target: str
    proc: subprocess.Popen[bytes]
    port: int
    watch: dict[str, int]
    namespace: str = ""
    token: str = ""
    key_id: str = ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5,
                        help="length of each measured phase, in whole seconds (default 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every phase of every target this many times and report "
                             "the medians (default 3)")
    parser.add_argument("--connections", type=int, default=64,
                        help="concurrent keep-alive connections (default 64)")
    parser.add_argument("--value-bytes", type=int, default=256,
                        help="size of each stored JSON value (default 256, minimum 11)")
    parser.add_argument("--keys", type=int, default=10_000,
                        help="distinct keys in the namespace, all filled before measuring "
                             "(default 10000)")
    parser.add_argument("--redis-url",
                        help="use this Redis instead of starting redis-server; the run uses a "
                             "fresh namespace and deletes its keys afterwards")
    parser.add_argument("--targets", default="floor,blind,redis,noaudit,embedded",
                        help="comma-separated subset of floor,blind,blindx,redis,noaudit,"
                             "workers,limited,embedded (default floor,blind,redis,noaudit,"
                             "embedded); blindx is the JSON-blind floor with --workers "
                             "processes, noaudit the broker on Redis without its audit log, "
                             "workers the broker on Redis with --workers processes, limited "
                             "the broker "
                             "on Redis with every fair-share limit set far above the load")
    parser.add_argument("--workers", type=int, default=2,
                        help="processes of the workers and blindx targets (default 2)")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto",
                        help="wrk (default when installed) or bench/client.py's asyncio client")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


# ---- load generation ----


# Fair share for the `limited` target: every limit set, none reachable by the load.
LIMITS = {"writes_per_second": 1_000_000, "write_burst": 1_000_000,
          "reads_per_second": 1_000_000, "read_burst": 1_000_000,
          "max_keys": 1_000_000_000, "max_bytes": 10**12, "max_streams": 1_000}
AGENT_RATES = {"MEMP_AGENT_WRITES_PER_SECOND": "1000000", "MEMP_AGENT_READS_PER_SECOND": "1000000"}


def _path(namespace: str, i: int) -> str:
    return f"/v1/namespaces/{namespace}/memory/bench/key-{i:05d}"


def _requests(cfg: Config, server: Server, method: str) -> list[bytes]:
    body = client.put_body(cfg.value_bytes) if method == "PUT" else None
    return [client.build_request(method, _path(server.namespace, i), server.token, body)
            for i in range(cfg.keys)]


def _wrk(procs: Processes, cfg: Config, server: Server, method: str, connections: int
         ) -> dict[str, Any]:
    return run_wrk(procs, WRK_SCRIPT, f"http://{HOST}:{server.port}", connections, cfg.seconds,
                   [method, server.namespace, str(cfg.keys), str(cfg.value_bytes), server.token])


def _drive(procs: Processes, cfg: Config, server: Server, method: str, connections: int
           ) -> dict[str, Any]:
    """One measured phase, with the CPU used meanwhile by the server, Redis and the load."""
    requests = _requests(cfg, server, method) if cfg.loadgen == "python" else []

    def drive() -> dict[str, Any]:
        if cfg.loadgen == "wrk":
            return _wrk(procs, cfg, server, method, connections)
        raw: dict[str, Any] = client.run(lambda: client.load(HOST, server.port, requests,
                                                             connections, cfg.seconds))
        return raw

    return measure_phase(procs, server.proc, TARGETS[server.target], server.watch, drive)


# ---- targets ----


def _start(procs: Processes, cfg: Config, target: str, redis_pid: int | None) -> Server:
    port = free_port()
    if target in FLOOR_SERVERS:
        factory = "create_app" if target == "floor" else "create_blind_app"
        argv = [sys.executable, "-m", "uvicorn", "--factory", f"bench.floor:{factory}",
                "--host", HOST, "--port", str(port), "--loop", "uvloop", "--http", "httptools",
                "--no-access-log", "--log-level", "warning"]
        if target == "blindx":
            argv += ["--workers", str(cfg.workers)]
        env = clean_env(BENCH_REDIS_URL=cfg.redis_url)
    else:
        module = "bench.noaudit" if target == "noaudit" else "broker.cli"
        argv = [sys.executable, "-m", module, "serve", "--host", HOST, "--port", str(port),
                "--log-level", "warning"]
        if target == "workers":
            argv += ["--workers", str(cfg.workers)]
        env = clean_env(MEMP_ADMIN_KEY=cfg.admin_key)
        if target != "embedded":
            env["MEMP_REDIS_URL"] = cfg.redis_url
        if target == "limited":
            env.update(AGENT_RATES)
    proc = procs.start(target, argv, env)
    wait_started(procs, proc, port, TARGETS[target])
    watch = {"server": proc.pid}
    if redis_pid is not None and target != "embedded":
        watch["redis"] = redis_pid
    server = Server(target, proc, port, watch, _namespace(cfg, target))
    if target not in FLOOR_SERVERS:
        credentials = client.register_agent(HOST, port, cfg.admin_key, server.namespace)
        server.token, server.key_id = credentials["api_key"], credentials["key_id"]
    if target == "limited":
        body = json.dumps({"limits": LIMITS}).encode()
        path = f"/v1/namespaces/{server.namespace}/config"
        status, reply = client.run(lambda: client.request_once(
            HOST, port, client.build_request("PUT", path, cfg.admin_key, body)))
        if status != 200:
            raise RuntimeError(f"setting the limits failed: {status} {reply[:300]!r}")
    return server


def _namespace(cfg: Config, target: str) -> str:
    """The limited target has a namespace of its own: limits are per namespace."""
    return f"{cfg.namespace}-limited" if target == "limited" else cfg.namespace


def _fill(cfg: Config, server: Server) -> None:
    print(f"  {TARGETS[server.target]}: writing {cfg.keys} keys", flush=True)
    puts = _requests(cfg, server, "PUT")
    client.run(lambda: client.fill(HOST, server.port, puts, min(cfg.connections, 32)))


def _revoke(cfg: Config, server: Server) -> None:
    request = client.build_request("DELETE", f"/v1/keys/{server.key_id}", cfg.admin_key)
    try:
        status, _ = client.run(lambda: client.request_once(HOST, server.port, request))
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        print(f"bench: could not revoke API key {server.key_id}: {exc}", file=sys.stderr)
        return
    if status != 204:
        print(f"bench: could not revoke API key {server.key_id}: {status}", file=sys.stderr)


def _forget(cfg: Config) -> None:
    """On a shared Redis, delete the run's namespace (once the brokers have stopped, as their
    sweepers would note the namespace again)."""
    import redis

    try:
        with redis.Redis.from_url(cfg.redis_url) as conn:
            limited = _namespace(cfg, "limited")
            for prefix in (f"memp:{{{cfg.namespace}}}:", f"floor:{{{cfg.namespace}}}:",
                           f"memp:{{{limited}}}:"):
                batch = list(conn.scan_iter(match=prefix + "*", count=1000))
                for i in range(0, len(batch), 1000):
                    conn.unlink(*batch[i:i + 1000])
            conn.srem("memp:namespaces", cfg.namespace, limited)
    except redis.RedisError as exc:
        print(f"bench: could not clean up Redis: {exc}", file=sys.stderr)


def _measure(procs: Processes, cfg: Config, servers: list[Server]) -> dict[str, Any]:
    """Every phase of every target, round after round, rotating the order of targets."""
    phases = (("put", "PUT", cfg.connections), ("get", "GET", cfg.connections),
              ("put_c1", "PUT", 1))
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        s.target: {p[0]: [] for p in phases} for s in servers}
    for n in range(cfg.rounds):
        order = servers[n % len(servers):] + servers[:n % len(servers)]
        for phase, method, connections in phases:
            print(f"  round {n + 1}/{cfg.rounds}: {phase} at {connections} connection(s), "
                  f"{cfg.seconds} s each: " + ", ".join(TARGETS[s.target] for s in order),
                  flush=True)
            for server in order:
                samples[server.target][phase].append(
                    _drive(procs, cfg, server, method, connections))
    return {target: {phase: report.combine(rounds) for phase, rounds in by_phase.items()}
            for target, by_phase in samples.items()}


# ---- main ----


def _config(args: argparse.Namespace, targets: list[str]) -> Config:
    if args.value_bytes < 11 or min(args.connections, args.keys, args.seconds, args.rounds,
                                    args.workers) < 1:
        raise SystemExit("bench: --value-bytes must be >= 11; --connections, --keys, --seconds, "
                         "--rounds and --workers >= 1")
    own_redis = not args.redis_url and bool(
        {"floor", "blind", "blindx", "redis", "noaudit", "workers", "limited"} & set(targets))
    if own_redis:
        need_redis_server(", or pass --redis-url")
    return Config(seconds=args.seconds, rounds=args.rounds, connections=args.connections,
                  value_bytes=args.value_bytes, keys=args.keys,
                  namespace="bench" if not args.redis_url else f"bench-{secrets.token_hex(4)}",
                  loadgen=choose_loadgen(args.load_generator), workers=args.workers,
                  redis_url=args.redis_url or "",
                  own_redis=own_redis)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or set(targets) - set(TARGETS):
        raise SystemExit(f"bench: --targets is a subset of {','.join(TARGETS)}, "
                         f"not {args.targets!r}")
    targets = [t for t in TARGETS if t in targets]
    cfg = _config(args, targets)

    procs = start_run()
    servers: list[Server] = []
    load_before = os.getloadavg()[0]
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"bench: {cfg.connections} connections, {cfg.rounds} rounds of {cfg.seconds} s per "
          f"phase, {cfg.value_bytes}-byte values over {cfg.keys} keys, load generator "
          f"{cfg.loadgen}, {os.cpu_count()} CPUs, load average {load_before:.2f}"
          + (f"; xN: {cfg.workers} workers" if {"workers", "blindx"} & set(targets) else ""),
          flush=True)
    try:
        redis_pid = None
        if cfg.own_redis:
            cfg.redis_url, redis_proc = start_redis(procs)
            redis_pid = redis_proc.pid
        for target in targets:
            servers.append(_start(procs, cfg, target, redis_pid))
            _fill(cfg, servers[-1])
        results = _measure(procs, cfg, servers)
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failure_status(exc)
    finally:
        with signals_held():
            shared_redis = bool(servers) and not cfg.own_redis
            try:
                for server in servers:
                    if shared_redis and server.key_id and server.proc.poll() is None:
                        _revoke(cfg, server)
            finally:
                procs.stop_all()
                if shared_redis:
                    _forget(cfg)

    vs_floor = report.ratios(results)
    print()
    print(report.table(results, vs_floor))
    if args.json:
        document = {
            "config": {"seconds": cfg.seconds, "rounds": cfg.rounds,
                       "connections": cfg.connections, "value_bytes": cfg.value_bytes,
                       "keys": cfg.keys, "load_generator": cfg.loadgen,
                       "workers": cfg.workers if {"workers", "blindx"} & set(targets) else None,
                       "redis": "own redis-server" if cfg.own_redis else "--redis-url"},
            "machine": report.machine(load_before,
                                      versions=report.versions("fakeredis", "lupa")),
            "started_at": started_at,
            "results": results,
            "vs_floor": vs_floor,
        }
        report.write_json(args.json, document)
    errors = sum(p["errors"] for r in results.values() for p in r.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
