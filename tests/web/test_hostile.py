"""Every route of the served contract, attacked the same way over real HTTP on both stores: a key
of another tenant, a key without the permission and a revoked key; extreme numbers (2^63, 2^64,
1e400, -0, NaN, non-ASCII digits, 5,000 digits) in every query parameter and numeric body field;
NUL, DEL, control and invalid UTF-8 bytes in the broker's headers; deep and huge JSON bodies;
128-star patterns, 1,000-deep values and control characters in every path parameter, query
parameter, body field and MCP tool argument, and stored globs then matched, each beside another
tenant's read, which must not wait more than 250 ms on top of its normal latency.
None may answer 5xx, hang or drop the connection, a revoked key is always 401, and the data
seeded before is unchanged after. The routes and their query parameters come from openapi.yaml,
so a new route is attacked without being listed here."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml

from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, start_broker

SPEC = yaml.safe_load((Path(__file__).resolve().parents[2] / "openapi.yaml").read_text())
UNAUTHENTICATED = {"/healthz", "/readyz", "/metrics", "/openapi.yaml", "/openapi.json", "/docs",
                   "/console", "/console/{file}"}
SKIPPED = {"/mcp"}  # attacked by its own client-driven tests (tests/mcp/)
NUMBERS = ["9223372036854775808", "18446744073709551616", "-9223372036854775809", "1e400",
           "-0", "NaN", "-1", "\uff11\uff12", "1" * 5000, "0x10", "1_0", " 5"]
TEXTS = ["\x00", "a\r\nb", "\x7f\u202e", "x" * 20_000, "../.."]
HEADERS = ["If-Match", "If-None-Match", "Idempotency-Key", "Last-Event-ID", "X-AMP-Agent-ID",
           "X-Request-ID", "Content-Type"]
HEADER_VALUES = [b"\x00", b"\xff\xfe", b"a\x7f\x01b", b"9223372036854775808",
                 b'"18446744073709551616"', b"1e400", b"x" * 9000]
BODY_NUMBERS = [b"9223372036854775808", b"-9223372036854775809", b"1e400", b"-1e400", b"-0",
                b"-0.0", b"1e-400", b"NaN", b'"NaN"', b"18446744073709551616" * 3, b"true",
                b"null", b"[]"]
HUGE_BODIES = [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
               b"[" + b"1," * 1_000_000 + b"1]", b'"' + b"\\u0000" * 100_000 + b'"']
DEADLINE = 20.0  # seconds any one request may take


@dataclass
class Tenant:
    """A broker with seeded data in `ns` and the credentials that attack it."""

    broker: Broker
    ns: str
    agent_id: str
    cell_id: str
    tokens: dict[str, str]
    seed_keys: set[str]

    @property
    def port(self) -> int:
        return int(self.broker.url.rsplit(":", 1)[1])

    def fill(self, method: str, path: str) -> str:
        """The path with the seeded data's names; a write goes to a scratch namespace and
        names nothing seeded (the admin key may write, and the seed must stay)."""
        if method == "GET":
            return (path.replace("{namespace}", self.ns).replace("{key}", "k")
                    .replace("{agent_id}", self.agent_id).replace("{proposal_id}", "p1")
                    .replace("{schema_id}", "s1").replace("{key_id}", "key_0000000000000000")
                    .replace("{id}", self.cell_id))
        return (path.replace("{namespace}", f"{self.ns}-w").replace("{key}", "scratch")
                .replace("{agent_id}", "00000000-0000-4000-8000-000000000000")
                .replace("{proposal_id}", "p1").replace("{schema_id}", "s9")
                .replace("{key_id}", "key_0000000000000000")
                .replace("{id}", "01J00000000000000000000000"))

    def snapshot(self) -> Any:
        """What the attacks must leave as it was."""
        with self.broker.client() as admin:
            base = f"/v1/namespaces/{self.ns}"
            keys = {k["id"]: k for k in admin.get("/v1/keys").json()["keys"]}
            return (admin.get(f"{base}/memory", params={"pattern": "*"}).json(),
                    admin.get(f"{base}/history/k").json(), admin.get(f"{base}/config").json(),
                    admin.get(f"{base}/schemas").json(), admin.get(f"{base}/agents").json(),
                    {i: keys.get(i) for i in self.seed_keys}, self._cell(admin))

    def _cell(self, admin: httpx.Client) -> Any:
        """The seeded cell, but what reading it changes (its access count and time)."""
        cell = admin.get(f"/amp/memories/{self.cell_id}",
                         headers={"X-AMP-Agent-ID": "agent-writer"}).json()
        cell["scoring"].pop("access_count")
        cell["lifecycle"].pop("last_accessed_at")
        return cell


def _key(admin: httpx.Client, ns: str, permissions: list[str]) -> dict[str, Any]:
    created = admin.post("/v1/keys", json={"name": "hostile", "grants": [
        {"namespace": ns, "permissions": permissions}]})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


@pytest.fixture(scope="module", params=BACKENDS)
def tenant(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Tenant]:
    ns = f"hostile-{request.param}-{int(time.time() * 1000) % 10**9}"
    # An AMP namespace of its own: the cells the attacks leave meet no other test's searches.
    broker = start_broker(request.param, redis_url, amp_namespace=f"{ns}-amp")
    with broker.client() as admin:
        assert admin.put(f"/v1/namespaces/{ns}/memory/k", json={"value": {"a": 1}}
                         ).status_code == 201
        assert admin.put(f"/v1/namespaces/{ns}/schemas/s1", json={
            "pattern": "typed/*", "schema": {"type": "object"}}).status_code in (200, 201)
        agent = admin.post("/v1/agents", json={"name": "a", "namespace": ns}).json()
        cell = admin.post("/amp/memories", headers={"X-AMP-Agent-ID": "agent-writer"}, json={
            "type": "semantic", "content": {"text": "seed"},
            "identity": {"owner_id": "u", "owner_type": "user"}})
        assert cell.status_code == 201, cell.text
        outsider = _key(admin, f"{ns}-other", ["admin", "amp", "audit", "review"])
        reader = _key(admin, ns, ["read"])
        revoked = _key(admin, ns, ["admin"])
        assert admin.delete(f"/v1/keys/{revoked['key']['id']}").status_code == 204
    yield Tenant(broker, ns, agent["agent"]["id"], cell.json()["id"],
                 {"outsider": outsider["api_key"], "reader": reader["api_key"],
                  "revoked": revoked["api_key"]},
                 {outsider["key"]["id"], reader["key"]["id"], agent["credentials"]["key_id"]})
    broker.stop()


def send(tenant: Tenant, method: str, target: bytes,
         headers: Sequence[tuple[bytes, bytes]] = (),
         body: bytes | None = None, token: str = ADMIN_KEY) -> tuple[int, bytes]:
    """One request written byte for byte (httpx refuses the bytes under test); its status and
    body. A stream's answer ends at its headers."""
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: broker",
             b"Connection: close", b"Authorization: Bearer " + token.encode()]
    lines += [name + b": " + value for name, value in headers]
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    with socket.create_connection(("127.0.0.1", tenant.port), timeout=DEADLINE) as conn:
        # Refused before the body was read, the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
        data = b""
        started = time.monotonic()
        while b"text/event-stream" not in data.partition(b"\r\n\r\n")[0]:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            assert time.monotonic() - started < DEADLINE, f"{method} {target[:80]!r} hung"
    assert data, f"{method} {target[:80]!r}: the connection was dropped without an answer"
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path, item in SPEC["paths"].items():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete", "patch") and path not in SKIPPED:
                found.append((method.upper(), path, op))
    return found


