"""HTTP benchmark of the MEMP broker against its floor: `python -m bench.http --help`.

Starts redis-server (unless --redis-url), then, one at a time, the floor (bench/floor.py), the
broker on that Redis and the broker on its embedded store, each a separate uvicorn process; fills
--keys keys, then drives PUTs and GETs over HTTP from wrk (or the Python client) and prints
throughput and latency side by side with the ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

from bench import client
from bench.servers import Processes, cpu_seconds, free_port, start_redis, wait_for_port

HOST = "127.0.0.1"
WRK_SCRIPT = Path(__file__).with_name("wrk.lua")
TARGETS = {"floor": "floor", "redis": "broker (Redis)", "embedded": "broker (embedded)"}
# The targets for one broker process on real Redis (reported for embedded too).
PUT_RATIO_TARGET = 0.50
GET_RATIO_TARGET = 0.60
C1_PUT_P50_TARGET_MS = 2.0


@dataclass
class Config:
    seconds: int
    connections: int
    value_bytes: int
    keys: int
    namespace: str
    loadgen: str
    redis_url: str = ""
    own_redis: bool = True
    admin_key: str = field(default_factory=lambda: f"bench-admin-{secrets.token_hex(16)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10,
                        help="length of each measured phase (default 10)")
    parser.add_argument("--connections", type=int, default=64,
                        help="concurrent keep-alive connections (default 64)")
    parser.add_argument("--value-bytes", type=int, default=256,
                        help="size of each stored JSON value (default 256, minimum 11)")
    parser.add_argument("--keys", type=int, default=10_000,
                        help="distinct keys in the namespace, all filled before the phases "
                             "(default 10000)")
    parser.add_argument("--redis-url",
                        help="use this Redis instead of starting redis-server; the run uses a "
                             "fresh namespace and deletes its keys afterwards")
    parser.add_argument("--targets", default="floor,redis,embedded",
                        help="comma-separated subset of floor,redis,embedded")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto",
                        help="wrk (default when installed) or bench/client.py's asyncio client")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    return parser


# ---- load generation ----


def _wrk(procs: Processes, cfg: Config, port: int, method: str, token: str,
         connections: int) -> dict[str, Any]:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{cfg.seconds}s", "--timeout", "10s",
            "-s", str(WRK_SCRIPT), f"http://{HOST}:{port}", "--",
            method, cfg.namespace, str(cfg.keys), str(cfg.value_bytes), token]
    proc = procs.start("wrk", argv, capture=True)
    try:
        out, _ = proc.communicate(timeout=cfg.seconds + 60)
    finally:
        procs.stop(proc)
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise RuntimeError(f"wrk printed no result (status {proc.returncode}):\n{out.decode()}")


def _requests(cfg: Config, method: str, token: str) -> list[bytes]:
    body = client.put_body(cfg.value_bytes) if method == "PUT" else None
    return [client.build_request(method, _path(cfg, i), token, body) for i in range(cfg.keys)]


def _path(cfg: Config, i: int) -> str:
    return f"/v1/namespaces/{cfg.namespace}/memory/bench/key-{i:05d}"


def _drive(procs: Processes, cfg: Config, port: int, method: str, token: str,
           connections: int, watch: dict[str, int]) -> dict[str, Any]:
    """One measured phase; `watch` names the processes whose CPU use is reported with it."""
    requests = _requests(cfg, method, token) if cfg.loadgen == "python" else []
    cpu_before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    load_before = _own_cpu()
    if cfg.loadgen == "wrk":
        raw = _wrk(procs, cfg, port, method, token, connections)
    else:
        raw = client.run(lambda: client.load(HOST, port, requests, connections, cfg.seconds))
    cpu = {"loadgen": _own_cpu() - load_before}
    for name, pid in watch.items():
        before, after = cpu_before[name], cpu_seconds(pid)
        if before is not None and after is not None:
            cpu[name] = after - before
    return _phase(raw, cpu)


def _own_cpu() -> float:
    """CPU seconds of this process and its waited-for children (wrk)."""
    me, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _phase(raw: dict[str, Any], cpu: dict[str, float]) -> dict[str, Any]:
    """Throughput counts 2xx responses only; everything else is reported as an error. CPU is
    given as the share of one core each process used, and as microseconds per request."""
    non2xx = sum(raw["non2xx"].values())
    socket_errors = sum(raw["socket_errors"].values())
    seconds = raw["duration_us"] / 1e6
    requests = max(raw["requests"], 1)
    return {
        "rps": round((raw["requests"] - non2xx) / seconds, 1) if seconds else 0.0,
        "p50_ms": raw["p50_us"] / 1000, "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000, "max_ms": raw["max_us"] / 1000,
        "requests": raw["requests"], "seconds": round(seconds, 3),
        "errors": non2xx + socket_errors,
        "non2xx": raw["non2xx"], "socket_errors": raw["socket_errors"],
        "cpu_core_share": {k: round(v / seconds, 3) for k, v in cpu.items()} if seconds else {},
        "cpu_us_per_request": {k: round(v * 1e6 / requests, 1) for k, v in cpu.items()},
    }


# ---- targets ----


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMP_", "BENCH_"))}
    env.update(extra)
    return env


def _start_target(procs: Processes, cfg: Config, target: str, port: int
                  ) -> subprocess.Popen[bytes]:
    python = sys.executable
    if target == "floor":
        argv = [python, "-m", "uvicorn", "--factory", "bench.floor:create_app",
                "--host", HOST, "--port", str(port), "--loop", "uvloop", "--http", "httptools",
                "--no-access-log", "--log-level", "warning"]
        env = _clean_env(BENCH_REDIS_URL=cfg.redis_url)
    else:
        argv = [python, "-m", "broker.cli", "serve", "--host", HOST, "--port", str(port),
                "--log-level", "warning"]
        env = _clean_env(MEMP_ADMIN_KEY=cfg.admin_key)
        if target == "redis":
            env["MEMP_REDIS_URL"] = cfg.redis_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                     env.get("PYTHONPATH")]))
    proc = procs.start(target, argv, env)
    try:
        wait_for_port(proc, port)
    except RuntimeError as exc:
        raise RuntimeError(f"{TARGETS[target]} {exc}:\n{procs.log_tail(proc)}") from None
    return proc


def _token(cfg: Config, target: str, port: int) -> tuple[str, str]:
    """The floor needs none; the broker is driven by a registered agent's API key.
    Returns the token and the key's id."""
    if target == "floor":
        return "", ""
    body = json.dumps({"name": "bench", "namespace": cfg.namespace}).encode()
    status, reply = client.run(lambda: client.request_once(
        HOST, port, client.build_request("POST", "/v1/agents", cfg.admin_key, body)))
    if status != 201:
        raise RuntimeError(f"agent registration failed: {status} {reply[:300]!r}")
    credentials = json.loads(reply)["credentials"]
    return credentials["api_key"], credentials["key_id"]


