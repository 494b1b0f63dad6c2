"""The end of a build's output: failures grouped by their error, the summary last, tracebacks in error.txt."""
from kforge.report import error_line, failure_groups, plural
from tests.support import doit, kernel_text, make_project, spec_text, statuses

MESSAGE = ("{name} failed\n  spec: specs/x.toml\n  config: {{'BLOCK': 16}}\n  error: {error}\n"
           "  retry alone: doit {name}")


def test_the_error_line_of_a_message():
    assert error_line(MESSAGE.format(name="x:a@sm_90a", error="RuntimeError: boom")) == "RuntimeError: boom"
    compilation = "CompilationError: at 3:37:\ndef k(x):\n    ^\nNameError('y is not defined')"
    assert error_line(MESSAGE.format(name="x:a@sm_90a", error=compilation)) == \
        "CompilationError: at 3:37: ... NameError('y is not defined')"
    crash = "compiler process crashed: SIGSEGV\ncompiler output (last lines):\n  Fatal Python error\n  in ptxas"
    assert error_line(MESSAGE.format(name="x:a@sm_90a", error=crash)) == \
        "compiler process crashed: SIGSEGV ... in ptxas"
    assert error_line("just one line") == "just one line"
    assert error_line("") == "(no message)"
    assert error_line("error: " + "x" * 1000) == "x" * 1000   # whole: the fix is often at its end


def test_failures_are_grouped_by_error_largest_group_first():
    failed = [{"name": f"k:c{i}@sm_90a", "cause": "AssertionError: same"} for i in range(12)]
    failed.append({"name": "k:odd@gfx942", "cause": "ValueError: other"})
    text = "\n".join(failure_groups(failed))
    assert text.index("12 targets failed with: AssertionError: same") < text.index(
        "k:odd@gfx942 failed with: ValueError: other")
    assert "first 5: k:c0@sm_90a, k:c1@sm_90a, k:c2@sm_90a, k:c3@sm_90a, k:c4@sm_90a (and 7 more)" in text
    assert text.count("k:c") == 6   # five named, one in the retry line: never one block per target
    assert failure_groups([]) == []
    assert plural(1, "target") == "1 target" and plural(2, "target") == "2 targets"


def test_a_failing_build_ends_with_grouped_errors_then_the_summary_and_keeps_each_traceback(tmp_path):
    bad = kernel_text().replace("* 2", "* undefined_name")
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(64, 128, 256)),
                                               "one": spec_text(name="one", module="one")},
                        kernels={"scale": bad, "one": kernel_text()})
    proc = doit(root, "-n", "2", check=False)
    assert proc.returncode != 0 and statuses(root, "failed") == {f"scale:fp16-b{b}-w4@sm_90a" for b in (64, 128, 256)}
    assert "kforge: 4 targets selected" in proc.stdout
    assert "kforge: 3 targets failed with: triton.compiler.errors.CompilationError: " in proc.stdout
    assert "NameError('undefined_name is not defined')" in proc.stdout
    assert "\nFAILED " not in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("kforge: built 1, up to date 0, failed 3, wall ")
    kept = (root / "out/sm_90a/scale/fp16-b64-w4/error.txt").read_text()
    assert "Traceback in the compiler's process:" in kept and "triton_compile.py" in kept and "in lower" in kept
    one = doit(root, "one")
    assert "kforge: 1 target selected" in one.stdout
