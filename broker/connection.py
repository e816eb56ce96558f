"""A redis.asyncio connection that packs commands with hiredis (C) instead of pure Python.

Packing a write script's ~30 arguments in Python costs more than the rest of the request's
Redis work; hiredis does it in a few microseconds. Anything hiredis cannot pack falls back to
the library's own packer, so behaviour is unchanged."""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import Connection

# Argument types the library encodes its own way (float repr, bool refused, buffers); checked by
# exact type, which is all the broker passes.
_LIBRARY_PACKS = frozenset((float, bool, memoryview, bytearray))


class HiredisPackingConnection(Connection):
    """TCP connection whose command packing runs in hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        if not _LIBRARY_PACKS.isdisjoint(map(type, args)):
            return super().pack_command(*args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return super().pack_command(*args)
