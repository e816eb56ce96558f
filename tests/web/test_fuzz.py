"""Schemathesis against a real broker over real HTTP, on both stores: every operation of the
served `/openapi.json` but the SSE stream, checked for zero 5xx and zero responses (status,
content type, headers, body) outside the contract.

Deterministic: a fixed seed, derandomized generation, no example database, no shrinking, and
no values fed back from the broker's (random) ids. Instead the broker is given data to find
(an agent, entries, a schema, a cell, keys to revoke), and part of the valid cases are pointed
at it. Each case is sent with credentials picked from the case itself: the admin key, a key
bound to an agent (403 wherever it has no grant), or none or a forged one (401)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core import NOT_SET
from schemathesis.engine import events, from_schema
from schemathesis.generation import GenerationMode

from tests.support.brokers import ADMIN_KEY, BACKENDS, RedisServer, free_port, wait_for_port

NAMESPACE = "my-app"  # the document's example namespace, so its examples find data too
AMP_AGENT = "agent-writer"  # the document's example X-AMP-Agent-ID
SEED = 20261130
EXAMPLES = 30
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance")
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
# Operations that take no input, so every generated request is the same one.
MCP = ("POST /mcp", "GET /mcp", "DELETE /mcp")
NO_INPUT = {"GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.yaml",
            "GET /openapi.json", "GET /docs", "GET /v1/keys", "GET /console"}


@dataclass
class FuzzBroker:
    """`memp-broker serve` in a process of its own: Hypothesis resets the `random` module of the
    process it runs in, and a broker in the same process would share it (and the GIL)."""

    url: str
    backend: str
    log: Path
    process: subprocess.Popen[bytes]

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=15,
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"}, **kwargs)


@pytest.fixture(params=BACKENDS)
def fuzz_broker(request: pytest.FixtureRequest, redis_server: RedisServer | str,
                tmp_path: Path) -> Iterator[FuzzBroker]:
    """A broker of the fuzzer's own: it creates and revokes keys, reconfigures namespaces and
    runs the AMP lifecycle and purge, so on Redis it gets a redis-server of its own too (unless
    MEMP_TEST_REDIS_URL names one)."""
    private = None
    env = {**os.environ, "MEMP_ADMIN_KEY": ADMIN_KEY, "AMP_PURGE_RETENTION": "1"}
    env.pop("MEMP_REDIS_URL", None)
    if request.param == "redis":
        if isinstance(redis_server, str):
            env["MEMP_REDIS_URL"] = redis_server
        else:
            private = RedisServer(free_port(), tmp_path)
            private.start()
            env["MEMP_REDIS_URL"] = private.url
    port = free_port()
    env["MEMP_PORT"] = str(port)
    log = tmp_path / "broker.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--log-level", "warning"],
            env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=20)
        yield FuzzBroker(f"http://127.0.0.1:{port}", request.param, log, process)
    finally:
        process.terminate()
        process.wait(timeout=15)
        if private is not None:
            private.stop()


@dataclass
class Seeded:
    """What the broker holds before the run, and the credentials cases are sent with."""

    agent_token: str = ""  # bound to the agent; read/write on NAMESPACE and on AMP
    agent_id: str = ""
    spare_agent_id: str = ""  # the one the run may remove (removing the other revokes its key)
    cell_id: str = ""
    key_ids: list[str] = field(default_factory=list)  # keys the run may revoke


def _seed(broker: FuzzBroker) -> Seeded:
    """Data for the fuzzer to find, named as in the document's examples: entries under a
    reporting schema, an enforcing one (422) and a merge rule (conflicts), agents, keys and
    a cell."""
    seeded = Seeded()

    def ok(response: httpx.Response) -> Any:
        assert response.status_code in (200, 201), response.text
        return response.json()

    with broker.client() as admin:
        seeded.agent_id = ok(admin.post("/v1/agents", json={
            "name": "my-agent", "framework": "langchain", "namespace": NAMESPACE}))["agent"]["id"]
        seeded.spare_agent_id = ok(admin.post("/v1/agents", json={
            "name": "spare", "namespace": NAMESPACE}))["agent"]["id"]
        seeded.agent_token = ok(admin.post("/v1/keys", json={
            "name": "fuzz agent", "agent_id": seeded.agent_id, "grants": [
                {"namespace": NAMESPACE, "permissions": ["read", "write", "subscribe"]},
                {"namespace": "amp", "permissions": ["read", "write"]}]}))["api_key"]
        seeded.key_ids = [ok(admin.post("/v1/keys", json={
            "name": f"revocable {n}", "grants": [{"namespace": NAMESPACE,
                                                   "permissions": ["read"]}]}))["key"]["id"]
            for n in range(4)]
        ok(admin.put(f"/v1/namespaces/{NAMESPACE}/memory/customer/123",
                     json={"value": {"plan": "pro", "acv": 12000}}))
        ok(admin.put(f"/v1/namespaces/{NAMESPACE}/memory/profile/42",
                     json={"value": {"plan": "free", "seats": 3}}))
        ok(admin.put(f"/v1/namespaces/{NAMESPACE}/schemas/customer", json={
            "pattern": "customer/*", "schema": {
                "type": "object", "required": ["plan"],
                "properties": {"plan": {"enum": ["free", "pro"]}}}}))
        ok(admin.put(f"/v1/namespaces/{NAMESPACE}/schemas/order", json={
            "pattern": "order/*", "enforce": True, "schema": {
                "type": "object", "required": ["total"],
                "properties": {"total": {"type": "number", "exclusiveMinimum": 0}}}}))
        ok(admin.put(f"/v1/namespaces/{NAMESPACE}/config", json={
            "rules": [{"pattern": "profile/*", "strategy": "merge"},
                      {"pattern": "policy/*", "strategy": "agent-priority"}],
            "priorities": [{"agent": seeded.agent_id, "priority": 10}]}))
        seeded.cell_id = ok(admin.post("/amp/memories", headers={"X-AMP-Agent-ID": AMP_AGENT},
                                       json={
            "type": "semantic",
            "content": {"text": "The user prefers Python for backend development",
                        "metadata": {"topic": "languages"}},
            "identity": {"owner_id": "u-7", "owner_type": "user"},
            "access_policy": {"readable_by": ["agent-team-*"]}}))["id"]
    return seeded


def _steer(seeded: Seeded) -> Callable[[Any, Any], Any]:
    """A `map_case` hook. It picks the case's credentials from a checksum of the case, so the
    run stays deterministic: mostly the admin key (acting on AMP as AMP_AGENT unless the case
    names an agent, or sometimes as nobody: 400), often the agent's key, sometimes none or a
    forged one. Half of the valid cases are pointed at the seeded data."""
    known = {"namespace": [NAMESPACE], "key": ["customer/123", "profile/42", "order/7"],
             "agent_id": [seeded.agent_id], "schema_id": ["customer"], "id": [seeded.cell_id],
             "key_id": seeded.key_ids, "file": ["", "js/main.js", "console.css"]}

    def steer(context: Any, case: Any) -> Any:
        body = None if case.body is NOT_SET else case.body
        pick = zlib.crc32(repr((case.operation.label, case.path_parameters, case.query,
                                dict(case.headers or {}), body)).encode())
        bucket, pick = pick % 20, pick // 20
        headers = dict(case.headers or {})
        if bucket == 0:
            headers.pop("Authorization", None)
        elif bucket == 1:
            headers["Authorization"] = "Bearer memp_sk_live_forged"
        elif bucket < 8:
            headers["Authorization"] = f"Bearer {seeded.agent_token}"
        else:
            headers["Authorization"] = f"Bearer {ADMIN_KEY}"
            if case.path.startswith("/amp/") and pick % 5:
                headers.setdefault("X-AMP-Agent-ID", AMP_AGENT)
        case.headers = headers
        positive = case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE
        if positive and case.path_parameters and (pick // 5) % 2:
            for name, values in known.items():
                if name in case.path_parameters:
                    if name == "agent_id" and case.method == "DELETE":
                        values = [seeded.spare_agent_id]
                    case.path_parameters[name] = values[(pick // 10) % len(values)]
        return case

    return steer


def _config() -> SchemathesisConfig:
    checks: dict[str, Any] = {"enabled": False}
    checks.update({name: {"enabled": True} for name in CHECKS})
    no_feedback = {"extra-data-sources": {"responses": False}}
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {"max-examples": EXAMPLES, "deterministic": True, "database": "none",
                       "no-shrink": True, "with-security-parameters": False},
        # Stateful runs follow OpenAPI links, which the document does not declare.
        "phases": {"examples": no_feedback, "coverage": no_feedback, "fuzzing": no_feedback,
                   "stateful": {"enabled": False}},
        "checks": checks,
        # Reproducing a failure needs the Idempotency-Key and tokens the case sent.
        "output": {"sanitization": {"enabled": False}},
    })


@dataclass
class Run:
    """What one schemathesis run saw."""

    cases: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    failures: dict[tuple[str, str, str], str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def record(self, event: Any) -> None:
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            self.cases[recorder.label][event.phase.value] += len(recorder.cases)
            for interaction in recorder.interactions.values():
                if interaction.response is not None:
                    self.statuses[recorder.label][interaction.response.status_code] += 1
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        case = recorder.cases[case_id].value
                        self.failures.setdefault(
                            (recorder.label, check.name, failure.title),
                            f"{failure.message[:1500]}\n{case.as_curl_command()[:1500]}")
            if event.status.value == "error":
                self.errors.append(f"{recorder.label}, {event.phase.value} phase")
        elif isinstance(event, events.NonFatalError):
            self.errors.append(f"{event.label}: {event.info.format()[-3000:]}")
        elif isinstance(event, events.FatalError):
            self.errors.append(f"fatal: {event.exception!r}")

    def total(self, label: str) -> int:
        return sum(self.cases[label].values())

    def report(self) -> str:
        lines = [f"{label}: {self.total(label)} cases {dict(phases)}, "
                 f"statuses {dict(sorted(self.statuses[label].items()))}"
                 for label, phases in sorted(self.cases.items())]
        for (label, check, title), detail in sorted(self.failures.items()):
            lines.append(f"\n--- {label} [{check}] {title}\n{detail}")
        lines.extend(f"\n--- engine error {error}" for error in self.errors)
        return "\n".join(lines)


@pytest.mark.timeout(300)
# Hypothesis notes it when a generated body's repr is huge (a 64 KiB cell text); not a finding.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_fuzz_every_operation(fuzz_broker: FuzzBroker) -> None:
    seeded = _seed(fuzz_broker)
    loaded = schemathesis.openapi.from_url(f"{fuzz_broker.url}/openapi.json", config=_config())
    loaded.config.update(base_url=fuzz_broker.url)
    # Every operation, the document's own too (left out by default); not the SSE stream, which
    # never ends, so no request to it completes (tests/web/test_subscribe.py checks it instead),
    # nor /mcp, whose bodies and replies are MCP's JSON-RPC, served by the `mcp` package and
    # driven by its own client in tests/mcp/test_mcp.py.
    schema = loaded.include(path_regex="^/").exclude(operation_id="subscribe") \
        .exclude(tag="mcp")
    schema.hook("map_case")(_steer(seeded))
    run = Run()
    started = time.monotonic()
    for event in from_schema(schema).execute():
        run.record(event)
    report = f"fuzzed {fuzz_broker.backend} in {time.monotonic() - started:.1f}s\n{run.report()}"
    print(report)
    if run.failures or run.errors:
        pytest.fail(f"{report}\n\n--- broker log\n{fuzz_broker.log.read_text()[-20000:]}",
                    pytrace=False)
    documented = {f"{method.upper()} {path}" for path, item in schema.raw_schema["paths"].items()
                  for method in item if method in HTTP_METHODS}
    assert set(run.cases) == documented - {"GET /v1/subscribe", *MCP}
    few = {label: run.total(label) for label in run.cases
           if run.total(label) < EXAMPLES and label not in NO_INPUT}
    assert not few, f"fewer than {EXAMPLES} cases: {few}"
    # Every operation got past authentication and look-ups at least once, and the run saw
    # both kinds of refusal.
    stopped = {label for label, statuses in run.statuses.items()
               if set(statuses) <= {401, 403, 404, 405}}
    assert not stopped, f"never past 401/403/404: {sorted(stopped)}"
    seen = set().union(*run.statuses.values())
    assert {401, 403} <= seen
