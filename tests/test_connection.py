"""The hiredis packer must produce exactly the bytes redis-py's own packer does."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection

from broker.connection import HiredisPackingConnection


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("SET", "key", "value"), id="strings"),
        pytest.param(("EVALSHA", "abc", 2, "k1", b"k2", "x\u00e9", 12345678901234, b"\x00\xff"),
                     id="script-call"),
        pytest.param(("CONFIG GET", "maxmemory"), id="two-word-command"),
        pytest.param((b"CLIENT SETNAME", b"x"), id="two-word-bytes"),
        pytest.param(("ZADD", "z", 1.5, "m"), id="float"),
        pytest.param(("SET", "k", memoryview(b"abc")), id="memoryview"),
        pytest.param(("SET", "k", "x" * 100_000), id="large"),
        pytest.param(("XADD", "s", "*", "v", -3), id="negative"),
    ],
)
def test_packing_matches_redis_py(args: tuple[Any, ...]) -> None:
    ours = b"".join(bytes(part) for part in HiredisPackingConnection().pack_command(*args))
    theirs = b"".join(bytes(part) for part in Connection().pack_command(*args))
    assert ours == theirs
