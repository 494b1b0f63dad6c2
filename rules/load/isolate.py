"""Compiles run in a warm child process: a crash, abort, OOM kill or hang fails that compile, not the build.

A Server is one forked child that runs fn(request) per call. The caller imports the compiler once and forks from
there: the compiler's lazily built state lives on from call to call, process-global state (LLVM options, env
overrides) stays in the child. A call that crashes or times out takes the child; the next call forks a fresh one.

The child runs without the cyclic garbage collector: freeing Triton's MLIR contexts slows later compiles (100
compiles: 17.2 CPU s with it off, 19.5-19.9 s on: bench/compile_gc.py). Memory then only grows (about 1 MB per
compile), so a child grown by more than `retire_after_mb` since its first call is replaced after that call.

A Hub is one process that forks servers for every process of a run (doit's workers): each sends it a socket of
its own; the hub forks a server that answers on it (serve_on) and the asker talks to it directly (Attached). Only
a parent learns how its child ended, so each such server runs under a minder that tells the asker its pid and,
when it ends, its exit status (docs/correctness.md: isolated compiles).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import gc
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection, Pipe
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
    # a server forked elsewhere ended with no word from its minder (a hub killed from outside), not the call's own
    # doing: asking again gets a fresh one
    vanished: bool = False
    exit_code: int | None = None   # the server exited by itself (os._exit, LLVM's exit(1)) with this code, no answer
    output: str = ""   # the last lines it printed during the call


class Forwarded(Exception):
    """Raised by fn with the failed Outcome of a server of its own (a server that forks servers): sent on to the
    caller as that server's answer, its error, traceback, facts, exit code and output unchanged."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.error)
        self.payload = {"error": outcome.error, "traceback": outcome.traceback, "exit_code": outcome.exit_code,
                        "output": outcome.output, **({"facts": outcome.facts} if outcome.facts else {})}


class Server:
    """A child process forked on first use; setup() runs once in it, fn(request) once per call."""

    def __init__(self, fn: Callable[[Any], dict], setup: Callable[[], None] | None = None,
                 retire_after_mb: float = RETIRE_AFTER_MB):
        self.fn, self.setup, self.retire_after_mb = fn, setup, retire_after_mb
        self.pid: int | None = None
        self.conn = None
        self.started = 0   # children forked so far (a retired or crashed child is replaced by a fresh one)

    def call(self, request: Any, timeout: float, log_dir: str | None = None, handle: int | None = None) -> Outcome:
        """fn(request) in the child; its output goes to a log in log_dir, or nowhere with log_dir=os.devnull. With
        `handle` (a file descriptor), fn gets (request, the child's own copy of it)."""
        try:
            self._ensure_alive()
        except Unavailable as e:
            return e.outcome
        with (open(os.devnull, "rb") if log_dir == os.devnull else
              tempfile.NamedTemporaryFile(prefix="kforge-compile-", suffix=".log", dir=log_dir)) as log:
            start = time.monotonic()
            try:
                self.conn.send((log.name, request, handle is not None))
                if handle is not None:
                    reduction.send_handle(self.conn, handle, self.pid)
            except OSError:   # died just now, between the liveness check and the send
                return self._ended(None, start, log)
            answered = self.conn.poll(timeout)   # also true at EOF, when the child died
            if not answered:
                self._kill()
                output = _tail(log)
                return Outcome(False, time.monotonic() - start, output=output,
                               error=f"timed out after {timeout:.0f} s and was killed{headed(output)}")
            try:
                payload = self.conn.recv()
            except (EOFError, OSError):
                payload = None
            if payload is None or "died" in payload:
                return self._ended(payload, start, log)
            seconds = time.monotonic() - start
            if payload.get("retire"):   # grown past its memory bound, or unfit: the next call forks a fresh child
                self._kill()
            if "error" in payload:
                output = _tail(log)
                return Outcome(False, seconds, error=payload["error"] + headed(output), traceback=payload.get(
                    "traceback", ""), facts=payload.get("facts"), exit_code=payload.get("exit_code"),
                    output=payload.get("output", output))   # a forwarded one's: its server's own, even none
            return Outcome(True, seconds, result=payload["result"])

    def _ended(self, payload: dict | None, start: float, log) -> Outcome:
        status, output = self._reap(payload), _tail(log)
        exited = status is not None and os.WIFEXITED(status)
        return Outcome(False, time.monotonic() - start, error=_death(status) + headed(output), output=output,
                       vanished=status is None, exit_code=os.WEXITSTATUS(status) if exited else None)

    def start(self) -> None:
        """Fork the child now, if none is alive (else the next call does)."""
        self._ensure_alive()

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
            _serve(child_end, self.fn, self.setup, self.retire_after_mb, parent)
        child_end.close()
        self.pid, self.conn = pid, parent_end
        self.started += 1

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap()

    def _reap(self, payload: dict | None = None) -> int | None:
        """Forget the child that is gone (or killed): its exit status."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = 0
        self.conn.close()
        self.pid = self.conn = None
        return status


class Unavailable(Exception):
    """No server could be had for a call: its failed Outcome is the call's answer."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.error)
        self.outcome = outcome


