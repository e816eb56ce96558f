"""The listening sockets: bound before anything says the broker listens, one per worker."""

from __future__ import annotations

import errno
import socket

from broker.runtime.settings import SettingsError


class PortTaken(SettingsError):
    """The address to listen on is in use."""


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket bound to the address, not listening yet: until a worker's app has started, a
    connection is refused rather than left waiting, so a port that accepts means a broker that
    answers. A port in use is said plainly instead of as `[Errno 98]`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortTaken(f"port {port} on {host} is taken: another program (perhaps another "
                            "broker) is listening there; stop it, or choose another port with "
                            "--port or MEMP_PORT") from None
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def bind_each(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` sockets on one address, one per worker. A plain bind first: a port held by
    anything else, another broker's SO_REUSEPORT group included, is refused as taken rather
    than shared."""
    bind(host, port).close()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(bind(host, port, reuse_port=True))
    except SettingsError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
