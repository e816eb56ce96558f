"""The README's quick start, run as written against a fresh broker, so it cannot rot.

Every ```sh block between "## Quick start" and the next section runs, in order, in one bash
with `set -euo pipefail`, except the install line (this environment is installed already: a
`.venv` beside the script points at it). `MEMP_PORT` picks a free port, which the quick start
reads as it says."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.brokers import free_port

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> list[str]:
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def test_the_quick_start_has_the_blocks_a_user_needs() -> None:
    blocks = quick_start()
    assert "pip install" in blocks[0]
    script = "\n".join(blocks)
    assert "jq -r .credentials.api_key" in script  # the key is captured, not copied by hand
    assert script.count("memp-broker serve") == 1  # one broker, never a second on the port
    assert "kill $BROKER" in script


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("curl") is None,
                    reason="the quick start needs curl and jq (scripts/test installs jq)")
def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    blocks = [b for b in quick_start() if "pip install" not in b]
    script = "set -euo pipefail\n" + "\n".join(blocks)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMP_")}
    env["MEMP_PORT"] = str(free_port())
    process = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=90)
    finally:
        # Whatever the script left running (the broker, if it failed before `kill`).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert '"plan":"pro"' in out.replace(" ", "")  # the put and the get
    assert "event: snapshot" in out and "event: snapshot-end" in out  # the stream
    assert "'plan': 'pro'" in out  # the Python SDK, with the key the quick start made
    assert "Traceback" not in err


def test_the_javascript_sdk_is_built_before_it_is_installed() -> None:
    """The package's entry points are compiled into `sdk-js/dist/`, which git ignores: an
    `npm install ./sdk-js` the README asks for must come after the build, or the import fails
    with ERR_MODULE_NOT_FOUND."""
    root = README.parent
    package = json.loads((root / "sdk-js" / "package.json").read_text())
    assert package["main"].startswith("./dist/")
    assert "dist/" in (root / ".gitignore").read_text().split()
    for doc in (README, root / "sdk-js" / "README.md"):
        for paragraph in doc.read_text().split("\n\n"):
            if "npm install ./sdk-js" in paragraph:
                build = paragraph.find("npm run build")
                assert 0 <= build < paragraph.index("npm install ./sdk-js"), (doc, paragraph)


def test_the_paths_served_without_a_token_are_the_ones_the_docs_name() -> None:
    """docs/authentication.md and the API reference (/docs) name every path the contract
    serves without a token (`security: []` in openapi.yaml)."""
    import yaml

    root = README.parent
    contract = yaml.safe_load((root / "openapi.yaml").read_text())
    public = {path for path, operations in contract["paths"].items()
              for operation in operations.values()
              if isinstance(operation, dict) and operation.get("security") == []}
    authentication = (root / "docs" / "authentication.md").read_text()
    for text in (authentication, contract["info"]["description"]):
        sentence = re.sub(r"\s+", " ", text.split("Every request except", 1)[1].split(
            "carries", 1)[0])
        named = set(re.findall(r"`(/[^`]*)`", sentence))
        named = {p for p in public if p in named or any(
            n.endswith("*") and p.startswith(n[:-1]) for n in named)}
        assert named == public, sorted(public - named)
