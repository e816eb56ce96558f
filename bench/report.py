"""Turning measured phases into results: medians over rounds, ratios to the floor, the table."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

TARGETS = {"floor": "floor", "blind": "floor, JSON-blind", "redis": "broker (Redis)",
           "blindx": "floor, JSON-blind xN", "noaudit": "broker, no audit",
           "workers": "broker (Redis) xN",
           "limited": "broker (limits on)", "embedded": "broker (embedded)"}
FLOORS = ("floor", "blind")
LABEL_WIDTH = max(map(len, TARGETS.values()))  # the tables' first column
# Floor servers: the two floors above, and the JSON-blind floor with --workers processes.
FLOOR_SERVERS = (*FLOORS, "blindx")
BROKERS = ("redis", "workers", "limited", "embedded")
# What fair share's checks may cost an agent under its limits: a share of a put's server CPU.
CHECK_COST_TARGET = 0.05
# The audit log may cost at most this share of a plain put's server CPU (broker on Redis with
# it, against the same broker without it, bench/noaudit.py).
AUDIT_COST_LIMIT = 0.15
PHASES = ("put", "get", "put_c1")
# Targets for one broker process on real Redis (reported for the others too): throughput
# against the floor (the first release's), server CPU per request against the JSON-blind floor
# (the hot path's), and what a second worker adds.
PUT_RATIO_TARGET = 0.50
GET_RATIO_TARGET = 0.60
PUT_CPU_TARGET = 1.6
GET_CPU_TARGET = 1.3
WORKERS_TARGET = 1.8
C1_PUT_P50_TARGET_MS = 2.0


def phase_result(raw: dict[str, Any], cpu: dict[str, float]) -> dict[str, Any]:
    """One measured phase. Throughput counts 2xx responses only; everything else is an error.
    CPU is given as the share of one core each process used, and as µs per request."""
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


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A phase measured in several rounds: the median of each figure, errors summed."""
    def median(get: Any) -> float:
        values = [v for v in (get(r) for r in rounds) if v is not None]
        return round(statistics.median(values), 3) if values else 0.0

    out: dict[str, Any] = {
        name: median(lambda r, name=name: r[name])
        for name in ("rps", "p50_ms", "p90_ms", "p99_ms", "max_ms")
    }
    for group in ("cpu_core_share", "cpu_us_per_request"):
        procs = sorted({p for r in rounds for p in r[group]})
        out[group] = {p: median(lambda r, p=p, g=group: r[g].get(p)) for p in procs}
    non2xx: Counter[str] = Counter()
    sockets: Counter[str] = Counter()
    for r in rounds:
        non2xx.update(r["non2xx"])
        sockets.update(r["socket_errors"])
    out.update(requests=sum(r["requests"] for r in rounds), errors=sum(r["errors"] for r in rounds),
               non2xx=dict(non2xx), socket_errors=dict(sockets), rounds=rounds)
    return out


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each broker target against the floors: req/s as a share of the floor's, server CPU per
    request as a multiple of each floor's (`put_cpu_x_blind`: 1.5 costs half as much again),
    and for several workers, req/s as a multiple of one worker's."""
    out: dict[str, Any] = {}
    for target in BROKERS:
        mine = results.get(target)
        if not mine:
            continue
        c1 = mine["put_c1"]["p50_ms"]
        entry: dict[str, Any] = {"put_c1_p50_ms": c1,
                                 "put_c1_p50_met": c1 < C1_PUT_P50_TARGET_MS}
        floor = results.get("floor")
        if floor:
            for phase, goal in (("put", PUT_RATIO_TARGET), ("get", GET_RATIO_TARGET)):
                base = floor[phase]["rps"]
                ratio = mine[phase]["rps"] / base if base else 0.0
                entry[f"{phase}_ratio"] = round(ratio, 3)
                entry[f"{phase}_met"] = ratio >= goal
        for name in FLOORS:
            base_result = results.get(name)
            for phase, cpu_goal in (("put", PUT_CPU_TARGET), ("get", GET_CPU_TARGET)):
                base_cpu = base_result[phase]["cpu_us_per_request"].get("server") \
                    if base_result else None
                cpu = mine[phase]["cpu_us_per_request"].get("server")
                if not (base_cpu and cpu):
                    continue
                suffix = "" if name == "floor" else f"_{name}"
                entry[f"{phase}_cpu_ratio{suffix}"] = round(base_cpu / cpu, 3)
                entry[f"{phase}_cpu_x_{name}"] = round(cpu / base_cpu, 3)
                if name == "blind":
                    entry[f"{phase}_cpu_met"] = cpu / base_cpu <= cpu_goal
        one = results.get("redis")
        if target == "workers" and one:
            for phase in ("put", "get"):
                base = one[phase]["rps"]
                entry[f"{phase}_x_one_worker"] = round(mine[phase]["rps"] / base, 3) \
                    if base else 0.0
                entry[f"{phase}_workers_met"] = entry[f"{phase}_x_one_worker"] >= WORKERS_TARGET
                stack = _stack_scaling(results, phase)
                if stack is not None:
                    entry[f"{phase}_floor_x_one_worker"] = stack
        out[target] = entry
    plain, limited = results.get("redis"), results.get("limited")
    if plain and limited:
        for phase in ("put", "get"):
            base = plain[phase]["cpu_us_per_request"].get("server")
            cost = limited[phase]["cpu_us_per_request"].get("server")
            if base and cost:
                out["limited"][f"{phase}_check_cost"] = round(cost / base - 1, 3)
        if "put_check_cost" in out["limited"]:
            out["limited"]["put_check_cost_met"] = \
                out["limited"]["put_check_cost"] <= CHECK_COST_TARGET
    with_audit, without = results.get("redis"), results.get("noaudit")
    if with_audit and without:
        mine = with_audit["put"]["cpu_us_per_request"].get("server")
        base = without["put"]["cpu_us_per_request"].get("server")
        if mine and base:
            cost = mine / base - 1
            out["audit"] = {"put_server_us": round(mine, 1),
                            "put_server_us_without": round(base, 1),
                            "cost": round(cost, 3), "met": cost <= AUDIT_COST_LIMIT}
            redis_mine = with_audit["put"]["cpu_us_per_request"].get("redis")
            redis_base = without["put"]["cpu_us_per_request"].get("redis")
            if redis_mine and redis_base:
                out["audit"]["redis_cost"] = round(redis_mine / redis_base - 1, 3)
    return out


