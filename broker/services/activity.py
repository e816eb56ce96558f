"""Keeps agents' `last_seen` current without a Redis write on every request."""

from __future__ import annotations

from broker.storage.accounts import AccountStore


class AgentActivity:
    """Collects the latest time each agent was seen; `flush` writes them in one pipeline."""

    def __init__(self, store: AccountStore) -> None:
        self.store = store
        self._seen: dict[tuple[str, str], int] = {}

    def seen(self, namespace: str, agent_id: str | None, now: int) -> None:
        if agent_id is not None:
            self._seen[(namespace, agent_id)] = now

    async def flush(self) -> None:
        pending, self._seen = self._seen, {}
        try:
            await self.store.touch_agents(pending)
        except Exception:
            for key, when in pending.items():
                self._seen[key] = max(when, self._seen.get(key, 0))
            raise
