"""The processes a benchmark run starts (redis-server, uvicorn servers, wrk), and their cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Processes:
    """Starts processes in their own sessions (so a terminal's Ctrl-C reaches only us, and we
    stop them in order) and stops every one of them on `stop_all`, however the run ends."""

    def __init__(self) -> None:
        self._running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._logs = Path(tempfile.mkdtemp(prefix="memp-bench-"))

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              capture: bool = False, stdin: bool = False) -> subprocess.Popen[bytes]:
        """Start `argv`; its output goes to a log file (or a pipe, with `capture`); `stdin`
        gives it a pipe to read from instead of /dev/null."""
        log = self._logs / f"{name}.log"
        out = subprocess.PIPE if capture else log.open("wb")
        try:
            proc = subprocess.Popen(list(argv), env=env, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            if not capture:
                out.close()  # type: ignore[union-attr]
        self._running.append((name, proc, log))
        return proc

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 20) -> str:
        for _, known, log in self._running:
            if known is proc and log.exists():
                return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        """SIGTERM the process's group, then SIGKILL it if it has not gone within `timeout`."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._running = [r for r in self._running if r[1] is not proc]

    def stop_all(self) -> None:
        for _, proc, _ in reversed(list(self._running)):
            self.stop(proc)
        for log in self._logs.glob("*.log"):
            log.unlink()
        with contextlib.suppress(OSError):
            self._logs.rmdir()


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without MEMP_*/BENCH_* settings (so runs are comparable), plus
    `extra`, with the repository on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMP_", "BENCH_"))}
    env.update(extra)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def wait_for_port(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> None:
    """Wait until something accepts connections on `port`; fail if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"not listening on port {port} after {timeout:.0f} s")


def wait_started(procs: Processes, proc: subprocess.Popen[bytes], port: int, label: str,
                 timeout: float = 30.0) -> None:
    """`wait_for_port`, failing with `label` and the end of the process's log."""
    try:
        wait_for_port(proc, port, timeout)
    except RuntimeError as exc:
        raise RuntimeError(f"{label} {exc}:\n{procs.log_tail(proc)}") from None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process and its descendants (a multi-worker server's workers)
    have used so far (Linux /proc; None elsewhere)."""
    stats = _process_stats()
    if pid not in stats:
        return None
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += stats[current][1]
        todo += children.get(current, [])
    return total


def _process_stats() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds (user + system), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    return out


def cpu_snapshot(watch: dict[str, int]) -> dict[str, float | None]:
    """`cpu_seconds` of each watched process (name -> pid)."""
    return {name: cpu_seconds(pid) for name, pid in watch.items()}


def cpu_since(watch: dict[str, int], before: dict[str, float | None]) -> dict[str, float]:
    """CPU seconds each watched process has used since `before` (a `cpu_snapshot`), for the
    processes whose CPU time could be read both times."""
    used = {}
    for name, pid in watch.items():
        start, end = before[name], cpu_seconds(pid)
        if start is not None and end is not None:
            used[name] = end - start
    return used


def own_cpu() -> float:
    """CPU seconds of this process and its waited-for children (wrk)."""
    me, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def need_redis_server(alternative: str = "") -> None:
    """Stop the run before it starts if redis-server is not installed (`alternative`: what the
    user may do instead, such as ", or pass --redis-url")."""
    if not shutil.which("redis-server"):
        raise SystemExit("bench: redis-server is not installed (apt-get install -y "
                         f"redis-server){alternative}")


def start_redis(procs: Processes) -> tuple[str, subprocess.Popen[bytes]]:
    """A throwaway redis-server (no persistence) on a free port; returns its URL and process."""
    port = free_port()
    proc = procs.start("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"])
    wait_started(procs, proc, port, "redis-server", 10.0)
    return f"redis://127.0.0.1:{port}/0", proc


def choose_loadgen(choice: str) -> str:
    """The load generator to use for --load-generator `choice` (auto, wrk or python)."""
    has_wrk = shutil.which("wrk") is not None
    if choice == "wrk" and not has_wrk:
        raise SystemExit("bench: wrk is not installed (apt-get install -y wrk, or brew install "
                         "wrk), or pass --load-generator python")
    if choice == "auto" and not has_wrk:
        print("bench: wrk not found (apt-get install -y wrk); using the Python load generator, "
              "which needs a core of its own and may not saturate the server", file=sys.stderr)
        return "python"
    return "wrk" if choice == "auto" else choice


def run_wrk(procs: Processes, script: Path, url: str, connections: int, seconds: int,
            script_args: Sequence[str]) -> dict[str, Any]:
    """Run wrk (one thread) against `url` for `seconds` with a script of ours (bench/wrk.lua,
    bench/replay.lua) and return the figures its `done` prints as "BENCH_RESULT {json}"."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
            "-s", str(script), url, "--", *script_args]
    proc = procs.start("wrk", argv, capture=True)
    try:
        out, _ = proc.communicate(timeout=seconds + 60)
    finally:
        procs.stop(proc)
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise RuntimeError(f"wrk printed no result (status {proc.returncode}):\n{out.decode()}")


# ---- a run's end ----


def start_run() -> Processes:
    """The start of a run: SIGTERM stops it as Ctrl-C does (through its cleanup); the
    processes it will start."""
    signal.signal(signal.SIGTERM, on_sigterm)
    return Processes()


def end_run(procs: Processes) -> None:
    """However a run ends: stop every process it started, uninterrupted."""
    with signals_held():
        procs.stop_all()


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM handler: stop the run as Ctrl-C would, through its cleanup."""
    raise KeyboardInterrupt


def failure_status(exc: BaseException) -> int:
    """Say why the run stopped; its exit status (130 when interrupted, else 1)."""
    if isinstance(exc, KeyboardInterrupt):
        print("bench: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    print(f"bench: {exc}", file=sys.stderr)
    return 1


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Cleanup under this ignores SIGINT and SIGTERM, so a second Ctrl-C cannot cut it short
    and leave servers running; then SIGINT's handler is restored and SIGTERM's reset."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