def _stack_scaling(results: dict[str, Any], phase: str) -> float | None:
    """The JSON-blind floor's req/s with --workers processes as a multiple of its one process:
    what the machine lets any server on this stack gain from more workers in this run."""
    one, many = results.get("blind"), results.get("blindx")
    if not (one and many and one[phase]["rps"]):
        return None
    return round(float(many[phase]["rps"]) / float(one[phase]["rps"]), 3)


def table(results: dict[str, Any], vs_floor: dict[str, Any]) -> str:
    def share(target: str, phase: str) -> float | None:
        ratio: float | None = vs_floor.get(target, {}).get(f"{phase}_ratio")
        return ratio

    lines = throughput_lines(results, TARGETS, LABEL_WIDTH, "%floor", share)
    lines += ["", _cpu_table(results, vs_floor), ""]
    for target in BROKERS:
        ratio = vs_floor.get(target)
        if ratio:
            lines.append(f"targets, {TARGETS[target]}: " + "; ".join(_checks(ratio)))
    limited = vs_floor.get("limited", {})
    if "put_check_cost" in limited:
        lines.append(
            f"fair share, limits on vs off by server CPU: put +{limited['put_check_cost']:.1%} "
            f"(target {CHECK_COST_TARGET:.0%}: {verdict(limited['put_check_cost_met'])}), "
            f"get +{limited.get('get_check_cost', 0):.1%} (a read rate, checked in the read's "
            "script)")
    audit = vs_floor.get("audit")
    if audit:
        redis_cost = f", Redis +{audit['redis_cost']:.0%}" if "redis_cost" in audit else ""
        lines.append(f"audit log: put server {audit['put_server_us']:.0f} µs/req against "
                     f"{audit['put_server_us_without']:.0f} without it, +{audit['cost']:.1%} "
                     f"(<= {AUDIT_COST_LIMIT:.0%}) {verdict(audit['met'])}{redis_cost}")
    lines += error_lines(results, TARGETS)
    return "\n".join(lines)


def throughput_lines(results: dict[str, Any], labels: dict[str, str], width: int,
                     share_name: str, share: Callable[[str, str], float | None]) -> list[str]:
    """The put/get table, a row per labelled target with results: req/s, `share(target,
    phase)` (a fraction, or None for "-") under `share_name`, p50 and p99, put p50 at one
    connection, errors."""
    head = (f"{'':<{width}} {'put/s':>7} {share_name:>6} {'p50ms':>6} {'p99ms':>7}   "
            f"{'get/s':>7} {share_name:>6} {'p50ms':>6} {'p99ms':>7}   {'put p50ms@1':>11} "
            f"{'errors':>6}")
    lines = [head, "-" * len(head)]
    for target, label in labels.items():
        r = results.get(target)
        if not r:
            continue
        cells = [f"{label:<{width}}"]
        for phase in ("put", "get"):
            p = r[phase]
            cells.append(f"{p['rps']:>7,.0f} {percent(share(target, phase)):>6} "
                         f"{p['p50_ms']:>6.2f} {p['p99_ms']:>7.2f}  ")
        errors = sum(p["errors"] for p in r.values())
        cells.append(f"{r['put_c1']['p50_ms']:>11.2f} {errors:>6}")
        lines.append(" ".join(cells))
    return lines


