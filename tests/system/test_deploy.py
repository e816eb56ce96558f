"""deploy/: the compose file, the image's lock and the systemd unit have the shape they promise,
and deploy/local, driven as an operator would, keeps every acknowledged write and every stream
through HAProxy while a broker is SIGKILLed (and, on sentinel and cluster, a Redis primary)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from packaging.requirements import Requirement

from broker.storage import layout
from broker.storage.urls import parse

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROFILES = ("single", "sentinel", "cluster")


# ---- the files ----


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text()))


def services_of(profile: str) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose()["services"].items()
            if profile in service.get("profiles", ())}


@pytest.mark.parametrize("profile", PROFILES)
def test_each_compose_profile_runs_two_brokers_behind_haproxy(profile: str) -> None:
    services = services_of(profile)
    brokers = {name: s for name, s in services.items() if s.get("image") == "memp-broker"}
    assert len(brokers) >= 2
    for broker in brokers.values():
        assert broker["restart"] == "unless-stopped"
        assert "/healthz" in " ".join(broker["healthcheck"]["test"])
        assert broker["environment"] == {"MEMP_ADMIN_KEY_FILE": "/run/secrets/admin_key",
                                         "MEMP_REDIS_URL_FILE": "/run/secrets/redis_url"}
        targets = {s if isinstance(s, str) else s["target"] for s in broker["secrets"]}
        assert targets == {"admin_key", "redis_url"}
    (lb,) = [s for s in services.values() if str(s.get("image", "")).startswith("haproxy:")]
    assert lb["restart"] == "unless-stopped"
    assert lb["volumes"] == ["./haproxy:/usr/local/etc/haproxy:ro"]
    assert {lb["environment"]["MEMP_BROKER_1"], lb["environment"]["MEMP_BROKER_2"]} == {
        f"{name}:8080" for name in brokers}
    assert set(lb["depends_on"]) == set(brokers)
    for name, service in services.items():
        for needed in service.get("depends_on", {}):
            assert needed in services, f"{name} needs {needed}, not in profile {profile}"
        if "redis" in name and name != "redis-cluster-init":
            assert service["restart"] == "unless-stopped" and "healthcheck" in service, name


def test_every_compose_secret_is_defined_and_made_by_make_secrets() -> None:
    document = compose()
    defined = set(document["secrets"])
    for service in document["services"].values():
        for secret in service.get("secrets", ()):
            assert (secret if isinstance(secret, str) else secret["source"]) in defined
    script = (DEPLOY / "make-secrets").read_text()
    for secret in defined:
        assert f"write {secret} " in script, secret
        assert document["secrets"][secret] == {"file": f"./secrets/{secret}"}


def haproxy() -> str:
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is not installed (./scripts/test installs it)")
    return binary


@pytest.mark.parametrize("variant", ["loopback", "docker-dns", "tls"])
def test_haproxy_configuration_is_valid(variant: str, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "MEMP_LB_BIND": "127.0.0.1:1",
           "MEMP_BROKER_1": "127.0.0.1:2", "MEMP_BROKER_2": "127.0.0.1:3"}
    if variant == "docker-dns":
        env |= {"MEMP_LB_RESOLVER": "127.0.0.11:53", "MEMP_BROKER_1": "broker-1:8080"}
    if variant == "tls":
        import trustme

        leaf = trustme.CA().issue_cert("127.0.0.1")
        leaf.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "memp.pem"))
        env |= {"MEMP_LB_TLS_CERT": str(tmp_path / "memp.pem"), "MEMP_LB_TLS_BIND": "127.0.0.1:4"}
    checked = subprocess.run([haproxy(), "-c", "-f", str(DEPLOY / "haproxy" / "haproxy.cfg")],
                             env=env, capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ALERT" not in checked.stdout + checked.stderr


def test_haproxy_errors_are_the_brokers_unavailable() -> None:
    head, _, body = (DEPLOY / "haproxy" / "errors" / "503.http").read_bytes().partition(
        b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Retry-After"] == "1" and headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body) == {"error": {"code": "unavailable", "details": {},
                                          "message": "no broker could answer; retry"}}


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    text = (DEPLOY / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\", text, flags=re.MULTILINE))
    pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
    assert text.count("==") == len(pins) and len(pins) > 20
    assert len(re.findall(r"--hash=sha256:", text)) >= len(pins)
    assert "--index-url" not in text and "--find-links" not in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in deploy/requirements.lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "--require-hashes -r requirements.lock" in dockerfile
    assert "--no-deps ." in dockerfile


def test_the_build_context_leaves_secrets_out() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore  # nothing enters unless named
    assert [line for line in ignore if line.startswith("!deploy")] == ["!deploy/requirements.lock"]


def test_the_systemd_unit_restarts_and_allows_many_streams() -> None:
    unit = dict(line.split("=", 1) for line in
                (DEPLOY / "memp-broker.service").read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    assert unit["Restart"] == "on-failure" and unit["RestartPreventExitStatus"] == "2"
    assert int(unit["LimitNOFILE"]) >= 65536
    assert unit["Environment"] == "MEMP_ADMIN_KEY_FILE=%d/admin_key"


# ---- deploy/local, driven as an operator would ----


def run_local(*args: str, env: dict[str, str] | None = None,
              timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "local"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_local_help_names_every_command() -> None:
    shown = run_local("--help")
    assert shown.returncode == 0
    for word in ("start", "stop", "status", "single", "sentinel", "cluster"):
        assert word in shown.stdout


class Follower(threading.Thread):
    """A subscriber through the load balancer that reconnects with Last-Event-ID, as the SDKs
    do, and keeps every event it got."""

    def __init__(self, url: str, token: str, namespace: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.namespace = url, token, namespace
        self.events: list[dict[str, Any]] = []
        self.last_id: str | None = None
        self.connections = 0
        self.finish = threading.Event()

    def run(self) -> None:
        while not self.finish.is_set():
            headers = {"Authorization": f"Bearer {self.token}"}
            if self.last_id is not None:
                headers["Last-Event-ID"] = self.last_id
            try:
                with httpx.stream("GET", f"{self.url}/v1/subscribe", headers=headers,
                                  params={"namespace": self.namespace, "pattern": "*"},
                                  timeout=httpx.Timeout(5.0)) as response:
                    if response.status_code == 200:
                        self.connections += 1
                        self.follow(response)
            except httpx.HTTPError:
                pass
            self.finish.wait(0.1)

    def follow(self, response: httpx.Response) -> None:
        event: dict[str, str] = {}
        for line in response.iter_lines():
            if self.finish.is_set():
                return
            if line == "":
                if "data" in event:
                    self.events.append({"event": event.get("event", "message"),
                                        "id": event.get("id"), **json.loads(event["data"])})
                    self.last_id = event.get("id", self.last_id)
                event = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                event[name] = value.removeprefix(" ")

    def keys(self) -> list[str]:
        return [e["key"] for e in self.events if e["event"] == "put"]


class Writer:
    """Writes k/0, k/1, ... through the load balancer, each retried with its Idempotency-Key
    until it is acknowledged (a 503 or a cut connection may have been applied; the retry
    replays it)."""

    def __init__(self, url: str, token: str, namespace: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=5,
                                   headers={"Authorization": f"Bearer {token}"})
        self.namespace = namespace
        self.acknowledged: list[str] = []
        self.retries = 0

    def write(self, count: int) -> None:
        for _ in range(count):
            index = len(self.acknowledged)
            key = f"k/{index}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    response = self.client.put(
                        f"/v1/namespaces/{self.namespace}/memory/{key}",
                        json={"value": {"i": index}}, headers={"Idempotency-Key": f"w-{index}"})
                    if response.status_code in (200, 201):
                        break
                    assert response.status_code in (502, 503, 504), response.text
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"{key} not acknowledged within 30 s"
                self.retries += 1
                time.sleep(0.1)
            self.acknowledged.append(key)


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[Path]:
    """A run dir for deploy/local; whatever was started is stopped by pid afterwards."""
    run_dir = tmp_path / "run"
    yield run_dir
    state_file = run_dir / "state.json"
    if state_file.exists():
        run_local("stop", "--run-dir", str(run_dir), timeout=60)


def redis_primary(state: dict[str, Any], namespace: str, avoid: int = 0) -> dict[str, Any]:
    """The Redis primary holding the namespace's keys, as state.json records it, as the
    sentinels or a cluster node other than `avoid` see it."""
    target = parse(state["redis_url"])
    ports: dict[int, dict[str, Any]] = {
        p["port"]: p for p in state["processes"] if p["role"] == "redis"}
    if target.kind == "sentinel":
        with redis.Redis(port=target.hosts[0][1], username=target.sentinel_username,
                         password=target.sentinel_password,
                         socket_timeout=2) as sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(target.service)
        return ports[int(port)]
    with data_node(state, next(port for port in ports if port != avoid)) as node:
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", layout.changelog(namespace)))
        for low, high, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if low <= slot <= high:
                return ports[int(primary[1])]
    raise AssertionError("no primary owns the namespace's slot")


def data_node(state: dict[str, Any], port: int) -> redis.Redis:
    target = parse(state["redis_url"])
    return redis.Redis(port=port, username=target.username, password=target.password,
                       socket_timeout=2)


def role_of(state: dict[str, Any], port: int) -> str:
    with data_node(state, port) as node:
        return str(node.info("replication")["role"])


def wait_until_promoted(state: dict[str, Any], namespace: str, killed: int) -> None:
    """Wait until another node than `killed` is the namespace's primary."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, KeyError):
            if redis_primary(state, namespace, avoid=killed)["port"] != killed:
                return
        time.sleep(0.1)
    raise AssertionError(f"no replica took over from port {killed}")


