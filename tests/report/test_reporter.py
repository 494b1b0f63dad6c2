"""The end of a build's output: failures grouped by their error, the summary last, tracebacks in error.txt."""
import io
import json
import subprocess
import sys
import types

from doit.exceptions import TaskFailed

from kforge.report import reporter as report
from kforge.report.reporter import error_line, failure_groups, plural
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
    # Triton says "at 4:...", a line of the kernel's own source: the summary names the file's line
    assert "CompilationError: at tk/scale.py:10, column " in proc.stdout and "(line 4 of scale_kernel)" in proc.stdout
    assert "NameError('undefined_name is not defined')" in proc.stdout
    assert "\nFAILED " not in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("kforge: built 1, up to date 0, failed 3, wall ")
    kept = (root / "out/sm_90a/scale/fp16-b64-w4/error.txt").read_text()
    assert "Traceback in the compiler's process:" in kept and "compile/triton_backend.py" in kept and "in lower" in kept
    one = doit(root, "one")
    assert "kforge: 1 target selected" in one.stdout


def test_an_error_line_ending_in_a_colon_takes_its_cause_from_above_the_retry_and_compiler_output_lines():
    nothing_below = "error: CompilationError: at 1:2:\n  retry alone: doit x:a@sm_90a"
    assert error_line(nothing_below) == "CompilationError: at 1:2:"
    with_output = ("error: CompilationError: at 1:2:\ndef k():\nNameError('y')\n"
                   "compiler output (last lines):\n  some warning\nretry alone: doit x:a@sm_90a")
    assert error_line(with_output) == "CompilationError: at 1:2: ... NameError('y')"


def test_an_error_line_keeps_the_first_error_and_adds_compiler_output_only_to_a_crash():
    assert error_line("building\n\n  error: A\nerror: B\n") == "A"
    not_a_crash = "error: RuntimeError: boom\ncompiler output (last lines):\n  ptxas noise"
    assert error_line(not_a_crash) == "RuntimeError: boom"
    assert error_line("error: compiler process crashed: SIGKILL\nretry alone: doit x") == \
        "compiler process crashed: SIGKILL"
    assert error_line("\n   \n  Traceback (most recent call last):\n  File x\n") == "Traceback (most recent call last):"


def test_a_group_of_exactly_the_shown_number_names_them_all_and_equal_groups_go_by_error():
    failed = [{"name": f"k:{i}", "cause": "B: later"} for i in range(3)]
    failed += [{"name": "k:x", "cause": "A: first"}, {"name": "k:y", "cause": "A: first"}]
    failed += [{"name": "k:z", "cause": "A: first"}]
    lines = failure_groups(failed, shown=3)
    text = "\n".join(lines)
    assert text.index("3 targets failed with: A: first") < text.index("3 targets failed with: B: later")
    assert "  they are: k:x, k:y, k:z\n" in text and "  they are: k:0, k:1, k:2\n" in text and "more)" not in text
    assert "  retry one alone: doit k:x" in lines and "  retry one alone: doit k:0" in lines
    assert sum("full message and traceback" in line for line in lines) == 1   # the hint once, at the end
    assert "full message and traceback" in lines[-1]
    assert "  first 2: k:0, k:1 (and 1 more)" in failure_groups(failed, shown=2)


def test_a_failure_without_a_cause_is_grouped_by_the_error_line_of_its_message():
    failed = [{"name": "k:a", "error": "k:a failed\n  error: ValueError: x\n  retry alone: doit k:a"},
              {"name": "k:b", "cause": "ValueError: x"}, {"name": "k:c"}]
    text = "\n".join(failure_groups(failed))
    assert "2 targets failed with: ValueError: x\n  they are: k:a, k:b" in text
    assert "k:c failed with: (no message)\n  retry one alone: doit k:c" in text
    assert plural(0, "target") == "0 targets"


class FakeTask:
    """What BuildReporter reads of a doit task."""

    def __init__(self, name, actions=True, values=None, meta=None, task_dep=()):
        self.name, self.actions, self.values, self.meta = name, ["run"] if actions else [], values or {}, meta
        self.task_dep, self.setup_tasks = list(task_dep), []

    def title(self):
        return self.name


