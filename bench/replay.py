"""Measuring the broker with pools of requests built in advance (bench.strategies, bench.amp):
start it, register agents, call it, and drive one phase from wrk (bench/replay.lua) or the
asyncio client, with the CPU the server and Redis used meanwhile."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import client, report, servers
from bench.servers import (
    Processes,
    choose_loadgen,
    clean_env,
    cpu_since,
    cpu_snapshot,
    free_port,
    need_redis_server,
    own_cpu,
    run_wrk,
    wait_started,
)

HOST = "127.0.0.1"
REPLAY_SCRIPT = Path(__file__).with_name("replay.lua")


def build(method: str, path: str, token: str = "", body: Any = None,
          headers: dict[str, str] | None = None) -> bytes:
    """One request's bytes; a `body` that is not bytes is encoded as JSON."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(
        body, separators=(",", ":")).encode()
    raw = client.build_request(method, path, token, data)
    if not headers:
        return raw
    head, rest = raw.split(b"\r\n", 1)
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()
    return head + b"\r\n" + extra + rest


@dataclass
class Broker:
    """A running `memp-broker serve` and the processes whose CPU a phase is charged with."""

    proc: subprocess.Popen[bytes]
    port: int
    watch: dict[str, int]
    admin_key: str


@dataclass
class Agent:
    namespace: str
    agent_id: str
    token: str
    key_id: str


def start_broker(procs: Processes, redis_url: str, redis_pid: int | None, admin_key: str,
                 **env: str) -> Broker:
    port = free_port()
    argv = [sys.executable, "-m", "broker.cli", "serve", "--host", HOST, "--port", str(port),
            "--log-level", "warning"]
    proc = procs.start("broker", argv, clean_env(MEMP_ADMIN_KEY=admin_key,
                                                 MEMP_REDIS_URL=redis_url, **env))
    wait_started(procs, proc, port, "broker")
    watch = {"server": proc.pid}
    if redis_pid is not None:
        watch["redis"] = redis_pid
    return Broker(proc, port, watch, admin_key)


def call(broker: Broker, request: bytes, expect: tuple[int, ...] = (200, 201, 204),
         timeout: float = 60.0) -> Any:
    """Send one request on a fresh connection; the decoded JSON reply, or RuntimeError."""
    async def once() -> tuple[int, bytes]:
        return await asyncio.wait_for(client.request_once(HOST, broker.port, request), timeout)

    try:
        status, reply = client.run(once)
    except TimeoutError:
        raise RuntimeError(f"no reply within {timeout:.0f} s to "
                           f"{request.split(b' HTTP/')[0].decode()}") from None
    if status not in expect:
        raise RuntimeError(f"{request.split(b' HTTP/')[0].decode()}: {status} {reply[:400]!r}")
    return json.loads(reply) if reply else None


def register(broker: Broker, namespace: str, name: str) -> Agent:
    """Register an agent with the admin key; the broker is driven with its API key."""
    reply = call(broker, build("POST", "/v1/agents", broker.admin_key,
                               {"name": name, "namespace": namespace}), (201,))
    credentials = reply["credentials"]
    return Agent(namespace, credentials["agent_id"], credentials["api_key"],
                 credentials["key_id"])


def fill(broker: Broker, requests: list[bytes], connections: int = 32) -> None:
    """Send every request once; any non-2xx fails the run."""
    client.run(lambda: client.fill(HOST, broker.port, requests, connections))


def measure_phase(procs: Processes, server: subprocess.Popen[bytes], label: str,
                  watch: dict[str, int], drive: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One measured phase: `drive()` sends the load and returns wrk's (or the asyncio client's)
    figures; to them is added the CPU used meanwhile by the load generator and each watched
    process. Fails if the server (`label`) exited meanwhile."""
    before = cpu_snapshot(watch)
    load_before = own_cpu()
    raw = drive()
    cpu = {"loadgen": own_cpu() - load_before}
    cpu.update(cpu_since(watch, before))
    if server.poll() is not None:
        raise RuntimeError(f"{label} exited while measured:\n{procs.log_tail(server)}")
    return report.phase_result(raw, cpu)


class Driver:
    """Runs measured phases: a pool of requests, sent at random (wrk) or round-robin (the
    asyncio client) over `connections` keep-alive connections for `seconds`."""

    def __init__(self, procs: Processes, loadgen: str, seconds: int) -> None:
        self.procs = procs
        self.loadgen = loadgen
        self.seconds = seconds
        self._pools = Path(tempfile.mkdtemp(prefix="memp-bench-pools-"))

    def close(self) -> None:
        shutil.rmtree(self._pools, ignore_errors=True)

    def phase(self, broker: Broker, requests: list[bytes], connections: int) -> dict[str, Any]:
        def drive() -> dict[str, Any]:
            if self.loadgen == "wrk":
                return self._wrk(broker, requests, connections)
            raw: dict[str, Any] = client.run(lambda: client.load(
                HOST, broker.port, requests, connections, self.seconds))
            return raw

        return measure_phase(self.procs, broker.proc, "the broker", broker.watch, drive)

    def _wrk(self, broker: Broker, requests: list[bytes], connections: int) -> dict[str, Any]:
        pool = self._pools / "pool.bin"
        pool.write_bytes(b"".join(b"%d\n" % len(r) + r for r in requests))
        return run_wrk(self.procs, REPLAY_SCRIPT, f"http://{HOST}:{broker.port}", connections,
                       self.seconds, [str(pool)])


def versions() -> dict[str, str]:
    """The versions bench.strategies and bench.amp report: those of the broker's stack."""
    return report.versions("jsonschema", "deepmerge")


def start_run(load_generator: str, seconds: int) -> tuple[str, Processes, Driver]:
    """The start of a bench.strategies or bench.amp run: check for redis-server, choose the load
    generator, have SIGTERM stop the run as Ctrl-C does; the load generator, the processes to
    start and the driver of measured phases."""
    need_redis_server()
    loadgen = choose_loadgen(load_generator)
    procs = servers.start_run()
    return loadgen, procs, Driver(procs, loadgen, seconds)


def end_run(procs: Processes, driver: Driver) -> None:
    """However the run ends: stop every process it started and drop the request pools."""
    servers.end_run(procs)
    driver.close()
