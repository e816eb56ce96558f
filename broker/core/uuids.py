"""UUID v4 text from the OS's random source, drawn 4 KiB at a time: `str(uuid.uuid4())` makes
a system call and a UUID object per id, a visible share of a put."""

from __future__ import annotations

import os

_BATCH = 4096


class _Source:
    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def take(self) -> bytearray:
        if self._at + 16 > len(self._pool):
            self._pool, self._at = os.urandom(_BATCH), 0
        chunk = bytearray(self._pool[self._at:self._at + 16])
        self._at += 16
        return chunk


_source = _Source()
# A forked child must not hand out the ids left in its parent's pool.
os.register_at_fork(after_in_child=lambda: setattr(_source, "_pool", b""))


def uuid4() -> str:
    """A random (version 4, RFC 9562 variant) UUID in its canonical text form."""
    raw = _source.take()
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