def _revoke(cfg: Config, port: int, key_id: str) -> None:
    """Revoke the run's API key, so a shared Redis keeps nothing of the run."""
    status, reply = client.run(lambda: client.request_once(
        HOST, port, client.build_request("DELETE", f"/v1/keys/{key_id}", cfg.admin_key)))
    if status != 204:
        print(f"bench: could not revoke API key {key_id}: {status} {reply[:200]!r}",
              file=sys.stderr)


def _bench_target(procs: Processes, cfg: Config, target: str, redis_pid: int | None
                  ) -> dict[str, Any]:
    port = free_port()
    proc = _start_target(procs, cfg, target, port)
    watch = {"server": proc.pid}
    if redis_pid is not None and target != "embedded":
        watch["redis"] = redis_pid
    key_id = ""
    try:
        token, key_id = _token(cfg, target, port)
        print(f"  {TARGETS[target]}: filling {cfg.keys} keys", flush=True)
        puts = _requests(cfg, "PUT", token)
        client.run(lambda: client.fill(HOST, port, puts, min(cfg.connections, 32)))
        result: dict[str, Any] = {}
        for phase, method, connections in (("put", "PUT", cfg.connections),
                                           ("get", "GET", cfg.connections),
                                           ("put_c1", "PUT", 1)):
            print(f"  {TARGETS[target]}: {phase} for {cfg.seconds:g} s "
                  f"at {connections} connection(s)", flush=True)
            result[phase] = _drive(procs, cfg, port, method, token, connections, watch)
            if proc.poll() is not None:
                raise RuntimeError(f"{TARGETS[target]} exited during {phase}:\n"
                                   f"{procs.log_tail(proc)}")
        return result
    finally:
        if key_id and target == "redis" and not cfg.own_redis and proc.poll() is None:
            _revoke(cfg, port, key_id)
        procs.stop(proc)


