"""bench.cluster's table and summary: each target beside the one Redis, what
`MEMP_WRITE_REPLICAS=1` costs, and the Redis CPU per write that bounds one shard."""

from __future__ import annotations

from typing import Any

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


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def table(results: dict[str, Any], layout: dict[str, Any]) -> str:
    s = summary(results, layout)
    head = (f"{'':<26} {'put/s':>7} {'%redis':>6} {'p50ms':>6} {'p99ms':>7}   {'get/s':>7} "
            f"{'%redis':>6} {'p50ms':>6} {'p99ms':>7}   {'put p50ms@1':>11} {'errors':>6}")
    lines = [head, "-" * len(head)]
    for name, label in LABELS.items():
        r = results.get(name)
        if not r:
            continue
        cells = [f"{label:<26}"]
        for phase in ("put", "get"):
            p = r[phase]
            share = _pct(s.get(name, {}).get(f"{phase}_vs_redis")) if name != "redis" else "-"
            cells.append(f"{p['rps']:>7,.0f} {share:>6} {p['p50_ms']:>6.2f} {p['p99_ms']:>7.2f}  ")
        errors = sum(p["errors"] for p in r.values())
        cells.append(f"{r['put_c1']['p50_ms']:>11.2f} {errors:>6}")
        lines.append(" ".join(cells))
    lines += ["", f"{'CPU µs/req, put/get':<26} {'brokers':>9} {'redis/this':>10} "
                  f"{'primaries':>10} {'replicas':>9} {'brokers busy':>13} {'loadgen busy':>13}"]
    for name, label in LABELS.items():
        r = results.get(name)
        if not r:
            continue

        def pair(group: str, role: str, pct: bool = False, r: dict[str, Any] = r) -> str:
            values = [r[p][group].get(role) for p in ("put", "get")]
            if None in values:
                return "-"
            return "/".join(f"{v:.0%}" if pct else f"{v:.0f}" for v in values)

        mine = s.get(name, {})
        vs = "/".join(_pct(mine.get(f"{p}_cpu_vs_redis")) for p in ("put", "get")) \
            if name != "redis" else "-"
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
        lines.append(f"MEMP_WRITE_REPLICAS=1 on the cluster: put {_pct(w['put_rps_ratio'])} of "
                     f"the req/s without it ({_pct(w['put_broker_cpu_ratio'])} by the brokers' "
                     f"CPU per put); +{w['put_c1_p50_ms_added']:.2f} ms p50 at one connection")
    for name, cost in s.get("redis_per_put", {}).items():
        replicas = f" (+{cost['replicas_us']:.0f} µs on replicas)" if cost["replicas_us"] else ""
        lines.append(f"{LABELS[name]}: Redis primaries spend {cost['primaries_us']:.0f} µs per "
                     f"put, {cost['primaries_at_rest_us']:.0f} of it at rest{replicas}: one "
                     f"shard, one core, ~{cost['shard_ceiling_puts_per_s']:,} puts/s")
    for name, r in results.items():
        for phase, p in r.items():
            if p["errors"]:
                lines.append(f"ERRORS {LABELS[name]} {phase}: non-2xx {p['non2xx']}, "
                             f"socket {p['socket_errors']}")
    return "\n".join(lines)