def read_through_503s(client: httpx.Client, path: str) -> dict[str, Any]:
    """GET `path` as the SDKs do, retrying a 503 (HAProxy's while its health checks still
    count a broker out after a failover, or a broker's own) for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        reply = client.get(path)
        if reply.status_code != 503 or time.monotonic() > deadline:
            return dict(reply.json())
        time.sleep(0.2)


def check_status_names_roles_and_the_failover(state: dict[str, Any], run_dir: Path) -> None:
    """`status` shows each data node's role, as the node says it, and the exact command that
    fails a primary over."""
    shown = run_local("status", "--run-dir", str(run_dir))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]
            if line.startswith("  ") and " pid " in line}
    for process in state["processes"]:
        if process["role"] == "redis" and state["profile"] != "single":
            said = "primary" if role_of(state, process["port"]) == "master" else "replica of"
            assert said in rows[process["name"]], shown.stdout
        elif process["role"] == "sentinel":
            assert rows[process["name"]].endswith("sentinel"), shown.stdout
    if state["profile"] == "single":
        assert "no replica to fail over to" in shown.stdout
        return
    command = re.search(r"^fail over (\S+), (?:the|a) primary:  kill -9 (\d+)$", shown.stdout,
                        flags=re.MULTILINE)
    assert command, shown.stdout
    [named] = [p for p in state["processes"] if p["name"] == command.group(1)]
    assert named["pid"] == int(command.group(2)) and role_of(state, named["port"]) == "master"
    assert f"deploy/local restart {named['name']} --run-dir {run_dir}" in shown.stdout


@pytest.mark.deploy
@pytest.mark.timeout(180)
@pytest.mark.parametrize("profile", PROFILES)
def test_local_keeps_every_acknowledged_write_and_stream_through_failures(
        profile: str, local_run: Path) -> None:
    haproxy()
    env = {**os.environ, "MEMP_HEARTBEAT_SECONDS": "1", "MEMP_WRITE_REPLICAS": "1"}
    if profile == "single":
        env.pop("MEMP_WRITE_REPLICAS")  # no replica to wait for
    started = run_local("start", profile, "--port", "0", "--failover-ms", "1000",
                        "--stop-after", "170", "--run-dir", str(local_run), env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    state = json.loads((local_run / "state.json").read_text())
    admin_key = (local_run / "admin-key").read_text().strip()
    assert admin_key in started.stdout  # deploy/local prints the key it made; brokers do not
    for process in state["processes"]:
        if process["role"] == "broker":
            assert admin_key not in Path(process["log"]).read_text()
    namespace = f"deploy-{profile}"
    check_status_names_roles_and_the_failover(state, local_run)

    # Two streams: with leastconn they land on different brokers, so killing either broker
    # cuts one of them.
    followers = [Follower(state["url"], admin_key, namespace) for _ in range(2)]
    for follower in followers:
        follower.start()
        deadline = time.monotonic() + 10
        while follower.connections == 0:
            assert time.monotonic() < deadline, "stream did not open"
            time.sleep(0.02)
    writer = Writer(state["url"], admin_key, namespace)
    try:
        writer.write(1)
        wait_for(followers, writer.acknowledged, 10)
        writer.write(20)
        broker = next(p for p in state["processes"] if p["name"] == "broker-1")
        os.kill(broker["pid"], signal.SIGKILL)
        writer.write(20)
        if profile != "single":
            primary = redis_primary(state, namespace)
            os.kill(primary["pid"], signal.SIGKILL)
            # As a supervisor would, bring it back (deploy/local waits for the failover and
            # starts it as a replica): MEMP_WRITE_REPLICAS=1 acknowledges no write until the
            # new primary has a replica again.
            restarted: list[subprocess.CompletedProcess[str]] = []

            def restart_after_failover() -> None:
                wait_until_promoted(state, namespace, primary["port"])
                restarted.append(run_local("restart", primary["name"], "--run-dir",
                                           str(local_run), env=env))

            restarter = threading.Thread(target=restart_after_failover)
            restarter.start()
            writer.write(20)
            restarter.join(timeout=60)
            assert restarted and restarted[0].returncode == 0, restarted
            assert role_of(state, primary["port"]) == "slave"  # a replica took over
        wait_for(followers, writer.acknowledged, 30)
    finally:
        for follower in followers:
            follower.finish.set()
        for follower in followers:
            follower.join(timeout=10)
        writer.client.close()

    with httpx.Client(base_url=state["url"], timeout=10,
                      headers={"Authorization": f"Bearer {admin_key}"}) as client:
        for index, key in enumerate(writer.acknowledged):
            entry = read_through_503s(client, f"/v1/namespaces/{namespace}/memory/{key}")
            assert "value" in entry, (key, entry)
            assert entry["value"] == {"i": index} and entry["version"] == 1, entry
    for follower in followers:
        assert follower.keys() == writer.acknowledged  # each once, in order, none missing
        assert not [e for e in follower.events if e["event"] in ("reset", "overflow")]
    assert sum(f.connections for f in followers) >= 3, "no stream was cut and resumed"

    state = json.loads((local_run / "state.json").read_text())  # with restarted pids
    stopped = run_local("stop", "--run-dir", str(local_run))
    assert stopped.returncode == 0, stopped.stderr
    for process in state["processes"]:
        assert not Path(f"/proc/{process['pid']}").exists() or b"Z" in Path(
            f"/proc/{process['pid']}/stat").read_bytes().rsplit(b")", 1)[1][:3]


def wait_for(followers: list[Follower], keys: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(f.keys()[:len(keys)] != keys for f in followers):
        assert time.monotonic() < deadline, [f.keys()[-3:] for f in followers]
        time.sleep(0.05)