def query_names(op: dict[str, Any]) -> list[str]:
    names = []
    for param in op.get("parameters", []):
        if "$ref" in param:
            param = SPEC["components"]["parameters"][param["$ref"].rsplit("/", 1)[1]]
        if param.get("in") == "query":
            names.append(param["name"])
    return names


def well(status: int, what: str, body: bytes) -> None:
    """Not a server error: a documented 4xx, a success, or 503 when the store is away."""
    assert status < 500, f"{what}: {status} {body[:300]!r}"


def test_every_route_refuses_other_tenants_missing_permissions_and_revoked_keys(
        tenant: Tenant) -> None:
    before = tenant.snapshot()
    for method, path, _ in operations():
        if path in UNAUTHENTICATED:
            continue
        target = quote(tenant.fill("GET", path)).encode()  # the seeded data itself
        body = b"{}" if method in ("PUT", "POST", "PATCH") else None
        for name, token in tenant.tokens.items():
            status, reply = send(tenant, method, target, [(b"X-AMP-Agent-ID", b"agent-writer")],
                                 body, token)
            well(status, f"{method} {path} as {name}", reply)
            if name == "revoked":
                assert status == 401, (method, path, reply[:200])
            elif name == "outsider" and "{namespace}" in path:
                assert status in (400, 403, 404), (method, path, status, reply[:200])
    assert tenant.snapshot() == before


