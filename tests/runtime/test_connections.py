"""broker/runtime/connections.py against real `memp-broker serve` processes over raw sockets, on
HTTP, HTTPS and with two worker processes: oversized heads are refused with 431 (or 414) and
closed, heads and bodies dribbled past their deadline and connections that send nothing or
idle after a reply are closed, and other clients are served meanwhile."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.brokers import ADMIN_KEY, CertificateAuthority, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # far beyond every deadline below: a connection left open this long is a failure
# Deadlines short enough for tests; what they are for is in docs/security.md.
LIMITS = {"MEMP_HEAD_TIMEOUT_SECONDS": "1", "MEMP_BODY_TIMEOUT_SECONDS": "1",
          "MEMP_KEEP_ALIVE_SECONDS": "1"}


@dataclass
class Served:
    """A broker process and how to reach it."""

    port: int
    context: ssl.SSLContext | None
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://127.0.0.1:{self.port}"

    def connect(self, handshake: bool = True) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT)
        if self.context is None or not handshake:
            return raw
        return self.context.wrap_socket(raw, server_hostname="127.0.0.1")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=WAIT, verify=self.context or True,
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})


@pytest.fixture(scope="module", params=["http", "https", "workers"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           redis_url: str) -> Iterator[Served]:
    """`memp-broker serve` with short deadlines: plain HTTP, HTTPS, and HTTP with two worker
    processes on Redis."""
    port = free_port()
    env = {**os.environ, "MEMP_ADMIN_KEY": ADMIN_KEY, "MEMP_PORT": str(port), **LIMITS}
    args = ["--log-level", "warning"]
    context = None
    if request.param == "https":
        authority = CertificateAuthority(tmp_path_factory.mktemp("tls"))
        args += ["--tls-cert", authority.files.cert, "--tls-key", authority.files.key or ""]
        context = authority.client_context()
    if request.param == "workers":
        env["MEMP_REDIS_URL"] = redis_url
        args += ["--workers", "2"]
    process = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", *args], env=env,
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    handle = Served(port, context, process)
    try:
        wait_for_port(port, timeout=60)
        with handle.client() as client:
            assert client.get("/healthz").status_code == 200
        yield handle
    finally:
        process.terminate()
        process.wait(timeout=30)


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes the connection (a reset after the reply,
    or a TLS connection cut without close_notify, counts as closed)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return received
        if not chunk:
            return received
        received += chunk


def answer_so_far(sock: socket.socket) -> bytes | None:
    """What the broker has sent without waiting for more (b"" once it closed), or None. (A
    readable TLS socket may hold only the broker's session tickets: not an answer.)"""
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except (BlockingIOError, ssl.SSLWantReadError):
        return None
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return b""
    finally:
        sock.settimeout(WAIT)


def send_until_answered(sock: socket.socket, payload: bytes) -> bytes:
    """Send `payload` in pieces until the broker answers or stops reading; then read its
    whole answer."""
    for start in range(0, len(payload), 64 * 1024):
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            first = answer_so_far(sock)
            if first is not None:
                return first + read_to_end(sock) if first else first
        try:
            sock.sendall(payload[start:start + 64 * 1024])
        except OSError:  # it closed the connection: its answer is waiting to be read
            break
    return read_to_end(sock)


def error_of(reply: bytes) -> tuple[int, str]:
    """The status and the error code of an HTTP error reply in the broker's shape."""
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]["code"]


REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.mark.parametrize("payload, status, code", [
    pytest.param(REQUEST + b"X-Big: " + b"a" * (9 * 1024 * 1024), 431, "headers_too_large",
                 id="9-mib-line"),
    pytest.param(REQUEST + b"".join(b"X-%d: y\r\n" % n for n in range(200_000)) + b"\r\n",
                 431, "headers_too_large", id="200000-fields"),
    pytest.param(REQUEST + b"".join(b"X-%d: y\r\n" % n for n in range(100)) + b"\r\n",
                 431, "headers_too_large", id="101-fields"),
    pytest.param(REQUEST + b"X-Big: " + b"a" * (16 * 1024) + b"\r\n\r\n", 431,
                 "headers_too_large", id="field-over-16-kib"),
    pytest.param(b"GET /" + b"a" * (17 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                 "uri_too_long", id="target-over-16-kib"),
    pytest.param(REQUEST + b"".join(b"X-%d: %s\r\n" % (n, b"v" * 8000) for n in range(9))
                 + b"\r\n", 431, "headers_too_large", id="head-over-64-kib"),
])
def test_an_oversized_head_is_refused_and_the_connection_closed(
        served: Served, payload: bytes, status: int, code: str) -> None:
    with served.connect() as sock:
        reply = send_until_answered(sock, payload)
    assert error_of(reply) == (status, code), reply[:300]


def test_a_head_inside_the_limits_is_served(served: Served) -> None:
    """99 fields, one of them 15 KiB (a large token or cookie), pipelined twice."""
    fields = b"".join(b"X-%d: y\r\n" % n for n in range(97)) + b"Cookie: " + b"c" * 15000
    one = REQUEST + fields + b"\r\n\r\n"
    with served.connect() as sock:
        sock.sendall(one + one.replace(b"Host:", b"Connection: close\r\nHost:"))
        reply = read_to_end(sock)
    assert reply.count(b"HTTP/1.1 200 OK") == 2, reply[:300]


def test_a_head_dribbled_past_its_deadline_is_closed(served: Served) -> None:
    """One byte of a header line every 0.2 s: the head never ends, so the broker answers
    408 and closes instead of waiting for ever (slowloris)."""
    with served.connect() as sock:
        sock.sendall(REQUEST)
        deadline = time.monotonic() + WAIT
        reply = None
        while reply is None and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.2)
            reply = answer_so_far(sock) if readable else None
            if reply is None:
                try:
                    sock.sendall(b"x")
                except OSError:
                    reply = b""
        if reply is None:
            pytest.fail("the connection was still open after 30 s of dribbling")
        reply += read_to_end(sock)
    assert error_of(reply) == (408, "request_timeout"), reply[:300]


@pytest.mark.parametrize("handshake", [pytest.param(True, id="connected"),
                                       pytest.param(False, id="no-tls-handshake")])
def test_a_connection_that_sends_nothing_is_closed(served: Served, handshake: bool) -> None:
    if not handshake and served.context is None:
        pytest.skip("plain HTTP has no handshake")
    with served.connect(handshake) as sock:
        assert read_to_end(sock) == b""  # closed, without a word (within WAIT, or it raises)


def test_an_idle_kept_alive_connection_is_closed(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(REQUEST + b"\r\n")
        reply = read_to_end(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK") and reply.count(b"HTTP/1.1") == 1


def test_a_kept_alive_connection_sending_only_blank_lines_is_closed(served: Served) -> None:
    """Blank lines between requests do not start a head; they must not stop the idle timer
    either (uvicorn's keep-alive timer is cancelled by any bytes and armed again only by a
    reply)."""
    with served.connect() as sock:
        sock.sendall(REQUEST + b"\r\n")
        time.sleep(0.2)
        sock.sendall(b"\r\n")
        reply = read_to_end(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK")


def test_a_body_dribbled_past_its_deadline_is_closed(served: Served) -> None:
    head = (b"PUT /v1/namespaces/conn/memory/slow HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n\r\n")
    with served.connect() as sock:
        sock.sendall(head + b'{"value": "')
        reply = read_to_end(sock)
    assert error_of(reply) == (408, "request_timeout"), reply[:300]
    with served.client() as client:
        assert client.get("/v1/namespaces/conn/memory/slow").status_code == 404


def test_other_clients_are_served_while_hostile_connections_wait(served: Served) -> None:
    """40 connections that send nothing or dribble a head, while others write and read; every
    hostile connection is closed in the end."""
    hostile = [served.connect() for _ in range(20)]
    dribbling = [served.connect() for _ in range(20)]
    try:
        for sock in dribbling:
            sock.sendall(REQUEST[:20])
        with served.client() as client:
            for n in range(10):
                for sock in dribbling:
                    with contextlib.suppress(OSError):  # closed already: its deadline passed
                        sock.sendall(b"x")
                key = f"/v1/namespaces/conn/memory/bystander-{served.port}-{n}"
                assert client.put(key, json={"value": n}).status_code in (200, 201)
                assert client.get(key).json()["value"] == n
        for sock in hostile + dribbling:
            read_to_end(sock)  # returns once the broker closed it (else WAIT raises)
    finally:
        for sock in hostile + dribbling:
            sock.close()


# ---- in process: a stall of the broker's own is not the client's fault ----


def test_an_upgrade_request_is_served_as_http(served: Served) -> None:
    """The broker upgrades to nothing (no WebSocket, no h2c): such a request is answered as
    HTTP/1.1, and its connection then closes like any idle one, out of no limit's reach."""
    with served.connect() as sock:
        sock.sendall(REQUEST + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZQ==\r\n\r\n")
        reply = read_to_end(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:200]