class Attached(Server):
    """A server another process forked for this one (Hub, serve_on): connect() returns (connection, pid), or
    raises Unavailable; its minder says how it ended (the "died" message)."""

    def __init__(self, connect: Callable[[], tuple[Connection, int]]):
        super().__init__(fn=None)
        self.connect = connect

    def _ensure_alive(self) -> None:
        if self.conn is not None and self.conn.poll(0):   # an idle server says nothing, unless it has died
            self._reap()
        if self.conn is None:
            self.conn, self.pid = self.connect()
            self.started += 1

    def _reap(self, payload: dict | None = None) -> int | None:
        """Not this process's child: its minder reaps it, and says how it ended (None: no word)."""
        self.conn.close()
        self.pid = self.conn = None
        return payload.get("died") if payload else None


def serve_on(fd: int, fn: Callable[[Any], dict], setup: Callable[[], None] | None = None) -> int:
    """Fork a server answering calls on the socket `fd` (the asker's end: Attached), under a minder that sends the
    asker its pid first and its exit status last. Returns the minder's pid (the caller reaps it); closes `fd`."""
    caller = os.getpid()
    minder = os.fork()
    if minder:
        os.close(fd)
        return minder
    try:
        _leave_hub()
        die_with_parent(caller)
        conn = Connection(fd)
        me = os.getpid()
        child = os.fork()
        if child == 0:   # never returns
            _serve(conn, fn, setup, RETIRE_AFTER_MB, me)
        conn.send({"pid": child})
        _, status = os.waitpid(child, 0)
        conn.send({"died": status})
    except BaseException:   # the asker has gone: nothing to tell
        pass
    finally:
        os._exit(0)


MAX_REQUEST = 1 << 20   # bytes of one pickled request to a Hub