def test_every_query_parameter_and_header_refuses_hostile_values(tenant: Tenant) -> None:
    before = tenant.snapshot()
    headed: set[str] = set()
    for method, path, op in operations():
        base = quote(tenant.fill(method, path))
        body = b"{}" if method in ("PUT", "POST", "PATCH") else None
        for name in query_names(op):
            for value in NUMBERS + TEXTS:
                target = f"{base}?{name}={quote(value, safe='')}"
                if path == "/v1/subscribe" and name != "namespace":
                    target += f"&namespace={tenant.ns}"
                status, reply = send(tenant, method, target.encode(), body=body)
                well(status, f"{method} {path}?{name}={value[:20]!r}", reply)
        if path in headed:
            continue  # a path's headers are attacked once, with its first method
        headed.add(path)
        for header in HEADERS:
            for raw in HEADER_VALUES:
                status, reply = send(tenant, method, base.encode(), [(header.encode(), raw)],
                                     body)
                well(status, f"{method} {path} {header}: {raw[:20]!r}", reply)
    assert tenant.snapshot() == before


WRITES: list[tuple[str, str, dict[str, Any]]] = [
    # method, path ({w}: a scratch namespace), a body the broker would accept
    ("PUT", "/v1/namespaces/{w}/memory/n", {"value": {"x": 1}, "ttl_seconds": 10,
                                             "timestamp": 1, "base_version": 1}),
    ("POST", "/v1/messages", {"memp": "1.0", "type": "memory.put", "namespace": "{w}",
                              "key": "m", "value": 1, "ttl_seconds": 5, "timestamp": 1,
                              "if_version": 1}),
    ("POST", "/v1/messages", {"memp": "1.0", "type": "memory.query", "namespace": "{w}",
                              "pattern": "*", "limit": 5}),
    ("POST", "/v1/messages", {"memp": "1.0", "type": "memory.history", "namespace": "{w}",
                              "key": "m", "limit": 5}),
    ("POST", "/v1/messages", {"memp": "1.0", "type": "memory.delete", "namespace": "{w}",
                              "key": "m", "if_version": 1, "timestamp": 1}),
    ("POST", "/v1/messages", {"memp": "1.0", "type": "agent.list", "namespace": "{w}",
                              "limit": 1}),
    ("PUT", "/v1/namespaces/{w}/config", {
        "strategy": "agent-priority", "priorities": {"a": 1}, "history_limit": 5,
        "default_ttl_seconds": 10, "default_priority": 1,
        "limits": {"max_keys": 1, "max_bytes": 1, "max_streams": 1, "writes_per_second": 1,
                   "write_burst": 1, "reads_per_second": 1, "read_burst": 1}}),
    ("PUT", "/v1/namespaces/{w}/schemas/s", {"pattern": "t/*",
                                              "schema": {"type": "string", "maxLength": 5}}),
    ("POST", "/amp/memories", {"type": "semantic", "content": {"text": "x"}, "importance": 0.5,
                               "confidence": 0.5,
                               "identity": {"owner_id": "u", "owner_type": "user"}}),
    ("POST", "/amp/memories/search", {"query": "x", "limit": 5}),
    ("PATCH", "/amp/memories/{cell}", {"importance": 0.4}),
]


