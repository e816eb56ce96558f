"""The `memp` command line, run as a user would: its arguments, environment and stdin, its
output and its exit code. Most runs are in-process (tests/support/commands.py); `watch`, which
a user stops with a signal, and one run of the installed entry point are subprocesses."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from memp.cli import build_parser
from tests.support.brokers import ADMIN_KEY, Broker, free_port
from tests.support.commands import Completed, run_memp

WAIT = 15.0
_BIN = Path(sys.executable).with_name("memp")
MEMP_COMMAND = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "memp.cli"]


@pytest.fixture
def env(server: Broker, ns: str) -> dict[str, str]:
    """The environment a user would set: broker URL, key and namespace."""
    return {**os.environ, "MEMP_BASE_URL": server.url, "MEMP_API_KEY": ADMIN_KEY,
            "MEMP_NAMESPACE": ns}


def memp(env: dict[str, str], *args: str, stdin: str | None = None) -> Completed:
    return run_memp(env, *args, stdin=stdin)


def lines(output: str) -> list[Any]:
    return [json.loads(line) for line in output.splitlines()]


def commands() -> list[list[str]]:
    parser = build_parser()
    found: list[list[str]] = [[]]
    actions = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    for name, sub in actions[0].choices.items():
        found.append([name])
        for action in sub._actions:
            if action.choices and isinstance(action.choices, dict):
                found += [[name, child] for child in action.choices]
    return found


@pytest.mark.parametrize("command", [pytest.param(c, id=" ".join(c) or "memp")
                                     for c in commands()])
def test_every_command_has_help(command: list[str]) -> None:
    done = run_memp(dict(os.environ), *command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: memp {' '.join(command)}".rstrip())
    assert "--base-url" in done.stdout and "--api-key" in done.stdout
    assert "\nexample:\n  " in done.stdout and " memp" in done.stdout.split("example:")[1]


def test_the_installed_command_runs_as_a_process(env: dict[str, str], ns: str) -> None:
    """The entry point pip installs, in a process of its own: exit codes and streams."""
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MEMP_COMMAND, *args], env=env, input=stdin,
                              capture_output=True, text=True, timeout=WAIT)
    assert run("put", "process/key", stdin='{"from": "stdin"}').returncode == 0
    got = run("get", "process/key")
    assert (got.returncode, got.stdout) == (0, '{"from": "stdin"}\n')
    missing = run("get", "process/absent")
    assert missing.returncode != 0 and "memp:" in missing.stderr and missing.stdout == ""
    assert run("--help").stdout.startswith("usage: memp")


def test_put_get_query_history_delete(env: dict[str, str], ns: str) -> None:
    put = memp(env, "put", "customer/123", '{"plan": "pro", "acv": 12000}', "--ttl", "3600")
    assert put.returncode == 0, put.stderr
    entry = json.loads(put.stdout)
    assert (entry["namespace"], entry["key"], entry["version"]) == (ns, "customer/123", 1)
    assert entry["ttl_seconds"] == 3600

    from_stdin = memp(env, "put", "customer/456", stdin='{"plan": "free"}')
    assert from_stdin.returncode == 0 and json.loads(from_stdin.stdout)["value"] == {
        "plan": "free"}
    assert memp(env, "put", "customer/123", '"text"', "--if-version", "1").returncode == 0

    got = memp(env, "get", "customer/123")
    assert (got.returncode, got.stdout) == (0, '"text"\n')
    full = json.loads(memp(env, "get", "customer/123", "--entry").stdout)
    assert full["version"] == 2 and full["value"] == "text"

    query = memp(env, "query", "customer/*")
    assert query.returncode == 0
    assert [(e["key"], e["value"]) for e in lines(query.stdout)] == [
        ("customer/123", "text"), ("customer/456", {"plan": "free"})]
    table = memp(env, "query", "customer/*", "--table").stdout.splitlines()
    assert table[0].split() == ["KEY", "VERSION", "UPDATED", "VALUE"]
    assert table[1].split()[:2] == ["customer/123", "2"] and table[1].endswith('"text"')

    deleted = memp(env, "delete", "customer/123")
    assert deleted.returncode == 0 and json.loads(deleted.stdout)["deleted"] is True
    history = memp(env, "history", "customer/123")
    assert [(e["version"], e["deleted"]) for e in lines(history.stdout)] == [
        (3, True), (2, False), (1, False)]
    assert "(deleted)" in memp(env, "history", "customer/123", "--table").stdout

    missing = memp(env, "get", "customer/123")
    assert missing.returncode == 1 and missing.stdout == ""
    assert "not_found 404" in missing.stderr and "Traceback" not in missing.stderr


def test_flags_win_over_the_environment(server: Broker, ns: str) -> None:
    bare = {k: v for k, v in os.environ.items() if not k.startswith("MEMP_")}
    put = memp(bare, "put", "k", "1", "--base-url", server.url, "--api-key", ADMIN_KEY,
               "--namespace", ns)
    assert put.returncode == 0, put.stderr
    wrong = {**bare, "MEMP_BASE_URL": "http://127.0.0.1:9", "MEMP_NAMESPACE": "elsewhere",
             "MEMP_API_KEY": "wrong"}
    got = memp(wrong, "--base-url", server.url, "--api-key", ADMIN_KEY, "-n", ns, "get", "k")
    assert (got.returncode, got.stdout) == (0, "1\n")


def test_refusals_and_usage_errors_have_their_exit_codes(env: dict[str, str]) -> None:
    assert memp(env, "put", "k", "1", "--if-absent").returncode == 0
    again = memp(env, "put", "k", "2", "--if-absent")
    assert again.returncode == 1 and "precondition_failed 412" in again.stderr
    assert '"current_version": 1' in again.stderr

    not_json = memp(env, "put", "k", "not json")
    assert not_json.returncode == 2 and "must be JSON" in not_json.stderr
    assert memp(env, "put").returncode == 2
    assert memp(env, "frobnicate").returncode == 2

    denied = memp({**env, "MEMP_API_KEY": "memp_sk_live_nope"}, "get", "k")
    assert denied.returncode == 1 and "unauthorized 401" in denied.stderr
    assert "MEMP_API_KEY" in denied.stderr and "--api-key" in denied.stderr

    for url in ("127.0.0.1:8080", "localhost", "ftp://host"):
        schemeless = memp({**env, "MEMP_BASE_URL": url}, "get", "k")
        assert schemeless.returncode == 2, schemeless.stderr
        assert "must start with http:// or https://" in schemeless.stderr

    url = f"http://127.0.0.1:{free_port()}"
    down = memp({**env, "MEMP_BASE_URL": url}, "get", "k", "--retry-for", "0.5")
    assert down.returncode == 3 and "could not reach the broker" in down.stderr
    # it said what it waited for, once, before giving up
    assert down.stderr.count("; retrying GET /v1/namespaces/") == 1, down.stderr
    assert f"memp: could not reach the broker at {url} (" in down.stderr
    at_once = memp({**env, "MEMP_BASE_URL": url, "MEMP_RETRY_FOR": "0"}, "get", "k")
    assert at_once.returncode == 3 and "retrying" not in at_once.stderr
    bad = memp({**env, "MEMP_RETRY_FOR": "soon"}, "get", "k")
    assert bad.returncode == 2 and "MEMP_RETRY_FOR must be a number" in bad.stderr

    no_namespace = memp({k: v for k, v in env.items() if k != "MEMP_NAMESPACE"}, "get", "k")
    assert no_namespace.returncode == 2, no_namespace.stderr
    # Worded for the command line: its flag and variable, not the SDK's keyword argument.
    assert "-n NAMESPACE" in no_namespace.stderr and "MEMP_NAMESPACE" in no_namespace.stderr
    assert "namespace=" not in no_namespace.stderr


def test_register_prints_the_agent_and_its_key(env: dict[str, str], ns: str) -> None:
    done = memp(env, "register", "--name", "cli-agent", "--framework", "autogen")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    agent, credentials = reply["agent"], reply["credentials"]
    assert (agent["name"], agent["framework"], agent["namespace"]) == (
        "cli-agent", "autogen", ns)
    assert credentials["agent_id"] == agent["id"]
    assert f"export MEMP_API_KEY={credentials['api_key']}" in done.stderr

    as_agent = {**env, "MEMP_API_KEY": credentials["api_key"]}
    written = memp(as_agent, "put", "by/agent", "true")
    assert json.loads(written.stdout)["agent_id"] == agent["id"]


def test_register_reuses_an_agent_by_name_and_agents_are_listed(env: dict[str, str],
                                                                  ns: str) -> None:
    first = json.loads(memp(env, "register", "--name", "planner", "--reuse").stdout)
    again = memp(env, "register", "--name", "planner", "--reuse")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["agent"]["id"] == first["agent"]["id"]  # the same agent, not another
    assert second["credentials"]["api_key"] != first["credentials"]["api_key"]
    assert "reusing agent planner" in again.stderr
    written = memp({**env, "MEMP_API_KEY": second["credentials"]["api_key"]}, "put", "p", "1")
    assert json.loads(written.stdout)["agent_id"] == first["agent"]["id"]
    plain = memp(env, "register", "--name", "planner")  # the same token: the same agent
    assert json.loads(plain.stdout)["agent"]["id"] == first["agent"]["id"]
    assert "reusing agent planner" in plain.stderr
    other = json.loads(memp(env, "register", "--name", "planner", "--new").stdout)
    assert other["agent"]["id"] != first["agent"]["id"]
    # --reuse keeps the first key's grants, AMP's included
    keys = {k["id"]: k for k in lines(memp(env, "keys", "list").stdout)}
    first_grants = keys[first["credentials"]["key_id"]]["grants"]
    assert any(g["namespace"] == "amp" for g in first_grants), first_grants
    assert keys[second["credentials"]["key_id"]]["grants"] == first_grants

    listed = lines(memp(env, "agents", "list").stdout)
    assert [a["id"] for a in listed] == [first["agent"]["id"], other["agent"]["id"]]
    table = memp(env, "agents", "list", "--table").stdout
    assert table.startswith("ID") and table.count("planner") == 2
    shown = json.loads(memp(env, "agents", "get", first["agent"]["id"]).stdout)
    assert shown["name"] == "planner"


def test_listings_follow_every_page(serve: Any, ns: str) -> None:
    # A broker whose pages hold two items: five agents and five proposals take three pages.
    broker = serve(MEMP_DEFAULT_QUERY_LIMIT="2")
    env = {**os.environ, "MEMP_BASE_URL": broker.url, "MEMP_API_KEY": ADMIN_KEY,
           "MEMP_NAMESPACE": ns}
    names = [f"pager-{n}" for n in range(5)]
    for name in names:
        assert memp(env, "register", "--name", name).returncode == 0
    assert [a["name"] for a in lines(memp(env, "agents", "list").stdout)] == names
    table = memp(env, "agents", "list", "--table").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "FRAMEWORK", "LAST", "SEEN"]
    assert [row.split()[1] for row in table[1:]] == names
    for n in range(5):
        assert memp(env, "put", f"gated/{n}", str(n), "--approval-required").returncode == 0
    proposals = lines(memp(env, "proposals").stdout)
    assert sorted(p["key"] for p in proposals) == [f"gated/{n}" for n in range(5)]
    table = memp(env, "proposals", "--table").stdout.splitlines()
    assert table[0].split() == ["ID", "STATUS", "OP", "BY", "KEY"] and len(table) == 6


def test_schema_list_as_json_and_as_a_table(env: dict[str, str]) -> None:
    for name in ("alpha", "beta"):
        assert memp(env, "schema", "put", name, '{"type": "object"}', "--pattern",
                    f"{name}/*").returncode == 0
    assert [r["id"] for r in lines(memp(env, "schema", "list").stdout)] == ["alpha", "beta"]
    table = memp(env, "schema", "list", "--table").stdout.splitlines()
    assert table[0].split() == ["ID", "PATTERN", "ENFORCE", "DRAFT"]
    assert [row.split()[:3] for row in table[1:]] == [["alpha", "alpha/*", "no"],
                                                      ["beta", "beta/*", "no"]]


def test_a_schema_violation_is_one_readable_line(env: dict[str, str]) -> None:
    schema = '{"type": "object", "required": ["plan"]}'
    assert memp(env, "schema", "put", "customer", schema, "--pattern", "customer/*"
                ).returncode == 0
    written = memp(env, "put", "customer/1", '{"acv": 1}')
    assert written.returncode == 0, written.stderr
    assert written.stderr.count("\n") == 1, written.stderr
    assert written.stderr.startswith("memp: schema violation: ")
    assert ".py" not in written.stderr and "Warning" not in written.stderr


def test_watch_says_when_the_broker_is_out_of_reach(env: dict[str, str], watch: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    watcher = watch({**env, "MEMP_BASE_URL": url}, "*")
    line = watcher.wait_open()
    assert line.startswith(f"memp: cannot reach {url} (attempt 1): ")
    assert watcher.interrupt() == 130


def test_keys_create_list_revoke(env: dict[str, str], ns: str) -> None:
    created = memp(env, "keys", "create", "--namespace", ns, "--namespace", f"{ns}-*",
                   "--permissions", "read,subscribe", "--name", "cli reader")
    assert created.returncode == 0, created.stderr
    reply = json.loads(created.stdout)
    key_id, api_key = reply["key"]["id"], reply["api_key"]
    assert [(g["namespace"], g["permissions"]) for g in reply["key"]["grants"]] == [
        (ns, ["read", "subscribe"]), (f"{ns}-*", ["read", "subscribe"])]

    listed = memp(env, "keys", "list")
    assert key_id in {k["id"] for k in lines(listed.stdout)}
    assert api_key not in listed.stdout, "keys are never listed"
    table = memp(env, "keys", "list", "--table").stdout
    assert key_id in table and "cli reader" in table

    as_reader = {**env, "MEMP_API_KEY": api_key}
    refused = memp(as_reader, "put", "k", "1")
    assert refused.returncode == 1 and "forbidden 403" in refused.stderr
    assert memp(as_reader, "keys", "list").returncode == 1

    revoked = memp(env, "keys", "revoke", key_id)
    assert revoked.returncode == 0 and key_id in revoked.stderr
    assert memp(as_reader, "get", "k").returncode == 1
    assert memp(env, "keys", "revoke", key_id).returncode == 1


class Watch:
    """`memp watch` in the background; its stdout lines arrive on a queue."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen([*MEMP_COMMAND, "watch", *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.stdout: queue.Queue[str] = queue.Queue()
        self.stderr: queue.Queue[str] = queue.Queue()
        self.pumps = [threading.Thread(target=self._pump, args=(stream, into), daemon=True)
                      for stream, into in ((self.process.stdout, self.stdout),
                                           (self.process.stderr, self.stderr))]
        for pump in self.pumps:
            pump.start()

    @staticmethod
    def _pump(stream: IO[str] | None, into: queue.Queue[str]) -> None:
        assert stream is not None
        for line in stream:
            into.put(line.rstrip("\n"))

    def wait_open(self) -> str:
        try:
            return self.stderr.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail("memp watch did not say it was watching")

    def take(self, count: int) -> list[str]:
        try:
            return [self.stdout.get(timeout=WAIT) for _ in range(count)]
        except queue.Empty:
            pytest.fail(f"memp watch printed fewer than {count} lines")

    def interrupt(self) -> int:
        """Ctrl-C; returns the exit code once the process and its output have ended."""
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=WAIT)
        for pump in self.pumps:
            pump.join(WAIT)
        return code

    def rest(self, lines: queue.Queue[str]) -> list[str]:
        return [lines.get_nowait() for _ in range(lines.qsize())]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=WAIT)
        for pump in self.pumps:
            pump.join(WAIT)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def watch() -> Iterator[Any]:
    started: list[Watch] = []

    def start(env: dict[str, str], *args: str) -> Watch:
        handle = Watch(env, *args)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


