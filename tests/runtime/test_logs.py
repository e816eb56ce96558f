"""broker/runtime/logs.py and `serve`'s start: request ids, log lines as text or JSON, outage
warnings kept to one a period with a line on recovery, a taken port said plainly."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from broker.runtime.logs import JsonFormatter, TextFormatter, Throttle
from tests.support.brokers import ADMIN_KEY, Broker, RedisServer, free_port, wait_for_port

WAIT = 30.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("given", [pytest.param("trace-abc.123", id="plain"),
                                   pytest.param(None, id="absent")])
def test_a_request_id_is_echoed_and_put_in_error_bodies(broker: Broker,
                                                        given: str | None) -> None:
    headers = {"X-Request-ID": given} if given else {}
    response = httpx.get(f"{broker.url}/v1/namespaces/x/memory/k",
                         headers={**headers, "Authorization": "Bearer wrong-key"}, timeout=10)
    assert response.status_code == 401
    rid = response.headers["x-request-id"]
    assert rid == given if given else re.fullmatch(r"[0-9a-f]{16}", rid)
    assert response.json()["error"]["request_id"] == rid
    ok = httpx.get(f"{broker.url}/healthz", headers=headers, timeout=10)
    assert ok.headers["x-request-id"] == (given or ok.headers["x-request-id"])


@pytest.mark.parametrize("hostile", [
    pytest.param("x" * 129, id="too-long"),
    pytest.param("a b", id="space"),
    pytest.param("<script>", id="markup"),
    pytest.param("%0d%0aSet-Cookie:x", id="encoded-crlf"),
])
def test_a_hostile_request_id_is_replaced(broker: Broker, hostile: str) -> None:
    response = httpx.get(f"{broker.url}/v1/namespaces/x/memory/k",
                         headers={"X-Request-ID": hostile}, timeout=10)
    assert response.status_code == 401
    rid = response.headers["x-request-id"]
    assert rid != hostile and re.fullmatch(r"[0-9a-f]{16}", rid)
    assert response.json()["error"]["request_id"] == rid


def test_formatters_give_time_level_and_request_id() -> None:
    record = logging.LogRecord("memp.x", logging.WARNING, __file__, 1, "hello %s", ("you",),
                               None)
    record.request_id = "r-1"
    text = TextFormatter().format(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING memp\.x \[req=r-1\] "
                        r"hello you", text), text
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["message"] == "hello you"
    assert entry["request_id"] == "r-1" and entry["time"].endswith("Z")


HOSTILE = "x\n2099-01-01T00:00:00.000Z CRITICAL memp.auth forged\r\x1b[31mred\x7f\x9b\u2028\u202e"


@pytest.mark.parametrize("char, shown", [
    pytest.param("\n", "\\n", id="lf"), pytest.param("\r", "\\r", id="cr"),
    pytest.param("\t", "\\t", id="tab"), pytest.param("\x00", "\\x00", id="nul"),
    pytest.param("\x1b", "\\x1b", id="esc"), pytest.param("\x7f", "\\x7f", id="del"),
    pytest.param("\x85", "\\x85", id="c1-nel"), pytest.param("\x9b", "\\x9b", id="c1-csi"),
    pytest.param("\u2028", "\\u2028", id="line-separator"),
    pytest.param("\u2029", "\\u2029", id="paragraph-separator"),
    pytest.param("\u202e", "\\u202e", id="bidi-override"),
    pytest.param("\u2066", "\\u2066", id="bidi-isolate"),
])
def test_text_lines_escape_every_control_character(char: str, shown: str) -> None:
    record = logging.LogRecord("memp.x", logging.INFO, __file__, 1, "GET %s", (f"/a{char}b",),
                               None)
    line = TextFormatter().format(record)
    assert line.endswith(f"GET /a{shown}b") and char not in line
    entry = JsonFormatter().format(record)
    assert char not in entry and "\n" not in entry
    assert json.loads(entry)["message"].startswith("GET /a")


def test_text_lines_keep_plain_text_and_unicode_as_it_is() -> None:
    record = logging.LogRecord("memp.x", logging.INFO, __file__, 1, "%s", ("café ☕ a\\b",),
                               None)
    assert TextFormatter().format(record).endswith(" café ☕ a\\b")


def test_a_traceback_quoting_a_request_cannot_pass_for_a_record() -> None:
    try:
        raise ValueError(f"bad key {HOSTILE}")
    except ValueError:
        record = logging.LogRecord("memp.x", logging.ERROR, __file__, 1, "failed on %s",
                                   (HOSTILE,), sys.exc_info())
    lines = TextFormatter().format(record).split("\n")
    assert re.match(r"\d{4}-\d\d-\d\dT", lines[0]) and "\\n2099-" in lines[0]
    assert len(lines) > 3 and all(line.startswith("  ") for line in lines[1:])
    assert not any(_RAW_UNSAFE.search(line) for line in lines)


def test_a_throttle_says_a_repeating_failure_once_a_period_then_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("memp.test-throttle")
    throttle = Throttle(logger, period=3600)
    with caplog.at_level(logging.WARNING, logger.name):
        for attempt in range(50):
            throttle.failure("down: %s", attempt)
        throttle.recovered("back")
        throttle.recovered("back")  # once, not again
        throttle.failure("down: %s", "again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "down: 0"
    assert lines[1].startswith("back after ")
    assert lines[2] == "down: again"
    assert len(lines) == 3


# ---- a broker process ----


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    log: Path
    url: str

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def wait_line(self, predicate: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + WAIT
        while True:
            for line in self.lines():
                if predicate(line):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"no line {what} in:\n" + "\n".join(self.lines()[-30:]))
            time.sleep(0.1)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(*args: str, **env: str) -> Served:
        port = free_port()
        log = tmp_path / f"broker-{port}.log"
        environment = {**os.environ, "MEMP_ADMIN_KEY": ADMIN_KEY, "MEMP_PORT": str(port),
                       **env}
        with log.open("wb") as sink:
            process = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", *args],
                                       env=environment, cwd=ROOT, stdout=sink, stderr=sink)
        served = Served(process, log, f"http://127.0.0.1:{port}")
        started.append(served)
        wait_for_port(port, timeout=30)
        assert httpx.get(f"{served.url}/healthz", timeout=60).status_code == 200
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.process.terminate()
            served.process.wait(timeout=20)


def test_json_logs_are_one_object_a_line_with_the_request_id(
        serve: Callable[..., Served]) -> None:
    served = serve(MEMP_LOG_FORMAT="json")
    response = httpx.get(f"{served.url}/v1/namespaces/x/memory/k",
                         headers={"X-Request-ID": "json-check-1"}, timeout=10)
    assert response.status_code == 401
    access = served.wait_line(lambda line: "json-check-1" in line, "for the request")
    entry = json.loads(access)
    assert entry["request_id"] == "json-check-1" and entry["status"] == 401
    assert entry["level"] == "INFO" and entry["time"].endswith("Z")
    served.process.terminate()
    served.process.wait(timeout=20)
    for line in served.lines():
        if line.startswith("memp-broker:"):  # what serve prints for people (admin key, where)
            continue
        assert isinstance(json.loads(line), dict), line


def test_text_logs_carry_time_level_and_request_id(serve: Callable[..., Served]) -> None:
    served = serve()
    httpx.get(f"{served.url}/healthz", headers={"X-Request-ID": "text-check-1"}, timeout=10)
    line = served.wait_line(lambda line: "text-check-1" in line, "for the request")
    assert re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z INFO memp\.access \[req=text-check-1\] GET "
                    r"/healthz 200 ", line), line


_RAW_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")
# A record's first line: time, level, logger. Anything else is a traceback's indented line or
# what `serve` prints for people.
_RECORD = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [a-z_.]+ ")


def _send_hostile_requests(url: str) -> None:
    """Requests whose path, headers, message ids and bodies carry line breaks, terminal
    escapes, C1 controls and bidirectional overrides."""
    quoted = quote(HOSTILE, safe="")
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get(f"/{quoted}").status_code == 404
        assert client.get(f"/v1/namespaces/{quoted}/memory/k", headers=headers
                          ).status_code == 400
        client.put(f"/v1/namespaces/logs/memory/{quoted}", headers=headers,
                   json={"value": HOSTILE})
        client.post("/v1/messages", headers=headers, json={
            "memp": "1.0", "type": "memory.get", "id": HOSTILE, "namespace": "logs",
            "key": "k"})
        # Header values may carry obs-text (bytes 0x80-0xFF: C1 controls once decoded).
        obs_text = b"\x85\x9b\xe2\x80\xa8\xe2\x80\xae"
        client.get("/healthz", headers={b"X-Request-ID": obs_text, b"User-Agent": obs_text})
        client.post("/mcp", headers={b"Authorization": f"Bearer {ADMIN_KEY}".encode(),
                                     b"mcp-session-id": obs_text,
                                     b"Accept": b"application/json, text/event-stream"},
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_requests_cannot_forge_or_colour_a_log_line(serve: Callable[..., Served],
                                                    log_format: str) -> None:
    served = serve("--log-level", "debug", MEMP_LOG_FORMAT=log_format)
    _send_hostile_requests(served.url)
    with httpx.Client(base_url=served.url, timeout=30) as client:
        client.get("/healthz", headers={"X-Request-ID": "logs-done"})
    served.wait_line(lambda line: "logs-done" in line, "for the last request")
    served.process.terminate()
    served.process.wait(timeout=20)
    text = served.log.read_text(encoding="utf-8", errors="strict")
    assert not _RAW_UNSAFE.search(text.replace("\n", "")), "a raw control character"
    lines = [line for line in text.split("\n") if line and not line.startswith("memp-broker:")]
    for line in lines:
        if log_format == "json":
            assert isinstance(json.loads(line), dict), line
        else:
            assert _RECORD.match(line) or line.startswith("  "), line
    assert not any(line.startswith("2099") for line in lines)
    if log_format == "json":
        paths = [json.loads(line).get("path", "") for line in lines]
        assert any(path.startswith("/x\n2099-01-01T00:00:00.000Z CRITICAL") for path in paths)
    else:
        assert any(" GET /x\\n2099-01-01T00:00:00.000Z CRITICAL memp.auth forged\\r\\x1b[31m"
                   in line for line in lines), "the hostile request's access line, escaped"


@pytest.mark.parametrize("env", [
    pytest.param({"MEMP_ADMIN_KEY": ADMIN_KEY}, id="admin-key-set"),
    pytest.param({}, id="embedded-quick-start"),
])
def test_a_taken_port_is_said_plainly_and_first_and_nothing_claims_to_listen(
        serve: Callable[..., Served], env: dict[str, str]) -> None:
    """The quick start's broker makes up an admin key; one that cannot listen says so first
    and prints no key it would never use."""
    first = serve()
    port = first.url.rsplit(":", 1)[1]
    base = {k: v for k, v in os.environ.items() if k not in ("MEMP_ADMIN_KEY", "MEMP_REDIS_URL")}
    second = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--port", port,
                             "--workers", "auto"],
                            env={**base, **env}, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert second.stdout == ""
    assert second.stderr.startswith(f"memp-broker: port {port} on 127.0.0.1 is taken"), \
        second.stderr
    assert "Traceback" not in second.stderr and "Errno" not in second.stderr


@pytest.mark.parametrize("args, env", [
    pytest.param(["--log-level", "loud"], {}, id="flag"),
    pytest.param([], {"MEMP_LOG_LEVEL": "loud"}, id="level-variable"),
    pytest.param([], {"MEMP_LOG_FORMAT": "xml"}, id="format-variable"),
])
def test_a_bad_log_setting_is_a_usage_error(args: list[str], env: dict[str, str]) -> None:
    result = subprocess.run([sys.executable, "-m", "broker.cli", "serve", *args],
                            env={**os.environ, "MEMP_PORT": str(free_port()), **env}, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "'loud'" in result.stderr or "'xml'" in result.stderr
    assert "listening" not in result.stdout


def test_an_outage_is_warned_once_a_period_and_its_end_is_said(
        serve: Callable[..., Served], private_redis: RedisServer) -> None:
    served = serve("--log-level", "warning", MEMP_REDIS_URL=private_redis.url)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    private_redis.stop()
    try:
        for _ in range(30):
            response = httpx.get(f"{served.url}/v1/namespaces/x/memory/k", headers=headers,
                                 timeout=10)
            assert response.status_code == 503
        time.sleep(3)  # the background loops fail and restart meanwhile, several times
    finally:
        private_redis.start()
    served.wait_line(lambda line: "reachable again" in line, "saying the store is back")
    warnings = [line for line in served.lines() if " WARNING " in line]
    assert len(warnings) == 2, "\n".join(warnings)  # the outage once, then its end
    assert httpx.get(f"{served.url}/v1/namespaces/x/memory/k", headers=headers,
                     timeout=10).status_code == 404


def test_a_redis_out_of_memory_is_warned_once_a_period_and_is_no_outage(
        serve: Callable[..., Served], private_redis: RedisServer) -> None:
    """Refused writes are logged once a period; Redis still answers, so nothing says the store
    went away or came back (a warning pair per refused write, before)."""
    import redis

    served = serve("--log-level", "warning", MEMP_REDIS_URL=private_redis.url)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    data = redis.Redis.from_url(private_redis.url)
    data.config_set("maxmemory", 1)
    try:
        deadline = time.monotonic() + 2.5  # the store watch looks each second
        while time.monotonic() < deadline:
            response = httpx.put(f"{served.url}/v1/namespaces/x/memory/k", headers=headers,
                                 json={"value": 1}, timeout=10)
            assert response.status_code == 503, response.text
            time.sleep(0.2)
    finally:
        data.config_set("maxmemory", 0)
        data.close()
    # One line, from a refused request or from a background loop, whichever came first.
    warnings = [line for line in served.lines() if " WARNING " in line]
    assert len(warnings) == 1, "\n".join(warnings)
    assert "out of memory" in warnings[0] or "OutOfMemoryError" in warnings[0], warnings[0]
