"""`memp-broker` driven as a user would: real processes, real stdout, stderr and exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.cli import usable_cores
from tests.support.brokers import (
    Broker,
    ServeProcesses,
    check_workers_auto,
    free_port,
    wait_for_port,
)

ROOT = Path(__file__).resolve().parents[2]
GARBAGE_PEM = "-----BEGIN PUBLIC KEY-----\nabc\n-----END PUBLIC KEY-----\n"


def clean_env(**env: str) -> dict[str, str]:
    """The caller's environment without any MEMP_* setting (or AMP's), plus `env`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MEMP_") and k != "AMP_PURGE_RETENTION"}
    return {**base, **env}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args], env=clean_env(**env), cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )


def assert_one_line_failure(result: subprocess.CompletedProcess[str], code: int,
                            reason: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("memp-broker: ")
    assert reason in lines[0]


# ---- serve ----


@pytest.mark.parametrize("command", [pytest.param(c, id=" ".join(c)) for c in (
    ["serve"], ["keys"], ["keys", "create"], ["keys", "list"], ["keys", "revoke"])])
def test_every_command_shows_an_example_in_its_help(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    example = result.stdout.split("\nexample:\n", 1)[1]
    assert f"memp-broker {' '.join(command)}" in example


def test_serve_help_names_its_options() -> None:
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    for option in ("--host", "--port", "--redis-url", "--workers", "--tls-cert", "--tls-key"):
        assert option in result.stdout
    assert "MEMP_REDIS_URL" in result.stdout and "MEMP_TLS_CERT" in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "reason"),
    [
        pytest.param([], {"MEMP_PORT": "abc"}, "MEMP_PORT must be a whole number",
                     id="port-not-a-number"),
        pytest.param([], {"MEMP_AMP_PURGE_RETENTION": "maybe"},
                     "MEMP_AMP_PURGE_RETENTION must be one of 1, 0, true, false, yes, no",
                     id="bool-not-a-bool"),
        pytest.param([], {"AMP_PURGE_RETENTION": "1", "MEMP_AMP_PURGE_RETENTION": "0"},
                     "AMP_PURGE_RETENTION='1' and MEMP_AMP_PURGE_RETENTION='0' disagree",
                     id="purge-retention-names-disagree"),
        pytest.param(["--port", "70000"], {}, "port must be between 1 and 65535",
                     id="port-out-of-range"),
        pytest.param([], {"MEMP_REDIS_URL": "http://x"}, "MEMP_REDIS_URL must start with",
                     id="redis-url-scheme"),
        pytest.param(["--redis-url", "http://x"], {}, "MEMP_REDIS_URL must start with",
                     id="redis-url-flag"),
        pytest.param([], {"MEMP_MAX_VALUE_BYTES": "-1"}, "max_value_bytes must be positive",
                     id="negative-value-limit"),
        pytest.param([], {"MEMP_ADMIN_KEY": "short"}, "MEMP_ADMIN_KEY must be at least 16",
                     id="short-admin-key"),
        pytest.param([], {"MEMP_SWEEP_INTERVAL_SECONDS": "nan"}, "must be a finite number",
                     id="nan-interval"),
        pytest.param([], {"MEMP_JWT_PUBLIC_KEY": GARBAGE_PEM}, "MEMP_JWT_PUBLIC_KEY",
                     id="unreadable-public-key"),
        pytest.param(["--workers", "2"], {}, "--workers > 1 needs MEMP_REDIS_URL",
                     id="workers-on-embedded"),
        pytest.param([], {"MEMP_ADMIN_KEY": "k" * 20, "MEMP_ADMIN_KEY_FILE": "/dev/null"},
                     "MEMP_ADMIN_KEY and MEMP_ADMIN_KEY_FILE are both set", id="key-twice"),
        pytest.param([], {"MEMP_REDIS_URL_FILE": "/nonexistent/redis-url"},
                     "MEMP_REDIS_URL_FILE: cannot read /nonexistent/redis-url",
                     id="redis-url-file-missing"),
    ],
)
def test_broken_configuration_stops_serve_with_one_line(
    args: list[str], env: dict[str, str], reason: str
) -> None:
    result = run_cli("serve", *args, **{"MEMP_PORT": str(free_port()), **env})
    assert_one_line_failure(result, 2, reason)
    assert "listening" not in result.stdout


