"""Compiles run in a warm child process: a crash, abort, OOM kill or hang fails that compile, not the build.

A Server is one forked child that runs fn(request) for each call, one call at a time. The caller imports
the compiler once (warm) and forks the server from there: no Python start and no compiler import per
kernel, and the compiler's lazily built state (MLIR context, LLVM target init) survives from one compile
to the next inside the child, as in a process pool. Process-global compiler state (LLVM options, env
overrides) stays in the child, which serves one toolchain, and one arch where the compiler fixes its arch
per process. When a call crashes or times out, the child is gone; the next call forks a fresh one.

The child runs without Python's cyclic garbage collector. Triton's MLIR contexts are freed only by that
collector, and a process that has freed them compiles more slowly from then on: 100 Triton compiles in one
process took 17.2 CPU s with the collector off and 17.7-17.8 s with it on but every context kept alive,
against 19.5-19.9 s with it on (bench/compile_gc.py on the dev machine; the cause inside MLIR/LLVM was not
found; on the 16-CPU H100 host a whole build gained about 5%: docs/benchmarks.md). Without the
collector memory only grows (about 1 MB per Triton compile), so a child whose resident memory has grown by
more than `retire_after_mb` since its first call is retired after the call that crossed the line: the next call
forks a fresh one, from the same warm parent. The first call is not counted: it holds what a server does once (a
package server imports its library there: fla-core's 2,800 modules grew a server past 512 MB on a GPU host, and a
server retired after every call imported the library again for each target, 11 s each).
"""
from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Pipe
from typing import Any, Callable

STDERR_TAIL_LINES = 20
RETIRE_AFTER_MB = 512   # growth of a child's resident memory after which it is replaced


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    result: dict | None = None
    error: str = ""
    traceback: str = ""   # the compiler's own, where it raised: kept in error.txt, not printed
    facts: dict | None = None   # what fn attached to the exception it raised (`kforge_facts`), for the caller