def numeric_fields(obj: Any, at: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(obj, dict):
        for name, value in obj.items():
            yield from numeric_fields(value, (*at, name))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield at


def with_raw(body: Any, at: tuple[Any, ...], raw: bytes) -> bytes:
    """`body` encoded with the JSON text `raw` at `at` (object names and array indices)."""
    copy = json.loads(json.dumps(body))
    holder = copy
    for name in at[:-1]:
        holder = holder[name]
    holder[at[-1]] = "\x00HERE\x00"
    return json.dumps(copy).encode().replace(b'"\\u0000HERE\\u0000"', raw)


def test_every_numeric_body_field_and_huge_bodies_are_refused_cleanly(tenant: Tenant) -> None:
    before = tenant.snapshot()
    for method, path, template in WRITES:
        body = json.loads(json.dumps(template).replace("{w}", f"{tenant.ns}-w"))
        target = path.replace("{w}", f"{tenant.ns}-w").replace("{cell}", tenant.cell_id)
        headers = [(b"X-AMP-Agent-ID", b"agent-writer")]
        for at in [*numeric_fields(body), ("unexpected",)]:
            for raw in BODY_NUMBERS:
                status, reply = send(tenant, method, target.encode(), headers,
                                     with_raw(body, at, raw))
                well(status, f"{method} {path} {'.'.join(at)}={raw[:20]!r}", reply)
        for huge in HUGE_BODIES:
            status, reply = send(tenant, method, target.encode(), headers, huge)
            well(status, f"{method} {path} {huge[:12]!r}...", reply)
            assert 400 <= status < 500, (method, path, status, reply[:200])
    assert tenant.snapshot() == before
    with tenant.broker.client() as admin:
        assert admin.get("/healthz").status_code == 200


# ---- patterns, depth and control characters in every field, with a bystander ----

STARS = "*" * 127 + "Z"  # 128 characters; a backtracking matcher takes exponential time
CONTROL = "\x00\x1b[2J\r\n2099-01-01 CRITICAL forged\u202e\x7f\x9b"
HOSTILE_TEXTS = {"128-stars": STARS, "control": CONTROL}
DEEP_VALUE = b"[" * 1_000 + b"]" * 1_000
MARGIN = 0.25  # seconds a bystander may wait on top of its normal latency
# Fields that take patterns, beside the documented examples, so every kind is attacked.
PATTERN_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/amp/memories"): {"access_policy": {"readable_by": ["team-*"],
                                                  "writable_by": ["team-*"]}},
    ("POST", "/amp/import"): {"cells": [{"id": "01J00000000000000000000000", "type": "semantic",
                                         "content": {"text": "x"},
                                         "identity": {"owner_id": "u", "owner_type": "user"},
                                         "access_policy": {"readable_by": ["team-*"]}}]},
    ("POST", "/v1/namespaces/{namespace}/proposals/{proposal_id}/reject"): {"reason": "x"},
}
_POOL = ThreadPoolExecutor(1)


