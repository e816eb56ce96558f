"""Namespace configuration and JSON Schema records, kept as the JSON the namespace registry
writes; every change waits for replicas (`MEMP_WRITE_REPLICAS`) and is announced so other
processes drop their cached copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from broker.storage import layout
from broker.storage.writes import Holds, RecordWriter


class ConfigStore:
    """One namespace's configuration (a JSON document with a revision) and its schemas."""

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.redis = writer.backend.redis

    async def load(self, namespace: str) -> tuple[bytes | None, list[bytes]]:
        """The configuration (None when never set) and every schema record, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(layout.config(namespace))
            pipe.hvals(layout.schemas(namespace))
            config, schemas = await pipe.execute()
        return cast(bytes | None, config), [cast(bytes, r) for r in schemas]

    async def update_config(self, namespace: str, change: Callable[[bytes | None], bytes]
                            ) -> bytes:
        """Replace the configuration with `change(current)`, atomically against other
        writers (it runs again if another process wrote meanwhile; whatever it raises ends
        the update unapplied), and announce it. Returns what was stored."""
        key = layout.config(namespace)
        while True:
            current = cast(bytes | None, await self.redis.get(key))
            stored = change(current)
            if await self.writer.write(("SET", key, stored), only_if=Holds(current),
                                       announce=("namespace", namespace)) is not None:
                return stored

    async def schema_records(self, namespace: str) -> list[bytes]:
        return [cast(bytes, r) for r in await self.redis.hvals(layout.schemas(namespace))]

    async def schema_record(self, namespace: str, schema_id: str) -> bytes | None:
        return cast(bytes | None, await self.redis.hget(layout.schemas(namespace), schema_id))

    async def save_schema(self, namespace: str, schema_id: str, record: bytes) -> None:
        await self.writer.write(("HSET", layout.schemas(namespace), schema_id, record),
                                announce=("namespace", namespace))

    async def delete_schema(self, namespace: str, schema_id: str) -> bool:
        replies = await self.writer.write(("HDEL", layout.schemas(namespace), schema_id),
                                          announce=("namespace", namespace))
        return bool(replies and replies[0])
