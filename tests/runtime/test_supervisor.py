"""Background loops under the supervisor (broker/runtime/supervisor.py): a loop that fails is logged
and restarted with backoff, shutdown is bounded; and each of the broker's loops, with a fault
injected into what it depends on, logs the failure, restarts and does its work afterwards."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest

from broker.runtime.metrics import Metrics
from broker.runtime.supervisor import Backoff, Supervisor
from broker.streaming import revocation
from broker.web.sse import EventStreamResponse, SendWatchdog
from tests.support.amp import amp_broker, assert_posted_alone, iso, now_ms
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, read_changelog
from tests.support.clients import sync_client
from tests.support.streams import Stream
from tests.support.waiting import wait_until

INJECTED = "injected fault"
WAIT = 15.0


def logged(caplog: pytest.LogCaptureFixture, loop: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "memp.supervisor" and r.getMessage().startswith(f"{loop} ")]


def delays(records: list[logging.LogRecord]) -> list[float]:
    found = [re.search(r"restarting in ([0-9.]+)s", r.getMessage()) for r in records]
    return [float(match[1]) for match in found if match]


# ---- the supervisor ----


@pytest.mark.parametrize(("fault", "level", "traceback"), [
    pytest.param(RuntimeError(INJECTED), logging.ERROR, True, id="bug"),
    pytest.param(ConnectionRefusedError(INJECTED), logging.WARNING, False, id="store-down"),
])
def test_a_loop_that_raises_is_logged_and_restarted(
        caplog: pytest.LogCaptureFixture, fault: Exception, level: int, traceback: bool) -> None:
    async def scenario() -> int:
        runs = 0
        working = asyncio.Event()

        async def loop() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                raise fault
            working.set()
            await asyncio.sleep(3600)

        supervisor = Supervisor(transient=(OSError,))
        supervisor.start("flaky loop", loop, Backoff(first=0.01))
        await asyncio.wait_for(working.wait(), WAIT)
        await supervisor.close()
        return runs

    assert asyncio.run(scenario()) == 2
    [record] = logged(caplog, "flaky loop")
    assert record.levelno == level
    assert (record.exc_info is not None) == traceback
    assert f"{type(fault).__name__}: {INJECTED}" in record.getMessage()
    assert delays([record]) == [0.01]


def test_a_loop_that_returns_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        runs = 0
        working = asyncio.Event()

        async def loop() -> None:
            nonlocal runs
            runs += 1
            if runs > 1:
                working.set()
                await asyncio.sleep(3600)

        supervisor = Supervisor()
        supervisor.start("quitter", loop, Backoff(first=0.01))
        await asyncio.wait_for(working.wait(), WAIT)
        await supervisor.close()

    asyncio.run(scenario())
    [record] = logged(caplog, "quitter")
    assert record.levelno == logging.ERROR and "returned" in record.getMessage()


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        runs = 0
        done = asyncio.Event()

        async def loop() -> None:
            nonlocal runs
            runs += 1
            if runs == 6:
                await asyncio.sleep(0.3)  # up longer than healthy_after, then fails
            if runs == 8:
                done.set()
                await asyncio.sleep(3600)
            raise RuntimeError(f"run {runs}")

        supervisor = Supervisor()
        supervisor.start("flapping loop", loop, Backoff(first=0.01, cap=0.04, healthy_after=0.2))
        await asyncio.wait_for(done.wait(), WAIT)
        await supervisor.close()

    asyncio.run(scenario())
    assert delays(logged(caplog, "flapping loop")) == [0.01, 0.02, 0.04, 0.04, 0.04, 0.01, 0.02]


async def _ignores_cancels(times: int, cancels: list[str]) -> None:
    """Sleeps, shrugging off `times` cancels as redis-py's wait_for can (CPython gh-86296)."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancels.append("cancel")
            if len(cancels) > times:
                raise


@pytest.mark.parametrize("ignored", [pytest.param(0, id="obeys"),
                                     pytest.param(1, id="ignores-one")])
