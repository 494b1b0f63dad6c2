"""Run one compile in a forked child: a crash, abort, OOM kill or hang fails that compile, not the build.

The caller imports the compiler once (warm), then every compile forks from that warm process: no Python
start and no `import triton` per kernel, and process-global compiler state (LLVM options, env overrides)
dies with the child.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    result: dict | None = None
    error: str = ""


def run(fn: Callable[[Any], dict], request: Any, timeout: float) -> Outcome:
    """fn(request) in a forked child; its dict result comes back as JSON through a pipe."""
    read_fd, write_fd = os.pipe()
    log = tempfile.TemporaryFile()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        _child(fn, request, write_fd, log.fileno())
    os.close(write_fd)
    try:
        data, timed_out = _read_until_exit(read_fd, timeout)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(read_fd)
    seconds = time.monotonic() - start
    tail = _tail(log)
    if timed_out:
        return Outcome(False, seconds, error=f"timed out after {timeout:.0f} s and was killed{tail}")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = "killed (out of memory?)" if sig == signal.SIGKILL else "crashed"
        return Outcome(False, seconds, error=f"compiler process {why}: {signal.Signals(sig).name}{tail}")
    try:
        message = json.loads(data)
    except ValueError:
        return Outcome(False, seconds, error=f"compiler process exited with code {os.WEXITSTATUS(status)} "
                                             f"and no result{tail}")
    if "error" in message:
        return Outcome(False, seconds, error=message["error"] + tail)
    return Outcome(True, seconds, result=message["result"])


def _child(fn, request, write_fd: int, log_fd: int) -> None:
    code = 1
    try:
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # Python-level writes too (doit and pytest replace sys.stdout/err with in-memory buffers)
        sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)
        try:
            payload = {"result": fn(request)}
            code = 0
        except Exception as e:  # the compiler's own error: report it, shortened
            payload = {"error": _short_error(e)}
        _write_all(write_fd, json.dumps(payload).encode())
    finally:
        sys.stderr.flush()
        os._exit(code)


def _short_error(e: Exception) -> str:
    lines = traceback.format_exception_only(type(e), e)
    text = "".join(lines).strip()
    return text if len(text) < 4000 else text[:4000] + " ..."


def _read_until_exit(fd: int, timeout: float) -> tuple[bytes, bool]:
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:   # EOF: the child closed its end (exited or died)
                return b"".join(chunks), False
            chunks.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _tail(log) -> str:
    log.seek(0)
    text = log.read().decode("utf-8", "replace").strip()
    log.close()
    if not text:
        return ""
    lines = text.splitlines()[-STDERR_TAIL_LINES:]
    return "\ncompiler output (last lines):\n  " + "\n  ".join(lines)


def _die_with_parent() -> None:
    """If the build process is killed, the compile it started stops too (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
