"""Compile servers: a crash, abort, kill or hang fails that one call, with a message; the next call works."""
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

from kforge.load import isolate


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


_calls = []


def counts(_):
    _calls.append(os.getpid())
    return {"calls": len(_calls), "pid": os.getpid()}


def run(fn, request, timeout):
    server = isolate.Server(fn)
    try:
        return server.call(request, timeout)
    finally:
        server.close()


def test_result_comes_back():
    out = run(ok, 21, timeout=30)
    assert out.ok and out.result == {"double": 42}


def test_one_warm_child_serves_many_calls():
    server = isolate.Server(counts)
    try:
        results = [server.call(None, timeout=30).result for _ in range(3)]
    finally:
        server.close()
    assert [r["calls"] for r in results] == [1, 2, 3]
    assert len({r["pid"] for r in results}) == 1 and results[0]["pid"] != os.getpid()
    assert _calls == []   # the caller's own state is untouched


def test_a_crash_fails_one_call_and_the_next_call_gets_a_fresh_child():
    calls = iter([aborts, ok])
    server = isolate.Server(lambda x: next(calls)(x))
    try:
        first = server.call(21, timeout=30)
        calls = iter([ok])   # the fresh child is forked from here and sees this iterator
        second = server.call(21, timeout=30)
    finally:
        server.close()
    assert "crashed: SIGABRT" in first.error
    assert second.ok and second.result == {"double": 42}


def test_setup_error_fails_every_call_with_its_message():
    def setup():
        raise RuntimeError("no linker")
    server = isolate.Server(ok, setup)
    try:
        assert "RuntimeError: no linker" in server.call(1, timeout=30).error
    finally:
        server.close()


def test_a_child_killed_while_idle_is_replaced():
    server = isolate.Server(counts)
    try:
        first = server.call(None, timeout=30).result["pid"]
        os.kill(first, signal.SIGKILL)
        time.sleep(0.2)
        out = server.call(None, timeout=30)
    finally:
        server.close()
    assert out.ok and out.result["pid"] != first


def test_exception_is_reported_with_its_message():
    out = run(raises, None, timeout=30)
    assert not out.ok and "RuntimeError: bad tile shape" in out.error


def test_abort_is_contained_and_stderr_kept():
    out = run(aborts, None, timeout=30)
    assert not out.ok
    assert "crashed: SIGABRT" in out.error and "LLVM ERROR: something broke" in out.error


def test_segfault_and_kill_are_contained():
    assert "crashed: SIGSEGV" in run(segfaults, None, timeout=30).error
    assert "killed (out of memory?)" in run(oom_killed, None, timeout=30).error


def test_hang_times_out():
    start = time.monotonic()
    out = run(hangs, None, timeout=1)
    assert not out.ok and "timed out after 1 s" in out.error
    assert time.monotonic() - start < 10


_held = []


def grows(megabytes):
    _held.append(bytearray(megabytes * 2**20))   # touched memory: resident
    return {"pid": os.getpid(), "collector_on": __import__("gc").isenabled()}


def test_the_child_runs_without_the_cyclic_collector():
    assert run(grows, 0, timeout=30).result["collector_on"] is False


def test_a_child_that_grew_past_its_bound_is_replaced_after_the_call():
    server = isolate.Server(grows, retire_after_mb=40)
    try:
        small = [server.call(1, timeout=30) for _ in range(2)]
        big = server.call(64, timeout=30)   # crosses the bound: answered, then retired
        after = server.call(1, timeout=30)
    finally:
        server.close()
    assert all(o.ok for o in small + [big, after])
    assert small[0].result["pid"] == small[1].result["pid"] == big.result["pid"]
    assert after.result["pid"] != big.result["pid"] and server.started == 2


def test_what_the_first_call_grows_by_is_set_up_not_growth():
    # a package server imports its library in its first call: that must not retire it (each target of it then
    # imported the library again); growth after it still does
    server = isolate.Server(grows, retire_after_mb=40)
    try:
        first = server.call(64, timeout=30)
        second = server.call(1, timeout=30)
        big = server.call(64, timeout=30)
        after = server.call(1, timeout=30)
    finally:
        server.close()
    assert first.result["pid"] == second.result["pid"] == big.result["pid"] != after.result["pid"]
    assert server.started == 2


def log_path(_):
    return {"log": os.readlink("/proc/self/fd/2")}   # the child's stderr is the call's log


def test_the_compile_log_is_kept_where_the_caller_says_and_removed_after_the_call(tmp_path):
    server = isolate.Server(log_path)
    try:
        out = server.call(None, 30, log_dir=str(tmp_path))
    finally:
        server.close()
    assert out.ok and os.path.dirname(out.result["log"]) == str(tmp_path), out
    assert list(tmp_path.iterdir()) == []