class Saved:
    def __init__(self):
        self.saves, self.refreshed = 0, []

    def save(self):
        self.saves += 1

    def refresh(self, path):
        self.refreshed.append(path)


def test_the_reporter_writes_progress_summary_and_report_without_doit(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(report, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0]))
    monkeypatch.setattr(report, "process_age", lambda: 2.0)   # doit loaded the catalog for 2 s before
    out, key_index, other_state = io.StringIO(), Saved(), Saved()
    reporter = report.BuildReporter(out, {})
    reporter.report_path = str(tmp_path / "out" / "build-report.json")
    reporter.key_index, reporter.saved_at_end = key_index, (other_state,)
    reporter.find_orphans = lambda: ["out/sm_90a/gone/x", "out/sm_90a/gone/y"]
    odd = 'k:"\u00e9"@sm_90a'   # a name json must escape
    target = types.SimpleNamespace(meta_path="out/sm_90a/k/a/meta.json")
    built = FakeTask("k:a@sm_90a", values={"compile_seconds": 2.5, "from_cache": False,
                                           "cache_warnings": ["remote cache down (GET http://c/1)"]},
                     meta={"kforge_target": target})
    cached = FakeTask("k:b@sm_90a", values={"from_cache": True, "compiled_on": "host1", "cache_warnings": [
        "remote cache down (GET http://c/2)", "remote cache full"]})
    failing, fresh = FakeTask("k:c@sm_90a"), FakeTask(odd)
    group = FakeTask("k", actions=False, task_dep=[t.name for t in (built, cached, failing, fresh)])
    package = FakeTask("package:sm_90a")
    tasks = {t.name: t for t in (built, cached, failing, fresh, group, package, FakeTask("unselected"))}
    reporter.initialize(tasks, ["k", "package:sm_90a"])
    long_cause = "ValueError: " + "v" * 500
    message = "\n".join(["k:c@sm_90a failed", f"  error: {long_cause}"] + [f"  line {i}" for i in range(10)])
    for task, seconds, finish in [(built, 3.0, reporter.add_success), (cached, 10.0, reporter.add_success),
                                  (failing, 1.0, lambda t: reporter.add_failure(t, TaskFailed(message)))]:
        reporter.execute_task(task)
        clock[0] += seconds
        finish(task)
    reporter.skip_uptodate(fresh)
    reporter.add_failure(group, TaskFailed("one of its targets failed"))   # already reported: ignored
    reporter.execute_task(package)
    reporter.add_failure(package, TaskFailed("no space left"))
    reporter.runtime_error("a doit complaint")
    reporter.complete_run()

    lines = out.getvalue().splitlines()
    assert lines[0] == "kforge: 4 targets selected"   # neither the group, the package nor an unselected task
    assert "[1/4] built  k:a@sm_90a 3.00s  (failed so far: 0)" in lines
    assert "[2/4] remote k:b@sm_90a 10.00s  (failed so far: 0)" in lines
    assert f"[3/4] failed k:c@sm_90a 1.00s  (failed so far: 1)  error: {long_cause[:400]} ..." in lines
    assert lines.count("kforge: warning: remote cache down (GET http://c/1)") == 1
    assert not any("http://c/2" in line for line in lines) and "kforge: warning: remote cache full" in lines
    assert f"kforge: k:c@sm_90a failed with: {long_cause}" in lines   # the summary keeps the cause whole
    assert "FAILED package:sm_90a:" in lines and "no space left" in lines and "doit: a doit complaint" in lines
    # the compiler's own 2.5 s, not the 3 s its worker took (a first target also pays the imports); a cached
    # target is no compile
    assert "slowest compiles: k:a@sm_90a 2.50s" in lines
    assert "kforge: 2 warnings: remote cache down (GET http://c/1) (and 1 more above and in out/build-report.json)" \
        in lines
    assert "kforge: 2 artifacts in out/ belong to no target: `doit prune` removes them" in lines
    assert lines[-1] == ("kforge: built 2 (1 from the remote cache), up to date 1, failed 2 (1 package task), "
                         "wall 16.0 s")
    assert key_index.refreshed == ["out/sm_90a/k/a/meta.json"] and key_index.saves == 1 and other_state.saves == 1

    text = (tmp_path / "out" / "build-report.json").read_text()
    saved = json.loads(text)
    assert saved["counts"] == {"built": 2, "up-to-date": 1, "skipped": 0, "failed": 1, "ignored": 0}
    assert saved["wall_seconds"] == 16.0
    assert saved["origins"] == {"compiled": 1, "local cache": 0, "remote cache": 1, "unchanged": 0}
    assert saved["warnings"] == ["remote cache down (GET http://c/1)", "remote cache full"]
    assert [r["name"] for r in saved["tasks"]] == sorted([built.name, cached.name, failing.name, odd])
    records = {r["name"]: r for r in saved["tasks"]}
    assert records[built.name] == {"name": built.name, "status": "built", "seconds": 3.0, "origin": "compiled",
                                   "compile_seconds": 2.5, "start": 0.0}   # from_cache False is left out
    assert records[cached.name] == {"name": cached.name, "status": "built", "seconds": 10.0,
                                    "origin": "remote cache", "from_cache": True, "compiled_on": "host1", "start": 3.0}
    assert records[odd] == {"name": odd, "status": "up-to-date", "seconds": 0.0}
    failed = records[failing.name]
    assert failed["cause"] == long_cause and failed["start"] == 13.0
    assert failed["error"].splitlines() == message.splitlines()[:report.ERROR_LINES]
    assert [p["name"] for p in saved["packages"]] == ["package:sm_90a"] and saved["packages"][0]["status"] == "failed"
    assert len(text.splitlines()) == len(saved["tasks"]) + 2   # one line per task between the head and the end


