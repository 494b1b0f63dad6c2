"""Loading the catalog runs the project's code, bounded: a Python catalog file and the probe's imports each run in
a child process that says what it loads once it has taken a few seconds (a hang is otherwise a silent `doit
list`), is stopped at catalog_timeout with one line naming the file and the setting, may allocate at most
catalog_memory (RLIMIT_DATA, not RLIMIT_AS: CUDA and torch reserve many GB of address space at import), and runs
in a process group of its own, killed when the load ends, dying with its parent. For diagnosis, not containment
(a catalog is trusted code): a process that leaves its group or ignores its parent's death is not followed.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Pipe
from typing import Callable

from kforge.base import settings
from kforge.base.errors import SpecError
from kforge.load.isolate import die_with_parent, no_input, own_group

NOTICE_S = 5.0   # a load taking longer says what it is loading (earlier under a smaller catalog_timeout)


class TooLong(SpecError):
    """The child ran past catalog_timeout; the message names what it was loading and the setting."""


def run(fn: Callable[[], object], shown: str) -> object:
    """fn() in a forked child (its result pickled back); SpecError for what it raised, ran past the time limit
    or ran out of memory. `shown` is the file it loads, as messages show it."""
    memory = settings.get("catalog_memory")
    wait = Wait(shown, "the catalog file", f"python {shown}")
    sys.stdout.flush()
    sys.stderr.flush()   # or the child would write what is buffered a second time
    # its answer is framed by its length, not ended by the end of the pipe: a process the catalog forked may hold it
    reader, writer = Pipe(duplex=False)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:   # never returns
        reader.close()
        _child(fn, writer, parent, memory, shown)
    writer.close()
    own_group(pid)
    try:
        wait.readable(reader.fileno())
        data = reader.recv_bytes()
    except (EOFError, OSError):   # it died first
        data = None
    finally:
        reader.close()
        status = _end(pid)
    if data is None:
        raise SpecError(f"{shown}: the process loading it died ({_death(status)}) before it returned; run "
                        f"`python {shown}` to see why")
    kind, value = pickle.loads(data)
    if kind == "memory":
        raise SpecError(f"{shown}: ran out of memory at catalog_memory={_size(memory)}; raise it (catalog_memory="
                        f"SIZE or KFORGE_CATALOG_MEMORY, e.g. 16G) if the file needs more")
    if kind == "error":
        raise SpecError(value)
    return value


def popen(args: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen for a child that imports the project's modules: its own process group (stop() kills
    it and all it started), catalog_memory, and it dies with this process."""
    memory, parent = settings.get("catalog_memory"), os.getpid()
    return subprocess.Popen(args, process_group=0, preexec_fn=lambda: _limit(parent, memory), **kwargs)


def stop(child: subprocess.Popen) -> None:
    """Kill a popen() child and everything it started."""
    _kill_group(child.pid)
    child.wait()


def memory_hint(error: str) -> str:
    """A child's one-line error, with the setting to raise when it ran out of memory."""
    if "MemoryError" not in error:
        return error
    memory = _size(settings.get("catalog_memory"))
    return (f"{error.rstrip(': ')} (at catalog_memory={memory}; raise it: catalog_memory=SIZE or "
            f"KFORGE_CATALOG_MEMORY, e.g. 16G)")


class Wait:
    """Waiting on a child that is `doing` something for `where` (the file) since `started` (time.monotonic();
    default: now): one notice after a few seconds, a stop at catalog_timeout; `look` shows where it hangs."""

    def __init__(self, where: str, doing: str, look: str, started: float | None = None):
        self.where, self.doing, self.look = where, doing, look
        self.limit = settings.get("catalog_timeout")
        self.started, self.noticed = time.monotonic() if started is None else started, False

    def readable(self, fd: int) -> None:
        """Return once fd has something to read; TooLong at the time limit."""
        notice_at = min(NOTICE_S, self.limit / 2)
        while True:
            elapsed = time.monotonic() - self.started
            if elapsed >= self.limit:
                raise TooLong(f"{self.where}: {self.doing} ran past catalog_timeout ({self.limit:g} s) and was "
                              f"stopped; see where it hangs with `{self.look}`, or raise the limit (catalog_timeout="
                              f"SECONDS or KFORGE_CATALOG_TIMEOUT) if it needs longer")
            until = self.limit if self.noticed else notice_at
            if select.select([fd], [], [], max(0.0, until - elapsed))[0]:
                return
            took = time.monotonic() - self.started
            if not self.noticed and took >= notice_at:
                sys.stderr.write(f"kforge: loading {self.where} ({self.doing}) for {took:.0f} s so far; it is "
                                 f"stopped at {self.limit:g} s (catalog_timeout)\n")
                self.noticed = True


def _child(fn: Callable[[], object], writer, parent: int, memory: int, shown: str) -> None:
    try:
        own_group(0)
        _limit(parent, memory)
        no_input()
        os.dup2(2, 1)   # what a catalog prints goes to stderr: stdout is the command's (`doit list`, read by scripts)
        sys.stdout = sys.stderr
        try:
            answer = ("ok", fn())
        except MemoryError:
            answer = ("memory", None)
        except SpecError as e:
            answer = ("error", str(e))
        except BaseException as e:   # fn reports the catalog's own failures; this is kforge's
            answer = ("error", f"{shown}: loading it failed: {type(e).__name__}: {e}")
        try:
            data = pickle.dumps(answer)
        except MemoryError:
            data = pickle.dumps(("memory", None))
        except Exception as e:   # a value family() was given that cannot leave the process
            data = pickle.dumps(("error", f"{shown}: a family's arguments must be plain values (strings, numbers, "
                                          f"booleans, lists and dicts of them): {type(e).__name__}: {e}"))
        sys.stdout.flush()
        sys.stderr.flush()
        writer.send_bytes(data)
    finally:
        os._exit(0)   # no atexit handler of the parent's (scratch.sweep) runs in the child


def _limit(parent: int, memory: int) -> None:
    """In the child, before it runs the project's code: die with the parent, allocate at most `memory`."""
    die_with_parent(parent)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (memory if hard == resource.RLIM_INFINITY else min(memory, hard), hard))


def _end(pid: int) -> int:
    """Kill the child's group (the child, if it still runs, and whatever it started); its exit status."""
    _kill_group(pid)
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def _size(n: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if n % settings.SIZE_UNITS[unit] == 0:
            return f"{n // settings.SIZE_UNITS[unit]}{unit}"
    return str(n)
