"""`memp-broker serve` without its audit log, for bench.http's "broker (Redis, no audit)"
target only: the same broker, its writes told no audit stream and no content hash, so the same
run measures what the audit log costs a put. Not a setting: the broker has no way to turn its
audit log off."""

from __future__ import annotations

import sys
from typing import Any

from broker import cli
from broker.storage import entries

_write_keys = entries.EntryStore.write_keys


def _without_audit(self: entries.EntryStore, *args: Any) -> list[str]:
    keys = _write_keys(self, *args)
    keys[entries.WRITE_KEYS.names.index("audit")] = ""  # the scripts skip the audit record
    return keys


entries.EntryStore.write_keys = _without_audit  # type: ignore[method-assign, assignment]
entries.content_hash = lambda value: ""

if __name__ == "__main__":
    sys.exit(cli.main())
