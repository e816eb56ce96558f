"""The processes a benchmark run starts (redis-server, uvicorn servers, wrk), and their cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_redis(procs: Processes) -> tuple[str, subprocess.Popen[bytes]]:
    """A throwaway redis-server (no persistence) on a free port; returns its URL and process."""
    port = free_port()
    proc = procs.start("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"])
    try:
        wait_for_port(proc, port, 10.0)
    except RuntimeError as exc:
        raise RuntimeError(f"redis-server {exc}:\n{procs.log_tail(proc)}") from None
    return f"redis://127.0.0.1:{port}/0", proc
