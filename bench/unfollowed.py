"""`python -m bench.unfollowed serve ...`: `memp-broker` as it was before it followed Sentinel's
word, for `python -m bench.faults --unfollowed`, to show what that costs.

The broker's Sentinel clients (broker/storage/sentinel.py) are replaced by redis-py's own:
the primary is asked of the sentinels only when a connection opens, pooled connections keep
writing to whatever node they reached, no `ROLE` check, and `+switch-master` is not listened
to. Nothing else changes. Never for production: this exists only to measure the old loss."""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from broker.storage import sentinel


async def _deaf(self: sentinel.Follower) -> None:
    """Never hears a failover announced."""
    await asyncio.Event().wait()


def _plain_client(self: sentinel.Follower) -> aioredis.Redis:
    """redis-py's client of the primary, with its own pool and connections."""
    client: aioredis.Redis = self.sentinel.master_for(self.service)
    return client


def unfollow() -> None:
    sentinel.Follower.run = _deaf  # type: ignore[method-assign]
    sentinel.Follower.client = _plain_client  # type: ignore[method-assign]


if __name__ == "__main__":
    unfollow()
    from broker.cli import main

    sys.exit(main())