def test_watch_prints_json_lines_until_interrupted(env: dict[str, str], ns: str,
                                                   watch: Any) -> None:
    watcher = watch(env, "customer/*")
    assert watcher.wait_open() == f"memp: watching {ns}: customer/* (Ctrl-C to stop)"
    memp(env, "put", "customer/1", '{"plan": "pro"}')
    memp(env, "put", "other/1", "1")
    memp(env, "delete", "customer/1")
    put, deleted = (json.loads(line) for line in watcher.take(2))
    assert (put["type"], put["key"], put["version"], put["value"]) == (
        "put", "customer/1", 1, {"plan": "pro"})
    assert put["event_id"] and put["namespace"] == ns and put["id"] != put["event_id"]
    assert (deleted["type"], deleted["version"], deleted["deleted"]) == ("delete", 2, True)

    assert watcher.interrupt() == 130
    assert watcher.rest(watcher.stdout) == [], "nothing but the events"
    assert watcher.rest(watcher.stderr) == [], "no traceback, no noise"


def test_watch_table_with_snapshot(env: dict[str, str], watch: Any) -> None:
    memp(env, "put", "k/a", '"first"')
    watcher = watch(env, "k/*", "--snapshot", "--table")
    watcher.wait_open()
    snapshot, end = watcher.take(2)
    assert snapshot.split()[1:4] == ["snapshot", "k/a", "v1"] and snapshot.endswith('"first"')
    assert end.split()[1] == "snapshot-end"
    memp(env, "put", "k/b", "[1, 2]")
    [live] = watcher.take(1)
    assert live.split()[1:4] == ["put", "k/b", "v1"] and live.endswith("[1, 2]")
    assert watcher.interrupt() == 130


