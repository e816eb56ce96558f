"""broker/runtime/metrics.py: what /metrics shows, on one process and added up over worker
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    RedisServer,
    free_port,
    start_broker,
    wait_for_port,
)
from tests.support.streams import Stream

WAIT = 20.0


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {name for name, _ in samples}


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_requests_are_timed_by_route_template_and_streams_counted_apart(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    broker = broker_factory("embedded")
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    stream = Stream(f"{broker.url}/v1/subscribe", [("namespace", ns), ("pattern", "*")],
                    headers).wait_open()
    with broker.client() as client:
        eventually(lambda: value(scrape(broker.url), "memp_subscribers") == 1, "one subscriber")
        for key in ("a", "b/c", "d%2Fe"):
            assert client.put(f"/v1/namespaces/{ns}/memory/{key}",
                              json={"value": 1}).status_code == 201
        assert client.get(f"/v1/namespaces/{ns}/memory/missing").status_code == 404
        assert client.get("/no/such/path").status_code == 404
        stream.wait_for(lambda: len(stream.events) >= 3, "three events")
        stream.close()
        eventually(lambda: value(scrape(broker.url), "memp_subscribers") == 0, "no subscriber")
    samples = scrape(broker.url)
    memory = "/v1/namespaces/{namespace}/memory/{key:path}"
    count = "memp_http_request_duration_seconds_count"
    assert value(samples, count, method="PUT", route=memory, status="201") == 3
    assert value(samples, count, method="GET", route=memory, status="404") == 1
    assert value(samples, count, method="GET", route="unmatched", status="404") == 1
    routes = {dict(labels).get("route") for name, labels in samples if name == count}
    assert "/v1/subscribe" not in routes  # a stream's lifetime is no request duration
    assert not any(ns in str(route) for route in routes)  # templates, never raw paths
    assert value(samples, "memp_events_delivered_total") == 3
    assert value(samples, "memp_stream_closes_total", reason="client_gone") == 1
    assert value(samples, "memp_redis_command_duration_seconds_count", command="EVALSHA") >= 3
    assert "process_cpu_seconds_total" in names(samples)


def test_a_hostile_method_does_not_make_new_label_values(broker: Broker) -> None:
    response = httpx.request("PROPFIND", f"{broker.url}/healthz", timeout=10)
    assert response.status_code == 405
    samples = scrape(broker.url)
    methods = {dict(labels)["method"] for name, labels in samples
               if name == "memp_http_request_duration_seconds_count"}
    assert "PROPFIND" not in methods and "other" in methods


def test_a_revoked_key_closes_its_stream_as_revoked(broker_factory: Callable[..., Broker],
                                                     ns: str) -> None:
    broker = broker_factory("embedded")
    with broker.client() as admin:
        created = admin.post("/v1/keys", json={"grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]}]})
        assert created.status_code == 201, created.text
        key, key_id = created.json()["api_key"], created.json()["key"]["id"]
        stream = Stream(f"{broker.url}/v1/subscribe", [("namespace", ns)],
                        {"Authorization": f"Bearer {key}"}).wait_open()
        assert admin.delete(f"/v1/keys/{key_id}").status_code in (200, 204)
        stream.wait_for(lambda: any(e.event == "revoked" for e in stream.events), "revoked")
    eventually(lambda: value(scrape(broker.url), "memp_stream_closes_total",
                             reason="revoked") == 1, "a close counted as revoked")


def test_the_amp_engine_reports_its_passes(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory("embedded", amp_lifecycle_interval_seconds=0.05)
    eventually(lambda: value(scrape(broker.url),
                             "memp_amp_lifecycle_pass_duration_seconds_count") > 0, "a pass")


def test_redis_failures_are_counted(private_redis: RedisServer, ns: str) -> None:
    broker = start_broker("redis", private_redis.url)
    with broker.client() as client:
        assert client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}).status_code == 201
        private_redis.stop()
        try:
            assert client.get(f"/v1/namespaces/{ns}/memory/k").status_code == 503
        finally:
            private_redis.start()
    samples = scrape(broker.url)
    broker.stop()
    errors = sum(v for (name, _), v in samples.items() if name == "memp_redis_errors_total")
    assert errors >= 1


# ---- several worker processes ----


@pytest.fixture
def workers(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """`memp-broker serve --workers 2` on the test Redis; its URL."""
    port = free_port()
    env = {**os.environ, "MEMP_REDIS_URL": redis_url, "MEMP_ADMIN_KEY": ADMIN_KEY,
           "MEMP_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}
    process = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "serve", "--workers", "2", "--log-level",
         "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout=30)
        url = f"http://127.0.0.1:{port}"
        # The port listens before the workers have started: wait until both answer (a
        # worker's process metrics appear in every scrape once it runs).
        assert httpx.get(f"{url}/readyz", timeout=60).status_code == 200
        eventually(lambda: len({dict(labels)["pid"] for name, labels in scrape(url)
                                if name == "process_cpu_seconds_total"}) == 2,
                   "both workers running")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_every_scrape_adds_up_every_worker(workers: str, ns: str) -> None:
    # New connections are spread over the workers by the kernel; each is one request.
    for _ in range(40):
        assert httpx.get(f"{workers}/healthz", timeout=10).status_code == 200
    pids: set[str] = set()
    for _ in range(8):
        samples = scrape(workers)
        assert value(samples, "memp_http_request_duration_seconds_count", method="GET",
                     route="/healthz", status="200") >= 40
        pids |= {dict(labels)["pid"] for name, labels in samples
                 if name == "process_cpu_seconds_total"}
    healthz = [value(scrape(workers), "memp_http_request_duration_seconds_count",
                     method="GET", route="/healthz", status="200") for _ in range(4)]
    assert len(set(healthz)) == 1  # the same total whichever worker answers
    assert len(pids) == 2  # process metrics of both workers
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    streams = [Stream(f"{workers}/v1/subscribe", [("namespace", ns)], headers).wait_open()
               for _ in range(3)]
    try:
        for _ in range(4):
            assert value(scrape(workers), "memp_subscribers") == 3
    finally:
        for stream in streams:
            stream.close()
    eventually(lambda: value(scrape(workers), "memp_subscribers") == 0, "no subscribers")


def test_the_grafana_dashboard_uses_only_metrics_the_broker_serves(broker: Broker) -> None:
    import json
    import re

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" /
                            "memp-broker.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:memp|process)_[a-z_]+)", e)}
    httpx.get(f"{broker.url}/healthz", timeout=10)
    served = names(scrape(broker.url))
    # A labelled counter has no sample before its first event (no Redis error yet), but the
    # broker declares it from the start.
    declared = set(re.findall(r"^# TYPE (\S+)", httpx.get(f"{broker.url}/metrics",
                                                         timeout=10).text, flags=re.MULTILINE))
    for metric in sorted(used):
        assert metric in served or f"{metric}_count" in served or any(
            n.startswith(metric) for n in served) or metric in declared \
            or metric.removesuffix("_total") in declared, metric
    assert {"memp_subscribers", "memp_events_delivered_total", "memp_stream_closes_total",
            "memp_redis_errors_total"} <= used


def test_no_created_series_and_every_documented_metric_has_its_help(broker: Broker) -> None:
    import re

    text = httpx.get(f"{broker.url}/metrics", timeout=10).text
    assert "_created" not in text
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, flags=re.MULTILINE))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    documented = re.findall(r"^\| `(memp_[a-z_]+)` \|", doc, flags=re.MULTILINE)
    assert len(documented) >= 10
    for metric in documented:
        assert metric in helps or metric.removesuffix("_total") in helps, metric
    quota = helps.get("memp_quota_exceeded_total") or helps["memp_quota_exceeded"]
    for word in ("approvals", "streams", "proposals"):
        assert word in quota, quota
