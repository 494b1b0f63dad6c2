"""rules/load/isolate.py: what a failed call says. A kernel's code that exits or raises a BaseException while the
server runs it (a module calling sys.exit at import) fails that call with what it did, in one line, and its
traceback; an exit that cannot be caught (os._exit) says what the process was running and the likely cause; an
error that says only where (Triton's CompilationError of a call) gets its cause's last line."""
import ast
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


def one_call(fn, timeout: float) -> isolate.Outcome:
    """fn(None) in a server of its own, closed after."""
    server = isolate.Server(fn)
    try:
        return server.call(None, timeout)
    finally:
        server.close()


def test_a_process_that_exits_uncaught_says_it_was_running_the_kernels_code_and_the_likely_cause():
    out = one_call(exits_hard, 30)
    assert not out.ok and out.error.splitlines()[0] == "compiler process exited with code 0 and no result"
    assert ("while running the kernel's code (importing its module or compiling): a module that calls sys.exit or "
            "os._exit at import is a likely cause") in out.error
    assert out.exit_code == 0 and out.output == ""


def prints_and_exits(_):
    os.write(2, b"warning: first\nerror: last\n")
    os._exit(3)


def forwards(_):
    """A server of its own's failed outcome, forwarded as this server's answer."""
    raise isolate.Forwarded(one_call(prints_and_exits, 30))


def test_an_exit_and_what_was_printed_reach_the_caller_as_fields_through_a_server_of_servers():
    """The exit code and the printed lines are fields of the outcome (compile/core.py tells a compiler's exit(1)
    by them), the same when a server forwards its own server's death."""
    direct, forwarded = one_call(prints_and_exits, 30), one_call(forwards, 60)
    for out in direct, forwarded:
        assert not out.ok and out.exit_code == 3 and out.output == "warning: first\nerror: last", out
        assert out.error.startswith("compiler process exited with code 3 and no result\n")
        assert "compiler output (last lines):\n  warning: first\n  error: last" in out.error
    crashed = one_call(lambda _: os.abort(), 30)
    assert crashed.exit_code is None and "SIGABRT" in crashed.error   # a signal is no exit of its own


SOURCE = 'def kernel(BLOCK):\n    z = helper(BLOCK)\n\ndef helper(BLOCK):\n    return tl.full([BLOCK], 0, dtype="fp32")\n'


def fails_in_a_call(_):
    """As Triton 3.6 raises it for a call into a @jit function that failed (code_generator.py: the builtin's error
    wrapped with str(e) from e, then the call's with no message from that)."""
    from triton.compiler.errors import CompilationError
    call, full = ast.parse(SOURCE).body[0].body[0].value, ast.parse(SOURCE).body[1].body[0].value
    try:
        try:
            "fp32".to_ir(None)
        except AttributeError as e:
            raise CompilationError(SOURCE, full, str(e)) from e
    except CompilationError as e:
        raise CompilationError(SOURCE, call, None) from e


def test_a_compilation_error_that_says_only_where_gets_the_last_line_of_its_innermost_cause():
    out = one_call(fails_in_a_call, 60)
    lines = out.error.splitlines()
    assert lines[0] == "triton.compiler.errors.CompilationError: at 2:8:" and lines[-2].strip() == "^", out.error
    assert lines[-1] == "AttributeError: 'str' object has no attribute 'to_ir'"
    assert "Traceback" in out.traceback


def imports_a_broken_file(_):
    compile("A = 1\nKEYS = (\n", "/site/lib/extra.py", "exec")


def test_a_syntax_error_in_a_file_the_kernels_import_reads_is_one_line_naming_the_file_and_line():
    """Python's own form begins with the file and quotes the line under it: the first line, which every summary
    takes, named no error (an outside review with gemlite)."""
    out = one_call(imports_a_broken_file, 30)
    assert out.error == "SyntaxError: '(' was never closed (/site/lib/extra.py, line 2): fix that file", out.error
    assert "Traceback" in out.traceback
    made = one_call(lambda _: compile("A = (\n", "<string>", "exec"), 30)   # code made at run time: no file to fix
    assert made.error == "SyntaxError: '(' was never closed (<string>, line 1)", made.error


def forwards_a_quiet_death(_):
    """This server prints a line with "error" in it, then forwards its own server's silent exit."""
    os.write(2, b"a deprecation error-prone warning\n")
    raise isolate.Forwarded(one_call(lambda _: os._exit(1), 30))


def test_a_forwarded_death_keeps_its_own_servers_output_even_when_it_printed_nothing():
    out = one_call(forwards_a_quiet_death, 60)
    assert out.exit_code == 1 and out.output == "", out   # not the forwarding server's line
