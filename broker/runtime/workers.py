"""Several worker processes, each with a listening socket of its own.

Workers sharing one listening socket take connections in bursts: whichever is awake accepts
everything queued, so 64 connections opened at once split 50/14 and one core idles while the
other is saturated. Here every worker gets its own socket bound to the same address with
SO_REUSEPORT (`broker.runtime.listen.bind_each`), and the kernel spreads new connections over
them by hash, as nginx's `reuseport` does. Linux lets only sockets of the same user join such a
group."""

from __future__ import annotations

import logging
import socket

from uvicorn import Config
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger("uvicorn.error")


class WorkerPool(Multiprocess):
    """uvicorn's supervisor (health checks, signals, restarts that bring the replacement up
    before retiring the old worker), with worker `i` always on socket `i`: a worker that dies
    is replaced on its own socket, whose queued connections wait for the replacement."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        self.processes_num = len(sockets)

    def _spawn(self, slot: int) -> Process:
        process = Process(self.config, [self.sockets[slot]])
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes = [self._spawn(slot) for slot in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        for slot, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # It failed before serving: the app, TLS or settings would fail every restart.
                log.error("worker [%s] failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            log.info("worker [%s] died; starting another on its socket", process.pid)
            self.processes[slot] = self._spawn(slot)

    def restart_all(self) -> None:
        for slot, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._spawn(slot)
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck,
                                        self.should_exit):
                new.kill()
                new.join()
                log.error("worker [%s] was not ready in time; keeping [%s], restart aborted",
                          new.pid, old.pid)
                return
            old.terminate()
            old.join()
            self.processes[slot] = new