@dataclass
class Bystander:
    """Another tenant, reading its own key while the attacks run, and how long it waited."""

    client: httpx.Client
    path: str
    normal: float = 0.0
    waits: list[tuple[float, bool, str]] = field(default_factory=list)

    def read(self) -> float:
        started = time.monotonic()
        assert self.client.get(self.path).status_code == 200
        return time.monotonic() - started

    def beside(self, what: str, hostile: Callable[[], tuple[int, bytes]]) -> tuple[int, bytes]:
        """Run `hostile` and, once it is under way, one read; note how long the read waited
        and whether it was answered first. A read held past the margin is tried again with the
        attack (at most three times): a request that holds everyone holds them every time, a
        load spike on a shared machine does not."""
        for _ in range(3):
            result, waited, first = self._once(hostile)
            if first or waited <= self.normal + MARGIN:
                break
        self.waits.append((waited, first, what))
        return result

    def _once(self, hostile: Callable[[], tuple[int, bytes]]
              ) -> tuple[tuple[int, bytes], float, bool]:
        finished: list[float] = []

        def attack() -> tuple[int, bytes]:
            try:
                return hostile()
            finally:
                finished.append(time.monotonic())

        running = _POOL.submit(attack)
        time.sleep(0.001)
        waited = self.read()
        answered = time.monotonic()
        result = running.result(timeout=DEADLINE + 5)
        return result, waited, answered <= finished[0]

    def check(self) -> None:
        """No read waited more than MARGIN on top of its normal latency, unless it was answered
        before the attack was (then the attack held no one)."""
        held = [(round(w, 3), what) for w, first, what in self.waits
                if not first and w > self.normal + MARGIN]
        assert not held, f"normal {self.normal:.3f} s; held: {held[:10]}"


@pytest.fixture
def bystander(tenant: Tenant) -> Iterator[Bystander]:
    ns = f"{tenant.ns}-bystander"
    with tenant.broker.client() as admin:
        token = _key(admin, ns, ["read", "write"])["api_key"]
        assert admin.put(f"/v1/namespaces/{ns}/memory/mine", json={"value": 1}).status_code < 300
    with tenant.broker.client(token) as client:
        watcher = Bystander(client, f"/v1/namespaces/{ns}/memory/mine")
        watcher.normal = max(watcher.read() for _ in range(8))
        yield watcher
    watcher.check()


def example_body(method: str, path: str, op: dict[str, Any], scratch: str) -> Any:
    """A body the route would take: its documented example (names moved to the scratch
    namespace), plus the pattern fields it has."""
    content = op["requestBody"]["content"]["application/json"]
    body = content.get("example")
    if body is None and "examples" in content:
        body = next(iter(content["examples"].values()))["value"]
    body = json.loads(json.dumps(body or {}).replace('"my-app"', json.dumps(scratch)))
    if isinstance(body, dict):
        body.update(PATTERN_FIELDS.get((method, path), {}))
    return body