def test_a_target_doit_ignore_skips_is_counted_and_named_in_the_summary_and_the_report(tmp_path):
    """`doit ignore NAME` made every later build "built 0, up to date 0, failed 0", exit 0, with nothing built
    (a hostile-input review): a CI shipping out/ shipped nothing and passed."""
    out = io.StringIO()
    reporter = report.BuildReporter(out, {})
    reporter.report_path = str(tmp_path / "out" / "build-report.json")
    ignored, group = FakeTask("k:a@sm_90a"), FakeTask("k", actions=False, task_dep=["k:a@sm_90a"])
    reporter.initialize({t.name: t for t in (ignored, group)}, ["k"])
    reporter.skip_ignore(group)
    reporter.skip_ignore(ignored)
    reporter.complete_run()
    assert out.getvalue().splitlines()[-1].startswith(
        "kforge: built 0, up to date 0, ignored 1 (`doit ignore`: not built; `doit forget k:a@sm_90a` ends it), "
        "failed 0, wall ")
    saved = json.loads((tmp_path / "out" / "build-report.json").read_text())
    assert saved["counts"]["ignored"] == 1 and saved["tasks"] == [
        {"name": "k:a@sm_90a", "status": "ignored", "seconds": 0.0}]


def test_the_reporter_traces_what_ran(tmp_path):
    """Built targets by their action's phases on their worker's row; failures, packages and tunings on rows of
    their own."""
    out = io.StringIO()
    reporter = report.BuildReporter(out, {})
    reporter.report_path = str(tmp_path / "out" / "build-report.json")
    t0 = reporter.trace.started
    target = types.SimpleNamespace(meta_path="m", kernel="k")
    built = FakeTask("k:a@sm_90a", values={"worker": 41, "spans": [["start", t0 + 0.5, t0 + 1],
                                                                      ["compile", t0 + 1, t0 + 3],
                                                                      ["write", t0 + 3, t0 + 3.5]]},
                     meta={"kforge_target": target})
    failing, package = FakeTask("k:b@sm_90a", meta={"kforge_target": target}), FakeTask("package:sm_90a")
    tune = FakeTask("tune:k@sm_90a")
    tasks = (built, failing, package, tune)
    reporter.initialize({t.name: t for t in tasks}, [t.name for t in tasks])
    for task in tasks:
        reporter.execute_task(task)
    reporter.add_success(built)
    reporter.add_failure(failing, TaskFailed("boom"))
    reporter.add_success(package)
    reporter.add_success(tune)
    reporter.complete_run()
    events = json.loads((tmp_path / "out" / "build-trace.json").read_text())["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [(rows[e["tid"]], e["name"], e["cat"]) for e in events if e["ph"] == "X"]
    assert ("worker 41", "k:a@sm_90a", "compile") in slices and ("worker 41", "k:a@sm_90a", "write") in slices
    assert ("failed", "k:b@sm_90a", "failed") in slices and ("package", "package:sm_90a", "package") in slices
    assert ("tune", "tune:k@sm_90a", "tune") in slices   # a task that is not a compile target: a row of its kind
    compile_slice = next(e for e in events if e["ph"] == "X" and e["cat"] == "compile")
    assert compile_slice["dur"] == 2_000_000 and compile_slice["args"]["family"] == "k"
    # where the time went besides compiling (issue 52): a worker's and a server's start, the run's own time
    # before its first target (doit's start, the catalog and its probes; the up-to-date checks) on a row of its own
    assert ("worker 41", "k:a@sm_90a", "start") in slices
    assert ("doit", "load", "load") in slices and ("doit", "up-to-date", "up-to-date") in slices
    assert next(e for e in events if e["ph"] == "X" and e["cat"] == "load")["ts"] == 0   # from the process's start
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("kforge: time in targets")]
    assert "compile 2.0 s, start 0.5 s, write 0.5 s" in line and "; before the first target: load " in line
    assert ", up-to-date checks " in line