def test_watch_resumes_from_a_printed_id(env: dict[str, str], watch: Any) -> None:
    first = watch(env, "r")
    first.wait_open()
    memp(env, "put", "r", "1")
    [line] = first.take(1)
    assert first.interrupt() == 130
    memp(env, "put", "r", "2")
    memp(env, "put", "r", "3")
    resumed = watch(env, "r", "--last-event-id", json.loads(line)["event_id"])
    resumed.wait_open()
    assert [json.loads(x)["version"] for x in resumed.take(2)] == [2, 3]
    assert resumed.interrupt() == 130


def test_proposals_approve_reject_and_audit(env: dict[str, str], ns: str) -> None:
    assert memp(env, "config", "set", json.dumps({
        "rules": [{"pattern": "facts/*", "approval": "required"}],
        "allow_self_approval": True})).returncode == 0
    proposed = memp(env, "put", "facts/a", '{"x": 1}')
    assert proposed.returncode == 0 and "awaits approval" in proposed.stderr
    proposal = json.loads(proposed.stdout)
    assert proposal["status"] == "pending"
    assert memp(env, "get", "facts/a").returncode == 1
    listed = memp(env, "proposals", "--status", "pending")
    assert [p["id"] for p in lines(listed.stdout)] == [proposal["id"]]
    assert proposal["id"] in memp(env, "proposals", "--table").stdout
    shown = json.loads(memp(env, "proposal", proposal["id"]).stdout)
    assert shown["diff"] == [{"op": "add", "path": "", "value": {"x": 1}}]
    approved = memp(env, "approve", proposal["id"])
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["entry"]["value"] == {"x": 1}
    assert json.loads(memp(env, "get", "facts/a").stdout) == {"x": 1}
    second = json.loads(memp(env, "delete", "facts/a").stdout)
    rejected = memp(env, "reject", second["id"], "--reason", "keep it")
    assert json.loads(rejected.stdout)["status"] == "rejected"
    again = memp(env, "approve", second["id"])
    assert again.returncode == 1 and "write_conflict" in again.stderr

    records = lines(memp(env, "audit", "--since", "1h").stdout)
    assert [r["action"] for r in records][:3] == ["reject", "propose", "approve"]
    assert lines(memp(env, "audit", "--since", "1h", "--action", "config").stdout)
    assert "approve" in memp(env, "audit", "--table").stdout
    exported = lines(memp(env, "audit", "export").stdout)
    assert len(exported) == len(records)
    # Incrementally: after the newest record exported, only what was appended since.
    assert lines(memp(env, "audit", "export", "--after", exported[0]["id"]).stdout) == []
    assert memp(env, "put", "notes/n", "1").returncode == 0
    newer = lines(memp(env, "audit", "export", "--after", exported[0]["id"]).stdout)
    assert [(r["action"], r["key"]) for r in newer] == [("put", "notes/n")]
    hostile = memp(env, "audit", "export", "--after", "*" * 128)
    assert hostile.returncode == 1 and "after" in hostile.stderr
    verified = memp(env, "audit", "verify")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True