def _forget_redis_data(cfg: Config) -> None:
    """Flush our own redis-server; on a shared one, delete only this run's namespace."""
    import redis

    try:
        with redis.Redis.from_url(cfg.redis_url) as conn:
            if cfg.own_redis:
                conn.flushall()
                return
            for prefix in (f"memp:{{{cfg.namespace}}}:", f"floor:{{{cfg.namespace}}}:"):
                batch = list(conn.scan_iter(match=prefix + "*", count=1000))
                for i in range(0, len(batch), 1000):
                    conn.unlink(*batch[i:i + 1000])
            conn.srem("memp:namespaces", cfg.namespace)
    except redis.RedisError as exc:
        print(f"bench: could not clean up Redis: {exc}", file=sys.stderr)


# ---- report ----


def _ratios(results: dict[str, Any]) -> dict[str, Any]:
    floor = results.get("floor")
    out: dict[str, Any] = {}
    for target in ("redis", "embedded"):
        mine = results.get(target)
        if not mine:
            continue
        c1 = mine["put_c1"]["p50_ms"]
        entry: dict[str, Any] = {"put_c1_p50_ms": c1,
                                 "put_c1_p50_met": c1 < C1_PUT_P50_TARGET_MS}
        if floor:
            for phase, goal in (("put", PUT_RATIO_TARGET), ("get", GET_RATIO_TARGET)):
                base = floor[phase]["rps"]
                ratio = mine[phase]["rps"] / base if base else 0.0
                entry[f"{phase}_ratio"] = round(ratio, 3)
                entry[f"{phase}_met"] = ratio >= goal
        out[target] = entry
    return out


def _table(results: dict[str, Any], ratios: dict[str, Any]) -> str:
    head = (f"{'':<18} {'put/s':>7} {'%floor':>6} {'p50ms':>6} {'p99ms':>6}   "
            f"{'get/s':>7} {'%floor':>6} {'p50ms':>6} {'p99ms':>6}   {'put p50ms@1':>11} "
            f"{'errors':>6}")
    lines = [head, "-" * len(head)]
    for target, label in TARGETS.items():
        r = results.get(target)
        if not r:
            continue
        ratio = ratios.get(target, {})
        cells = [f"{label:<18}"]
        for phase in ("put", "get"):
            p = r[phase]
            share = f"{ratio[f'{phase}_ratio']:.0%}" if f"{phase}_ratio" in ratio else "-"
            cells.append(f"{p['rps']:>7,.0f} {share:>6} {p['p50_ms']:>6.2f} {p['p99_ms']:>6.2f}  ")
        errors = sum(r[p]["errors"] for p in ("put", "get", "put_c1"))
        cells.append(f"{r['put_c1']['p50_ms']:>11.2f} {errors:>6}")
        lines.append(" ".join(cells))
    lines += ["", _cpu_table(results)]
    for target in ("redis", "embedded"):
        ratio = ratios.get(target)
        if not ratio:
            continue
        checks = []
        if "put_ratio" in ratio:
            checks.append(f"put {ratio['put_ratio']:.0%} of floor (>= 50%) "
                          f"{_verdict(ratio['put_met'])}")
            checks.append(f"get {ratio['get_ratio']:.0%} (>= 60%) {_verdict(ratio['get_met'])}")
        checks.append(f"p50 put @1 {ratio['put_c1_p50_ms']:.2f} ms (< 2 ms) "
                      f"{_verdict(ratio['put_c1_p50_met'])}")
        lines.append(f"targets, {TARGETS[target]}: " + "; ".join(checks))
    for target, label in TARGETS.items():
        for phase, p in results.get(target, {}).items():
            if p["errors"]:
                lines.append(f"ERRORS {label} {phase}: non-2xx {p['non2xx']}, "
                             f"socket {p['socket_errors']}")
    return "\n".join(lines)


