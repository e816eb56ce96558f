"""What the bounded HTTP protocol (broker/runtime/connections.py) costs a request, in process.

`python -m bench.heads` feeds the same kept-alive PUT (the head and a 256-byte JSON body, as
`bench.http` sends them) to uvicorn's `HttpToolsProtocol` and to the broker's `BoundedProtocol`,
with an application that answers at once, and prints the CPU time per request of each: the
parsing and bookkeeping around the application, which is all the subclass changes. Rounds
alternate between the two, and the minimum over rounds is the figure least disturbed by a busy
machine."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from uvicorn import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from broker.runtime.connections import BoundedProtocol, ConnectionLimits, ServerConfig
from broker.runtime.settings import Settings

BODY = b'{"value": "' + b"v" * 256 + b'"}'
REQUEST = (b"PUT /v1/namespaces/bench/memory/bench/key-01234 HTTP/1.1\r\n"
           b"Host: 127.0.0.1:8080\r\nAuthorization: Bearer memp_sk_live_" + b"x" * 43 +
           b"\r\nContent-Type: application/json\r\nContent-Length: " +
           str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class _Transport(asyncio.Transport):
    """A socket that takes every write and never closes by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    pass


def per_request(kind: type[HttpToolsProtocol], config: Config, requests: int) -> float:
    """Microseconds of CPU per request, `requests` fed one read each on one connection."""
    loop = asyncio.new_event_loop()
    state = ServerState()
    protocol = kind(config, state, {}, _loop=loop)
    protocol.connection_made(_Transport())

    def answer(cycle: Any, app: Any) -> None:  # the application replies at once
        cycle.response_complete = True
        protocol.on_response_complete()

    protocol._start_asgi_task = answer  # type: ignore[method-assign]
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
    spent = time.process_time() - started
    if state.total_requests != requests:
        raise RuntimeError(f"{state.total_requests} of {requests} requests were parsed")
    protocol.connection_lost(None)
    loop.close()
    return spent / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.heads", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000, help="per round (20,000)")
    parser.add_argument("--rounds", type=int, default=25, help="per protocol (25)")
    args = parser.parse_args()
    plain = Config(_app, log_config=None)
    bounded = ServerConfig(_app, ConnectionLimits.of(Settings()), log_config=None)
    plain.load()
    bounded.load()
    kinds: dict[str, tuple[type[HttpToolsProtocol], Config]] = {
        "uvicorn HttpToolsProtocol": (HttpToolsProtocol, plain),
        "broker BoundedProtocol": (BoundedProtocol, bounded)}
    figures: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, (kind, config) in kinds.items():
            figures[name].append(per_request(kind, config, args.requests))
    for name, values in figures.items():
        print(f"{name:28} µs/request: min {min(values):6.2f}  median "
              f"{statistics.median(values):6.2f}")


if __name__ == "__main__":
    main()
