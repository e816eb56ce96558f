"""broker/web/sse.py leans on sse-starlette's internals: check they are still what it expects."""

from __future__ import annotations

import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from sse_starlette.sse import EventSourceResponse

from broker.web.sse import EventStreamResponse

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_sse_starlette_is_pinned_below_its_next_major() -> None:
    """The broker overrides a private method, which a new major may rename or rework."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in dependencies if Requirement(d).name == "sse-starlette"]
    installed = Version(metadata.version("sse-starlette"))
    assert installed in pin.specifier
    next_major = Version(f"{installed.major + 1}")
    assert next_major not in pin.specifier
    assert any(spec.operator == "<" for spec in pin.specifier)


def test_the_send_method_the_broker_replaces_is_still_there() -> None:
    """A minor release renaming `_send_with_timeout`, or sending without it, would silently
    bring back a timer per event per subscriber."""
    original = inspect.signature(EventSourceResponse._send_with_timeout)
    override = inspect.signature(EventStreamResponse._send_with_timeout)
    assert list(original.parameters) == list(override.parameters) == ["self", "send", "message"]
    events = inspect.getsource(EventSourceResponse._stream_response)
    assert "await self._send_with_timeout(" in events