@pytest.fixture
def serve_process() -> Iterator[Callable[..., tuple[subprocess.Popen[str], list[str]]]]:
    """Start `memp-broker serve`; returns the process and its stdout up to where it listens."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> tuple[subprocess.Popen[str], list[str]]:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--log-level", "warning", *args],
            env=clean_env(**env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or ("listening" not in lines[-1] and lines[-1]):
            lines.append(process.stdout.readline())
        return process, lines

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


def test_serve_workers_auto_runs_a_worker_per_core_on_redis(
        serve_processes: ServeProcesses, ns: str) -> None:
    # Worker processes each import the broker before the port answers: slow on a busy host.
    check_workers_auto(serve_processes.start(1, {}, ("--workers", "auto"), timeout=120)[0], ns)


def _tcp_sockets(port: int, state: str) -> set[int]:
    """Inodes of this host's IPv4 TCP sockets with local port `port` in `state` (/proc/net/tcp:
    0A listening, 01 established)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
            inodes.add(int(fields[9]))
    return inodes


def _socket_owners(pids: list[int], inodes: set[int]) -> dict[int, int]:
    """How many of these socket inodes each process holds open."""
    held = {}
    for pid in pids:
        links = (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
        held[pid] = sum(link.startswith("socket:[") and int(link[8:-1]) in inodes
                        for link in links)
    return held


def test_serve_workers_share_connections_opened_at_once(
        serve_processes: ServeProcesses) -> None:
    """Each worker listens on a socket of its own (SO_REUSEPORT), so a burst of connections
    is spread over the workers, not taken by whichever one woke first."""
    broker = serve_processes.start(1, {}, ("--workers", "2"), timeout=120)[0]
    deadline = time.monotonic() + 120
    while len(_tcp_sockets(broker.port, "0A")) < 2:  # both workers listening
        assert time.monotonic() < deadline, "the second worker never listened"
        time.sleep(0.1)
    children = Path(f"/proc/{broker.process.pid}/task/{broker.process.pid}/children")
    workers = [int(pid) for pid in children.read_text().split()
               if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 2, workers
    connections = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(64)]
    try:
        request = b"GET /healthz HTTP/1.1\r\nHost: broker\r\n\r\n"
        for connection in connections:
            connection.sendall(request)
        for connection in connections:  # every one accepted and answered
            assert connection.recv(64).startswith(b"HTTP/1.1 200")
        held = _socket_owners(workers, _tcp_sockets(broker.port, "01"))
        assert sum(held.values()) == 64, held
        # By hash, each worker's share is Binomial(64, 1/2): 16 or fewer for either about one
        # time in 13,000. One shared socket gave 50/14, 62/2 and 64/0.
        assert min(held.values()) > 16, held
    finally:
        for connection in connections:
            connection.close()


def test_serve_workers_auto_on_the_embedded_store_is_one_process(
    serve_process: Callable[..., tuple[subprocess.Popen[str], list[str]]]
) -> None:
    port = free_port()
    _, lines = serve_process("--port", str(port), "--workers", "auto")
    assert "--workers auto: 1 worker process (the embedded store is per process)" in "".join(lines)
    wait_for_port(port, timeout=20)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_serve_refuses_a_worker_count_that_is_not_one(value: str) -> None:
    result = run_cli("serve", "--workers", value, MEMP_PORT=str(free_port()))
    assert result.returncode == 2
    assert "--workers: a number from 1, or auto" in result.stderr


def test_usable_cores_counts_the_cpus_this_process_may_use() -> None:
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def test_serve_on_the_embedded_store_says_where_and_answers(
    serve_process: Callable[..., tuple[subprocess.Popen[str], list[str]]]
) -> None:
    port = free_port()
    process, lines = serve_process("--port", str(port))
    output = "".join(lines)
    assert f"listening on http://127.0.0.1:{port}" in output
    assert "in memory" in output
    found = re.search(r"admin key for this run: (\S+)", output)
    assert found is not None, output
    wait_for_port(port, timeout=20)
    base = f"http://127.0.0.1:{port}"
    health = httpx.get(f"{base}/healthz", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = httpx.get(f"{base}/readyz", timeout=10).json()
    assert ready == {"status": "ready", "store": "embedded"}
    headers = {"Authorization": f"Bearer {found.group(1)}"}
    put = httpx.put(f"{base}/v1/namespaces/cli-demo/memory/customer/123",
                    json={"value": {"plan": "pro"}}, headers=headers, timeout=10)
    assert put.status_code == 201
    assert httpx.get(f"{base}/v1/namespaces/cli-demo/memory/customer/123",
                     headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    process.terminate()
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert process.wait(timeout=15) in (0, -signal.SIGTERM)


def test_serve_uses_the_configured_admin_key_and_host(
    serve_process: Callable[..., tuple[subprocess.Popen[str], list[str]]]
) -> None:
    port = free_port()
    admin_key = "configured-admin-key-0123"
    _, lines = serve_process(MEMP_HOST="127.0.0.1", MEMP_PORT=str(port),
                             MEMP_ADMIN_KEY=admin_key)
    assert len(lines) == 1 and "admin key" not in lines[0]
    assert f"listening on http://127.0.0.1:{port}" in lines[0]
    wait_for_port(port, timeout=20)
    response = httpx.put(f"http://127.0.0.1:{port}/v1/namespaces/cli-demo/memory/k",
                         json={"value": 1}, headers={"Authorization": f"Bearer {admin_key}"},
                         timeout=10)
    assert response.status_code == 201


def test_serve_on_redis_names_redis_without_the_password(
    serve_process: Callable[..., tuple[subprocess.Popen[str], list[str]]], redis_url: str
) -> None:
    port = free_port()
    secret_url = redis_url.replace("redis://", "redis://user:s3cret-pw@", 1)
    process, lines = serve_process(MEMP_PORT=str(port), MEMP_REDIS_URL=secret_url,
                                   MEMP_ADMIN_KEY="configured-admin-key-0123")
    assert "in Redis at" in lines[0]
    assert "s3cret-pw" not in lines[0]
    process.terminate()
    process.wait(timeout=15)


def test_serve_in_production_mode_prints_no_admin_key(
    serve_process: Callable[..., tuple[subprocess.Popen[str], list[str]]], redis_url: str,
    tmp_path: Path
) -> None:
    """Production mode (a Redis URL is set): secrets come from files, the admin key works and
    appears nowhere in the output, and none is made up when none is configured."""
    admin_key = f"memp_admin_{uuid.uuid4().hex}"
    (tmp_path / "admin_key").write_text(f"{admin_key}\n")
    (tmp_path / "redis_url").write_text(f"{redis_url}\n")
    port = free_port()
    process, lines = serve_process(MEMP_PORT=str(port),
                                   MEMP_ADMIN_KEY_FILE=str(tmp_path / "admin_key"),
                                   MEMP_REDIS_URL_FILE=str(tmp_path / "redis_url"))
    assert len(lines) == 1 and "in Redis at" in lines[0] and "admin key" not in lines[0]
    wait_for_port(port, timeout=20)
    response = httpx.get(f"http://127.0.0.1:{port}/v1/keys",
                         headers={"Authorization": f"Bearer {admin_key}"}, timeout=10)
    assert response.status_code == 200
    process.terminate()
    output, _ = process.communicate(timeout=15)
    assert admin_key not in output

    port = free_port()
    _, lines = serve_process(MEMP_PORT=str(port), MEMP_REDIS_URL=redis_url)
    output = "".join(lines)
    assert "admin key for this run" not in output and "memp_admin_" not in output
    # With no token configured at all, every request would be 401: serve says where tokens
    # come from, before it says where it listens.
    assert len(lines) == 2 and "listening on" in lines[1]
    assert "no MEMP_ADMIN_KEY" in lines[0] and "memp-broker keys create" in lines[0]


# ---- what the CLI loads ----


def test_cli_does_not_import_the_http_layer() -> None:
    """`memp-broker keys` needs Redis and the auth rules, not the HTTP routes: the CLI imports
    neither Starlette nor `broker.web` (serve imports the app when it runs)."""
    script = "import json, sys, broker.cli; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], env=clean_env(), cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(result.stdout)
    assert "broker.services.auth" in loaded
    http = [name for name in loaded
            if name.partition(".")[0] in ("starlette", "sse_starlette", "uvicorn")
            or name == "broker.app" or name.startswith("broker.web")]
    assert http == []


# ---- keys ----


def create_key(redis_url: str, *extra: str) -> dict[str, Any]:
    result = run_cli("keys", "create", "--namespace", "acme-*", "--permissions", "read,write",
                     *extra, MEMP_REDIS_URL=redis_url)
    assert result.returncode == 0, result.stderr
    created: dict[str, Any] = json.loads(result.stdout)
    return created


def listed_keys(redis_url: str) -> tuple[str, list[dict[str, Any]]]:
    result = run_cli("keys", "list", MEMP_REDIS_URL=redis_url)
    assert result.returncode == 0, result.stderr
    return result.stdout, [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def redis_broker(broker_factory: Callable[..., Broker]) -> Broker:
    """A broker on the test Redis that looks every API key up afresh (no auth cache)."""
    return broker_factory("redis", auth_cache_seconds=0.0)


def test_keys_create_prints_a_key_that_works(redis_url: str, redis_broker: Broker) -> None:
    created = create_key(redis_url, "--name", "ci")
    api_key = created["api_key"]
    assert api_key.startswith("memp_sk_live_")
    record = created["key"]
    assert record["name"] == "ci" and record["created_by"] == "cli"
    assert record["grants"] == [{"namespace": "acme-*", "permissions": ["read", "write"]}]
    ns = f"acme-{uuid.uuid4().hex[:8]}"
    with redis_broker.client(api_key) as client:
        put = client.put(f"/v1/namespaces/{ns}/memory/customer/1", json={"value": {"a": 1}})
        assert put.status_code == 201
        assert put.json()["agent_id"] == record["id"]
        assert client.get(f"/v1/namespaces/{ns}/memory/customer/1").json()["value"] == {"a": 1}
        other = client.get(f"/v1/namespaces/other-{ns}/memory/customer/1")
        assert other.status_code == 403
        new_key = client.post("/v1/keys", json={"grants": [
            {"namespace": "acme-*", "permissions": ["read"]}]})
        assert new_key.status_code == 403


def test_keys_list_shows_a_key_without_its_secret(redis_url: str) -> None:
    created = create_key(redis_url)
    output, records = listed_keys(redis_url)
    assert created["api_key"] not in output
    mine = [r for r in records if r["id"] == created["key"]["id"]]
    assert mine == [created["key"]]
    assert all("api_key" not in r for r in records)


def test_keys_revoke_removes_the_key(redis_url: str, redis_broker: Broker) -> None:
    created = create_key(redis_url)
    key_id = created["key"]["id"]
    ns = f"acme-{uuid.uuid4().hex[:8]}"
    with redis_broker.client(created["api_key"]) as client:
        assert client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}).status_code == 201
        result = run_cli("keys", "revoke", key_id, MEMP_REDIS_URL=redis_url)
        assert result.returncode == 0, result.stderr
        assert key_id in result.stdout
        assert key_id not in [r["id"] for r in listed_keys(redis_url)[1]]
        refused = client.get(f"/v1/namespaces/{ns}/memory/k")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
    again = run_cli("keys", "revoke", key_id, MEMP_REDIS_URL=redis_url)
    assert_one_line_failure(again, 1, f"no API key {key_id}")


def test_keys_create_can_bind_a_key_to_an_agent(redis_url: str, redis_broker: Broker) -> None:
    agent_id = str(uuid.uuid4())
    created = create_key(redis_url, "--agent-id", agent_id)
    assert created["key"]["agent_id"] == agent_id
    ns = f"acme-{uuid.uuid4().hex[:8]}"
    with redis_broker.client(created["api_key"]) as client:
        put = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
        assert put.status_code == 201 and put.json()["agent_id"] == agent_id


@pytest.mark.parametrize(
    ("args", "env", "code", "reason"),
    [
        pytest.param(["create", "--namespace", "acme-*"], {}, 2, "keys needs MEMP_REDIS_URL",
                     id="create-without-redis"),
        pytest.param(["list"], {}, 2, "keys needs MEMP_REDIS_URL", id="list-without-redis"),
        pytest.param(["create", "--namespace", "acme-*", "--permissions", "read,fly"],
                     {"MEMP_REDIS_URL": "redis"}, 2, "invalid grant", id="unknown-permission"),
        pytest.param(["create", "--namespace", "Acme", "--permissions", "read"],
                     {"MEMP_REDIS_URL": "redis"}, 2, "not a namespace glob", id="bad-namespace"),
        pytest.param(["create", "--namespace", "acme-*", "--permissions", ","],
                     {"MEMP_REDIS_URL": "redis"}, 2, "at least one permission",
                     id="no-permissions"),
        pytest.param(["create", "--namespace", "acme-*", "--agent-id", "two words"],
                     {"MEMP_REDIS_URL": "redis"}, 2, "agent_id must be 1-128 characters",
                     id="agent-id-grammar"),
        pytest.param(["create", "--namespace", "acme-*", "--agent-id", "key_0123"],
                     {"MEMP_REDIS_URL": "redis"}, 2, "reserved for the broker's own identities",
                     id="agent-id-reserved"),
        pytest.param(["list"], {"MEMP_REDIS_URL": "redis://127.0.0.1:1/0"}, 1, "Redis",
                     id="redis-unreachable"),
    ],
)
def test_keys_failures_are_one_line(args: list[str], env: dict[str, str], code: int,
                                    reason: str, redis_url: str) -> None:
    if env.get("MEMP_REDIS_URL") == "redis":
        env = {**env, "MEMP_REDIS_URL": redis_url}
    result = run_cli("keys", *args, **env)
    assert_one_line_failure(result, code, reason)
    assert result.stdout == ""

