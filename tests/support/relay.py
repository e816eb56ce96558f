"""A TCP relay between a client and Redis that a test can cut or reset, to see what the broker
does when a connection dies under it."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import pytest


class RelayProxy:
    """Relays TCP to Redis. `reset()` resets every relayed connection at once; `go_silent()`
    makes them drop what they are sent and reset only then, as a connection that died without
    a word (a NAT or load balancer that forgot it) does; `cut_on()` resets the connection that
    next sends a given command, before Redis gets it or once Redis has answered it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.silent: set[socket.socket] = set()
        self.clients: set[socket.socket] = set()
        self.cut: tuple[bytes, bool] | None = None  # see cut_on
        self.cuts = 0  # connections cut_on has cut
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self.lock:
                self.pairs.append((client, upstream))
                self.clients.add(client)
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if source in self.silent or self._cut_now(source, target, chunk):
                    _reset(source)
                    _reset(target)
                    return
                target.sendall(chunk)
        _reset(target)

    def reset(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)

    def cut_on(self, command: bytes, *, answered: bool) -> None:
        """Reset the next connection that sends `command` (once): at once, so Redis never
        runs it, or (`answered`) once Redis has run it and answers, so the reply is lost."""
        with self.lock:
            self.cut = (command, answered)

    def _cut_now(self, source: socket.socket, target: socket.socket, chunk: bytes) -> bool:
        """Whether `chunk` from a client is the command `cut_on` waits for, to be dropped;
        one to be answered first goes on, and its reply (from `target`) cuts the connection."""
        with self.lock:
            if self.cut is None or source not in self.clients or self.cut[0] not in chunk:
                return False
            answered = self.cut[1]
            self.cut = None
            self.cuts += 1
            if answered:
                self.silent.add(target)
            return not answered

    def go_silent(self) -> None:
        with self.lock:
            self.silent |= {client for client, _ in self.pairs}

    def close(self) -> None:
        self.listener.close()
        self.reset()


def _reset(sock: socket.socket) -> None:
    """Close with an RST, not a FIN (SO_LINGER with a zero timeout); shutting the reading side
    first wakes a thread blocked reading it, which would otherwise keep the socket open."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    sock.close()


# Where a relay cut falls: before Redis ran the command sent, or after (its reply lost).
ANSWERED = [
    pytest.param(False, id="closed-before-redis-ran-it"),
    pytest.param(True, id="closed-after-redis-ran-it"),
]
