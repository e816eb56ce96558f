"""The review console at /console: the files the broker serves (offline, CSP), and sessions in
a real headless Chromium (Debian's `chromium`, driven by Playwright) against a real broker on
Redis. Screenshots of every screen go to MEMP_CONSOLE_ARTIFACTS (default artifacts/console/)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.web.console.routes import CSP, load_files
from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    free_port,
    load_yaml,
    start_broker,
    wait_for_port,
)
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "broker" / "web" / "console" / "static"
ARTIFACTS = Path(os.environ.get("MEMP_CONSOLE_ARTIFACTS") or ROOT / "artifacts" / "console")
# A reference that would make the browser fetch from elsewhere (a CDN, a font service...).
REMOTE = re.compile(r"""(?:src|href)=["']https?:|url\(\s*['"]?https?:|import\s*\(?\s*['"]https?:""")
GOVERNANCE = "/v1/namespaces/{namespace}/proposals" in load_yaml(
    (ROOT / "openapi.yaml").read_text())["paths"]


# ---- the files, over HTTP ----


def test_console_redirects_and_serves_its_page_with_a_strict_policy(broker: Broker) -> None:
    with broker.client(token=None) as client:
        moved = client.get("/console")
        assert moved.status_code == 308
        assert moved.headers["location"] == "/console/"
        page = client.get("/console/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe" not in CSP
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<title>MEMP console</title>" in page.text


def test_every_asset_the_page_names_is_served_and_none_is_remote(broker: Broker) -> None:
    """No CDN: every script, style and icon is a file of the package, served by the broker."""
    with broker.client(token=None) as client:
        html = client.get("/console/").text
        assets = re.findall(r'(?:src|href)="([^"#]+)"', html)
        assert "/console/vendor/memp-sdk.js" not in assets  # loaded by main.js, checked below
        for asset in assets:
            assert asset.startswith("/console/"), asset
            assert client.get(asset).status_code == 200, asset
        for name in load_files():
            if name.endswith(".js"):
                text = (STATIC / name).read_text()
                for target in re.findall(r"""^import .*? from ['"]([^'"]+)['"]""", text, re.M):
                    assert target.startswith("."), f"{name} imports {target}"
                    resolved = (STATIC / name).parent.joinpath(target).resolve()
                    assert resolved.is_file(), f"{name} imports a missing {target}"
    for path in STATIC.rglob("*"):
        if path.suffix in {".html", ".css", ".js"}:
            text = path.read_text()
            assert not REMOTE.search(text), f"{path.name} loads something remote"
            assert "<script>" not in text and " style=" not in text, f"{path.name}: inline code"


def test_package_data_ships_every_console_file() -> None:
    """A wheel (not only an editable install) carries the whole console."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["broker.web.console"]
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert any(fnmatch.fnmatch("broker.web.console", pattern) for pattern in include)
    files = [p.relative_to(STATIC.parent).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/")
                   for g in globs), f"{name} is not in package-data"
    assert set(load_files()) - {""} == {f.removeprefix("static/") for f in files}


@pytest.mark.parametrize("path", [
    pytest.param("/console/nope.js", id="unknown"),
    pytest.param("/console/..%2fopenapi.yaml", id="dot-dot-slash"),
    pytest.param("/console/%2e%2e/app.py", id="encoded-dot-dot"),
    pytest.param("/console/js/%2e%2e/%2e%2e/routes.py", id="deep-dot-dot"),
    pytest.param("/console//etc/passwd", id="absolute"),
    pytest.param("/console/js", id="directory"),
    pytest.param("/console/index.html%00.js", id="nul"),
    pytest.param("/console/" + "a" * 5000, id="long"),
    pytest.param("/console/%ff%fe", id="not-utf8"),
])
def test_hostile_paths_get_404_and_nothing_else(broker: Broker, path: str) -> None:
    with broker.client(token=None) as client:
        reply = client.get(path)
        assert reply.status_code == 404, path
        assert reply.json()["error"]["code"] == "not_found"
        assert client.get("/healthz").status_code == 200


def test_unchanged_files_answer_304_and_need_no_token(broker: Broker) -> None:
    with broker.client(token="not-a-key") as client:
        first = client.get("/console/js/main.js")
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/javascript")
        again = client.get("/console/js/main.js", headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        assert client.post("/console/").status_code == 405
        # The page is public; the data is not: the same token is refused by the API.
        assert client.get("/v1/namespaces/x/memory").status_code == 401


def test_memp_console_0_turns_it_off(broker_factory: Callable[..., Broker]) -> None:
    off = broker_factory("embedded", console=False)
    with off.client(token=None) as client:
        assert client.get("/console/").status_code == 404
        assert client.get("/console").status_code == 404
        assert client.get("/healthz").status_code == 200


def test_the_pure_modules_with_node() -> None:
    """Diffs, patches and patterns (tests/web/console_units.mjs), in Node.js's own test runner."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run tests/web/console_units.mjs (Node.js 20+, as for sdk-js)")
    run = subprocess.run([node, "--test", str(ROOT / "tests" / "web" / "console_units.mjs")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


# ---- in the browser ----


def browser_test(test: Callable[..., None]) -> Callable[..., None]:
    """A test in Chromium (marker `browser`); under pytest-xdist they share one worker (the
    file's tests are one group: tests/conftest.py), so one Chromium and one broker serve them
    all."""
    marked: Callable[..., None] = pytest.mark.xdist_group("console")(pytest.mark.browser(test))
    return marked


def chromium() -> str | None:
    """The system Chromium: MEMP_CHROMIUM, else `chromium` (Debian) or `chromium-browser`."""
    named = os.environ.get("MEMP_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class ConsoleBroker:
    """`memp-broker serve` on the test Redis, on a port that survives a restart."""

    redis_url: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "MEMP_REDIS_URL": self.redis_url, "MEMP_ADMIN_KEY": ADMIN_KEY,
               "MEMP_PORT": str(self.port), "MEMP_HEARTBEAT_SECONDS": "2"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=15)
            self.process = None

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    def key(self, *grants: tuple[str, list[str]]) -> str:
        with self.admin() as client:
            reply = client.post("/v1/keys", json={"name": "console test", "grants": [
                {"namespace": ns, "permissions": perms} for ns, perms in grants]})
            assert reply.status_code == 201, reply.text
            return str(reply.json()["api_key"])

    def put(self, namespace: str, key: str, value: Any) -> dict[str, Any]:
        with self.admin() as client:
            reply = client.put(f"/v1/namespaces/{namespace}/memory/{key}", json={"value": value})
            assert reply.status_code in (200, 201), reply.text
            return dict(reply.json())


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium()
    if executable is None:
        pytest.skip("no chromium to drive: `apt-get install -y chromium` (scripts/test does) "
                    "or set MEMP_CHROMIUM to a Chromium executable")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def site(redis_url: str) -> Iterator[ConsoleBroker]:
    server = ConsoleBroker(redis_url)
    server.start()
    yield server
    server.stop()


@dataclass
class Session:
    """One browser tab on the console, recording what a test must check afterwards."""

    page: Any
    site: ConsoleBroker | Broker
    requests: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def sign_in(self, key: str, namespace: str) -> None:
        self.page.goto(self.site.url + "/console")
        self.page.get_by_label("API key").fill(key)
        self.page.locator("#signin-ns").fill(namespace)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_selector("#app:not([hidden])")

    def live(self) -> None:
        self.page.wait_for_selector('#stream[data-state="open"]')

    def key_row(self, label: str) -> Any:
        return self.page.locator("#keys li button", has=self.page.locator(
            ".name", has_text=re.compile(rf"^{re.escape(label)}")))

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def tab(browser: Any, site: ConsoleBroker) -> Iterator[Callable[..., Session]]:
    """Open console tabs (1280x800 and `site` unless told); each must end with no CSP violation, no
    script error, and no request that carries the key in its URL or leaves the broker."""
    opened: list[tuple[Any, Session]] = []

    def factory(width: int = 1280, height: int = 800,
                on: ConsoleBroker | Broker | None = None) -> Session:
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        session = Session(page, on or site)
        page.on("request", lambda request: session.requests.append(request))
        page.on("pageerror", lambda error: session.problems.append(f"page error: {error}"))
        page.on("console", lambda message: session.problems.append(message.text)
                if "Content Security Policy" in message.text or "Trusted Type" in message.text
                else None)
        opened.append((context, session))
        return session

    yield factory
    for context, session in opened:
        context.close()
        assert session.problems == []
        for request in session.requests:
            assert request.url.startswith(session.site.url + "/"), request.url
            assert "memp_sk_" not in request.url and ADMIN_KEY not in request.url


def ns() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def register_agent(site: ConsoleBroker, space: str, name: str) -> tuple[str, str]:
    """A registered agent's id and API key."""
    with site.admin() as admin:
        reply = admin.post("/v1/agents", json={"name": name, "namespace": space})
        assert reply.status_code == 201, reply.text
        return str(reply.json()["agent"]["id"]), str(reply.json()["credentials"]["api_key"])


def wipe(site: ConsoleBroker, space: str) -> None:
    """Every Redis key of the namespace gone, as after a Redis that lost its data."""
    import redis

    with redis.Redis.from_url(site.redis_url) as client:
        doomed = list(client.scan_iter(match=f"memp:{{{space}}}:*", count=1000))
        assert doomed
        client.delete(*doomed)


@browser_test
def test_sign_in_browse_and_see_a_write_from_outside_live(tab: Callable[..., Session],
                                                          site: ConsoleBroker) -> None:
    space = ns()
    for key in ("customer/1/profile", "customer/2/profile", "orders/7", "readme"):
        site.put(space, key, {"key": key})
    key = site.key((space, ["read", "subscribe"]))
    session = tab()
    session.sign_in(key, space)
    page = session.page
    session.live()
    assert page.locator("#who").inner_text().startswith("API key memp_sk_")
    assert key not in page.content()
    stored = page.evaluate("JSON.stringify(sessionStorage)")
    assert key in stored and page.evaluate("localStorage.length") == 0
    assert session.key_row("customer/").inner_text().endswith("2 keys")
    session.shot("01-signed-in")

    written = time.monotonic()
    site.put(space, "late/arrival", {"hello": "world"})
    session.key_row("late/").wait_for()
    seen = time.monotonic() - written
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "live-latency.txt").write_text(f"{seen:.3f} s from PUT to the key shown\n")
    # The requests carried the key as a Bearer token, never in a URL (checked at teardown).
    api = [r for r in session.requests if "/v1/" in r.url]
    assert api and all(r.headers.get("authorization") == f"Bearer {key}" for r in api)
    session.shot("02-live-write")


@browser_test
def test_entry_history_and_a_diff_between_any_two_versions(tab: Callable[..., Session],
                                                           site: ConsoleBroker) -> None:
    space = ns()
    site.put(space, "doc", {"title": "one", "tags": ["a"]})
    site.put(space, "doc", {"title": "two", "tags": ["a", "b"]})
    site.put(space, "doc", {"title": "three", "owner": "ann"})
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe"])), space)
    page = session.page
    session.key_row("doc").click()
    page.wait_for_selector("#entry h3")
    details = page.locator("#entry dl").inner_text()
    assert "Version\n3" in details.replace("\t", "\n") and "admin" in details
    assert '"owner": "ann"' in page.locator("#entry pre.value").inner_text()
    page.get_by_role("button", name="Show history").click()
    page.wait_for_selector("#history-diff")
    assert "version 2 → version 3" in page.locator("#history-diff").inner_text()
    page.get_by_label("From version 1").check()
    page.get_by_label("To version 2").check()
    diff = page.locator("#history-diff")
    assert "version 1 → version 2" in diff.inner_text()
    assert 'replace /title = "two"' in diff.inner_text()
    assert "add /tags/1" in diff.inner_text() or "replace /tags" in diff.inner_text()
    assert page.locator("#history-diff .diff .del").count() >= 1
    session.shot("03-history-diff")

    # The open entry follows a write from outside.
    site.put(space, "doc", {"title": "four"})
    page.wait_for_selector("text=Updated live: put to version 4.")
    assert '"title": "four"' in page.locator("#entry pre.value").inner_text()


@browser_test
def test_entry_shows_ttl_schema_flags_and_merge_conflicts(tab: Callable[..., Session],
                                                          site: ConsoleBroker) -> None:
    space = ns()
    with site.admin() as admin:
        assert admin.put(f"/v1/namespaces/{space}/config", json={
            "strategy": "merge"}).status_code == 200
        assert admin.put(f"/v1/namespaces/{space}/schemas/plan", json={
            "pattern": "acct/*", "schema": {"type": "object", "required": ["plan"]}}
        ).status_code in (200, 201)
        admin.put(f"/v1/namespaces/{space}/memory/acct/1", json={"value": {"a": 1}})
        admin.put(f"/v1/namespaces/{space}/memory/acct/1", json={"value": {"a": 2}})
        admin.put(f"/v1/namespaces/{space}/memory/acct/1",
                  json={"value": {"a": 3}, "base_version": 1})
        admin.put(f"/v1/namespaces/{space}/memory/ttl", json={"value": 1, "ttl_seconds": 3600})
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe"])), space)
    page = session.page
    session.key_row("acct/").click()
    session.key_row("1").click()
    page.wait_for_selector("#entry h3")
    text = page.locator("#entry").inner_text()
    assert "violates its schema" in text and "Schema errors" in text
    assert "Merge conflicts" in text and "/a" in text
    session.shot("04-entry-flags")
    page.locator("#crumbs button", has_text="(root)").click()
    session.key_row("ttl").click()
    page.wait_for_selector("#entry h3:text('ttl')")
    assert "3600 s, expires" in page.locator("#entry").inner_text()


@browser_test
def test_a_key_never_shows_another_namespace(tab: Callable[..., Session],
                                             site: ConsoleBroker) -> None:
    mine, theirs = ns(), ns()
    site.put(mine, "visible/one", {"note": "mine"})
    site.put(theirs, "hidden/secret", {"note": "classified-payload"})
    key = site.key((mine, ["read", "subscribe", "write"]))
    session = tab()
    session.sign_in(key, mine)
    page = session.page
    session.live()
    site.put(theirs, "hidden/later", {"note": "classified-payload"})
    site.put(mine, "visible/two", {"note": "mine"})
    session.key_row("visible/").wait_for()
    page.wait_for_selector("#keys li button:has-text('2 keys')")
    assert "classified" not in page.content() and "hidden" not in page.locator("#keys").inner_text()

    # Asking for the other namespace shows the refusal, and nothing of its data.
    page.locator("#ns-input").fill(theirs)
    page.get_by_role("button", name="Open").click()
    page.wait_for_selector(f"text=This key may not read namespace {theirs}.")
    page.wait_for_selector('#stream[data-state="refused"]')
    page.locator("#tab-proposals").click()
    page.wait_for_selector("#proposals p.notice")
    page.locator("#tab-audit").click()
    page.wait_for_selector("#audit p.notice")
    assert "classified" not in page.content() and "hidden/secret" not in page.content()
    session.shot("05-other-namespace-refused")


@browser_test
def test_a_key_without_review_sees_no_queue(tab: Callable[..., Session],
                                            site: ConsoleBroker) -> None:
    space = ns()
    session = tab()
    session.sign_in(site.key((space, ["read", "write", "subscribe"])), space)
    page = session.page
    page.locator("#tab-proposals").click()
    if GOVERNANCE:
        page.wait_for_selector("#proposals-denied")
        assert "no review permission" in page.locator("#proposals-denied").inner_text()
        assert page.locator("#proposals-empty").is_visible()  # none of its own either
    else:
        page.wait_for_selector("#proposals-missing")
        assert "no governance routes" in page.locator("#proposals-missing").inner_text()
    assert page.locator("#proposals table").count() == 0
    assert page.get_by_role("button", name="Approve").count() == 0
    session.shot("06-proposals-no-queue")
    page.locator("#tab-audit").click()
    page.wait_for_selector("#audit-denied" if GOVERNANCE else "#audit-missing")
    assert page.locator("#audit table").count() == 0
    session.shot("07-audit-no-access")


@browser_test
@pytest.mark.skipif(not GOVERNANCE, reason="this broker has no governance routes (issue 16)")
def test_approve_one_proposal_and_reject_another(tab: Callable[..., Session],
                                                 site: ConsoleBroker) -> None:
    space = ns()
    with site.admin() as admin:
        assert admin.put(f"/v1/namespaces/{space}/config", json={
            "rules": [{"pattern": "gated/*", "approval": "required"}]}).status_code == 200
    writer = site.key((space, ["read", "write", "subscribe"]))
    reviewer = site.key((space, ["read", "subscribe", "review"]))
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {writer}"}) as w:
        for key, value in (("gated/a", {"plan": "pro"}), ("gated/b", {"plan": "free"})):
            reply = w.put(f"/v1/namespaces/{space}/memory/{key}", json={"value": value})
            assert reply.status_code == 202, reply.text
    session = tab()
    session.sign_in(reviewer, space)
    page = session.page
    page.locator("#tab-proposals").click()
    page.get_by_role("button", name="Review proposal for gated/a").click()
    page.wait_for_selector("#proposal .diff-view")
    assert '"plan": "pro"' in page.locator("#proposal").inner_text()
    session.shot("08-proposal-review")
    page.locator("#proposal").get_by_role("button", name="Approve").click()
    page.wait_for_selector("#decision-done")
    page.get_by_role("button", name="Review proposal for gated/b").click()
    page.wait_for_selector("#proposal h3:has-text('gated/b')")
    page.get_by_label("Reason for rejecting").fill("free plans are set by billing")
    page.locator("#proposal").get_by_role("button", name="Reject").click()
    page.wait_for_selector("#decision-done")
    session.shot("09-proposal-decided")
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {reviewer}"}) as r:
        assert r.get(f"/v1/namespaces/{space}/memory/gated/a").json()["value"] == {"plan": "pro"}
        assert r.get(f"/v1/namespaces/{space}/memory/gated/b").status_code == 404
        rejected = r.get(f"/v1/namespaces/{space}/proposals", params={"status": "rejected"})
        assert [p["key"] for p in rejected.json()["proposals"]] == ["gated/b"]


@browser_test
@pytest.mark.skipif(not GOVERNANCE, reason="this broker has no governance routes (issue 16)")
def test_a_proposal_whose_key_moved_is_refused_then_approved_rebased(
        tab: Callable[..., Session], site: ConsoleBroker) -> None:
    space = ns()
    with site.admin() as admin:
        assert admin.put(f"/v1/namespaces/{space}/config", json={
            "rules": [{"pattern": "gated/*", "approval": "required"}]}).status_code == 200
    writer = site.key((space, ["read", "write", "subscribe"]))
    reviewer = site.key((space, ["read", "subscribe", "review"]))
    ids = []
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {writer}"}) as w:
        for value in ({"v": "first"}, {"v": "second"}):
            reply = w.put(f"/v1/namespaces/{space}/memory/gated/c", json={"value": value})
            assert reply.status_code == 202, reply.text
            ids.append(reply.json()["id"])
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {reviewer}"}) as r:
        approved = r.post(f"/v1/namespaces/{space}/proposals/{ids[0]}/approve", json={})
        assert approved.status_code == 200, approved.text
    session = tab()
    session.sign_in(reviewer, space)
    page = session.page
    page.locator("#tab-proposals").click()
    page.get_by_role("button", name="Review proposal for gated/c").click()
    page.wait_for_selector("#proposal >> text=The key moved since this proposal was made")
    page.locator("#proposal").get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_selector("#decision-conflict")
    session.shot("10-proposal-key-moved")
    page.locator("#approve-rebased").click()
    page.wait_for_selector("#decision-done")
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {reviewer}"}) as r:
        entry = r.get(f"/v1/namespaces/{space}/memory/gated/c").json()
        assert entry["value"] == {"v": "second"} and entry["version"] == 2


@browser_test
@pytest.mark.skipif(not GOVERNANCE, reason="this broker has no governance routes (issue 16)")
def test_audit_trail_filters_and_chain_check(tab: Callable[..., Session],
                                             site: ConsoleBroker) -> None:
    from playwright.sync_api import expect

    space = ns()
    site.put(space, "one", 1)
    site.put(space, "two", 2)
    agent_id, agent_key = register_agent(site, space, "auditee")
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {agent_key}"}) as a:
        assert a.put(f"/v1/namespaces/{space}/memory/one", json={"value": 3}).status_code == 200
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe", "audit"])), space)
    page = session.page
    page.locator("#tab-audit").click()
    page.wait_for_selector("#audit table")
    assert page.locator("#audit tbody tr").count() >= 3
    page.locator("#audit input[name=key]").fill("one")
    page.locator("#audit").get_by_role("button", name="Filter").click()
    # (The page's CSP forbids eval, so no wait_for_function: the locator's own wait.)
    expect(page.locator("#audit tbody tr")).to_have_count(2)
    # The agent that wrote is shown by name, its id on hover.
    actor = page.locator("#audit tbody tr .agent", has_text="auditee")
    expect(actor).to_have_attribute("title", agent_id)
    # The action filter offers the actions the broker records.
    action = page.locator("#audit select[name=action]")
    assert "agent-register" in action.locator("option").all_inner_texts()
    page.locator("#audit input[name=key]").fill("")
    action.select_option("agent-register")
    page.locator("#audit").get_by_role("button", name="Filter").click()
    expect(page.locator("#audit tbody tr")).to_have_count(1)
    page.get_by_role("button", name="Check the chain").click()
    page.wait_for_selector("#audit-verify.ok")
    session.shot("11-audit")


@browser_test
def test_amp_cells_per_owner(tab: Callable[..., Session], site: ConsoleBroker) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    with site.admin() as admin:
        for text in ("likes tea", "works in Lisbon"):
            reply = admin.post("/amp/memories", headers={"X-AMP-Agent-ID": "console-test"},
                               json={"content": {"text": text}, "type": "semantic",
                                     "identity": {"owner_id": owner, "owner_type": "user"},
                                     "access_policy": {"readable_by": ["*"]}})
            assert reply.status_code == 201, reply.text
        reader_name = f"amp-reader-{uuid.uuid4().hex[:6]}"
        registered = admin.post("/v1/agents", json={"name": reader_name, "namespace": "amp"})
        assert registered.status_code == 201, registered.text
        reader_id = registered.json()["agent"]["id"]
    session = tab()
    session.sign_in(ADMIN_KEY, "amp")
    page = session.page
    page.locator("#tab-amp").click()
    page.get_by_label("Owner id").fill(owner)
    page.get_by_role("button", name="Show cells").click()
    page.wait_for_selector("text=This key is not bound to an agent: name the agent to act as.")
    # The namespace's agents are offered by name (fed by the agent listing); any id may be typed.
    page.get_by_label("Act as agent").select_option(label=f"{reader_name} — {reader_id}")
    page.get_by_role("button", name="Show cells").click()
    page.wait_for_selector("#amp table")
    text = page.locator("#amp table").inner_text()
    assert "likes tea" in text and "works in Lisbon" in text and "active" in text
    assert re.search(r"\b[01]\.\d{3}\b", text)  # decay scores
    page.get_by_label("Or an agent id").fill("console-test")
    page.get_by_role("button", name="Show cells").click()
    page.wait_for_selector("#amp table")
    # The status checkboxes sit on one line, not stacked.
    boxes = [page.locator(f"#amp fieldset input[value={s}]").bounding_box()
             for s in ("active", "stale", "archived")]
    assert all(b is not None for b in boxes)
    assert len({round(b["y"]) for b in boxes if b is not None}) == 1, boxes
    session.shot("12-amp-cells")


def remember(client: httpx.Client, owner: str, *texts: str) -> None:
    for text in texts:
        reply = client.post("/amp/memories", headers={"X-AMP-Agent-ID": "console-test"},
                            json={"content": {"text": text}, "type": "semantic",
                                  "identity": {"owner_id": owner, "owner_type": "user"}})
        assert reply.status_code == 201, reply.text


def ask(session: Session, question: str, owner: str = "", mode: str | None = None,
        min_score: str = "") -> None:
    """Search the AMP view as the agent `console-test` (the admin key acts for it)."""
    page = session.page
    page.get_by_label("Question or words").fill(question)
    if mode is not None:
        page.get_by_label("Mode").select_option(mode)
    page.get_by_label("Min score").fill(min_score)
    page.get_by_label("Owner id").fill(owner)
    page.get_by_label("Or an agent id").fill("console-test")
    page.get_by_role("button", name="Show cells").click()


def first_cells(session: Session) -> list[str]:
    return [text.split("\n")[0] for text in
            session.page.locator("#amp tbody tr td:first-child").all_inner_texts()]


@browser_test
def test_amp_recall_by_meaning(tab: Callable[..., Session], site: ConsoleBroker) -> None:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    question = "what food could hurt Ana?"
    with site.admin() as admin:
        remember(admin, owner, "Ana is allergic to peanuts", "Ana's favourite colour is green",
                 "The team meets every Tuesday morning")

        def embedded() -> bool:  # the broker embeds new cells in the background
            reply = admin.post("/amp/memories/search",
                               headers={"X-AMP-Agent-ID": "console-test"},
                               json={"query": question, "owner_id": owner,
                                     "owner_type": "user", "mode": "semantic"})
            return len(reply.json()["results"]) == 3
        wait_until(embedded, "the cells embedded")
    session = tab()
    session.sign_in(ADMIN_KEY, "amp")
    page = session.page
    page.locator("#tab-amp").click()
    assert page.get_by_label("Mode").input_value() == "hybrid"  # the default
    ask(session, question, owner)
    page.wait_for_selector("#amp table")
    assert first_cells(session)[0] == "Ana is allergic to peanuts"
    assert page.locator("#amp thead th").all_inner_texts()[:2] == ["Cell", "Score"]
    scores = [float(t) for t in page.locator("#amp tbody tr td:nth-child(2)").all_inner_texts()]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1
    assert page.locator("#amp-degraded").count() == 0
    session.shot("13-amp-recall")
    # Any owner the agent may read, by meaning alone: the answer still comes first.
    ask(session, question, "", "semantic")
    page.wait_for_function("document.querySelector('#amp tbody td')?.innerText"
                           ".startsWith('Ana is allergic to peanuts')")
    # A floor above every match leaves nothing; one out of range is not sent.
    ask(session, question, owner, "hybrid", "0.99")
    page.wait_for_selector("#amp-message")
    assert "No active or stale cells match" in page.locator("#amp-message").inner_text()
    ask(session, question, owner, "hybrid", "2")
    assert page.locator("#amp-min-score:invalid").count() == 1
    # A question with no word is refused by the broker, and the view says why.
    ask(session, "*" * 128, owner, "hybrid")
    page.wait_for_selector("#amp-message:has-text('no searchable words')")
    assert page.locator("#amp table").count() == 0
    # Keyword mode ranks by words: "peanuts" finds its one cell.
    ask(session, "peanuts", owner, "keyword")
    page.wait_for_selector("#amp table")
    assert first_cells(session) == ["Ana is allergic to peanuts"]


@browser_test
def test_amp_recall_says_when_it_ranked_by_words_alone(
        tab: Callable[..., Session], redis_url: str) -> None:
    """An embedder that cannot be reached: hybrid answers from words, and the view says so."""
    broker = start_broker("embedded", redis_url, embedder="openai",
                          embeddings_url=f"http://127.0.0.1:{free_port()}",
                          embeddings_model="absent")
    try:
        owner = f"u-{uuid.uuid4().hex[:8]}"
        with broker.client() as admin:
            remember(admin, owner, "Ana is allergic to peanuts")
        session = tab(on=broker)
        session.sign_in(ADMIN_KEY, "amp")
        session.page.locator("#tab-amp").click()
        ask(session, "peanuts allergy", owner)
        session.page.wait_for_selector("#amp table")
        assert first_cells(session) == ["Ana is allergic to peanuts"]
        assert session.page.locator("#amp-degraded").inner_text() == \
            "The embedder is unavailable: these cells are ranked by their words alone."
    finally:
        broker.stop()


@browser_test
@pytest.mark.timeout(300)  # 10,000 writes first: about 25 s here, more on a busy machine
def test_ten_thousand_keys_page_and_filter(tab: Callable[..., Session],
                                           site: ConsoleBroker) -> None:
    space = ns()
    with site.admin() as admin:
        for batch in range(100):
            messages = [{"memp": "1.0", "type": "memory.put", "namespace": space,
                         "key": f"bulk/{batch:03d}/{i:02d}", "value": {"n": batch * 100 + i}}
                        for i in range(100)]
            reply = admin.post("/v1/messages", json=messages)
            assert reply.status_code == 200 and all(r["type"] == "ack" for r in reply.json())
    session = tab()
    timings: dict[str, float] = {}
    start = time.monotonic()
    session.sign_in(site.key((space, ["read", "subscribe"])), space)
    page = session.page
    session.key_row("bulk/").wait_for()
    timings["sign in to first page"] = time.monotonic() - start
    assert session.key_row("bulk/").inner_text().endswith("500+ keys")
    start = time.monotonic()
    session.key_row("bulk/").click()
    session.key_row("004/").wait_for()
    timings["open a folder"] = time.monotonic() - start
    page.get_by_role("button", name="Load more keys").click()
    session.key_row("009/").wait_for()
    start = time.monotonic()
    page.get_by_label("Filter keys").fill("bulk/*/42")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_selector("#keys-status:has-text('100 keys matching bulk/*/42')")
    timings["pattern over 10,000 keys"] = time.monotonic() - start
    assert page.locator("#keys li").count() == 100
    page.locator("#crumbs button", has_text="(root)").click()
    page.get_by_label("Filter keys").fill("bulk/007/")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_selector("#keys-status:has-text('100 keys matching bulk/007/*.')")
    session.shot("13-ten-thousand-keys")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "ten-thousand-keys.json").write_text(json.dumps(timings, indent=2) + "\n")


@browser_test
def test_keyboard_labels_and_phone_width(tab: Callable[..., Session],
                                         site: ConsoleBroker) -> None:
    space = ns()
    for key in ("alpha", "beta", "gamma"):
        site.put(space, key, {"key": key})
    session = tab(width=390, height=844)
    session.sign_in(site.key((space, ["read", "subscribe"])), space)
    page = session.page
    session.key_row("gamma").wait_for()
    # Every form control has a label; nothing is wider than the phone's screen.
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, select, textarea')]
        .filter(e => e.offsetParent !== null && !e.labels?.length && !e.getAttribute('aria-label'))
        .map(e => e.id || e.name)""")
    assert unlabelled == []
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    session.shot("14-phone")
    # Arrow keys move through the key list; Enter opens an entry.
    session.key_row("alpha").focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_selector("#entry h3:text('beta')")
    assert page.evaluate("document.activeElement.textContent") == "beta"


@browser_test
def test_the_stream_shows_its_state_and_resumes_after_a_broker_restart(
        tab: Callable[..., Session], site: ConsoleBroker) -> None:
    space = ns()
    site.put(space, "before", 1)
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe", "write"])), space)
    page = session.page
    session.live()
    site.stop()
    page.wait_for_selector('#stream[data-state="waiting"], #stream[data-state="connecting"]')
    session.shot("15-stream-reconnecting")
    site.start()
    session.live()
    site.put(space, "after", 2)
    session.key_row("after").wait_for()
    assert page.locator("#stream-text").inner_text() == "Live: connected"


@browser_test
def test_the_live_view_takes_a_filter(tab: Callable[..., Session], site: ConsoleBroker) -> None:
    space = ns()
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe"])), space)
    page = session.page
    session.live()
    page.locator("#live-filter-input").fill("/n = 1")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_selector('#stream[data-state="refused"]')
    assert "position 3" in page.locator("#stream-text").inner_text()
    page.locator("#live-filter-input").fill("/n == 2")
    page.get_by_role("button", name="Apply").click()
    session.live()
    assert page.locator("#stream-text").inner_text() == "Live: connected, filtered"
    site.put(space, "skipped", {"n": 1})
    site.put(space, "shown", {"n": 2})
    session.key_row("shown").wait_for()
    # Written first on the same stream: had it been sent, it would be in the tree by now.
    assert session.key_row("skipped").count() == 0
    session.shot("16-live-filter")


@browser_test
def test_a_refused_key_stays_out_and_sign_out_forgets_the_key(tab: Callable[..., Session],
                                                               site: ConsoleBroker) -> None:
    space = ns()
    session = tab()
    page = session.page
    page.goto(site.url + "/console/")
    page.get_by_label("API key").fill("memp_sk_live_forged")
    page.locator("#signin-ns").fill(space)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#signin-error:has-text('The broker does not accept this key.')")
    assert page.locator("#app").is_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    session.shot("00-sign-in-refused")

    key = site.key((space, ["read"]))
    session.sign_in(key, space)
    page.reload()  # the session survives a reload of the tab...
    page.wait_for_selector("#app:not([hidden])")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_selector("#signin:not([hidden])")
    assert page.evaluate("sessionStorage.length") == 0  # ...and not a sign-out
    assert key not in page.content()


@browser_test
def test_a_revoked_key_loses_the_stream(tab: Callable[..., Session], site: ConsoleBroker) -> None:
    space = ns()
    with site.admin() as admin:
        created = admin.post("/v1/keys", json={"name": "soon revoked", "grants": [
            {"namespace": space, "permissions": ["read", "subscribe"]}]}).json()
    session = tab()
    session.sign_in(created["api_key"], space)
    session.live()
    with site.admin() as admin:
        assert admin.delete(f"/v1/keys/{created['key']['id']}").status_code in (200, 204)
    page = session.page
    page.wait_for_selector('#stream[data-state="refused"]')
    assert "no longer accepts this key" in page.locator("#stream-text").inner_text()
    site.put(space, "after-revocation", {"secret": "not-for-you"})
    page.locator("#filter-form").get_by_role("button", name="Filter").click()
    page.wait_for_selector("#keys-status:has-text('The broker no longer accepts this key')")
    assert "not-for-you" not in page.content() and "after-revocation" not in page.content()


@browser_test
def test_agents_by_name_ages_that_move_and_an_entry_gone_after_a_wipe(
        tab: Callable[..., Session], site: ConsoleBroker) -> None:
    from playwright.sync_api import expect

    space = ns()
    agent_id, agent_key = register_agent(site, space, "writer-bot")
    with httpx.Client(base_url=site.url, headers={"Authorization": f"Bearer {agent_key}"}) as a:
        assert a.put(f"/v1/namespaces/{space}/memory/note", json={"value": 1}).status_code == 201
        with site.admin() as admin:
            assert admin.put(f"/v1/namespaces/{space}/config", json={
                "rules": [{"pattern": "gated/*", "approval": "required"}]}).status_code == 200
        assert a.put(f"/v1/namespaces/{space}/memory/gated/x",
                     json={"value": 2}).status_code == 202
    session = tab()
    session.sign_in(site.key((space, ["read", "subscribe", "review"])), space)
    page = session.page
    session.live()
    session.key_row("note").click()
    writer = page.locator("#entry .agent", has_text="writer-bot")
    expect(writer).to_have_attribute("title", agent_id)  # the name; the id on hover
    # "(N s ago)" moves on by itself.
    updated = page.locator("#entry time").first
    shown = updated.inner_text()
    expect(updated).not_to_have_text(shown, timeout=15_000)
    page.locator("#tab-proposals").click()
    proposer = page.locator("#proposals .agent", has_text="writer-bot")
    expect(proposer.first).to_have_attribute("title", agent_id)
    page.locator("#tab-memory").click()
    session.shot("13-agents-by-name")

    wipe(site, space)
    expect(page.locator("#entry-gone")).to_contain_text("note holds no entry any more")
    assert page.locator("#entry dl").count() == 0
    session.shot("14-entry-gone-after-a-wipe")
