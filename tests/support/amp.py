"""Helpers shared by the AMP bridge tests (no tests here): brokers with an AMP namespace of their
own, an AMP client over real HTTP, a broker whose clock the test sets, a reader of MEMP
subscriptions, and a search of every value the broker stored for a marker string."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import uvicorn

from broker.app import create_app
from broker.runtime.settings import Settings
from broker.storage import layout
from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    BrokerProcess,
    data_client,
    free_port,
    start_broker,
)
from tests.support.stored import stored

WAIT = 15.0  # seconds any single expectation may take before the test fails
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
NO_BACKGROUND_RUNS = 3600.0  # the periodic engine never runs during a test; passes are explicit


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def ms_of(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cell_key(cell: dict[str, Any]) -> str:
    identity = cell["identity"]
    return f"cells/{identity['owner_type']}/{identity['owner_id']}/{cell['id']}"


def created(response: httpx.Response) -> dict[str, Any]:
    """The cell a create's 201 reply holds: the reply less `near_duplicates`, the one field a
    create's reply has beyond the cell as stored (checked in tests/amp/test_duplicates.py)."""
    assert response.status_code == 201, response.text
    cell: dict[str, Any] = response.json()
    duplicates = cell.pop("near_duplicates")
    assert duplicates is None or isinstance(duplicates, list), duplicates
    return cell