class Hub:
    """A process that forks servers for every process holding it (doit's workers, forked after it): ask(request)
    sends the request with a fresh socket's other end; in the hub, handle(request, fd) forks a server on it
    (serve_on) and returns a dict sent after it (an exception as {"error": ...}), one request at a time."""

    def __init__(self, handle: Callable[[Any, int], dict]):
        self.handle = handle
        self.pid: int | None = None
        self.owner: int | None = None   # the process that forked it: the one that may close it
        self.attached = False   # forked by a keeper (rules/load/kept_hub.py), not by its owner
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()   # a process's threads share its hub

    def ask(self, request: Any, replace: bool = True) -> Connection:
        """The asker's end of the request's socket. A hub that has gone (killed) is replaced by one of this
        process's own, if `replace`."""
        data = pickle.dumps(request)
        while True:
            self.start()
            mine, theirs = socket.socketpair()
            try:
                socket.send_fds(self.sock, [data], [theirs.fileno()])
                return Connection(mine.detach())
            except OSError:
                mine.close()
                if not replace:
                    raise
                replace = False
                self.close()
            finally:
                theirs.close()

    def connect(self, request: Any, timeout: float, retry: bool = True) -> tuple[Connection, int, dict]:
        """ask(request), for a handler that forks a server on the socket (serve_on): (the connection to that
        server, its pid, what the handler answered); Unavailable for an error or no answer within `timeout`. A
        hub that ended with the request in its queue (killed) is replaced by one of this process's own, once."""
        conn, start, got = self.ask(request), time.monotonic(), {}
        try:
            while "pid" not in got or "answer" not in got:
                if not conn.poll(max(start + timeout - time.monotonic(), 0)):
                    raise Unavailable(Outcome(False, time.monotonic() - start,
                                              error=f"no compile server within {timeout:.0f} s"))
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = {"died": None}
                if "error" in message or "died" in message:
                    vanished = "died" in message and message["died"] is None
                    if vanished and retry:
                        break
                    raise Unavailable(Outcome(
                        False, time.monotonic() - start,
                        error=message.get("error") or _death(message.get("died")),
                        traceback=message.get("traceback", ""), facts=message.get("facts"), vanished=vanished))
                got.update(message if "pid" in message else {"answer": message})
            else:
                return conn, got["pid"], got["answer"]
        except BaseException:
            conn.close()
            raise
        conn.close()
        self.close()   # gone: the next ask forks one of this process's own
        return self.connect(request, timeout, retry=False)

    def close(self, grace_s: float = 5.0) -> None:
        """Kill the hub and every server below it, and wait (up to grace_s) until none is left: an interrupted
        run's compiles in flight must not outlive the run (they write in its scratch folders, which go next)."""
        if self.pid is not None and self.owner == os.getpid():
            try:
                os.killpg(self.pid, signal.SIGKILL)   # its process group: the hub and all it forked
            except ProcessLookupError:   # no group of its own (setpgid refused): the hub alone, its servers after it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            deadline = time.monotonic() + grace_s
            while _group_running(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.sock is not None:
            self.sock.close()
        self.pid = self.owner = self.sock = None
        self.attached = False
        atexit.unregister(self.close)   # a Dask worker closes a hub per build: none is kept until its exit

    def start(self, attach: Callable[[], tuple[socket.socket, int] | None] | None = None) -> bool:
        """Start the hub now, if this process has none: whether it did. attach() may give one forked elsewhere for
        this process, (its socket, its pid); else it is forked here."""
        with self.lock:
            if self.sock is not None:
                return False
            found = attach() if attach is not None else None
            if found is None:
                self._fork()
            else:
                (self.sock, self.pid), self.owner, self.attached = found, os.getpid(), True
                atexit.register(self.close)
            return True

    def _fork(self) -> None:
        ours, hubs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:   # never returns
            ours.close()
            _run_hub(hubs, self.handle, parent)
        hubs.close()
        own_group(pid)
        self.pid, self.owner, self.sock = pid, parent, ours
        # its own group hears no Ctrl-C: at this process's exit, before the scratch sweep registered earlier
        # (atexit runs the last registered first), its compiles in flight go
        atexit.register(self.close)


def reaped(pid: int) -> bool:
    """Whether this process's child `pid` has ended (reaped now if it had), without waiting."""
    try:
        return os.waitpid(pid, os.WNOHANG) != (0, 0)
    except ChildProcessError:
        return True


def processes():
    """(pid, command name, the fields of /proc/PID/stat after the name: state, ppid, pgrp, ...) of each process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    head, _, rest = f.read().rpartition(b")")   # the name may hold ")" itself
            except OSError:
                continue
            yield int(entry), head.partition(b"(")[2], rest.split()


def _group_running(group: int) -> bool:
    """Whether a process of this process group still runs (a zombie does not: it waits for whoever reaps it)."""
    return any(len(fields) > 2 and int(fields[2]) == group and fields[0] != b"Z" for _, _, fields in processes())


_hub_ends: list[socket.socket] = []   # in a hub: its end of the askers' socket, which no server it forks keeps


def _leave_hub() -> None:
    """In a process a hub forked: close its end of the askers' socket. While a server held it, a hub killed from
    outside still took requests (queued, never read), so askers never started their own."""
    for end in _hub_ends:
        end.close()
    _hub_ends.clear()


def _run_hub(sock: socket.socket, handle: Callable[[Any, int], dict], parent: int) -> None:
    try:
        own_group(0)   # which every server it forks joins: Hub.close kills the group
        _child_of(parent, HUB_NAME)   # it imports toolchains and forks: the collector would only slow the imports
        _hub_ends.append(sock)
        while True:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 1)
            if not data:   # no process holds the other end any more
                break
            if not fds:
                continue
            reply = Connection(fds[0])
            try:
                answer = handle(pickle.loads(data), fds[0])
            except Exception as e:
                answer = _error_payload(e)
            with contextlib.suppress(OSError):   # the asker has gone
                reply.send(answer)
            reply.close()
    finally:
        os._exit(0)


def _child_of(parent: int, name: bytes) -> None:
    """A hub's or server's start: named for ps, without the collector (the inherited heap frozen out of its walks),
    dying with `parent`; Ctrl-C ends it with the run, unless the run ignores it (under nohup): then it does too."""
    _leave_hub()
    _name_process(name)
    gc.freeze()
    gc.disable()
    die_with_parent(parent)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _serve(conn, fn, setup, retire_after_mb: float, parent: int) -> None:
    try:
        _child_of(parent, SERVER_NAME)
        no_input()
        faulthandler.disable()   # an inherited handler would print the caller's stack, not the compiler's error
        # Python-level writes go to fd 2 too (doit and pytest replace sys.stdout/err with in-memory buffers)
        sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)
        setup_error = None
        if setup is not None:
            try:
                setup()
            except BaseException as e:   # sys.exit in what it imports too: said, not an exit with no result
                setup_error = _error_payload(e)
        baseline_mb = None   # set after the first call (the module docstring says why)
        while True:
            try:
                log_path, request, handed = conn.recv()
                if handed:
                    request = (request, reduction.recv_handle(conn))
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
                # the kernel's code exited (sys.exit at import) or raised a KeyboardInterrupt of its own (a Ctrl-C
                # kills: SIGINT is default): said as its error; what it cut short may be half done, so retired
                except BaseException as e:
                    payload = _error_payload(e)
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


def _death(status: int | None) -> str:
    if status is None:   # a server forked elsewhere whose minder is gone too
        return "compiler process ended with no result"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = "killed (out of memory?)" if sig == signal.SIGKILL else "crashed"
        return f"compiler process {why}: {signal.Signals(sig).name}"
    # an exit no handler sees (os._exit; _serve catches sys.exit): the likely cause below the first line
    return (f"compiler process exited with code {os.WEXITSTATUS(status)} and no result\n"
            f"while running the kernel's code (importing its module or compiling): a module that calls sys.exit or "
            f"os._exit at import is a likely cause")


def _error_payload(e: BaseException) -> dict:
    facts = getattr(e, "kforge_facts", None)
    return {"error": _short_error(e), "traceback": traceback.format_exc(), **({"facts": facts} if facts else {})}


def _short_error(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    if isinstance(e, SyntaxError) and e.filename:   # Python's form begins with the file and quotes the line: one line
        line = f", line {e.lineno}" if e.lineno else ""
        fix = ": fix that file" if os.path.isabs(e.filename) else ""   # not "<string>": code made at run time
        text = f"{type(e).__name__}: {e.msg} ({e.filename}{line}){fix}"
    elif not isinstance(e, Exception):   # an exit or interrupt raised by the kernel's code: what it did, and where
        frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        exits = isinstance(e, SystemExit)
        what = (f"called sys.exit({'' if e.code is None else repr(e.code)})" if exits
                else f"raised {' '.join(text.split())}")
        text = (f"the kernel's code {what}{f' at {frame.filename}:{frame.lineno}' if frame else ''} while importing "
                f"its module or compiling; a module must not {'exit' if exits else 'raise ' + type(e).__name__} at "
                f"import (put such code under `if __name__ == \"__main__\":`)")
    elif text.endswith("^") and e.__cause__ is not None:
        # Triton's CompilationError for a call into a failing @jit function says only where: its innermost cause's
        # last line says why
        cause = e.__cause__
        while cause.__cause__ is not None:
            cause = cause.__cause__
        said = [line.strip() for line in "".join(traceback.format_exception_only(type(cause), cause)).splitlines()]
        said = [line for line in said if line]
        # and where, when its first line says so (a CompilationError's "at <file>:<line> ...:")
        text += "\n" + (f"{said[0]} ... {said[-1]}" if len(said) > 1 and said[0].endswith(":") else said[-1])
    return text if len(text) < 4000 else text[:4000] + " ..."


def _tail(log) -> str:
    """The last lines a call printed."""
    log.seek(0)
    return "\n".join(log.read().decode("utf-8", "replace").strip().splitlines()[-STDERR_TAIL_LINES:])


def headed(output: str) -> str:
    """A call's last printed lines below its error."""
    return "\ncompiler output (last lines):\n  " + output.replace("\n", "\n  ") if output else ""


HUB_NAME = b"kforge-hub"   # what ps and /proc/PID/comm show for a hub
SERVER_NAME = b"kforge-server"   # and for a server


def _name_process(name: bytes) -> None:
    _prctl(15, ctypes.c_char_p(name))   # PR_SET_NAME


def _prctl(option: int, value) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def own_group(pid: int) -> None:
    """A process group of its own for the child `pid` (0: this process), set on both sides of the fork: a kill
    right after it must find the group, whichever side runs first."""
    with contextlib.suppress(OSError):   # the other side set it already, or the child has exited
        os.setpgid(pid, 0)


def no_input() -> None:
    """In a child that imports a library or runs a catalog: stdin is /dev/null. A module reading stdin at import
    stalled the build with no word, waiting on the terminal."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def die_with_parent(parent_pid: int) -> None:
    """In a forked child: be killed when the process that forked it dies (PR_SET_PDEATHSIG), so that a SIGKILLed
    build leaves no worker or server behind; exit now if it has died already."""
    _prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:   # it died between the fork and the prctl
        os._exit(1)
