"""The glob matcher of the Lua scripts (storage/lua/amp_common.lua) against the definition that
broker/core/grammar.py's matcher is held to (tests/core/test_grammar.py), on the embedded
store's Lua and a real redis-server's, hostile globs included."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.globs import (
    AGENT_CHARS,
    GLOBS_SMALL,
    GLOBS_WIDE,
    HOSTILE_GLOBS,
    TEXTS_SMALL,
    reference_glob,
)

_GLOB_IN_LUA = (resources.files("broker.storage").joinpath("lua", "amp_common.lua").read_text()
                + "return glob_match(ARGV[1], ARGV[2]) and 1 or 0")


@pytest.fixture(scope="module", params=["embedded", "redis"])
def lua_client(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Any]:
    """Where the Lua matcher runs: the embedded store's Lua, and a real redis-server's."""
    client = fakeredis.FakeRedis() if request.param == "embedded" \
        else redis.Redis.from_url(redis_url)
    yield client
    client.close()


@settings(max_examples=300, deadline=None)
@given(glob=st.one_of(GLOBS_SMALL, GLOBS_WIDE),
       text=st.one_of(TEXTS_SMALL, st.text(AGENT_CHARS, max_size=9)))
def test_the_lua_glob_agrees_with_the_definition(lua_client: Any, glob: str, text: str) -> None:
    assert lua_client.eval(_GLOB_IN_LUA, 0, glob, text) == int(reference_glob(glob, text))


@pytest.mark.parametrize(("glob", "text"), [
    pytest.param(*p.values, id=p.id) for p in HOSTILE_GLOBS])
def test_the_lua_glob_refuses_hostile_globs(lua_client: Any, glob: str, text: str) -> None:
    # Redis would answer BUSY to every client while a script ran long; this one answers.
    assert lua_client.eval(_GLOB_IN_LUA, 0, glob, text) == 0