def test_a_full_disk_at_the_end_of_a_run_costs_one_line_per_file_and_the_summary_stays_last(tmp_path, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(report, "write_inside", full)
    out = io.StringIO()
    reporter = type("R", (report.BuildReporter,), {"report_path": str(tmp_path / "out" / "build-report.json")})(out, {})
    task = types.SimpleNamespace(name="k:a@sm_90a", actions=[1], values={})
    reporter.execute_task(task)
    reporter.add_failure(task, TaskFailed(MESSAGE.format(name="k:a@sm_90a", error="OSError: [Errno 28] No space")))
    reporter.complete_run()   # no exception
    lines = out.getvalue().rstrip().splitlines()
    assert lines[-1].startswith("kforge: built 0, up to date 0, failed 1")
    for line, name in zip(lines[-3:-1], ("build-report.json", "build-trace.json")):   # the report, then the trace
        assert line == (f"kforge: could not write {tmp_path / 'out' / name} ([Errno 28] No space left on device); "
                        f"nothing built is lost: free space and run again")


def test_a_cache_switched_off_for_the_run_is_repeated_in_the_summary_whatever_came_first(tmp_path):
    out = io.StringIO()
    reporter = type("R", (report.BuildReporter,), {"report_path": str(tmp_path / "r.json")})(out, {})
    off = "remote cache http://c:8080 switched off for the rest of this run: 301.2 s lost waiting on it, ..."
    for i, warning in enumerate(("cache entry http://c:8080/ac/k for k:a@sm_90a rejected (x)", off)):
        task = types.SimpleNamespace(name=f"k:{i}@sm_90a", actions=[1], values={"cache_warnings": [warning]})
        reporter.execute_task(task)
        reporter.add_success(task)
    reporter.complete_run()
    summary = out.getvalue().rstrip().splitlines()[-3:]
    assert summary[0].startswith("kforge: 2 warnings: cache entry http://c:8080/ac/k")
    assert summary[1] == f"kforge: warning: {off}"


def test_a_runs_wall_counts_from_its_process_start():
    """A no-op's time is doit loading the catalog and checking targets, all before the reporter exists: the
    summary said `wall 0.0 s` for a 9.8 s no-op."""
    proc = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6); "
                           "from kforge.report.reporter import process_age; print(process_age())"],
                          capture_output=True, text=True, check=True)
    assert 0.6 <= float(proc.stdout) < 30


def test_text_a_build_writes_shows_control_characters_as_replacement_characters(tmp_path):
    """A spec's file name in a failure (`specs/<ESC>[31mred.toml`: a checkout's own file, a pull request's) and a
    compiler's or a cache server's message reached the terminal with their escape sequences."""
    out = io.StringIO()
    reporter = type("R", (report.BuildReporter,), {"report_path": str(tmp_path / "r.json")})(out, {})
    task = FakeTask("bad", values={"cache_warnings": ["remote cache http://c down (HTTP 500 \x1b]0;owned\x07)"]})
    reporter.initialize({"bad": task}, ["bad"])
    reporter.execute_task(task)
    reporter.add_failure(task, TaskFailed("specs/esc\x1b[31mred.toml: missing table [signature]\r\n\tmore"))
    reporter.complete_run()
    text = out.getvalue()
    assert not any(c in text for c in "\x1b\x07\r") and "specs/esc\ufffd[31mred.toml" in text, text


