"""Processes on loopback for tests/support/topologies.py: free ports, one redis-server (or sentinel)
with its config file and log, an ACL user, and stopping by pid."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.waiting import wait_until

HOST = "127.0.0.1"
# A process the tests start is SIGKILLed when the test run dies, so none outlives it
# (PR_SET_PDEATHSIG, kept across exec; util-linux's setpriv sets it).
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


class TopologyError(RuntimeError):
    """A topology did not come up, or did not recover, in time."""


@dataclass(frozen=True)
class Credentials:
    """A Redis ACL user with every permission; the `default` user is switched off beside it."""

    user: str = "memp"
    password: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        # Both go into config files and URLs unquoted: keep them to characters neither escapes.
        for part in (self.user, self.password):
            if not part or not all(c.isalnum() or c in "._-" for c in part):
                raise ValueError("ACL user and password must be letters, digits, '.', '_', '-'")

    def userinfo(self) -> str:
        return f"{quote(self.user)}:{quote(self.password)}@"

    def acl_lines(self) -> list[str]:
        # `default` is off (nobody can log in as it) yet keeps every permission: Redis 7.0
        # checks its permissions when it replays MULTI/EXEC from the append-only file, and a
        # bare `user default off` makes a restart drop every transaction (every broker write).
        return ["user default off ~* &* +@all",
                f"user {self.user} on >{self.password} ~* &* +@all"]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def stop_pid(pid: int, expect: str, timeout: float = 10.0) -> bool:
    """SIGTERM the process `pid` if its command line contains `expect` (so a reused pid is left
    alone), SIGKILL it after `timeout`; False when no such process was running."""
    if expect.encode() not in _cmdline(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.02)
    return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise TopologyError("redis-server is not installed (apt-get install redis-server)")
    return binary


@dataclass
class RedisProcess:
    """One redis-server (data node or sentinel): its port, config file, log and process."""

    name: str
    port: int
    workdir: Path
    config_lines: list[str]
    sentinel: bool = False
    tls: dict[str, Any] = field(default_factory=dict)
    credentials: Credentials | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.workdir / ("sentinel.conf" if self.sentinel else "redis.conf")

    @property
    def log(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, *, detach: bool = False, extra: list[str] | None = None) -> None:
        """Start it (the config file is written the first time only: Redis rewrites its own)
        and wait until it answers PING. `detach` lets it outlive this Python process."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.config.exists():
            self.config.write_text("\n".join(self.config_lines) + "\n")
        argv = [redis_binary(), str(self.config), *(["--sentinel"] if self.sentinel else []),
                *(extra or [])]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv if detach else [*DIE_WITH_PARENT, *argv], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=detach)
        wait_until(self._answers, f"{self.name} on port {self.port}", 10, 0.05,
                   ignoring=(redis.RedisError, OSError))

    def _answers(self) -> bool:
        if not self.running:
            raise TopologyError(f"{self.name} exited; its log:\n{self.log_tail()}")
        with self.client(timeout=0.5) as client:
            return bool(client.ping())

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` and wait until the process is gone."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def client(self, timeout: float = 2.0, **kwargs: Any) -> redis.Redis:
        """A client of this process, authenticated when the topology has an ACL user."""
        auth: dict[str, Any] = {}
        if self.credentials is not None:
            auth = {"username": self.credentials.user, "password": self.credentials.password}
        # No retries: the helpers poll, and a refusal should show at once.
        return redis.Redis(host=HOST, port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=timeout, decode_responses=True,
                           retry=Retry(NoBackoff(), 0), **{**auth, **self.tls, **kwargs})

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as client:
            return dict(client.info(section))

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Certificates:
    """A CA made for one run (trustme), a certificate for 127.0.0.1 and localhost that the
    servers present, and a client certificate, as files in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca_file = directory / "ca.pem"
        self.cert_file = directory / "server.pem"
        self.key_file = directory / "server.key"
        self.client_cert_file = directory / "client.pem"
        self.client_key_file = directory / "client.key"

    def write(self) -> None:
        import trustme

        self.directory.mkdir(parents=True, exist_ok=True)
        authority = trustme.CA()
        authority.cert_pem.write_to_path(str(self.ca_file))
        server = authority.issue_cert(HOST, "localhost")
        server.private_key_pem.write_to_path(str(self.key_file))
        server.cert_chain_pems[0].write_to_path(str(self.cert_file))
        for pem in server.cert_chain_pems[1:]:
            pem.write_to_path(str(self.cert_file), append=True)
        client = authority.issue_cert("memp-broker")
        client.private_key_pem.write_to_path(str(self.client_key_file))
        client.cert_chain_pems[0].write_to_path(str(self.client_cert_file))

    def server_lines(self, port: int, mutual: bool = False) -> list[str]:
        """Config lines for a server (or sentinel) that speaks only TLS on `port`, and TLS to
        the servers it connects to (its primary; a sentinel's servers and sentinels)."""
        return ["port 0", f"tls-port {port}", f"tls-cert-file {self.cert_file}",
                f"tls-key-file {self.key_file}", f"tls-ca-cert-file {self.ca_file}",
                f"tls-auth-clients {'yes' if mutual else 'no'}", "tls-replication yes"]

    def client_options(self, mutual: bool = False) -> dict[str, Any]:
        """redis-py keyword arguments for a client that trusts the CA (and has a certificate
        when the server requires one)."""
        options: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(self.ca_file)}
        if mutual:
            options |= {"ssl_certfile": str(self.client_cert_file),
                        "ssl_keyfile": str(self.client_key_file)}
        return options


def tls_only(process: RedisProcess, certificates: Certificates, mutual: bool = False) -> None:
    """Make `process` (not started yet) speak only TLS on its port."""
    process.config_lines = [line for line in process.config_lines
                            if not line.startswith("port ")] + certificates.server_lines(
        process.port, mutual)
    process.tls = certificates.client_options(mutual)


class Topology(Protocol):
    """What tests and deploy/local use of every topology."""

    processes: list[RedisProcess]

    @property
    def url(self) -> str: ...

    def start(self) -> Self: ...

    def stop(self) -> None: ...


class LoopbackProcesses:
    """Processes started together on loopback, in order, and stopped together by pid."""

    def __init__(self, workdir: Path | None, credentials: Credentials | None,
                 tls: bool = False) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="memp-redis-")) if workdir is None \
            else workdir
        self.credentials = credentials
        # With `tls`, every process speaks only TLS, with certificates made at start().
        self.certificates = Certificates(self.workdir / "certs") if tls else None
        self.processes: list[RedisProcess] = []
        # Let the processes outlive this Python process (deploy/local), rather than die with it.
        self.detach = False

    def _userinfo(self) -> str:
        return self.credentials.userinfo() if self.credentials is not None else ""

    def _data_node(self, name: str, port: int, lines: list[str], *,
                   appendonly: bool = False) -> RedisProcess:
        """A data node: no RDB snapshots; the append-only file (fsync every second) if asked."""
        workdir = self.workdir / name
        config = [f"bind {HOST}", f"port {port}", f"dir {workdir}", 'save ""',
                  f"appendonly {'yes' if appendonly else 'no'}", "appendfsync everysec",
                  # A replica's full sync starts at once instead of waiting 5 s for others.
                  "repl-diskless-sync-delay 0"]
        if self.credentials is not None:
            config += [*self.credentials.acl_lines(), f"masteruser {self.credentials.user}",
                       f"masterauth {self.credentials.password}"]
        process = RedisProcess(name, port, workdir, config + lines, credentials=self.credentials)
        if self.certificates is not None:
            tls_only(process, self.certificates)
        return process

    def _with_ca(self, url: str) -> str:
        """`url` naming the run's CA file as the `ssl_ca_certs` query parameter."""
        if self.certificates is None:
            return url
        separator = "&" if "?" in url else "?"
        return f"{url}{separator}ssl_ca_certs={quote(str(self.certificates.ca_file))}"

    def start(self) -> Self:
        """Start every process in order, then wait until the whole is ready; on any failure
        stop what was started."""
        try:
            if self.certificates is not None and not self.certificates.ca_file.exists():
                self.certificates.write()
            for process in self.processes:
                process.start(detach=self.detach)
            self._settle()
        except BaseException:
            self.stop()
            raise
        return self

    def _settle(self) -> None:
        """Wait until the processes work together (nothing to wait for by default)."""

    def stop(self) -> None:
        """Stop every process by its pid; remove the working directory if this made it."""
        for process in reversed(self.processes):
            process.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.processes if p.pid is not None}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