def test_a_call_whose_log_is_devnull_writes_no_file():
    """The probe's module processes: what a module prints at import is nobody's, and no temp file (the system's
    temp directory is outside out/) is made for it."""
    server = isolate.Server(log_path)
    made = []
    real = isolate.tempfile.NamedTemporaryFile
    isolate.tempfile.NamedTemporaryFile = lambda *a, **k: made.append(k) or real(*a, **k)
    try:
        out = server.call(None, 30, log_dir=os.devnull)
    finally:
        isolate.tempfile.NamedTemporaryFile = real
        server.close()
    assert out.ok and out.result["log"] == os.devnull and made == [], (out, made)


def interrupted_by_sigint(_):
    """SIGINT sent to the child itself: whether it survived to answer."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return {"survived": True}


def test_ctrl_c_ends_a_child_unless_the_run_ignores_it():
    """A run started with SIGINT ignored (in the background of a script, under nohup) keeps going on a Ctrl-C to
    its process group; its compile servers must too, not die as crashed compilers. Otherwise SIGINT ends the child.
    Both dispositions are set here: the test itself may run in the background of a script (SIGINT ignored)."""
    outcomes = {}
    for disposition in (signal.default_int_handler, signal.SIG_IGN):
        previous = signal.signal(signal.SIGINT, disposition)
        try:
            outcomes[disposition] = run(interrupted_by_sigint, None, timeout=30)
        finally:
            signal.signal(signal.SIGINT, previous)
    assert outcomes[signal.default_int_handler].error.count("crashed: SIGINT") == 1
    out = outcomes[signal.SIG_IGN]
    assert out.ok and out.result == {"survived": True}


# --- a hub: servers forked for other processes, answering them directly ------------------------------------------

def _serving(fn):
    """A hub handler: a server running fn for the asker, answered {"forked": True}."""
    def handle(request, fd):
        isolate.serve_on(os.dup(fd), fn)
        return {"forked": True, "request": request}
    return handle


def _refusing(request, fd):
    raise RuntimeError(f"cannot import {request}")


def _attached(hub, request="r"):
    return isolate.Attached(lambda: hub.connect(request, timeout=30)[:2])


def test_a_hubs_server_answers_the_process_that_asked_which_is_not_its_parent():
    hub = isolate.Hub(_serving(counts))
    server = _attached(hub)
    try:
        results = [server.call(None, timeout=30).result for _ in range(2)]
        conn, pid, answer = hub.connect("again", timeout=30)
        conn.close()
    finally:
        server.close()
        hub.close()
    assert [r["calls"] for r in results] == [1, 2] and results[0]["pid"] == results[1]["pid"]
    assert results[0]["pid"] not in (os.getpid(), hub.pid) and answer == {"forked": True, "request": "again"}
    assert str(results[0]["pid"]) not in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()


def test_a_hubs_server_that_crashes_is_named_by_how_it_ended_and_the_next_call_gets_a_fresh_one():
    for fn, how in ((segfaults, "crashed: SIGSEGV"), (oom_killed, "killed (out of memory?): SIGKILL"),
                    (aborts, "crashed: SIGABRT")):
        hub = isolate.Hub(_serving(lambda x: fn(x) if x == "crash" else ok(x)))
        server = _attached(hub)
        try:
            first = server.call("crash", timeout=30)
            second = server.call(21, timeout=30)
        finally:
            server.close()
            hub.close()
        assert how in first.error and not first.ok, (fn, first.error)
        assert second.ok and second.result == {"double": 42} and server.started == 2


def test_a_hubs_server_that_hangs_is_killed_and_one_killed_while_idle_is_replaced():
    hub = isolate.Hub(_serving(lambda x: hangs(x) if x == "hang" else counts(x)))
    server = _attached(hub)
    try:
        hung = server.call("hang", timeout=1)
        first = server.call(None, timeout=30).result
        os.kill(first["pid"], signal.SIGKILL)   # from outside, between calls
        time.sleep(0.2)
        second = server.call(None, timeout=30).result
    finally:
        server.close()
        hub.close()
    assert "timed out after 1 s and was killed" in hung.error
    assert second["pid"] != first["pid"] and server.started == 3


def test_a_hubs_refusal_is_the_calls_answer_and_a_killed_hub_is_replaced_by_one_of_the_askers_own():
    refusing = isolate.Hub(_refusing)
    out = _attached(refusing, "liblib").call(None, timeout=30)
    refusing.close()
    assert not out.ok and "RuntimeError: cannot import liblib" in out.error
    hub = isolate.Hub(_serving(counts))
    hub.start()
    first = hub.pid
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    server = _attached(hub)
    try:
        assert server.call(None, timeout=30).ok
        replaced, owner = hub.pid, hub.owner
    finally:
        server.close()
        hub.close()
    assert replaced not in (None, first) and owner == os.getpid()


def reads_stdin(_):
    return {"read": os.read(0, 100)}


def test_a_child_reading_stdin_reads_nothing_and_never_waits_on_the_callers(monkeypatch):
    """A library or catalog that reads stdin as it is imported stalled a whole build until stdin closed (at a
    terminal: until the user typed, taking their input; an outside review). A child's stdin is /dev/null."""
    read_end, write_end = os.pipe()   # the caller's stdin: open, never written to, never closed
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        out = run(reads_stdin, None, timeout=10)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert out.ok and out.result == {"read": b""}, out
