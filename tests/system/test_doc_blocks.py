"""The code blocks of README.md, docs/ and the SDK READMEs that are meant to run, run as
written, so an example cannot rot. A block is meant to run when its fence says so after the
language (```` ```python run ````, ```` ```sh run ````; Markdown renders it as Python or
shell all the same); blocks with placeholders (a key to paste, a host of yours) are not marked.

One broker serves every block, each block in a namespace of its own. A block finds the
broker as a reader's shell would after the quick start: `MEMP_BASE_URL`, `MEMP_API_KEY` (the
admin key), `MEMP_NAMESPACE`, and for curl `$B` and `$H` (the quick start's variables). The
README's quick start itself runs in test_readme.py; the JavaScript SDK's marked blocks run in
sdk-js/test/readme.test.js."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.brokers import ADMIN_KEY, Broker, start_broker

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "sdk-python" / "README.md", ROOT / "sdk-js" / "README.md"]
BLOCK = re.compile(r"^```(\w+) run\n(.*?)^```$", re.MULTILINE | re.DOTALL)
RUNNERS = {"python": [sys.executable, "-"], "sh": ["bash", "-euo", "pipefail", "-s"]}


def marked() -> list[tuple[str, str, str]]:
    """(where, language, code) of every block marked to run."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1), match.group(2)))
    return found


BLOCKS = [block for block in marked() if block[1] != "js"]


@pytest.fixture(scope="module")
def docs_broker() -> Iterator[Broker]:
    broker = start_broker("embedded", "")
    yield broker
    broker.stop()


def test_the_runnable_blocks_are_found() -> None:
    """The marker is found where the docs use it (a renamed marker would run nothing)."""
    where = {place.split(":")[0] for place, _, _ in marked()}
    assert {"sdk-python/README.md", "docs/conflicts.md", "docs/schemas.md"} <= where, where
    assert {language for _, language, _ in marked()} <= {*RUNNERS, "js"}


@pytest.mark.parametrize(("where", "language", "code"), [
    pytest.param(*block, id=block[0]) for block in BLOCKS])
def test_the_block_runs_as_written(docs_broker: Broker, where: str, language: str,
                                   code: str) -> None:
    namespace = f"docs-{uuid.uuid4().hex[:10]}"
    # The docs' curl examples work in `my-app`, as the quick start does: each block gets its own.
    code = code.replace("my-app", namespace) if language == "sh" else code
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMP_")}
    env |= {"MEMP_BASE_URL": docs_broker.url, "MEMP_API_KEY": ADMIN_KEY,
            "MEMP_NAMESPACE": namespace, "MEMP_ADMIN_KEY": ADMIN_KEY, "B": docs_broker.url,
            "H": f"Authorization: Bearer {ADMIN_KEY}",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    run = subprocess.run(RUNNERS[language], input=code, env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, f"{where}:\n{code}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "Traceback" not in run.stderr
    assert '"error"' not in run.stdout, run.stdout  # a curl example the broker refused
