"""Measuring the broker with pools of requests built in advance (bench.strategies, bench.amp):
start it, register agents, call it, and drive one phase from wrk (bench/replay.lua) or the
asyncio client, with the CPU the server and Redis used meanwhile."""

from __future__ import annotations

import asyncio
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

from bench import client, report
from bench.servers import Processes, clean_env, cpu_seconds, free_port, wait_for_port

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
    try:
        wait_for_port(proc, port)
    except RuntimeError as exc:
        raise RuntimeError(f"broker {exc}:\n{procs.log_tail(proc)}") from None
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


def own_cpu() -> float:
    """CPU seconds of this process and its waited-for children (wrk)."""
    me, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


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
        before = {name: cpu_seconds(pid) for name, pid in broker.watch.items()}
        load_before = own_cpu()
        if self.loadgen == "wrk":
            raw = self._wrk(broker, requests, connections)
        else:
            raw = client.run(lambda: client.load(HOST, broker.port, requests, connections,
                                                 self.seconds))
        cpu = {"loadgen": own_cpu() - load_before}
        for name, pid in broker.watch.items():
            start, end = before[name], cpu_seconds(pid)
            if start is not None and end is not None:
                cpu[name] = end - start
        if broker.proc.poll() is not None:
            raise RuntimeError(f"the broker exited while measured:\n"
                               f"{self.procs.log_tail(broker.proc)}")
        return report.phase_result(raw, cpu)

    def _wrk(self, broker: Broker, requests: list[bytes], connections: int) -> dict[str, Any]:
        pool = self._pools / "pool.bin"
        pool.write_bytes(b"".join(b"%d\n" % len(r) + r for r in requests))
        argv = ["wrk", "-t1", f"-c{connections}", f"-d{self.seconds}s", "--timeout", "10s",
                "-s", str(REPLAY_SCRIPT), f"http://{HOST}:{broker.port}", "--", str(pool)]
        proc = self.procs.start("wrk", argv, capture=True)
        try:
            out, _ = proc.communicate(timeout=self.seconds + 60)
        finally:
            self.procs.stop(proc)
        for line in out.decode(errors="replace").splitlines():
            if line.startswith("BENCH_RESULT "):
                result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
                return result
        raise RuntimeError(f"wrk printed no result (status {proc.returncode}):\n{out.decode()}")


def choose_loadgen(choice: str) -> str:
    has_wrk = shutil.which("wrk") is not None
    if choice == "wrk" and not has_wrk:
        raise SystemExit("bench: wrk is not installed (apt-get install -y wrk), or pass "
                         "--load-generator python")
    if choice == "auto" and not has_wrk:
        print("bench: wrk not found (apt-get install -y wrk); using the Python load generator, "
              "which needs a core of its own and may not saturate the server", file=sys.stderr)
        return "python"
    return "wrk" if choice == "auto" else choice


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("uvicorn", "uvloop", "httptools", "starlette", "redis", "hiredis", "msgspec",
                 "jsonschema", "deepmerge"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt

