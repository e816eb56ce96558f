"""What MEMP reads and change events show of a namespace that a feature built on the core owns
(the AMP namespace: broker/amp/visibility.py). The core asks a `ReadPolicy` that the wiring
passes in, and never imports the feature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from broker.core.grammar import glob_match
from broker.core.models import Entry
from broker.services.auth import Principal

Readers = tuple[str, ...]  # globs of the agents an entry or a change goes to


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who reads a guarded namespace through MEMP: an agent id ("" for none), or anyone's eyes."""

    agent: str
    everything: bool = False

    def may_read(self, globs: Readers) -> bool:
        return self.everything or any(glob_match(glob, self.agent) for glob in globs)


class ReadPolicy(Protocol):
    """A feature's rules for the namespace it guards, as memory reads and the hub ask them."""

    def guards(self, namespace: str) -> bool:
        """Whether the policy applies to `namespace` (otherwise nothing is filtered)."""
        ...

    def refuse_write(self, namespace: str) -> None:
        """Raise when MEMP writes may not reach `namespace`."""
        ...

    def viewer(self, principal: Principal) -> Viewer:
        ...

    def shows(self, viewer: Viewer, entry: Entry, now: int) -> bool:
        """Whether `viewer` may see this version of an entry."""
        ...

    def shown(self, viewer: Viewer, entries: list[Entry], now: int) -> list[Entry]:
        ...

    def history(self, viewer: Viewer, versions: list[Entry], now: int) -> list[Entry] | None:
        """The versions `viewer` may see; None when the entry itself is hidden from it."""
        ...

    def audience(self, entry: Entry, kind: str) -> tuple[Entry, str, Readers]:
        """A change as subscribers get it, and the globs of the agents it goes to."""
        ...
