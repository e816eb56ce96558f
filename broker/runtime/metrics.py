"""The broker's Prometheus metrics, in one place: every metric is an attribute of `Metrics`.

Metrics go through `prometheus_client`. With several worker processes (`--workers N`) the
client's multiprocess mode keeps each worker's values in files under PROMETHEUS_MULTIPROC_DIR
and a scrape of any worker adds them up, so every scrape shows the whole server. That mode is
chosen when `prometheus_client` is first imported, so `memp-broker serve` sets the variable
before importing the app (`prepare_multiprocess`)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Closing reasons of a stream (memp_stream_closes_total{reason}); docs/operations.md says
# what each means.
CLOSE_REASONS = ("overflow", "send_timeout", "reset", "revoked", "shutdown", "client_gone",
                 "error")
AMP_TRANSITIONS = ("expired", "stale", "active", "archived")  # what a lifecycle pass counts
_REQUEST_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
_REDIS_BUCKETS = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1, 5)
_PASS_BUCKETS = (.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
# Methods counted by name; anything else a client sends is "other" (bounded label values).
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def prepare_multiprocess() -> str:
    """Before the workers start: a directory for their metric files, emptied of a previous
    run's (the operator's PROMETHEUS_MULTIPROC_DIR, else a fresh temporary one)."""
    path = multiprocess_dir()
    if path is None:
        path = tempfile.mkdtemp(prefix="memp-metrics-")
        os.environ[MULTIPROC_ENV] = path
    else:
        os.makedirs(path, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
    return path


def remove_multiprocess(path: str) -> None:
    """After the workers stopped: a temporary directory made by `prepare_multiprocess`."""
    if os.path.basename(path).startswith("memp-metrics-"):
        shutil.rmtree(path, ignore_errors=True)


class Metrics:
    """Every metric the broker keeps. Add new ones here, as attributes, so one module lists
    them all (docs/operations.md describes each)."""

    def __init__(self) -> None:
        # No `*_created` series beside each counter and histogram: clutter to most Prometheus
        # users (the client's switch is process-wide; the broker's metrics are all made here).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.multiprocess = multiprocess_dir()
        r = self.registry
        self.request_seconds = Histogram(
            "memp_http_request_duration_seconds",
            "HTTP requests by method, route template and status (streams excluded).",
            ["method", "route", "status"], buckets=_REQUEST_BUCKETS, registry=r)
        self.subscribers = Gauge("memp_subscribers", "Open event streams.",
                                 multiprocess_mode="livesum", registry=r)
        self.events_delivered = Counter(
            "memp_events_delivered", "Change events written to subscribers' streams.",
            registry=r)
        self.events_filtered = Counter(
            "memp_events_filtered", "Changes a subscription's filter left out (per subscriber).",
            registry=r)
        self.events_conflated = Counter(
            "memp_events_conflated", "Changes a lagging or rate-capped subscription replaced "
            "with a newer change to the same key.", registry=r)
        self.stream_closes = Counter("memp_stream_closes", "Event streams ended, by reason.",
                                     ["reason"], registry=r)
        self.redis_seconds = Histogram(
            "memp_redis_command_duration_seconds",
            "Redis commands and pipelines (blocking stream reads excluded), by command.",
            ["command"], buckets=_REDIS_BUCKETS, registry=r)
        self.redis_errors = Counter("memp_redis_errors", "Redis commands that failed.",
                                    ["command", "error"], registry=r)
        self.amp_pass_seconds = Histogram(
            "memp_amp_lifecycle_pass_duration_seconds", "AMP lifecycle engine passes.",
            buckets=_PASS_BUCKETS, registry=r)
        self.amp_transitions = Counter(
            "memp_amp_lifecycle_transitions", "AMP cells moved by the lifecycle engine, by "
            "the status they moved to.", ["to"], registry=r)
        self.amp_embedded = Counter(
            "memp_amp_cells_embedded", "AMP cells whose vector the embedder stored.",
            registry=r)
        self.amp_embed_failures = Counter(
            "memp_amp_embedder_failures", "Embedding batches the embedder could not embed "
            "(the cells wait and are tried again).", registry=r)
        self.amp_embed_backlog = Gauge(
            "memp_amp_embedding_backlog", "AMP cells waiting for a vector of the configured "
            "model, as last counted by this process.", multiprocess_mode="max", registry=r)
        self.amp_vector_index = Gauge(
            "memp_amp_vector_index_cells", "AMP cells in this process's in-memory vector index "
            "(0 until it has read every vector at start).", multiprocess_mode="max", registry=r)
        self.rate_limited = Counter(
            "memp_rate_limited", "Requests refused for going over a rate, by limit and by whose "
            "rate it was (scope: agent or namespace).", ["limit", "scope"], registry=r)
        self.quota_exceeded = Counter(
            "memp_quota_exceeded", "Writes, approvals, streams (SSE and MCP) and proposals refused "
            "for going over a quota, by limit.",
            ["limit"], registry=r)
        for reason in CLOSE_REASONS:
            self.stream_closes.labels(reason)  # present at 0 from the start
        for status in AMP_TRANSITIONS:
            self.amp_transitions.labels(status)
        if self.multiprocess is None:
            ProcessCollector(registry=r)
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._commands: dict[str, Any] = {}

    # ---- recording (cheap: labelled children are looked up once) ----

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.request_seconds.labels(method, route,
                                                                       str(status))
        child.observe(seconds)

    def redis_command(self, command: str, seconds: float) -> None:
        child = self._commands.get(command)
        if child is None:
            child = self._commands[command] = self.redis_seconds.labels(command)
        child.observe(seconds)

    def redis_error(self, command: str, error: BaseException) -> None:
        self.redis_errors.labels(command, type(error).__name__).inc()

    def count_refusal(self, code: str, limit: str, scope: str) -> None:
        """A request refused by fair share (`rate_limited` or `quota_exceeded`)."""
        if code == "rate_limited":
            self.rate_limited.labels(limit, scope).inc()
        else:
            self.quota_exceeded.labels(limit).inc()

    def stream_closed(self, reason: str) -> None:
        self.stream_closes.labels(reason).inc()

    def amp_pass(self, seconds: float, counts: dict[str, int]) -> None:
        self.amp_pass_seconds.observe(seconds)
        for status, count in counts.items():
            if count:
                self.amp_transitions.labels(status).inc(count)

    # ---- exposition ----

    def render(self) -> bytes:
        """The text exposition: this process's metrics, or every worker's added up."""
        if self.multiprocess is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        workers = _live_workers(self.multiprocess)
        MultiProcessCollector(registry, self.multiprocess)  # type: ignore[no-untyped-call]
        registry.register(WorkerProcesses(workers))
        return generate_latest(registry)


_PID_RE = re.compile(r"_(\d+)\.db$")


def _live_workers(path: str) -> list[int]:
    """Pids with metric files that are still running; the live gauges of the others (a
    worker that died) are dropped, so `memp_subscribers` does not count their streams."""
    pids = {int(m.group(1)) for f in os.listdir(path) if (m := _PID_RE.search(f))}
    alive = []
    for pid in sorted(pids):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
            continue
        except PermissionError:
            pass
        alive.append(pid)
    return alive


class WorkerProcesses:
    """Process metrics (CPU, memory, file descriptors) of each live worker, labelled `pid`."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pid in self.pids:
            collector = ProcessCollector(pid=lambda p=pid: p, registry=None)  # type: ignore[misc]
            for family in collector.collect():
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type))
                merged.samples += [Sample(s.name, {**s.labels, "pid": str(pid)}, s.value)
                                   for s in family.samples]
        yield from families.values()


class MetricsMiddleware:
    """Times every HTTP request by method, route template and status. A response that turns
    out to be an event stream is counted as a subscriber instead: its lifetime is not a
    request duration."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        streaming = False

        async def send_with_status(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"content-type" and value.startswith(b"text/event-stream"):
                        streaming = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            if not streaming:
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                method = scope["method"]
                self.metrics.request(method if method in _METHODS else "other", template, status,
                                     time.perf_counter() - started)
