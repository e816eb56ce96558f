"""The fan-out benchmark's verdicts against the issue's targets, and its table."""

from __future__ import annotations

from typing import Any

from bench.report import verdict

# The targets for one broker process.
HELD_SUBSCRIBERS = 5000
KIB_PER_SUBSCRIBER = 50.0
LATENCY_SUBSCRIBERS = 1000
LATENCY_P99_MS = 100.0


def _all_delivered(r: dict[str, Any]) -> bool:
    return all(r[p]["delivered"] == r[p]["expected"] and not r[p]["failed_writes"]
               for p in ("latency", "burst"))


def verdicts(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each target the run has the figures for: its measure and whether it was met."""
    out: dict[str, Any] = {"throughput_vs_floor": {}, "scaling": {}}
    for count, by_target in results.items():
        floor, broker = by_target.get("floor"), by_target.get("broker")
        if floor and broker and floor["burst"]["deliveries_per_s"]:
            ratio = broker["burst"]["deliveries_per_s"] / floor["burst"]["deliveries_per_s"]
            out["throughput_vs_floor"][count] = {"ratio": round(ratio, 3), "met": ratio >= 1.0}
        for name, r in by_target.items():
            if name.startswith("broker-x") and broker and broker["burst"]["deliveries_per_s"]:
                out["scaling"][f"{count}/{name}"] = round(
                    r["burst"]["deliveries_per_s"] / broker["burst"]["deliveries_per_s"], 3)
    held = results.get(str(HELD_SUBSCRIBERS), {}).get("broker")
    if held:
        out["held"] = {
            "streams": held["streams"], "all_delivered": _all_delivered(held),
            "kib_per_subscriber": held["kib_per_subscriber"],
            "met": held["streams"] == HELD_SUBSCRIBERS and _all_delivered(held)
            and held["kib_per_subscriber"] < KIB_PER_SUBSCRIBER,
        }
    timed = results.get(str(LATENCY_SUBSCRIBERS), {}).get("broker")
    if timed:
        p99 = timed["latency"]["p99_ms"]
        out["latency"] = {"p99_ms": p99, "rate": timed["latency"]["rate"],
                          "met": p99 < LATENCY_P99_MS and _all_delivered(timed)}
    return out


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def table(results: dict[str, dict[str, Any]], checks: dict[str, Any]) -> str:
    head = (f"{'subs':>5} {'target':<10} {'streams':>7} {'KiB/sub':>7} {'RSS MiB 0/N/burst':>17}"
            f" | {'p50ms':>6} {'p99ms':>7} {'delivered':>17}"
            f" | {'events/s':>8} {'%floor':>6} {'delivered':>17} {'µs/ev':>6} {'busy':>5}")
    lines = ["", f"{'':45}| latency phase{'':20}| burst", head, "-" * len(head)]
    for count, by_target in results.items():
        floor = by_target.get("floor")
        for name, r in by_target.items():
            lat, burst = r["latency"], r["burst"]
            rss = "/".join(_mib(r["rss_kib"][k]) for k in ("none", "idle", "after_burst"))
            share = "-"
            if floor and floor["burst"]["deliveries_per_s"]:
                share = f"{burst['deliveries_per_s'] / floor['burst']['deliveries_per_s']:.0%}"
            busy = sum(v for k, v in burst["cpu_core_share"].items() if k.startswith("server"))
            per_event = burst["server_us_per_delivery"]
            lines.append(
                f"{count:>5} {name:<10} {r['streams']:>7} {r['kib_per_subscriber']:>7.1f} "
                f"{rss:>17}"
                f" | {lat['p50_ms']:>6.1f} {lat['p99_ms']:>7.1f} "
                f"{lat['delivered']:>8}/{lat['expected']:<8}"
                f" | {burst['deliveries_per_s']:>8,.0f} {share:>6} "
                f"{burst['delivered']:>8}/{burst['expected']:<8} "
                f"{per_event if per_event is not None else '-':>6} {busy:>5.0%}")
            trouble = {k: v for k, v in (("failed writes", lat["failed_writes"]
                                          + burst["failed_writes"]),
                                         ("streams closed", burst["closed_streams"]),
                                         ("duplicates", lat["duplicates"]
                                          + burst["duplicates"])) if v}
            if trouble or burst["special_events"]:
                lines.append(f"{'':17}! {trouble} {burst['special_events']}")
    lines += ["", "targets (one broker process):"]
    for count, check in checks["throughput_vs_floor"].items():
        lines.append(f"  {count} subscribers: delivery throughput {check['ratio']:.0%} of the "
                     f"floor (>= 100%) {verdict(check['met'])}")
    if "held" in checks:
        held = checks["held"]
        lines.append(f"  {HELD_SUBSCRIBERS} subscribers held: {held['streams']} streams, "
                     f"every event delivered: {'yes' if held['all_delivered'] else 'NO'}, "
                     f"{held['kib_per_subscriber']:.1f} KiB each (< {KIB_PER_SUBSCRIBER:g}) "
                     f"{verdict(held['met'])}")
    if "latency" in checks:
        timed = checks["latency"]
        lines.append(f"  {LATENCY_SUBSCRIBERS} subscribers at {timed['rate']:g} writes/s: "
                     f"p99 {timed['p99_ms']:.1f} ms (< {LATENCY_P99_MS:g} ms, all delivered) "
                     f"{verdict(timed['met'])}")
    for where, ratio in checks["scaling"].items():
        count, name = where.split("/")
        lines.append(f"  scaling, {count} subscribers: {name} delivers {ratio:.2f}x one broker "
                     f"process")
    lines += ["", "busy: the server processes' CPU during the burst, in cores; µs/ev: their CPU "
              "per delivered event"]
    return "\n".join(lines)