def error_of(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


class Amp:
    """Speaks AMP to one broker (admin token by default, acting as `agent`), and reads the
    cells' MEMP entries, which does not count as an AMP access."""

    def __init__(self, url: str, namespace: str, token: str | None = ADMIN_KEY,
                 agent: str | None = "agent-1", app: Any = None) -> None:
        self.url = url
        self.namespace = namespace
        self.agent = agent
        self.app = app
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=WAIT)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Amp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def as_token(self, token: str, agent: str | None = None) -> Amp:
        """Another client on the same broker with another bearer token."""
        return Amp(self.url, self.namespace, token, agent, self.app)

    def _headers(self, agent: str | None) -> dict[str, str]:
        acting = self.agent if agent is None else agent
        return {"X-AMP-Agent-ID": acting} if acting else {}

    # ---- AMP ----

    def post_cell(self, body: Any, agent: str | None = None) -> httpx.Response:
        return self.http.post("/amp/memories", json=body, headers=self._headers(agent))

    def create(self, text: str = "the user prefers tea", *, owner: str = "u-1",
               owner_type: str = "user", type: str = "semantic", agent: str | None = None,
               **fields: Any) -> dict[str, Any]:
        body = {"type": type, "content": {"text": text},
                "identity": {"owner_id": owner, "owner_type": owner_type}, **fields}
        return created(self.post_cell(body, agent))

    def get(self, cell_id: str, agent: str | None = None) -> httpx.Response:
        return self.http.get(f"/amp/memories/{cell_id}", headers=self._headers(agent))

    def read(self, cell_id: str, agent: str | None = None) -> dict[str, Any]:
        response = self.get(cell_id, agent)
        assert response.status_code == 200, response.text
        cell: dict[str, Any] = response.json()
        return cell

    def patch(self, cell_id: str, body: Any, agent: str | None = None) -> httpx.Response:
        return self.http.patch(f"/amp/memories/{cell_id}", json=body,
                               headers=self._headers(agent))

    def delete(self, cell_id: str, agent: str | None = None) -> httpx.Response:
        return self.http.delete(f"/amp/memories/{cell_id}", headers=self._headers(agent))

    def search_response(self, agent: str | None = None, **body: Any) -> httpx.Response:
        """A search; with a query and no mode, by shared words (`keyword`), the ranking most
        tests check (recall by meaning: tests/amp/test_recall.py)."""
        if "query" in body and "mode" not in body:
            body["mode"] = "keyword"
        return self.http.post("/amp/memories/search", json=body, headers=self._headers(agent))

    def search(self, agent: str | None = None, **body: Any) -> dict[str, Any]:
        response = self.search_response(agent, **body)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def search_ids(self, agent: str | None = None, **body: Any) -> list[str]:
        return [hit["cell"]["id"] for hit in self.search(agent, **body)["results"]]

    def run(self, as_of: int | None = None) -> dict[str, int]:
        body = {} if as_of is None else {"as_of": iso(as_of)}
        response = self.http.post("/amp/lifecycle/run", json=body)
        assert response.status_code == 200, response.text
        counts: dict[str, int] = response.json()["transitions"]
        return counts

    def purge(self, ids: list[str] | None = None, as_of: int | None = None) -> httpx.Response:
        body: dict[str, Any] = {}
        if ids is not None:
            body["ids"] = ids
        if as_of is not None:
            body["as_of"] = iso(as_of)
        return self.http.post("/amp/purge", json=body)

    def import_cells(self, cells: list[dict[str, Any]], agent: str | None = None
                     ) -> httpx.Response:
        return self.http.post("/amp/import", json={"cells": cells}, headers=self._headers(agent))

    # ---- the cells' MEMP entries ----

    def entry_response(self, cell: dict[str, Any]) -> httpx.Response:
        """A MEMP read of the cell's entry, with this client's token (AMP's policy applies)."""
        return self.http.get(f"/v1/namespaces/{self.namespace}/memory/{cell_key(cell)}")

    def _storage(self) -> Any:
        """A synchronous client on the broker's own data (the cells as stored, deleted ones
        too, which no MEMP path shows)."""
        return data_client(self.app)

    def stored(self, cell: dict[str, Any]) -> dict[str, Any]:
        """The cell as its MEMP entry holds it (read from storage: no AMP access is counted,
        and a deleted cell is there until it is purged). Without the app, a MEMP read."""
        if self.app is None:
            response = self.entry_response(cell)
            assert response.status_code == 200, response.text
            shown: dict[str, Any] = response.json()["value"]
            return shown
        raw = self._storage().hget(layout.entry(self.namespace, cell_key(cell)), "val")
        assert raw, f"no stored entry for cell {cell['id']}"
        value: dict[str, Any] = json.loads(raw)
        return value

    def status(self, cell: dict[str, Any]) -> str:
        return str(self.stored(cell)["lifecycle"]["status"])

    def history(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        """The stored versions of a cell's entry, oldest first (each with `version` and
        `value`). Without the app, the MEMP history this client's token may see."""
        if self.app is None:
            response = self.http.get(
                f"/v1/namespaces/{self.namespace}/history/{cell_key(cell)}",
                params={"limit": 100})
            assert response.status_code == 200, response.text
            shown: list[dict[str, Any]] = response.json()["versions"]
            return sorted(shown, key=lambda v: int(v["version"]))
        rows = self._storage().lrange(layout.history(self.namespace, cell_key(cell)), 0, -1)
        versions = [{"version": int(f["ver"]), "agent_id": f["agent"],
                     "value": json.loads(f["val"]) if f.get("val") and f.get("del") != "1"
                     else None}
                    for f in map(json.loads, rows)]
        return sorted(versions, key=lambda v: int(v["version"]))

    def statuses(self, cell: dict[str, Any]) -> list[str]:
        """The status of each stored version, oldest first, with repeats collapsed."""
        seen: list[str] = []
        for version in self.history(cell):
            status = version["value"]["lifecycle"]["status"] if version["value"] else None
            if status is not None and (not seen or seen[-1] != status):
                seen.append(status)
        return seen

    def owner_keys(self, owner: str, owner_type: str = "user") -> list[str]:
        response = self.http.get(f"/v1/namespaces/{self.namespace}/memory",
                                 params={"pattern": f"cells/{owner_type}/{owner}/*"})
        assert response.status_code == 200, response.text
        return [e["key"] for e in response.json()["entries"]]

    # ---- identities ----

    def register(self, name: str) -> tuple[str, str]:
        """Register an agent in the AMP namespace: (agent id, its agent-bound API key)."""
        response = self.http.post("/v1/agents", json={"name": name, "namespace": self.namespace})
        assert response.status_code == 201, response.text
        credentials = response.json()["credentials"]
        return str(credentials["agent_id"]), str(credentials["api_key"])

    def new_key(self, permissions: list[str], agent_id: str | None = None) -> str:
        body: dict[str, Any] = {"name": "amp test key",
                                "grants": [{"namespace": self.namespace,
                                            "permissions": permissions}]}
        if agent_id is not None:
            body["agent_id"] = agent_id
        response = self.http.post("/v1/keys", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["api_key"])


def amp_broker(factory: Callable[..., Broker], backend: str, namespace: str,
               **settings: Any) -> Amp:
    """A broker whose AMP namespace no other test uses; the periodic engine stays out of it."""
    settings.setdefault("amp_lifecycle_interval_seconds", NO_BACKGROUND_RUNS)
    broker = factory(backend, amp_namespace=namespace, **settings)
    return Amp(broker.url, namespace, app=broker.app)


@contextlib.contextmanager
def started_amp(backend: str, redis_url: str, **settings: Any) -> Iterator[Amp]:
    """A broker of its own in this process, on an AMP namespace no other test uses, the
    periodic engine out of it; stopped on leaving."""
    namespace = f"a-{uuid.uuid4().hex[:10]}"
    settings.setdefault("amp_lifecycle_interval_seconds", NO_BACKGROUND_RUNS)
    broker = start_broker(backend, redis_url, amp_namespace=namespace, **settings)
    client = Amp(broker.url, namespace, app=broker.app)
    try:
        yield client
    finally:
        client.close()
        broker.stop()


# ---- a broker whose clock the test sets ----


class TestClock:
    """The broker's one clock (Unix ms), moved by the test."""

    __test__ = False

    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@contextlib.contextmanager
def clocked_broker(backend: str, redis_url: str, namespace: str, clock: TestClock,
                   **overrides: Any) -> Iterator[Amp]:
    """A broker built with `create_app(settings, clock=clock)`, served over real HTTP. Its
    change-log age retention is off: with the clock moved ahead it would trim every
    namespace in the shared test Redis (the audit retention too)."""
    overrides.setdefault("changelog_max_age_seconds", 0)
    overrides.setdefault("audit_retention_seconds", 0)  # likewise for the audit logs
    port = free_port()
    settings = Settings.from_env(
        environ={}, port=port, admin_key=ADMIN_KEY, amp_namespace=namespace,
        redis_url=redis_url if backend == "redis" else None,
        amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS, **overrides)
    app = create_app(settings, clock=clock)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", ws="none", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("broker did not start")
        time.sleep(0.01)
    client = Amp(f"http://127.0.0.1:{port}", namespace, app=app)
    try:
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=WAIT)