def text_leaves(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a body holds text: each string, in objects and arrays."""
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from text_leaves(inner, (*at, name))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from text_leaves(inner, (*at, index))
    elif isinstance(value, str):
        yield at


def attacks(tenant: Tenant, method: str, path: str, op: dict[str, Any]
            ) -> Iterator[tuple[str, bytes, bytes | None]]:
    """(what, target, body): each path parameter, query parameter and body field holding 128
    stars, control characters and (query parameters, top-level body fields) a value 1,000
    deep."""
    base = tenant.fill(method, path)
    body = example_body(method, path, op, f"{tenant.ns}-w") if "requestBody" in op else None
    encoded = None if body is None else json.dumps(body).encode()
    for name, text in HOSTILE_TEXTS.items():
        for param in ("{key}", "{namespace}", "{agent_id}", "{id}", "{schema_id}"):
            if param in path:
                target = tenant.fill(method, path.replace(param, "\x00HERE\x00"))
                yield (f"{param}={name}", quote(target).replace(
                    "%00HERE%00", quote(text, safe="")).encode(), encoded)
    for param in query_names(op):
        for name, text in [*HOSTILE_TEXTS.items(), ("1000-deep", DEEP_VALUE.decode())]:
            target = f"{quote(base)}?{param}={quote(text, safe='')}"
            if path == "/v1/subscribe" and param != "namespace":
                target += f"&namespace={tenant.ns}"
            yield f"?{param}={name}", target.encode(), encoded
    if body is None:
        return
    for at in text_leaves(body):
        for name, text in HOSTILE_TEXTS.items():
            yield (f"{'.'.join(map(str, at))}={name}", quote(base).encode(),
                   with_raw(body, at, json.dumps(text).encode()))
    for top in (body if isinstance(body, dict) else {"": None}):
        yield (f"{top}=1000-deep", quote(base).encode(),
               with_raw(body, (top,), DEEP_VALUE) if top else DEEP_VALUE)


def test_every_field_of_every_route_takes_stars_depth_and_control_characters(
        tenant: Tenant, bystander: Bystander) -> None:
    before = tenant.snapshot()
    headers = [(b"X-AMP-Agent-ID", b"agent-writer")]
    for method, path, op in operations():
        for what, target, body in attacks(tenant, method, path, op):
            status, reply = bystander.beside(f"{method} {path} {what}", functools.partial(
                send, tenant, method, target, headers, body))
            well(status, f"{method} {path} {what}", reply)
            if what.endswith("=1000-deep") and not what.startswith("?"):
                assert status >= 400, (method, path, what, reply[:200])  # never taken
    assert tenant.snapshot() == before


LONG_AGENT = "agent-" + "a" * 120  # matched by none of the globs below
STAR_GLOBS = [STARS, "*a" * 63 + "Z", "*********Z"]
GRANT_GLOB = "acme-" + "*" * 57 + "."  # as long as a namespace glob may be


def test_stored_patterns_are_matched_without_holding_anyone(tenant: Tenant,
                                                            bystander: Bystander) -> None:
    """Globs a tenant stores (agent priorities, shares, key grants, AMP access policies) and
    key patterns with many `*` segments, then the requests that match them, each beside a
    bystander's read."""
    before = tenant.snapshot()
    scratch, amp = f"{tenant.ns}-p", f"{tenant.ns}-amp"
    writer = [(b"X-AMP-Agent-ID", b"agent-writer")]
    stranger = [(b"X-AMP-Agent-ID", LONG_AGENT.encode())]
    with tenant.broker.client() as admin:
        assert admin.put(f"/v1/namespaces/{scratch}/config", json={
            "strategy": "agent-priority",
            "priorities": [{"agent": g, "priority": i} for i, g in enumerate(STAR_GLOBS)],
            "shares": [{"namespace": GRANT_GLOB, "permissions": ["read"]}],
            "rules": [{"pattern": "a/" + "*/" * 200 + "z", "strategy": "merge"}]}
        ).status_code == 200
        cells = []
        for i in range(3):
            made = admin.post("/amp/memories", headers=dict(writer), json={
                "type": "semantic", "content": {"text": f"hostile pattern {i}"},
                "identity": {"owner_id": "u-hostile", "owner_type": "user"},
                "access_policy": {"readable_by": STAR_GLOBS, "writable_by": STAR_GLOBS}})
            assert made.status_code == 201, made.text
            cells.append(made.json()["id"])
        agent = admin.post("/v1/agents", json={"name": "p", "namespace": scratch}).json()
        starred = admin.post("/v1/keys", json={"name": "stars", "grants": [
            {"namespace": GRANT_GLOB, "permissions": ["read", "write"]}]}).json()["api_key"]
        sharer = _key(admin, "acme-" + "a" * 58, ["read"])["api_key"]
        viewer = admin.post("/v1/keys", json={"name": "viewer", "agent_id": LONG_AGENT,
                                              "grants": [{"namespace": amp,
                                                          "permissions": ["read", "amp"]}]})
        assert viewer.status_code == 201, viewer.text
    token = agent["credentials"]["api_key"]
    matching: list[tuple[str, str, str, Sequence[tuple[bytes, bytes]], bytes | None]] = [
        (token, "PUT", f"/v1/namespaces/{scratch}/memory/k", [], b'{"value": 1}'),
        (token, "PUT", f"/v1/namespaces/{scratch}/memory/a/{'b/' * 200}z", [], b'{"value": {}}'),
        (starred, "GET", f"/v1/namespaces/acme-{'x' * 57}y/memory/k", [], None),
        (starred, "GET", f"/v1/namespaces/acme-{'x' * 57}./memory/k", [], None),
        (sharer, "GET", f"/v1/namespaces/{scratch}/memory/k", [], None),
        (ADMIN_KEY, "POST", "/amp/memories/search", stranger, b'{"query": "hostile pattern"}'),
        (viewer.json()["api_key"], "GET", f"/v1/namespaces/{amp}/memory", [], None),
        *[(ADMIN_KEY, "GET", f"/amp/memories/{c}", stranger, None) for c in cells],
        *[(ADMIN_KEY, "PATCH", f"/amp/memories/{c}", stranger, b'{"scoring": {"importance": 1}}')
          for c in cells],
    ]
    for credential, method, path, headers, body in matching:
        status, reply = bystander.beside(f"{method} {path[:60]}", functools.partial(
            send, tenant, method, quote(path).encode(), headers, body, credential))
        well(status, f"{method} {path[:60]}", reply)
    found = bystander.beside("search", functools.partial(
        send, tenant, "POST", b"/amp/memories/search", stranger, b'{"query": "hostile pattern"}'))
    assert json.loads(found[1])["results"] == []  # the globs match none of it
    assert tenant.snapshot() == before


MCP_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
MCP_ARGUMENTS: dict[str, dict[str, Any]] = {
    "memory_put": {"key": "k", "value": 1}, "memory_get": {"key": "k"}, "memory_query": {},
    "memory_delete": {"key": "k"}, "memory_history": {"key": "k"}, "amp_remember": {"text": "x"},
    "amp_recall": {"query": "x"}, "amp_forget": {"id": "01J00000000000000000000000"},
    "amp_merge": {"ids": ["01J00000000000000000000000", "01J00000000000000000000001"],
                  "text": "x"}}


def test_every_mcp_tool_argument_takes_stars_depth_and_control_characters(
        tenant: Tenant, bystander: Bystander) -> None:
    """`/mcp` over raw HTTP (a 2026-07-28 request stands alone): each argument of each tool
    holding 128 stars, control characters and values 100 and 1,000 deep, as an agent of the
    scratch namespace."""
    from broker.mcp.tools import TOOLS

    before = tenant.snapshot()
    with tenant.broker.client() as admin:
        agent = admin.post("/v1/agents", json={"name": "m", "namespace": f"{tenant.ns}-w"})
    token = agent.json()["credentials"]["api_key"]
    hostiles = {name: json.dumps(text).encode() for name, text in HOSTILE_TEXTS.items()}
    hostiles.update({f"{n}-deep": b"[" * n + b"]" * n for n in (100, 1_000)})
    for tool in TOOLS:
        for name in tool.definition().input_schema["properties"]:
            for what, hostile in hostiles.items():
                call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": tool.name, "arguments": {**MCP_ARGUMENTS[tool.name], name: None},
                    "_meta": MCP_META}}
                body = with_raw(call, ("params", "arguments", name), hostile)
                headers = [(b"Accept", b"application/json, text/event-stream"),
                           (b"MCP-Protocol-Version", b"2026-07-28"),
                           (b"mcp-method", b"tools/call"), (b"mcp-name", tool.name.encode())]
                status, reply = bystander.beside(f"{tool.name} {name}={what}", functools.partial(
                    send, tenant, "POST", b"/mcp", headers, body, token))
                well(status, f"{tool.name} {name}={what}", reply)
                if status == 200:
                    result = json.loads(reply)["result"]
                    if result.get("isError"):
                        code = result["structuredContent"]["error"]["code"]
                        assert code not in ("internal", "corrupt_record"), (tool.name, name, code)
    assert tenant.snapshot() == before
