"""The docs hold together: the README's index lists every page of docs/, relative links and
their anchors resolve, every file of the repository they name exists, the API reference names
every path and message type of the contract, and the README stays short enough to be read to
the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, ROOT / "CONTRIBUTING.md", *PAGES, *(ROOT / d / "README.md" for d in (
    "bench", "deploy", "sdk-python", "sdk-js", "tests"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A file of the repository as the docs name it (`broker/web/http.py`, `tests/core/...`).
FILE = re.compile(r"(?<![\w/.-])((?:broker|tests|bench|docs|sdk-python|sdk-js|deploy|scripts)"
                  r"/[\w./-]*\.(?:py|md|yaml|lua|ts|js|mjs|json|toml|sh))\b")


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def anchors(markdown: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", markdown.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_read_to_the_end() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_the_docs_index_lists_every_page_once() -> None:
    index = section(README.read_text(), "Documentation")
    listed = re.findall(r"^- \[[^\]]+\]\((docs/[^)#]+\.md)\)", index, flags=re.MULTILINE)
    assert sorted(listed) == sorted(f"docs/{page.name}" for page in PAGES)


@pytest.mark.parametrize("document", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_their_anchors_resolve(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists() or (anchor and linked.suffix == ".md"
                                   and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, broken


@pytest.mark.parametrize("document", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_the_docs_name_exists(document: Path) -> None:
    """From the repository's root, or from the document's folder (an SDK's README names its
    own `tests/...`)."""
    missing = [path for path in FILE.findall(document.read_text())
               if not (ROOT / path).exists() and not (document.parent / path).exists()]
    assert not missing, missing


def test_the_api_reference_names_every_path_and_message_type() -> None:
    """Each path of openapi.yaml as written there (`{namespace}` as `{ns}`, other ids as
    `{id}`), or as `.../` and its last two or more segments; each message type as a code span."""
    contract = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    reference = (ROOT / "docs" / "api.md").read_text()
    spans = set(re.findall(r"`([^`]+)`", reference))
    missing = []
    for path in contract["paths"]:
        path = re.sub(r"\{(agent_id|key_id|schema_id|proposal_id)\}", "{id}",
                      path.replace("{namespace}", "{ns}"))
        segments = path.split("/")
        forms = [path, *(".../" + "/".join(segments[i:]) for i in range(1, len(segments) - 1))]
        if not any(form in reference for form in forms):
            missing.append(path)
    mapping = contract["components"]["schemas"]["Message"]["discriminator"]["mapping"]
    missing += [kind for kind in mapping if kind not in spans]
    assert not missing, missing
