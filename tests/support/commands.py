"""The `memp` command line run in-process: its real `main()` with the arguments, environment
and stdin a user would give, and the exit code, stdout and stderr it leaves, as
`subprocess.run` reports them. A subprocess costs a Python start per call; the tests that
need one (signals, the installed entry point) start it themselves."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from memp.cli import main

_ONE_AT_A_TIME = threading.Lock()  # the environment and the standard streams are the process's


@dataclass(frozen=True)
class Completed:
    """What one run of the command left, named as `subprocess.CompletedProcess` names it."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _fresh_logger(name: str) -> Iterator[None]:
    """The logger as a new process has it (the command adds its handler on stderr to it)."""
    logger = logging.getLogger(name)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers.clear()
    try:
        yield
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_memp(env: Mapping[str, str], *args: str, stdin: str | None = None) -> Completed:
    """Run `memp ARGS` with `env` as its whole environment and `stdin` (or nothing) as input."""
    out, err = io.StringIO(), io.StringIO()
    saved_stdin, saved_showwarning = sys.stdin, warnings.showwarning
    with _ONE_AT_A_TIME, _environment(env), _fresh_logger("memp"), warnings.catch_warnings(), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("default")  # as a fresh interpreter shows them
        sys.stdin = io.StringIO(stdin or "")
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse: --help, usage errors
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        finally:
            sys.stdin, warnings.showwarning = saved_stdin, saved_showwarning
    return Completed(code, out.getvalue(), err.getvalue())
