"""Entry ids: random version 4 UUIDs in canonical text, fresh in a forked child."""

from __future__ import annotations

import os
import uuid

import pytest

from broker.core.uuids import uuid4

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


def test_entry_ids_are_random_version_4_uuids() -> None:
    ids = [uuid4() for _ in range(1000)]
    assert len(set(ids)) == 1000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    uuid4()  # the pool now holds ids the parent has not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, uuid4().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != uuid4()