class Forwarded(Exception):
    """Raised by fn with the failed Outcome of a server of its own (a server that forks servers): sent on to the
    caller as that server's answer, its error, traceback and facts unchanged."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.error)
        self.payload = {"error": outcome.error, "traceback": outcome.traceback,
                        **({"facts": outcome.facts} if outcome.facts else {})}


class Server:
    """A child process forked on first use; setup() runs once in it, fn(request) once per call."""

    def __init__(self, fn: Callable[[Any], dict], setup: Callable[[], None] | None = None,
                 collect_garbage: bool = False, retire_after_mb: float = RETIRE_AFTER_MB):
        self.fn, self.setup = fn, setup
        self.collect_garbage, self.retire_after_mb = collect_garbage, retire_after_mb
        self.pid: int | None = None
        self.conn = None
        self.started = 0   # children forked so far (a retired or crashed child is replaced by a fresh one)

    def call(self, request: Any, timeout: float, log_dir: str | None = None) -> Outcome:
        """fn(request) in the child; its output goes to a log in log_dir (kforge's scratch: rules/store/scratch.py)."""
        self._ensure_alive()
        with tempfile.NamedTemporaryFile(prefix="kforge-compile-", suffix=".log", dir=log_dir) as log:
            start = time.monotonic()
            try:
                self.conn.send((log.name, request))
            except OSError:   # died just now, between the liveness check and the send
                status = self._reap()
                return Outcome(False, time.monotonic() - start, error=_death(status) + _tail(log))
            answered = self.conn.poll(timeout)   # also true at EOF, when the child died
            if not answered:
                self._kill()
                return Outcome(False, time.monotonic() - start,
                               error=f"timed out after {timeout:.0f} s and was killed{_tail(log)}")
            try:
                payload = self.conn.recv()
            except (EOFError, OSError):
                status = self._reap()
                return Outcome(False, time.monotonic() - start, error=_death(status) + _tail(log))
            seconds = time.monotonic() - start
            if payload.get("retire"):   # grown past its memory bound, or unfit: the next call forks a fresh child
                self._kill()
            if "error" in payload:
                return Outcome(False, seconds, error=payload["error"] + _tail(log),
                               traceback=payload.get("traceback", ""), facts=payload.get("facts"))
            return Outcome(True, seconds, result=payload["result"])

    def close(self) -> None:
        if self.pid is not None:
            self._kill()

    def _ensure_alive(self) -> None:
        if self.pid is not None and os.waitpid(self.pid, os.WNOHANG) != (0, 0):
            self.pid = None   # died while idle (killed from outside): start over
            self.conn.close()
        if self.pid is None:
            self._start()

    def _start(self) -> None:
        parent_end, child_end = Pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:   # child: never returns
            parent_end.close()
            _serve(child_end, self.fn, self.setup, self.collect_garbage, self.retire_after_mb, parent)
        child_end.close()
        self.pid, self.conn = pid, parent_end
        self.started += 1

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()

    def _reap(self) -> int:
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = 0
        self.conn.close()
        self.pid = self.conn = None
        return status


def _serve(conn, fn, setup, collect_garbage: bool, retire_after_mb: float, parent: int) -> None:
    try:
        gc.freeze()   # the heap inherited from doit stays out of the collector's walks (and private pages)
        if not collect_garbage:
            gc.disable()   # see the module's docstring
        die_with_parent(parent)
        faulthandler.disable()   # an inherited handler would print the caller's stack, not the compiler's error
        # Ctrl-C ends the server with the run (the run reports it), unless the run ignores it (started in the
        # background, under nohup): then its servers ignore it too, or a compile would die with no interrupt at all
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Python-level writes go to fd 2 too (doit and pytest replace sys.stdout/err with in-memory buffers)
        sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)
        setup_error = None
        if setup is not None:
            try:
                setup()
            except Exception as e:
                setup_error = _error_payload(e)
        baseline_mb = None   # set after the first call (the module docstring says why)
        while True:
            try:
                log_path, request = conn.recv()
            except (EOFError, OSError):   # the caller is gone
                break
            log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            if setup_error is not None:
                payload = setup_error
            else:
                try:
                    payload = {"result": fn(request)}
                except Forwarded as e:
                    payload = dict(e.payload)
                except Exception as e:   # the compiler's own error: report it shortened, keep its traceback
                    payload = _error_payload(e)
                    if getattr(e, "kforge_retire", False):   # fn says this process is no longer fit to serve
                        payload["retire"] = True
            sys.stderr.flush()
            if baseline_mb is None:
                baseline_mb = _resident_mb()
            elif _resident_mb() - baseline_mb > retire_after_mb:
                payload["retire"] = True
            conn.send(payload)
    finally:
        os._exit(0)


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = "killed (out of memory?)" if sig == signal.SIGKILL else "crashed"
        return f"compiler process {why}: {signal.Signals(sig).name}"
    return f"compiler process exited with code {os.WEXITSTATUS(status)} and no result"


def _error_payload(e: Exception) -> dict:
    facts = getattr(e, "kforge_facts", None)
    return {"error": _short_error(e), "traceback": traceback.format_exc(), **({"facts": facts} if facts else {})}


def _short_error(e: Exception) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text if len(text) < 4000 else text[:4000] + " ..."


def _tail(log) -> str:
    log.seek(0)
    text = log.read().decode("utf-8", "replace").strip()
    if not text:
        return ""
    lines = text.splitlines()[-STDERR_TAIL_LINES:]
    return "\ncompiler output (last lines):\n  " + "\n  ".join(lines)


def die_with_parent(parent_pid: int) -> None:
    """In a forked child: be killed when the process that forked it dies (Linux prctl PR_SET_PDEATHSIG), so
    that a SIGKILLed build leaves no worker or compile server behind; exit now if it has died already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:   # it died between the fork and the prctl
        os._exit(1)