def test_the_time_line_names_a_results_way_back_to_doit_and_counts_queued_time_once():
    """On a 16-CPU host the targets' time outside every phase was 150 s of 900: a result's way back to doit's
    master is a phase of its own ("return"), and the time a target sat queued is "queued", not "other" too."""
    trace = report.Trace(started=100.0)
    trace.target("k:a@sm_90a", "k", 100.0, 104.5, types.SimpleNamespace(
        spans=(("compile", 101.0, 103.0), ("write", 103.0, 104.0)), worker=7, from_cache=False,
        from_local_cache=False))
    phases = trace.totals()
    assert phases == {"queue": 1.0, "compile": 2.0, "write": 1.0, "return": 0.5}
    line = report._time_spent(phases, in_tasks=4.75)
    assert "compile 2.0 s, write 1.0 s, return 0.5 s, other 0.2 s; queued 1.0 s" in line, line


def test_an_exit_with_no_result_and_no_output_carries_its_likely_cause_in_the_error_line():
    """isolate._death puts the likely cause of a plain exit (a module calling os._exit at import) on its second line:
    with no compiler output to show, the error line takes it; with output, the compiler's last words are the cause."""
    exited = ("compiler process exited with code 0 and no result\nwhile running the kernel's code (importing its "
              "module or compiling): a module that calls sys.exit or os._exit at import is a likely cause")
    assert error_line(MESSAGE.format(name="x:a@sm_90a", error=exited)) == " ".join(exited.splitlines())
    printed = exited + "\ncompiler output (last lines):\n  LLVM ERROR: out of registers"
    assert error_line(MESSAGE.format(name="x:a@sm_90a", error=printed)) == \
        "compiler process exited with code 0 and no result ... LLVM ERROR: out of registers"


def test_a_local_cache_that_cannot_be_listed_is_one_line_at_the_end_of_the_build(tmp_path):
    """reporter.py 256-257 (trim's scandir fails other than 'missing' or 'not a folder': a link loop as the cache
    folder; EACCES for a user who cannot list it): never run in the whole suite's coverage."""
    from kforge.share.local_cache import LocalCache
    (tmp_path / "cache").symlink_to("cache")
    assert report._trimming(LocalCache(str(tmp_path / "cache"), 1)) == [
        f"kforge: local cache {tmp_path / 'cache'} not trimmed ([Errno 40] Too many levels of symbolic links: "
        f"'{tmp_path / 'cache'}'); make its folder a readable folder of yours (or set local_cache= elsewhere), then "
        f"`doit cache --trim`"]


def test_a_build_whose_output_reader_went_away_builds_to_the_end_and_says_so_once(tmp_path):
    """`doit | head -1`: the progress line after the first was a BrokenPipeError traceback (a second one chained from
    the summary), the run stopped with the rest unbuilt. Now the build goes on with its output discarded: every
    target built and installed, out/build-report.json written, one line on stderr, the build's own exit code."""
    import os
    from tests.support import REPO
    root = make_project(tmp_path / "p", specs={"scale": spec_text(dtypes=("fp16", "fp32"), blocks=(64, 128, 256))})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-n", "1", "scale"], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "kforge: 6 targets selected\n"
    proc.stdout.close()   # the reader goes away, as `head -1` does
    stderr = proc.stderr.read()
    assert proc.wait(timeout=600) == 0 and stderr == report.READER_GONE + "\n", stderr
    names = {f"scale:{d}-b{b}-w4@sm_90a" for d in ("fp16", "fp32") for b in (64, 128, 256)}
    assert statuses(root, "built") == names
    assert all((root / "out/sm_90a/scale" / n.split(":")[1].split("@")[0] / "meta.json").is_file() for n in names)
    assert "built 0, up to date 6" in doit(root, "scale").stdout   # what was built is kept, and known to be