def cpu_pair(result: dict[str, Any], group: str, process: str, pct: bool = False) -> str:
    """`process`'s figure in `group` (cpu_us_per_request, or cpu_core_share with `pct`) for
    put and get, as "put/get"; "-" when either is missing."""
    values = [result[p][group].get(process) for p in ("put", "get")]
    if None in values:
        return "-"
    return "/".join(f"{v:.0%}" if pct else f"{v:.0f}" for v in values)


def error_lines(results: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """A line for each phase of each labelled target that had errors."""
    return [f"ERRORS {label} {phase}: non-2xx {p['non2xx']}, socket {p['socket_errors']}"
            for target, label in labels.items()
            for phase, p in results.get(target, {}).items() if p["errors"]]


def percent(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def _checks(ratio: dict[str, Any]) -> list[str]:
    checks = []
    if "put_cpu_x_blind" in ratio:
        checks.append(f"put CPU {ratio['put_cpu_x_blind']:.2f}x JSON-blind floor's "
                      f"(<= {PUT_CPU_TARGET}x) {verdict(ratio['put_cpu_met'])}")
    if "get_cpu_x_blind" in ratio:
        checks.append(f"get CPU {ratio['get_cpu_x_blind']:.2f}x (<= {GET_CPU_TARGET}x) "
                      f"{verdict(ratio['get_cpu_met'])}")
    if "put_ratio" in ratio:
        checks.append(f"put {ratio['put_ratio']:.1%} of floor's req/s (>= 50%) "
                      f"{verdict(ratio['put_met'])}")
        checks.append(f"get {ratio['get_ratio']:.1%} (>= 60%) {verdict(ratio['get_met'])}")
    for phase in ("put", "get"):
        if f"{phase}_x_one_worker" in ratio:
            stack = ratio.get(f"{phase}_floor_x_one_worker")
            beside = f"; the JSON-blind floor's {stack:.2f}x" if stack is not None else ""
            checks.append(f"{phase} {ratio[f'{phase}_x_one_worker']:.2f}x one worker's req/s "
                          f"(>= {WORKERS_TARGET}x) {verdict(ratio[f'{phase}_workers_met'])}"
                          f"{beside}")
    checks.append(f"p50 put @1 {ratio['put_c1_p50_ms']:.2f} ms (< 2 ms) "
                  f"{verdict(ratio['put_c1_p50_met'])}")
    return checks


def _cpu_table(results: dict[str, Any], vs_floor: dict[str, Any]) -> str:
    """CPU per request is steadier than req/s on a shared machine; a server busy well under
    100% was starved by other work or not driven hard enough."""
    lines = [f"{'CPU, put/get':<{LABEL_WIDTH}} {'server µs/req':>15} {'x floor':>11} "
             f"{'x blind':>11} {'redis µs/req':>13} {'server busy':>12} {'loadgen busy':>13}"]
    for target, label in TARGETS.items():
        r = results.get(target)
        if not r:
            continue
        ratio = vs_floor.get(target, {})
        factors = ["/".join(f"{ratio[k]:.2f}" for k in (f"put_cpu_x_{name}", f"get_cpu_x_{name}")
                            if k in ratio) or "-" for name in FLOORS]
        lines.append(f"{label:<{LABEL_WIDTH}} {cpu_pair(r, 'cpu_us_per_request', 'server'):>15} "
                     f"{factors[0]:>11} {factors[1]:>11} "
                     f"{cpu_pair(r, 'cpu_us_per_request', 'redis'):>13} "
                     f"{cpu_pair(r, 'cpu_core_share', 'server', True):>12} "
                     f"{cpu_pair(r, 'cpu_core_share', 'loadgen', True):>13}")
    return "\n".join(lines)


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


# ---- the JSON document ----

# The installed versions every benchmark reports; each adds those its own targets use.
VERSIONED = ("uvicorn", "uvloop", "httptools", "starlette", "redis", "hiredis", "msgspec")


def versions(*extra: str) -> dict[str, str]:
    """Python's version and the installed version of each distribution in VERSIONED + `extra`
    ("absent" where it is not installed)."""
    out = {"python": platform.python_version()}
    for dist in VERSIONED + extra:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def machine(load_before: float, **extra: Any) -> dict[str, Any]:
    """The "machine" part of a run's JSON: CPUs, platform, load average before and after (now),
    and `extra` (such as versions)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
            **extra}


def write_json(path: str, document: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {path}")
