"""Forked compiles: a crash, abort, kill or hang fails that one call, with a message; the caller lives on."""
import ctypes
import os
import signal
import sys
import time

from rules import isolate


def ok(x):
    return {"double": x * 2}


def raises(_):
    raise RuntimeError("bad tile shape")


def aborts(_):
    sys.stderr.write("LLVM ERROR: something broke\n")
    sys.stderr.flush()
    os.abort()


def segfaults(_):
    ctypes.string_at(0)


def oom_killed(_):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(_):
    time.sleep(60)


def test_result_comes_back():
    out = isolate.run(ok, 21, timeout=30)
    assert out.ok and out.result == {"double": 42}


def test_exception_is_reported_with_its_message():
    out = isolate.run(raises, None, timeout=30)
    assert not out.ok and "RuntimeError: bad tile shape" in out.error


def test_abort_is_contained_and_stderr_kept():
    out = isolate.run(aborts, None, timeout=30)
    assert not out.ok
    assert "crashed: SIGABRT" in out.error and "LLVM ERROR: something broke" in out.error


def test_segfault_and_kill_are_contained():
    assert "crashed: SIGSEGV" in isolate.run(segfaults, None, timeout=30).error
    assert "killed (out of memory?)" in isolate.run(oom_killed, None, timeout=30).error


def test_hang_times_out():
    start = time.monotonic()
    out = isolate.run(hangs, None, timeout=1)
    assert not out.ok and "timed out after 1 s" in out.error
    assert time.monotonic() - start < 10