# ---- every value the broker stored ----


def sync_redis(amp: Amp, redis_url: str) -> Any:
    """A synchronous client on the broker's data: its Redis (or Cluster), or the embedded
    server."""
    return data_client(amp.app)


def run_threads(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    """Start the threads together and wait until every one has finished."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
        assert not thread.is_alive(), f"{thread.name} did not finish"


def amp_processes(broker_processes: Callable[..., list[BrokerProcess]], namespace: str
                  ) -> tuple[BrokerProcess, BrokerProcess]:
    """Two broker processes on one Redis serving AMP in `namespace`; their periodic lifecycle
    engines stay out of the way."""
    env = {"MEMP_AMP_NAMESPACE": namespace, "MEMP_AMP_LIFECYCLE_INTERVAL_SECONDS": "3600"}
    first, second = broker_processes(2, **env)
    return first, second


def wait_posted(client: Any, namespace: str) -> None:
    """Wait until the brokers' term posters have posted every cell's search terms."""
    deadline = time.monotonic() + WAIT
    while client.scard(layout.amp_unposted(namespace)):
        assert time.monotonic() < deadline, "search terms were not posted in time"
        time.sleep(0.01)


def assert_posted_alone(amp: Amp, redis_url: str, word: str, cell_id: str) -> None:
    """Wait until every cell's terms are posted; then `word`'s term set holds `cell_id` alone."""
    client = sync_redis(amp, redis_url)
    try:
        wait_posted(client, amp.namespace)
        assert client.smembers(layout.amp_term(amp.namespace, word)) == {cell_id.encode()}
    finally:
        client.close()


def traces(client: Any, marker: str) -> list[str]:
    """Every key whose name or any value (of any type) contains `marker`."""
    needle = marker.encode()
    return sorted(f"{kind} {key.decode(errors='replace')}" for kind, key, values in stored(client)
                  if any(needle in (p if isinstance(p, bytes) else str(p).encode())
                         for p in (key, *values)))


# ---- a MEMP subscription read on a thread ----


class Subscription:
    """GET /v1/subscribe read line by line on a background thread; events fill `events`."""

    def __init__(self, url: str, params: dict[str, str], token: str = ADMIN_KEY,
                 last_event_id: str | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.opened = threading.Event()
        self.error: BaseException | None = None
        self._closing = False
        headers = {"Authorization": f"Bearer {token}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(WAIT, read=60.0))
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, args=(params, headers), daemon=True)
        self._thread.start()

    def _run(self, params: dict[str, str], headers: dict[str, str]) -> None:
        name, data = "message", []
        try:
            with self._client.stream("GET", "/v1/subscribe", params=params,
                                     headers=headers) as response:
                network = response.extensions.get("network_stream")
                self._sock = network.get_extra_info("socket") if network else None
                if response.status_code != 200:
                    raise AssertionError(f"subscribe answered {response.status_code}: "
                                         f"{response.read()!r}")
                for line in response.iter_lines():
                    if line.startswith("retry:"):
                        self.opened.set()
                    elif line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif line == "" and data:
                        self.events.append((name, json.loads("\n".join(data))))
                        name, data = "message", []
        except Exception as exc:  # the test reads `error`; a close it asked for is no error
            if not self._closing:
                self.error = exc
        finally:
            self.opened.set()

    def wait_open(self) -> Subscription:
        assert self.opened.wait(WAIT), "the subscription did not open"
        assert self.error is None, self.error
        return self

    def wait_for(self, match: Callable[[str, Any], bool], what: str) -> tuple[str, Any]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for event in list(self.events):
                if match(*event):
                    return event
            if self.error is not None:
                raise AssertionError(f"the subscription failed before {what}: {self.error!r}")
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}; saw {self.events[-5:]}")

    def close(self) -> None:
        """Drop the connection and wait for the reader to stop."""
        self._closing = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=WAIT)
        self._client.close()
        assert not self._thread.is_alive(), "the subscription reader did not stop"
