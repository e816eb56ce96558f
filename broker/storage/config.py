"""Namespace configuration and JSON Schema records, kept as the JSON the namespace registry
writes; every change is announced so other processes drop their cached copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from redis.exceptions import WatchError

from broker.storage import bulletins, layout
from broker.storage.client import Redis


class ConfigStore:
    """One namespace's configuration (a JSON document with a revision) and its schemas."""

    def __init__(self, client: Redis) -> None:
        self.redis = client

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
        the update unapplied), then announce it. Returns what was stored."""
        key = layout.config(namespace)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    stored = change(cast(bytes | None, await pipe.get(key)))
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, stored)
                    await pipe.execute()
                    break
                except WatchError:
                    continue
        await bulletins.announce(self.redis, "namespace", namespace)
        return stored

    async def schema_records(self, namespace: str) -> list[bytes]:
        return [cast(bytes, r) for r in await self.redis.hvals(layout.schemas(namespace))]

    async def schema_record(self, namespace: str, schema_id: str) -> bytes | None:
        return cast(bytes | None, await self.redis.hget(layout.schemas(namespace), schema_id))

    async def save_schema(self, namespace: str, schema_id: str, record: bytes) -> None:
        await self.redis.hset(layout.schemas(namespace), schema_id, record)
        await bulletins.announce(self.redis, "namespace", namespace)

    async def delete_schema(self, namespace: str, schema_id: str) -> bool:
        removed = await self.redis.hdel(layout.schemas(namespace), schema_id)
        await bulletins.announce(self.redis, "namespace", namespace)
        return bool(removed)