def test_a_loop_stopped_from_synchronous_code_ends_and_is_not_restarted(
        caplog: pytest.LogCaptureFixture, ignored: int) -> None:
    async def scenario() -> tuple[int, list[str], float]:
        starts = 0
        cancels: list[str] = []

        async def loop() -> None:
            nonlocal starts
            starts += 1
            await _ignores_cancels(ignored, cancels)

        supervisor = Supervisor()
        task = supervisor.start("on-demand loop", loop)
        await asyncio.sleep(0.01)
        started = time.monotonic()
        supervisor.stop_soon(task)
        await asyncio.wait_for(asyncio.wait([task]), WAIT)
        took = time.monotonic() - started
        await asyncio.sleep(0.05)
        assert supervisor.tasks == set()
        return starts, cancels, took

    starts, cancels, took = asyncio.run(scenario())
    assert starts == 1 and len(cancels) == ignored + 1
    assert took < WAIT / 2  # did not wait out the grace: a margin no loaded machine needs
    assert logged(caplog, "on-demand loop") == []


def test_shutdown_is_bounded_when_a_loop_ignores_a_cancel(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    async def scenario() -> tuple[float, list[str]]:
        cancels: list[str] = []
        supervisor = Supervisor()
        supervisor.start("stubborn once", lambda: _ignores_cancels(1, cancels))
        supervisor.start("obedient", lambda: asyncio.sleep(3600))
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await supervisor.close(grace=WAIT)
        assert supervisor.tasks == set()
        return time.monotonic() - started, cancels

    took, cancels = asyncio.run(scenario())
    assert cancels == ["cancel", "cancel"]
    assert took < WAIT / 2  # did not wait out the grace: a margin no loaded machine needs
    assert not [r for r in caplog.records if "left behind" in r.getMessage()]


def test_shutdown_leaves_behind_a_loop_that_ignores_every_cancel(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> float:
        deaf = True
        cancels = 0

        async def loop() -> None:
            nonlocal cancels
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancels += 1
                    if not deaf:
                        raise

        supervisor = Supervisor()
        task = supervisor.start("deaf loop", loop)
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await supervisor.stop([task], grace=0.3)  # as the hub stops its readers at shutdown
        await supervisor.close(grace=WAIT)  # what was left behind is not waited for again
        took = time.monotonic() - started
        assert not task.done() and cancels >= 1
        deaf = False  # so that the test can end
        task.cancel()
        await asyncio.wait([task])
        return took

    took = asyncio.run(scenario())
    assert 0.3 <= took < WAIT / 2
    [record] = [r for r in caplog.records if "left behind" in r.getMessage()]
    assert record.levelno == logging.ERROR and "deaf loop" in record.getMessage()


def test_a_one_off_job_that_fails_is_logged_and_not_retried(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    async def scenario() -> int:
        runs = 0

        async def job() -> None:
            nonlocal runs
            runs += 1
            raise RuntimeError(INJECTED)

        supervisor = Supervisor()
        supervisor.spawn("one-off", job())
        await asyncio.sleep(0.1)
        assert supervisor.tasks == set()
        await supervisor.close()
        return runs

    assert asyncio.run(scenario()) == 1
    [record] = logged(caplog, "one-off")
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "not retried" in record.getMessage()


# ---- the broker's loops, each with a fault in what it depends on ----


class Fault:
    """Makes one method of a live component fail on its next call, as if what it wraps broke
    (the broker runs in another thread: `fired` says when)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> None:
        self.fired = threading.Event()
        original = getattr(target, name)

        def failing(*args: Any, **kwargs: Any) -> Any:
            if not self.fired.is_set():
                self.fired.set()
                raise RuntimeError(INJECTED)
            return original(*args, **kwargs)  # a coroutine, for an async method

        monkeypatch.setattr(target, name, failing)


def assert_restarted(caplog: pytest.LogCaptureFixture, fault: Fault, loop: str) -> None:
    assert fault.fired.is_set(), "the fault was never hit"
    records = logged(caplog, loop)
    assert records, f"nothing logged for the {loop}"
    assert records[0].levelno == logging.ERROR and records[0].exc_info is not None
    assert f"RuntimeError: {INJECTED}; restarting in" in records[0].getMessage()


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def open_stream(url: str, token: str, *subs: str) -> Stream:
        stream = Stream(f"{url}/v1/subscribe", [("sub", s) for s in subs],
                        {"Authorization": f"Bearer {token}"})
        opened.append(stream)
        return stream.wait_open()

    yield open_stream
    for stream in opened:
        stream.close()


def test_the_lifespan_runs_every_loop_under_the_supervisor(
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory("embedded")
    tasks = broker.app.state.services.supervisor.tasks
    names = {task.get_name() for task in tasks} - {"stream recheck"}
    assert names == {"expiry sweeper", "last-seen flusher", "invalidation listener",
                     "stream guard", "AMP lifecycle engine", "AMP term poster",
                     "AMP embedder", "AMP vector index", "SSE send watchdog", "store watch",
                     "governance sweeper", "stream lease renewer"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sweeper_expires_entries_after_a_failed_sweep(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    broker = broker_factory(backend, sweep_interval_seconds=0.02)
    fault = Fault(monkeypatch, broker.app.state.services.storage.entries, "expire_due")
    with broker.client() as client:
        put = client.put(f"/v1/namespaces/{ns}/memory/brief",
                         json={"value": 1, "ttl_seconds": 1})
        assert put.status_code == 201, put.text
    data = sync_client(broker)
    try:
        wait_until(lambda: [r["type"] for r in read_changelog(data, ns)] == ["put", "expire"],
                   "the sweeper to expire the entry")
    finally:
        data.close()
    assert_restarted(caplog, fault, "expiry sweeper")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_change_log_reader_delivers_after_a_failed_read(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], streams: Callable[..., Stream], ns: str,
        backend: str) -> None:
    broker = broker_factory(backend)
    hub = broker.app.state.services.hub
    fault = Fault(monkeypatch, broker.app.state.services.changelog, "wait")
    stream = streams(broker.url, ADMIN_KEY, f"{ns}:*")
    with broker.client() as client:
        assert client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}).status_code == 201
    stream.wait_key("k", 1)
    assert_restarted(caplog, fault, f"change-log reader for {ns}")
    # On demand: the reader stops with its last subscriber, and nothing starts it again.
    reader = hub.readers[ns]
    stream.close()
    wait_until(lambda: ns not in hub.readers and reader.task.done(), "the reader to stop")
    time.sleep(0.2)
    assert reader.task not in broker.app.state.services.supervisor.tasks


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_term_poster_posts_after_a_failed_batch(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], redis_url: str, ns: str, backend: str) -> None:
    with amp_broker(broker_factory, backend, ns, amp_post_interval_seconds=0.02) as amp:
        fault = Fault(monkeypatch, amp.app.state.services.amp_cells.index, "post")
        wait_until(fault.fired.is_set, "the poster to try")
        cell = amp.create("the heron nests by the river")
        assert_posted_alone(amp, redis_url, "heron", cell["id"])
    assert_restarted(caplog, fault, "AMP term poster")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_embedder_embeds_after_a_failed_batch(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    with amp_broker(broker_factory, backend, ns) as amp:
        fault = Fault(monkeypatch, amp.app.state.services.amp_recall.vectors, "take")
        wait_until(fault.fired.is_set, "the embedder to try")
        amp.create("the heron nests by the river")
        wait_until(lambda: amp.search(query="which bird builds its home near water?",
                                      mode="semantic")["results"], "the cell embedded")
    assert_restarted(caplog, fault, "AMP embedder")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_lifecycle_engine_archives_after_a_failed_pass(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    with amp_broker(broker_factory, backend, ns, amp_lifecycle_interval_seconds=0.05) as amp:
        fault = Fault(monkeypatch, amp.app.state.services.amp_cells.index, "due")
        cell = amp.create("until very soon", expires_at=iso(now_ms() + 300))
        wait_until(lambda: amp.status(cell) == "archived", "the engine to archive the cell")
    assert_restarted(caplog, fault, "AMP lifecycle engine")


def _new_key(broker: Broker, ns: str) -> tuple[str, str]:
    with broker.client() as admin:
        created = admin.post("/v1/keys", json={"name": "t", "grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]}]})
    assert created.status_code == 201, created.text
    return created.json()["api_key"], created.json()["key"]["id"]


def _ends_revoked(stream: Stream, reason: str) -> None:
    event = stream.wait_event(lambda e: e.event == "revoked", "the revoked event", timeout=5)
    assert event.data["reason"] == reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_invalidation_listener_follows_announcements_after_a_failed_one(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], streams: Callable[..., Stream], ns: str,
        backend: str) -> None:
    broker = broker_factory(backend)
    (first, first_id), (second, second_id) = _new_key(broker, ns), _new_key(broker, ns)
    on_first, on_second = streams(broker.url, first, f"{ns}:*"), streams(broker.url, second,
                                                                        f"{ns}:*")
    fault = Fault(monkeypatch, broker.app.state.services.stream_guard, "recheck_soon")
    with broker.client() as admin:
        assert admin.delete(f"/v1/keys/{first_id}").status_code == 204
        # The announcement's handler failed; subscribing again checks every stream.
        _ends_revoked(on_first, "the API key was revoked")
        assert fault.fired.is_set()
        assert not on_second.ended.is_set()
        assert admin.delete(f"/v1/keys/{second_id}").status_code == 204
        _ends_revoked(on_second, "the API key was revoked")
    assert_restarted(caplog, fault, "invalidation listener")


def test_the_stream_guard_ends_expired_streams_after_a_failed_check(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], streams: Callable[..., Stream], ns: str) -> None:
    secret = "supervisor-test-secret-0123456789-abcdef"
    broker = broker_factory("embedded", jwt_secret=secret)
    clock = types.SimpleNamespace(time=time.time)
    monkeypatch.setattr(revocation, "time", clock)
    fault = Fault(monkeypatch, clock, "time")
    token = jwt.encode({"sub": "short-lived", "exp": int(time.time()) + 2,
                        "grants": [{"namespace": ns, "permissions": ["subscribe"]}]},
                       secret, algorithm="HS256")
    stream = streams(broker.url, token, f"{ns}:*")
    wait_until(fault.fired.is_set, "the guard's first check")
    event = stream.wait_event(lambda e: e.event == "revoked", "the revoked event", timeout=8)
    assert event.data["reason"] == "the token expired"
    assert_restarted(caplog, fault, "stream guard")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_last_seen_flusher_writes_after_a_failed_flush(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    broker = broker_factory(backend, last_seen_flush_seconds=0.05)
    with broker.client() as admin:
        registered = admin.post("/v1/agents", json={"name": "a", "namespace": ns})
        assert registered.status_code == 201, registered.text
        agent = registered.json()["agent"]
        fault = Fault(monkeypatch, broker.app.state.services.storage.accounts, "touch_agents")
        with broker.client(registered.json()["credentials"]["api_key"]) as client:
            time.sleep(0.01)
            put = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
            assert put.status_code == 201, put.text

        def last_seen() -> int:
            got = admin.get(f"/v1/namespaces/{ns}/agents/{agent['id']}")
            return int(got.json()["last_seen"])

        wait_until(lambda: last_seen() > agent["last_seen"], "last_seen to rise")
    assert_restarted(caplog, fault, "last-seen flusher")


class _Transport:
    """A connection whose abort fails, or works."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.tried = asyncio.Event()

    def abort(self) -> None:
        self.tried.set()
        if self.fails:
            raise RuntimeError(INJECTED)


def test_the_send_watchdog_cuts_streams_after_a_failed_cut(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    async def scenario() -> None:
        watchdog = SendWatchdog(timeout=0.04)
        supervisor = Supervisor()
        supervisor.start("SSE send watchdog", watchdog.run, Backoff(first=0.01))
        loop = asyncio.get_running_loop()

        def stuck(transport: _Transport) -> None:
            stream = EventStreamResponse(iter(()), watchdog=watchdog, metrics=Metrics())
            stream._transport = transport
            stream.send_started = loop.time()
            watchdog.streams.add(stream)

        broken, fine = _Transport(fails=True), _Transport(fails=False)
        stuck(broken)
        await asyncio.wait_for(broken.tried.wait(), WAIT)
        stuck(fine)  # after the failure: cut by the restarted watchdog
        await asyncio.wait_for(fine.tried.wait(), WAIT)
        await supervisor.close()

    asyncio.run(scenario())
    [record] = logged(caplog, "SSE send watchdog")
    assert record.levelno == logging.ERROR and record.exc_info is not None


def test_stopping_a_broker_is_bounded_when_a_loop_ignores_a_cancel(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory("embedded", last_seen_flush_seconds=0.02)
    store = broker.app.state.services.storage.accounts
    original = store.touch_agents
    entered = threading.Event()
    cancels: list[str] = []

    async def stuck_once(seen: Any) -> None:
        # The flusher's store call hangs and shrugs off its first cancel, as a redis-py call
        # can on Python 3.11 (CPython gh-86296); later calls (the final flush) go through.
        if entered.is_set():
            await original(seen)
            return
        entered.set()
        await _ignores_cancels(1, cancels)

    monkeypatch.setattr(store, "touch_agents", stuck_once)
    wait_until(entered.is_set, "the flusher to get stuck")
    broker.stop()
    assert not broker.thread.is_alive()  # a loop that ignored a cancel held no shutdown
    assert cancels == ["cancel", "cancel"]
    assert not [r for r in caplog.records if "left behind" in r.getMessage()]
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get(f"{broker.url}/healthz")
