"""Storage alone names Redis keys, and its Lua scripts read their KEYS and ARGV only through
readers generated from one definition (broker/storage/scripts.py). Which package may import
which (redis, fakeredis and hiredis included) is declared as import-linter contracts in
pyproject.toml and checked by `lint-imports` in ./scripts/test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from broker.storage import scripts
from broker.storage.amp import CELL_UPDATE
from broker.storage.entries import WRITE

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

BROKER = Path(__file__).resolve().parents[2] / "broker"
STORAGE = BROKER / "storage"


def strings(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(BROKER)))
                                  for p in sorted(BROKER.rglob("*.py"))
                                  if STORAGE not in p.parents])
def test_only_storage_names_redis_keys(path: Path) -> None:
    for text in strings(path):
        assert not text.startswith(("memp:", "memp:{")), f"{path.name} names key {text!r}"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name)
                                  for p in sorted((STORAGE / "lua").glob("*.lua"))])
def test_scripts_read_keys_and_arguments_by_name(path: Path) -> None:
    source = path.read_text()
    assert not re.search(r"\b(ARGV|KEYS)\s*\[", source), f"{path.name} indexes KEYS/ARGV"
    assert not re.search(r"\ba\s*\[\s*\d", source), f"{path.name} indexes arguments by number"


def test_a_definition_packs_by_name_and_refuses_missing_or_unknown_fields() -> None:
    block = scripts.Fields("sample", ("one", "two"), rest="more")
    assert block.pack(one=1, two="x", more=["a", "b"]) == [1, "x", 2, "a", "b"]
    assert block.pack(one=1, two="x", more=None) == [1, "x", -1]
    with pytest.raises(TypeError, match="sample"):
        block.pack(one=1, more=[])
    with pytest.raises(TypeError, match="sample"):
        block.pack(one=1, two=2, three=3, more=[])
    reader = block.lua()
    assert "local function read_sample(t, at)" in reader
    assert "one = t[at + 0], two = t[at + 1]" in reader


@pytest.mark.parametrize("block", [pytest.param(WRITE, id="write"),
                                   pytest.param(CELL_UPDATE, id="cell_update")])
def test_generated_readers_name_every_field_once(block: scripts.Fields) -> None:
    reader = block.lua()
    for position, name in enumerate(block.names):
        assert f"{name} = t[at + {position}]" in reader
    assert len(set(block.names)) == len(block.names)
