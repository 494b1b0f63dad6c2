"""rules/store/run_lock.py: two builds in one out/ at once: the second waits for the first with one line (and then
finds its work done); commands that only read never wait; a holder killed outright releases the lock."""
import os
import re
import signal
import subprocess
import sys
import time

from kforge.base.layout import Layout
from tests.support import REPO, doit, make_project, wait_until

HOLDER = '''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"`doit -n 9` (pid 4242, since 12:00:00)")
print("held", flush=True)
time.sleep(600)
'''


def start_build(root, log):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "doit", "-n", "1"], cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def test_a_build_waits_with_one_line_while_another_holds_out_and_goes_on_once_it_dies(tmp_path):
    root = make_project(tmp_path / "p")
    lock = root / "out" / ".kforge" / "run.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    log_path = tmp_path / "build.log"
    build = None
    try:
        assert holder.stdout.readline() == "held\n"
        with open(log_path, "w") as log:
            build = start_build(root, log)
        wait_until(lambda: "waiting" in log_path.read_text(), 30)
        assert log_path.read_text() == (
            f"kforge: waiting for `doit -n 9` (pid 4242, since 12:00:00) to finish: one build at a time in "
            f"{root / 'out'} ({lock}; Ctrl-C stops waiting)\n")
        assert "scale" in doit(root, "list", timeout=60).stdout            # reading commands never wait
        assert "not built" in doit(root, "info", "scale", timeout=60).stdout
        time.sleep(0.5)
        assert build.poll() is None and not (root / "out" / "sm_90a").exists()   # nothing generated, nothing built
        holder.send_signal(signal.SIGKILL)   # the OS releases its lock
        assert build.wait(timeout=120) == 0, log_path.read_text()
        assert "kforge: built 1, up to date 0, failed 0" in log_path.read_text()
    finally:
        for proc in (holder, build):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_two_builds_started_at_once_compile_each_target_once(tmp_path):
    root = make_project(tmp_path / "p")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    builds = []
    for path in logs:
        with open(path, "w") as log:
            builds.append(start_build(root, log))
    try:
        assert [b.wait(timeout=180) for b in builds] == [0, 0], [p.read_text() for p in logs]
    finally:
        for b in builds:
            if b.poll() is None:
                b.kill()
                b.wait()
    texts = [p.read_text() for p in logs]
    built = [int(re.search(r"kforge: built (\d+),", t).group(1)) for t in texts]
    assert sorted(built) == [0, 1], texts
    assert sum("kforge: waiting for `doit -n 1`" in t for t in texts) <= 1


def test_the_lock_names_its_holder_but_never_a_secret_setting(tmp_path, monkeypatch):
    from kforge.store import run_lock
    held = []
    monkeypatch.setattr(run_lock, "_held", held)
    monkeypatch.setattr(sys, "argv", ["doit", "-n", "2", "cache_key=0123456789abcdef0123", "scale"])
    run_lock.hold(Layout(tmp_path), "run")
    try:
        text = (tmp_path / "out" / ".kforge" / "run.lock").read_text()
        assert text.startswith(f"`doit -n 2 cache_key=(hidden) scale` (pid {os.getpid()}, since ")
    finally:
        os.close(held[0])


def test_a_link_leading_out_of_out_where_the_lock_goes_is_one_line_and_exit_2(tmp_path):
    root = make_project(tmp_path / "p")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "out").mkdir()
    (root / "out" / ".kforge").symlink_to(elsewhere)
    proc = doit(root, check=False, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"kforge: {root / 'out' / '.kforge'} (a symbolic link) "
                                                           f"leads outside out/")
    assert list(elsewhere.iterdir()) == []


def test_a_lock_that_cannot_be_opened_says_the_fix_that_fits_why(tmp_path, monkeypatch, capsys):
    """A folder planted where the lock file goes: remove it. A read-only or full out/: removing it would not help."""
    import errno
    import pytest
    from kforge.store import run_lock
    monkeypatch.setattr(run_lock, "_held", [])
    (tmp_path / "out" / ".kforge" / "run.lock").mkdir(parents=True)
    with pytest.raises(SystemExit):
        run_lock.hold(Layout(tmp_path), "run")
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"kforge: {tmp_path / 'out' / '.kforge' / 'run.lock'}: cannot open the run lock") and \
        line.endswith("remove it (a link or a folder where the lock file belongs) and run again"), line
    for code, fix in ((errno.EROFS, "out/ is not writable here"), (errno.ENOSPC, "free space"),
                      (errno.EISDIR, "remove it")):
        def refuse(*args, code=code):
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(run_lock.os, "open", refuse)
        with pytest.raises(SystemExit):
            run_lock.hold(Layout(tmp_path), "run")
        line = capsys.readouterr().err.strip()
        assert len(line.splitlines()) == 1 and fix in line and f"({os.strerror(code)})" in line, line


def test_a_fifo_where_the_run_lock_belongs_is_one_line_naming_it_and_the_fix(tmp_path, capsys):
    import pytest
    from kforge.store import run_lock
    lock = tmp_path / "out" / ".kforge" / "run.lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock)
    with pytest.raises(SystemExit) as stopped:
        run_lock.hold(Layout(tmp_path), "run")
    assert stopped.value.code == 2 and not run_lock._held
    assert capsys.readouterr().err == (f"kforge: {lock} is a FIFO or pipe, not the run lock kforge writes; remove it "
                                       f"and run again\n")


def test_a_file_where_out_kforge_or_an_arch_folder_belongs_is_one_line_naming_it(tmp_path):
    """out/.kforge a file: the line said `remove out/.kforge/run.lock`, a path that cannot be (Not a directory);
    out/<arch> a file: each target of that arch failed with `Not a directory`, naming no culprit. A link to a
    file, or to nothing, is named as one; the lock is never taken, nothing is built, nothing built is lost."""
    root = make_project(tmp_path / "p")
    out = root / "out"
    out.mkdir()
    (out / "kept.txt").write_text("a user's file")
    state = "its state (the run lock, indexes, the catalog)"
    cases = [(".kforge", lambda p: p.write_text("x"), "a file", state),
             (".kforge", lambda p: p.symlink_to("kept.txt"), f"a link to {out / 'kept.txt'}", state),
             (".kforge", lambda p: p.symlink_to("nothing"), "a link to nothing", state),
             ("sm_90a", lambda p: p.write_text("x"), "a file", "the sm_90a builds")]
    for name, make, kind, what in cases:
        make(out / name)
        proc = doit(root, "-n", "1", check=False, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [f"kforge: {out / name} is {kind}, not a folder: kforge keeps {what} "
                                            f"there; remove it and run again"]   # one line: no state file's warning
        assert "Traceback" not in proc.stderr and not (out / "sm_90a").is_dir()
        (out / name).unlink()
    assert (out / "kept.txt").read_text() == "a user's file"
    assert doit(root, "-n", "1", timeout=300).returncode == 0 and (out / "sm_90a").is_dir()
