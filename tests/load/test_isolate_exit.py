"""rules/load/isolate.py: a kernel's code that exits or raises a BaseException while the server runs it (a module
calling sys.exit at import) fails that call with what it did, in one line, and its traceback; an exit that cannot
be caught (os._exit) says what the process was running and the likely cause."""
import os
import sys

from kforge.load import isolate


class Stop(BaseException):
    pass


def exits(_):
    sys.exit(0)


def interrupts(_):
    raise KeyboardInterrupt


def stops(_):
    raise Stop("the kernel's own")


def exits_hard(_):
    os._exit(0)


def ok(x):
    return {"double": x * 2}


def test_a_kernels_code_that_exits_or_raises_a_base_exception_fails_the_call_with_what_it_did():
    for fn, what in ((exits, "called sys.exit(0)"), (interrupts, "raised KeyboardInterrupt"),
                     (stops, f"raised {__name__}.Stop: the kernel's own")):
        server = isolate.Server(fn)
        try:
            out = server.call(None, 30)
            assert not out.ok and not out.vanished and "\n" not in out.error, out.error
            assert out.error.startswith(f"the kernel's code {what} at {__file__}:"), out.error
            assert "while importing its module or compiling" in out.error
            assert fn.__name__ in out.traceback and "Traceback" in out.traceback
            server.fn = ok   # a fresh child serves the next call: what exited may have left things half done
            assert server.call(21, 30).result == {"double": 42} and server.started == 2
        finally:
            server.close()


def test_a_process_that_exits_uncaught_says_it_was_running_the_kernels_code_and_the_likely_cause():
    server = isolate.Server(exits_hard)
    try:
        out = server.call(None, 30)
    finally:
        server.close()
    assert not out.ok and out.error.splitlines()[0] == "compiler process exited with code 0 and no result"
    assert ("while running the kernel's code (importing its module or compiling): a module that calls sys.exit or "
            "os._exit at import is a likely cause") in out.error
