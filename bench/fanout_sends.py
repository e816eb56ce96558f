"""What the kernel asks for a lone event, for the fan-out benchmark's `--filtered` table: the CPU
of writing small chunks to many loopback TCP sockets (another process reading them), one write
per event as a filtered stream's rare event goes out, against the same events in one write as
a busy stream's batch goes out. No broker, no HTTP: the floor under either.

`python -m bench.fanout_sends` prints it; `--read PORT` is the reading side, started by it."""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from bench.client import run
from bench.servers import clean_env, free_port, wait_for_port

EVENT = b"x" * 450  # about one change's event of a 256-byte value, chunk framing included


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _write(
    port: int, sockets: int, rounds: int, per_round: int, rate: float
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(sockets):
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transports.append(transport)
    await asyncio.sleep(0.5)
    costs = {}
    for lone in (True, False):
        start, before = loop.time(), _cpu()
        for n in range(rounds):
            chosen = random.sample(transports, per_round)
            if lone:
                for transport in chosen:
                    transport.write(EVENT)
            else:
                chosen[0].write(EVENT * per_round)
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
        costs["lone" if lone else "batched"] = (_cpu() - before) * 1e6 / (rounds * per_round)
    for transport in transports:
        transport.close()
    return costs


def send_costs(
    sockets: int = 1000, rounds: int = 2000, per_round: int = 10, rate: float = 1000.0
) -> dict[str, Any]:
    """CPU µs per event: `per_round` events `rate` times a second, each to a socket of its own
    in its own write (`lone`), or all in one write to one socket (`batched`); the pacing's own
    cost is in both, so their difference is what the extra writes cost."""
    port = free_port()
    reader = subprocess.Popen(
        [sys.executable, "-m", "bench.fanout_sends", "--read", str(port)],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for_port(reader, port)
        costs = run(lambda: _write(port, sockets, rounds, per_round, rate))
    finally:
        reader.terminate()
        reader.wait(10)
    return {
        "sockets": sockets,
        "events_per_round": per_round,
        "rounds": rounds,
        "lone_us_per_event": round(costs["lone"], 2),
        "batched_us_per_event": round(costs["batched"], 2),
        "write_us": round((costs["lone"] - costs["batched"]) * per_round / (per_round - 1), 2),
    }


async def _read(port: int) -> None:
    class Drain(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            pass

    server = await asyncio.get_running_loop().create_server(Drain, "127.0.0.1", port, backlog=4096)
    async with server:
        await asyncio.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout_sends", description=__doc__)
    parser.add_argument("--read", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--sockets", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.read:
        run(lambda: _read(args.read))
        return 0
    started = time.monotonic()
    print(send_costs(args.sockets), f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