def _cpu_table(results: dict[str, Any]) -> str:
    """CPU per request is steadier than req/s on a shared machine; a server busy well under
    100% means it was starved (other load) or not driven hard enough."""
    lines = [f"{'CPU, put/get':<18} {'server µs/req':>15} {'redis µs/req':>14} "
             f"{'server busy':>13} {'loadgen busy':>13}"]
    for target, label in TARGETS.items():
        r = results.get(target)
        if not r:
            continue

        def pair(field: str, proc: str, pct: bool = False, r: dict[str, Any] = r) -> str:
            values = [r[p][field].get(proc) for p in ("put", "get")]
            if None in values:
                return "-"
            return "/".join(f"{v:.0%}" if pct else f"{v:.0f}" for v in values)

        lines.append(f"{label:<18} {pair('cpu_us_per_request', 'server'):>15} "
                     f"{pair('cpu_us_per_request', 'redis'):>14} "
                     f"{pair('cpu_core_share', 'server', True):>13} "
                     f"{pair('cpu_core_share', 'loadgen', True):>13}")
    return "\n".join(lines)


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("uvicorn", "uvloop", "httptools", "starlette", "redis", "hiredis", "msgspec",
                 "fakeredis", "lupa"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


# ---- main ----


def _choose_loadgen(choice: str) -> str:
    has_wrk = shutil.which("wrk") is not None
    if choice == "wrk" and not has_wrk:
        raise SystemExit("bench: wrk is not installed (apt-get install -y wrk, or brew install "
                         "wrk), or pass --load-generator python")
    if choice == "auto" and not has_wrk:
        print("bench: wrk not found (apt-get install -y wrk); using the Python load generator, "
              "which needs a core of its own and may not saturate the server", file=sys.stderr)
        return "python"
    return "wrk" if choice == "auto" else choice


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(targets) - set(TARGETS)
    if unknown or not targets:
        raise SystemExit(f"bench: --targets takes floor, redis, embedded, not {sorted(unknown)}")
    if args.value_bytes < 11 or args.connections < 1 or args.keys < 1 or args.seconds <= 0:
        raise SystemExit("bench: --value-bytes >= 11, and --connections, --keys, --seconds > 0")
    own_redis = not args.redis_url and bool({"floor", "redis"} & set(targets))
    if own_redis and not shutil.which("redis-server"):
        raise SystemExit("bench: redis-server is not installed (apt-get install -y redis-server)"
                         ", or pass --redis-url")
    cfg = Config(seconds=args.seconds, connections=args.connections,
                 value_bytes=args.value_bytes, keys=args.keys,
                 namespace="bench" if not args.redis_url else f"bench-{secrets.token_hex(4)}",
                 loadgen=_choose_loadgen(args.load_generator), redis_url=args.redis_url or "",
                 own_redis=own_redis)

    signal.signal(signal.SIGTERM, _on_sigterm)
    procs = Processes()
    results: dict[str, Any] = {}
    load_before = os.getloadavg()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"bench: {cfg.connections} connections, {cfg.seconds:g} s per phase, "
          f"{cfg.value_bytes}-byte values over {cfg.keys} keys, load generator {cfg.loadgen}, "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f}", flush=True)
    try:
        redis_pid = None
        if own_redis:
            cfg.redis_url, redis_proc = start_redis(procs)
            redis_pid = redis_proc.pid
        for target in TARGETS:
            if target not in targets:
                continue
            try:
                results[target] = _bench_target(procs, cfg, target, redis_pid)
            finally:
                if target != "embedded" and cfg.redis_url:
                    _forget_redis_data(cfg)
    except KeyboardInterrupt:
        print("bench: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        procs.stop_all()

    ratios = _ratios(results)
    print()
    print(_table(results, ratios))
    if args.json:
        report = {
            "config": {"seconds": cfg.seconds, "connections": cfg.connections,
                       "value_bytes": cfg.value_bytes, "keys": cfg.keys,
                       "load_generator": cfg.loadgen,
                       "redis": "own redis-server" if own_redis else "--redis-url"},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_before": load_before[0],
                        "load_average_after": os.getloadavg()[0], "versions": _versions()},
            "started_at": started_at,
            "results": results,
            "vs_floor": ratios,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    errors = sum(p["errors"] for r in results.values() for p in r.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
