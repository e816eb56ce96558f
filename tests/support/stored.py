"""Everything a store holds, read in pipelines (a round trip per thousand keys, not two per
key): for tests that check what a request left behind, or that nothing names a secret."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_BATCH = 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stored(client: Any) -> Iterator[tuple[str, bytes, list[Any]]]:
    """(type, key, the values it holds) for every key: a hash's fields and values, a stream's
    entry ids, fields and values, a sorted set's members; a key that expired since the scan
    named it is left out."""
    keys: list[bytes] = []
    for raw in client.scan_iter(count=_BATCH):
        keys.append(raw if isinstance(raw, bytes) else str(raw).encode())
        if len(keys) == _BATCH:
            yield from _read(client, keys)
            keys = []
    if keys:
        yield from _read(client, keys)


def _read(client: Any, keys: list[bytes]) -> Iterator[tuple[str, bytes, list[Any]]]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = [_text(kind) for kind in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    read = []
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "string":
            pipe.get(key)
        elif kind == "hash":
            pipe.hgetall(key)
        elif kind == "list":
            pipe.lrange(key, 0, -1)
        elif kind == "set":
            pipe.smembers(key)
        elif kind == "zset":
            pipe.zrange(key, 0, -1)
        elif kind == "stream":
            pipe.xrange(key, "-", "+")
        elif kind == "none":
            continue
        else:
            raise AssertionError(f"key {key!r} has a type this check does not read: {kind}")
        read.append((key, kind))
    for (key, kind), value in zip(read, pipe.execute(), strict=True):
        if value is None:  # expired between the two pipelines
            continue
        yield kind, key, _values(kind, value)


def _values(kind: str, value: Any) -> list[Any]:
    if kind == "string":
        return [value]
    if kind == "hash":
        return [part for pair in value.items() for part in pair]
    if kind == "stream":
        return [part for entry_id, fields in value
                for part in (entry_id, *(p for pair in fields.items() for p in pair))]
    return list(value)