def test_tables_name_agents_and_wide_ones_show_their_whole_ids(env: dict[str, str]) -> None:
    name = "a-proposer-with-a-name-longer-than-its-column"
    assert memp(env, "config", "set", json.dumps({
        "rules": [{"pattern": "facts/*", "approval": "required"}]})).returncode == 0
    agent = json.loads(memp(env, "register", "--name", name).stdout)
    agent_id = agent["agent"]["id"]
    as_agent = {**env, "MEMP_API_KEY": agent["credentials"]["api_key"]}
    assert "awaits approval" in memp(as_agent, "put", "facts/b", "1").stderr
    table = memp(env, "proposals", "--table").stdout.splitlines()
    assert table[0].split() == ["ID", "STATUS", "OP", "BY", "KEY"]
    assert f"  {name}  " in table[1] and agent_id not in table[1]
    wide = memp(env, "proposals", "--wide").stdout.splitlines()
    assert wide[0].split() == ["ID", "STATUS", "OP", "BY", "AGENT", "ID", "KEY"]
    assert f"  {name}  " in wide[1] and f"  {agent_id}  " in wide[1]  # whole, copyable
    audit = memp(env, "audit", "--wide", "--action", "propose").stdout.splitlines()
    assert f"  {name}  " in audit[1] and f"  {agent_id}  " in audit[1]
    # An actor that is no agent (the admin key) is shown as it is.
    assert "  admin  " in memp(env, "audit", "--table", "--action", "config").stdout
