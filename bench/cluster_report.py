"""bench.cluster's table and summary: each target beside the one Redis, what
`MEMP_WRITE_REPLICAS=1` costs, and the Redis CPU per write that bounds one shard."""

from __future__ import annotations

import functools
from typing import Any

from bench import report
from bench.report import percent

LABELS = {"redis": "one Redis", "cluster": "cluster",
          "cluster-wait1": "cluster, WRITE_REPLICAS=1"}


def _cpu(result: dict[str, Any], phase: str, role: str) -> float | None:
    value = result[phase]["cpu_us_per_request"].get(role)
    return float(value) if value is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summary(results: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """Ratios to the one Redis (by req/s, and by the brokers' CPU per request, which moves far
    less on a shared machine), the cost of waiting for a replica, and the shard ceiling."""
    out: dict[str, Any] = {}
    base = results.get("redis")
    for name in ("cluster", "cluster-wait1"):
        mine = results.get(name)
        if not (base and mine):
            continue
        out[name] = {f"{phase}_vs_redis": _ratio(mine[phase]["rps"], base[phase]["rps"])
                     for phase in ("put", "get")} | {
            f"{phase}_cpu_vs_redis": _ratio(_cpu(base, phase, "brokers"),
                                            _cpu(mine, phase, "brokers"))
            for phase in ("put", "get")}
    plain, waiting = results.get("cluster"), results.get("cluster-wait1")
    if plain and waiting:
        out["write_replicas_1"] = {
            "put_rps_ratio": _ratio(waiting["put"]["rps"], plain["put"]["rps"]),
            "put_broker_cpu_ratio": _ratio(_cpu(plain, "put", "brokers"),
                                           _cpu(waiting, "put", "brokers")),
            "put_c1_p50_ms_added": round(waiting["put_c1"]["p50_ms"]
                                         - plain["put_c1"]["p50_ms"], 3)}
    for name, result in results.items():
        primaries = _cpu(result, "put", "primaries")
        rps = result["put"]["rps"]
        if primaries and rps:
            # Every write of a namespace lands on the one primary that holds its slot; what
            # the primaries use at rest is not the writes' cost.
            rest = layout.get("at_rest_cores", {}).get(name, {}).get("primaries", 0.0)
            net = max(primaries - rest * 1e6 / rps, 1.0)
            out.setdefault("redis_per_put", {})[name] = {
                "primaries_us": primaries, "primaries_at_rest_us": round(rest * 1e6 / rps, 1),
                "replicas_us": _cpu(result, "put", "replicas"),
                "shard_ceiling_puts_per_s": round(1e6 / net)}
    return out


def table(results: dict[str, Any], layout: dict[str, Any]) -> str:
    s = summary(results, layout)

    def share(name: str, phase: str) -> float | None:
        value: float | None = s.get(name, {}).get(f"{phase}_vs_redis")
        return value if name != "redis" else None

    lines = report.throughput_lines(results, LABELS, 26, "%redis", share)
    lines += ["", f"{'CPU µs/req, put/get':<26} {'brokers':>9} {'redis/this':>10} "
                  f"{'primaries':>10} {'replicas':>9} {'brokers busy':>13} {'loadgen busy':>13}"]
    for name, label in LABELS.items():
        r = results.get(name)
        if not r:
            continue
        mine = s.get(name, {})
        vs = "/".join(percent(mine.get(f"{p}_cpu_vs_redis")) for p in ("put", "get")) \
            if name != "redis" else "-"
        pair = functools.partial(report.cpu_pair, r)
        lines.append(f"{label:<26} {pair('cpu_us_per_request', 'brokers'):>9} {vs:>10} "
                     f"{pair('cpu_us_per_request', 'primaries'):>10} "
                     f"{pair('cpu_us_per_request', 'replicas'):>9} "
                     f"{pair('cpu_core_share', 'brokers', True):>13} "
                     f"{pair('cpu_core_share', 'loadgen', True):>13}")
    lines.append("")
    if layout.get("namespaces_per_primary"):
        spread = "/".join(str(n) for n in layout["namespaces_per_primary"].values())
        lines.append(f"namespaces per primary: {spread}")
    if "write_replicas_1" in s:
        w = s["write_replicas_1"]
        lines.append(f"MEMP_WRITE_REPLICAS=1 on the cluster: put {percent(w['put_rps_ratio'])} of "
                     f"the req/s without it ({percent(w['put_broker_cpu_ratio'])} by the brokers' "
                     f"CPU per put); +{w['put_c1_p50_ms_added']:.2f} ms p50 at one connection")
    for name, cost in s.get("redis_per_put", {}).items():
        replicas = f" (+{cost['replicas_us']:.0f} µs on replicas)" if cost["replicas_us"] else ""
        lines.append(f"{LABELS[name]}: Redis primaries spend {cost['primaries_us']:.0f} µs per "
                     f"put, {cost['primaries_at_rest_us']:.0f} of it at rest{replicas}: one "
                     f"shard, one core, ~{cost['shard_ceiling_puts_per_s']:,} puts/s")
    lines += report.error_lines(results, LABELS)
    return "\n".join(lines)
