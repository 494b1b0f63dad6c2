"""A build's hub kept for the project's next build (rules/load/kept_hub.py): used only where nothing differs."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import sys
import time
import types

import pytest

from kforge.load import isolate, kept_hub
from tests.support import doit, make_project, wait_until

_imported: list = []   # in a hub: what it "imported" (the toolchain's stand-in), kept by its keeper


def _handle(request, fd):
    """A hub's handler: a Keep forks the keeper; any other request imports `request` (once) and says what it has."""
    if isinstance(request, kept_hub.Keep):
        return kept_hub.fork_keeper(request, _handle, lambda: None)
    if request and request.startswith("made:"):   # a module a library makes at run time, as torch makes torch._ops
        made = types.ModuleType(request[5:])
        made.__file__ = "_ops.py"   # no file: torch's own _ops and _classes name themselves so
        sys.modules[made.__name__] = made
        _imported.append(request)
    elif request and request not in sys.modules:
        __import__(request)
        _imported.append(request)
    return {"hub": os.getpid(), "parent": os.getppid(), "imported": list(_imported)}


def _ask(hub: isolate.Hub, request: str | None = None) -> dict:
    conn = hub.ask(request)
    try:
        assert conn.poll(30)
        return conn.recv()
    finally:
        conn.close()


def _keeper_of(root) -> int | None:
    """The pid of the keeper listening for the project, if one does."""
    name = "@" + kept_hub.address(str(root))[1:].decode()
    with open("/proc/net/unix") as f:
        inodes = {f"socket:[{fields[6]}]" for fields in map(str.split, f.read().splitlines()[1:])
                  if fields[-1] == name and int(fields[3], 16) & 0x10000}   # listening (__SO_ACCEPTCON)
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if inodes & {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")}:
                return int(entry)
        except OSError:
            continue
    return None


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@pytest.fixture(autouse=True)
def one_at_a_time():
    """The tests of this module one at a time, across xdist's workers: a user's keepers are capped (MAX_KEEPERS),
    and a keeper another test started would end one of this test's."""
    with open(os.path.join(os.environ["KFORGE_TESTS_USER_CACHE"], "kept-hub-tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    yield root
    pid = _keeper_of(root)
    if pid:
        os.kill(pid, signal.SIGKILL)


def _refused_and_ended(root, asked: dict, keeper: int) -> None:
    """The keeper found stale for `asked`: no hub for the build, and it ends."""
    assert kept_hub.attach(str(root), asked) is None
    wait_until(lambda: _gone(keeper), 10)
    assert _gone(keeper)


def _first_build(root, module="json", idle_s=60, between=None) -> tuple[dict, dict]:
    """A hub forked here that imports `module`, asked to keep itself at the end: (its answer, the identity);
    `between` runs after the import, before the hub is asked."""
    since = time.time_ns()   # as doit's master gives its start: nothing the hub imports changes after
    hub = isolate.Hub(_handle)
    hub.start()
    try:
        answer = _ask(hub, module)
        if between:
            between()
        asked = kept_hub.identity(str(root))
        assert kept_hub.ask_to_keep(hub, kept_hub.Keep(str(root), asked, idle_s, since))
        return answer, asked
    finally:
        hub.close()


def test_the_next_build_gets_a_hub_of_the_keeper_holding_what_the_first_imported(project):
    first, asked = _first_build(project, "wave")
    keeper = _keeper_of(project)
    assert keeper and not _gone(keeper)
    assert "wave" not in sys.modules   # imported in the hub only
    hub = isolate.Hub(_handle)
    assert hub.start(attach=lambda: kept_hub.attach(str(project), asked)) and hub.attached
    try:
        second = _ask(hub)
        assert second["hub"] != first["hub"] and second["parent"] == keeper   # forked by the keeper, for this build
        assert second["imported"] == ["wave"]   # what the first build's hub imported, not imported again
    finally:
        hub.close()
    assert _gone(second["hub"])   # closed with its build; the keeper stays for the next
    assert not _gone(keeper)


def test_the_keeper_holds_nothing_of_the_build(project):
    _first_build(project)
    keeper = _keeper_of(project)
    held = {fd: os.readlink(f"/proc/{keeper}/fd/{fd}") for fd in os.listdir(f"/proc/{keeper}/fd")}
    assert [held.pop(fd) for fd in "012"] == [os.devnull] * 3
    assert len(held) == 1 and next(iter(held.values())).startswith("socket:")   # its listening socket alone
    with open(f"/proc/{keeper}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    assert int(fields[3]) == keeper and int(fields[2]) == keeper   # a session and process group of its own


@pytest.mark.parametrize("change", ["environ", "argv", "path", "cwd"])
def test_a_build_that_differs_in_anything_gets_none_and_the_stale_keeper_ends(project, change):
    _, asked = _first_build(project)
    keeper = _keeper_of(project)
    other = json.loads(json.dumps(asked))
    if change == "environ":
        other["environ"]["TRITON_DEFAULT_FP_FUSION"] = "0"
    elif change == "argv":
        other["argv"].append("archs=gfx942")
    elif change == "path":
        other["path"].insert(0, "/elsewhere")
    else:
        other["cwd"] = "/"
    _refused_and_ended(project, other, keeper)


def test_a_changed_file_the_keeper_imported_makes_it_stale(project, tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "kept_toolchain_part.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(lib))
    _, asked = _first_build(project, "kept_toolchain_part")
    keeper = _keeper_of(project)
    (lib / "kept_toolchain_part.py").write_text("X = 2\n")
    _refused_and_ended(project, asked, keeper)


def test_a_package_installed_on_the_module_path_makes_it_stale(project, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    _, asked = _first_build(project)
    time.sleep(0.01)
    (site / "newly_installed-1.0.dist-info").mkdir()
    assert kept_hub.attach(str(project), kept_hub.identity(str(project))) is None


def test_the_keeper_ends_when_idle(project):
    _first_build(project, idle_s=1)
    keeper = _keeper_of(project)
    wait_until(lambda: _gone(keeper), 10)
    assert _gone(keeper)


def test_a_keeper_told_to_end_lets_the_build_it_serves_finish(project):
    _, asked = _first_build(project)
    keeper = _keeper_of(project)
    hub = isolate.Hub(_handle)
    hub.start(attach=lambda: kept_hub.attach(str(project), asked))
    try:
        os.kill(keeper, signal.SIGTERM)
        wait_until(lambda: _keeper_of(project) is None, 10)
        assert _keeper_of(project) is None   # it listens no more
        assert _ask(hub)["parent"] == keeper   # the build's hub still serves
    finally:
        hub.close()
    wait_until(lambda: _gone(keeper), 10)
    assert _gone(keeper)


def test_a_user_keeps_at_most_two(tmp_path):
    roots = [tmp_path / f"p{i}" for i in range(3)]
    keepers = []
    try:
        for root in roots:
            root.mkdir()
            _first_build(root)
            keepers.append(_keeper_of(root))
            time.sleep(0.02)   # started in this order (the oldest goes first)
        wait_until(lambda: _gone(keepers[0]), 10)
        assert _gone(keepers[0]) and not _gone(keepers[1]) and not _gone(keepers[2])
    finally:
        for pid in keepers:
            if pid and not _gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to be another user")
def test_another_user_cannot_use_the_keeper(project):
    _, asked = _first_build(project)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(0 if kept_hub.attach(str(project), asked) is None else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
    assert _keeper_of(project)   # refused, not ended


def _binaries(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "out").rglob("*.cubin"))}


def test_a_kept_hub_builds_the_same_binaries_without_importing_the_toolchain_again(tmp_path):
    root = make_project(tmp_path / "proj")
    keep = {"KFORGE_KEEP_HUB": "60"}
    try:
        doit(root, "-n", "2", "archs=sm_90a", env=keep)
        first = _binaries(root)
        keeper = _keeper_of(root)
        assert first and keeper
        doit(root, "clean", env=keep)
        doit(root, "-n", "2", "archs=sm_90a", env=keep)
        assert _binaries(root) == first
        assert _keeper_of(root) == keeper   # the same keeper: it served the second build
        trace = json.loads((root / "out" / "build-trace.json").read_text())["traceEvents"]
        assert not [e for e in trace if e.get("cat") == "start" and e["dur"] > 200_000]   # no toolchain import
        doit(root, "clean", env=keep)
        doit(root, "-n", "2", "archs=sm_90a", env={"KFORGE_KEEP_HUB": "60", "TRITON_DEBUG": "0"})
        wait_until(lambda: _gone(keeper), 10)
        assert _gone(keeper) and _keeper_of(root) not in (None, keeper)   # stale: replaced by the third build's
        assert _binaries(root) == first
    finally:
        pid = _keeper_of(root)
        if pid:
            os.kill(pid, signal.SIGKILL)


def test_a_build_in_a_folder_made_again_at_the_same_path_gets_a_hub_in_that_folder(project, monkeypatch):
    """The keeper's own working folder was removed and made again (a scratch project, a checkout made afresh):
    the hub it forks works in the folder the path names now, not in the removed one."""
    monkeypatch.chdir(project)   # as doit's master runs, in the project
    first, asked = _first_build(project)
    os.rmdir(project)
    project.mkdir()
    (project / "marker").write_text("")
    hub = isolate.Hub(_handle)
    assert hub.start(attach=lambda: kept_hub.attach(str(project), asked)) and hub.attached
    try:
        assert _ask(hub)["hub"] != first["hub"]
        assert os.path.exists(f"/proc/{hub.pid}/cwd/marker")
    finally:
        hub.close()


def test_a_build_whose_keeper_is_killed_midway_still_builds_every_target(tmp_path):
    """The keeper SIGKILLed while the hub it forked serves a build: that hub dies with it (its servers below it
    too), each worker forks a hub of its own, and no target is lost."""
    import subprocess
    from tests.support import REPO, spec_text, statuses
    root = make_project(tmp_path / "proj", specs={"scale": spec_text(dtypes=("fp16", "fp32"),
                                                                      blocks=(64, 128, 256, 512, 1024))})
    env = {**os.environ, "KFORGE_KEEP_HUB": "60",   # as tests.support.doit runs it: the keeper's environment
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    try:
        doit(root, "-n", "2", "archs=sm_90a", env={"KFORGE_KEEP_HUB": "60"})
        keeper = _keeper_of(root)
        doit(root, "clean", env={"KFORGE_KEEP_HUB": "60"})
        build = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2", "archs=sm_90a"], cwd=root, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        children = lambda: [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == keeper]
        wait_until(lambda: children() or build.poll() is not None, 60)
        assert children(), "the build was not served by the keeper"
        os.kill(keeper, signal.SIGKILL)
        out, _ = build.communicate(timeout=300)
        assert build.returncode == 0, out
        assert len(statuses(root, "built")) == 10
    finally:
        pid = _keeper_of(root)
        if pid:
            os.kill(pid, signal.SIGKILL)


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.parametrize("sent", [b"not json", b'{"uid": 0, "argv"', b"[1, 2]", b'"a string"'])
def test_a_keeper_sent_what_no_build_sends_goes_on_and_serves_the_next_build(project, sent):
    """Bytes that are no JSON, cut short, or no identity (only this user can connect: a same-user process's
    mistake): the keeper drops that connection and serves the next build. Nothing it is sent is run (JSON)."""
    import socket
    _, asked = _first_build(project)
    keeper = _keeper_of(project)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(kept_hub.address(str(project)))
        sock.send(sent)
        sock.settimeout(5)
        assert sock.recv(1 << 16) == b""   # closed with no answer
    hub = isolate.Hub(_handle)
    try:
        assert hub.start(attach=lambda: kept_hub.attach(str(project), asked)) and hub.attached
        assert _ask(hub)["parent"] == keeper
    finally:
        hub.close()


def test_a_file_changed_while_the_build_ran_keeps_no_keeper(project, tmp_path, monkeypatch):
    """Imported, then edited before the build ended: a keeper would hold the code as it was, and stats taken then
    would show the file as unchanged ever after (the next build was served the old code: every binary differed
    from a fresh build's). Now no keeper is kept."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "kept_edited_part.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(lib))
    _, asked = _first_build(project, "kept_edited_part",
                            between=lambda: (lib / "kept_edited_part.py").write_text("X = 2\n"))
    wait_until(lambda: _keeper_of(project) is None, 10)
    assert _keeper_of(project) is None
    assert kept_hub.attach(str(project), asked) is None


def test_the_shells_own_variables_do_not_make_a_keeper_stale(project, monkeypatch):
    """`cd` sets OLDPWD, `time doit` sets `_`, a subshell SHLVL: the same command run again in a shell differed
    in them, and every build after a `cd` found its keeper stale; so did one from another terminal (TERM), whose
    variables are no compile's inputs either (observe.SESSION)."""
    monkeypatch.setenv("OLDPWD", "/one")
    monkeypatch.setenv("TERM", "xterm")
    _, asked = _first_build(project)
    monkeypatch.setenv("OLDPWD", "/two")
    monkeypatch.setenv("_", "/usr/bin/time")
    monkeypatch.setenv("TERM", "dumb")
    hub = isolate.Hub(_handle)
    try:
        assert hub.start(attach=lambda: kept_hub.attach(str(project), kept_hub.identity(str(project))))
        assert hub.attached
    finally:
        hub.close()


def test_a_stopped_keeper_is_ended_and_the_build_goes_on_saying_so(project, capfd):
    """SIGSTOPped, it kept the project's address: each build waited out the attach and forked its own, and no
    keeper could be made again."""
    _, asked = _first_build(project)
    keeper = _keeper_of(project)
    os.kill(keeper, signal.SIGSTOP)
    started = time.monotonic()
    assert kept_hub.attach(str(project), asked) is None
    assert time.monotonic() - started < kept_hub.ATTACH_TIMEOUT_S + 1
    wait_until(lambda: _gone(keeper), 10)
    assert _gone(keeper)
    assert "the kept hub was not used (it did not answer within" in capfd.readouterr().err


def test_a_stale_keeper_says_which_variable_differs_and_never_its_value(project, monkeypatch, capfd):
    _, asked = _first_build(project)
    other = json.loads(json.dumps(asked))
    other["environ"]["KFORGE_SECRET_THING"] = "hunter2"
    assert kept_hub.attach(str(project), other) is None
    err = capfd.readouterr().err
    assert "the environment differs in KFORGE_SECRET_THING" in err and "hunter2" not in err


def test_a_module_named_by_no_file_keeps_the_keeper(project):
    """torch makes modules whose __file__ is a bare name (`_ops.py`, `_classes.py`): counted as files gone since
    the build began, they kept every torch-holding hub from being kept."""
    _first_build(project, "made:kforge_made_ops")
    wait_until(lambda: _keeper_of(project) is not None, 5)
    time.sleep(0.5)   # the keeper checks what it holds after the build is released
    assert _keeper_of(project) is not None
