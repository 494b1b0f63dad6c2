"""rules/edge/config.py: the changes kforge makes to how doit runs that are not the runner's
(tests/edge/test_config_runner.py) nor the backend's (tests/edge/test_backend.py), and the doit internals its patches
rely on."""
import gc
import importlib
import importlib.metadata
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from doit import cmd_run, control, runner

from kforge.edge import backend as doit_backend, config as doit_edge
from tests.support import REPO


def test_garbage_collection_pauses_while_tasks_load_and_resumes_before_the_first_runs():
    assert gc.isenabled()
    try:
        doit_edge.pause_gc_until_tasks_run()
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]   # what the task graph would be
        doit_edge._resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    finally:
        gc.enable()
        gc.unfreeze()


# --- doit's internals, as the patches in DOIT_PATCHES need them (doit 0.37.0) ---------------------------------

def _doit_attribute(dotted: str):
    module, attribute = dotted.rsplit(".", 1)
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError:   # a class attribute: doit.control.ExecNode.parent_status
        owner_module, owner = module.rsplit(".", 1)
        return getattr(getattr(importlib.import_module(owner_module), owner), attribute)


def test_every_patched_doit_internal_still_exists():
    for dotted in doit_edge.DOIT_PATCHES:
        assert _doit_attribute(dotted) is not None, dotted


def test_doits_run_command_picks_its_runner_by_the_names_kforge_replaces():
    """install_runner rebinds doit.cmd_run's MRunner and MThreadRunner; Run._execute must look them up there."""
    names = cmd_run.Run._execute.__code__.co_names
    assert "MRunner" in names and "MThreadRunner" in names
    for method in ("_run_tasks_init", "get_next_job", "_process_result", "process_task_result", "execute_task",
                   "execute_task_subprocess", "Queue", "Child"):   # what PrefetchRunner calls of doit's MRunner
        assert callable(getattr(runner.MRunner, method, None)), method
    assert list(inspect.signature(runner.MRunner.__init__).parameters)[-1] == "num_process"


def test_install_runner_puts_kforges_runners_in_doits_place(monkeypatch):
    monkeypatch.setattr(cmd_run, "MRunner", cmd_run.MRunner)
    monkeypatch.setattr(cmd_run, "MThreadRunner", cmd_run.MThreadRunner)
    for cls in (doit_edge.PrefetchRunner, doit_edge.CappedThreadRunner):
        monkeypatch.setattr(cls, "max_workers", cls.max_workers)
        monkeypatch.setattr(cls, "cap_reason", cls.cap_reason)
    monkeypatch.setattr(doit_edge.PrefetchRunner, "prefetch", doit_edge.PrefetchRunner.prefetch)
    doit_edge.install_runner(prefetch=3, max_workers=2, cap_reason="2 CPUs")
    assert cmd_run.MRunner is doit_edge.PrefetchRunner and cmd_run.MThreadRunner is doit_edge.CappedThreadRunner
    assert doit_edge.PrefetchRunner.prefetch == 3 and doit_edge.CappedThreadRunner.max_workers == 2


def test_doits_dispatcher_tells_a_node_of_each_finished_dependency_through_parent_status():
    """_run_after_failed_deps wraps ExecNode.parent_status(self, parent_node): doit's dispatcher calls it for each
    dependency that ended, and a failed one lands in bad_deps, which keeps the task from running."""
    doit_own = getattr(control.ExecNode.parent_status, "doit", control.ExecNode.parent_status)
    assert list(inspect.signature(doit_own).parameters) == ["self", "parent_node"]
    dispatcher = inspect.getsource(control.TaskDispatcher)
    assert ".parent_status(" in dispatcher and "bad_deps" in inspect.getsource(control.ExecNode)
    node = SimpleNamespace(bad_deps=[], ignored_deps=[])
    doit_own(node, SimpleNamespace(run_status="failure"))
    assert len(node.bad_deps) == 1


def test_a_task_marked_after_failed_deps_ignores_a_failed_dependency_and_others_do_not():
    doit_edge._run_after_failed_deps()
    wrapped = control.ExecNode.parent_status
    doit_edge._run_after_failed_deps()   # installed once
    assert control.ExecNode.parent_status is wrapped
    failed = SimpleNamespace(run_status="failure")
    after = SimpleNamespace(task=SimpleNamespace(meta={"after_failed_deps": True}), bad_deps=[], ignored_deps=[])
    plain = SimpleNamespace(task=SimpleNamespace(meta=None), bad_deps=[], ignored_deps=[])
    wrapped(after, failed)
    wrapped(plain, failed)
    assert after.bad_deps == [] and plain.bad_deps == [failed]


# --- the backend: registered, and checked before a run ------------------------------------------------------

def test_kforges_backend_is_registered_with_doit_as_an_entry_point():
    found = [e for e in importlib.metadata.entry_points(group="doit.BACKEND") if e.name == doit_backend.NAME]
    assert len(found) == 1 and found[0].load() is doit_backend.KforgeSqliteDB
    assert doit_edge.backend() == doit_backend.NAME


def test_a_backend_missing_from_kforges_installed_metadata_is_one_line_and_exit_2(monkeypatch, capsys):
    def no_kforge(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "distribution", no_kforge)
    with pytest.raises(SystemExit) as stopped:
        doit_edge.backend()
    assert stopped.value.code == 2
    assert capsys.readouterr().err == ("kforge: doit has no backend 'kforge-sqlite': kforge's installed metadata "
                                       "predates it; install kforge again (`pip install -e .` in its checkout)\n")


def test_a_setting_kforge_does_not_have_but_nearly_does_is_one_warning_and_one_without_a_name_stops(monkeypatch,
                                                                                                 capsys):
    """`doit arch=gfx942` (archs misspelt) built the default archs without a word; a project's own task may read
    a name of its own (verify_dispatch_combine's world=), so only a near miss is said."""
    from doit import doit_cmd
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"arch": "gfx942", "world": "2", "timout": "5"})
    doit_edge.check_settings()
    said = capsys.readouterr().err.splitlines()
    assert said == ["kforge: warning: arch=gfx942 is no setting of kforge's; did you mean archs=? (a task of the "
                    "project may read it: then ignore this)",
                    "kforge: warning: timout=5 is no setting of kforge's; did you mean timeout=? (a task of the "
                    "project may read it: then ignore this)"]
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"": "x"})
    with pytest.raises(SystemExit) as stopped:
        doit_edge.check_settings()
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "kforge: `=x` on the command line sets no name: write name=value (archs=sm_90a)\n"


def test_a_file_where_out_belongs_is_one_line_in_every_command(tmp_path):
    """out/ is kforge's folder: a file of that name (a user's, a broken restore) was a FileExistsError traceback."""
    from tests.support import doit, make_project
    root = make_project(tmp_path / "p")
    (root / "out").write_text("mine")
    for args in ((), ("info", "scale"), ("prune",)):
        proc = doit(root, *args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (f"kforge: {root / 'out'} is not a folder: kforge keeps its "
                                                        f"builds there; move it away and run again"), proc.stderr
    assert (root / "out").read_text() == "mine"


def test_a_name_that_selects_no_task_is_one_line_naming_the_closest(tmp_path):
    """A target typed with its arch or config id a little off, to a build or to doit's own commands that check
    names: one line, exit code 3, naming the target meant; a name close to none says how to list them."""
    from tests.support import doit, make_project, spec_text
    root = make_project(tmp_path / "p", specs={"scale": spec_text(archs=("sm_90a", "gfx942"))})
    meant = "scale:fp16-b256-w4@sm_90a"
    for args in (["scale:fp16-b256-w4@sm_90"], ["clean", "scale:fp16-b256-w4@sm90a"],
                 ["forget", "scale:fp16-b265-w4@sm_90a"], ["list", "scael"]):
        proc = doit(root, *args, check=False)
        assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"names no {'command, ' if len(args) == 1 else ''}task, family or target of this project; did you " \
               f"mean {'scale' if args[-1] == 'scael' else meant}" in proc.stderr, proc.stderr
    proc = doit(root, "qqqq", check=False)
    assert proc.returncode == 3 and proc.stderr.strip() == (
        "ERROR: kforge: 'qqqq' names no command, task, family or target of this project (`doit list --all` lists "
        "every target)"), proc.stderr
    # a command after a build's options is a task name to doit: it "named no command" (a hostile-input review)
    proc = doit(root, "-n", "0", "list", check=False)
    assert proc.returncode == 3 and proc.stderr.strip() == (
        "ERROR: kforge: 'list' is a doit command, not a task: after a build's options (`doit -n 2 list`) doit reads a "
        "name as a task; give the command first, `doit list ...`"), proc.stderr
    assert not (root / "out" / "sm_90a").exists()   # nothing built, nothing cleaned


def test_a_doit_command_line_that_stops_before_doit_reads_it_is_one_line():
    """An empty argument, a settings file that is no file or far too large: one line each (start_problem)."""
    assert doit_edge.start_problem(["info", "x"]) is None
    assert "argument 2 is empty" in doit_edge.start_problem(["info", ""])
    assert "argument 3 is empty" in doit_edge.start_problem(["-f", "p/dodo.py", " ", "x"])


@pytest.mark.parametrize("kind", ["fifo", "folder", "too large"])
def test_a_settings_file_doit_reads_first_that_is_no_file_is_one_line(tmp_path, kind):
    path = tmp_path / "pyproject.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(doit_edge.CONFIG_LIMIT + 1)
    problem = doit_edge.start_problem(["list"], str(tmp_path))
    assert problem.startswith(f"kforge: {path}: ") and ("not a file" in problem or "too large" in problem), problem


# the start-up line of the .pth setup.py puts in site-packages (the other line is the runtime's KFORGE_RECORD hook)
PTH_LINE = next(line for line in (REPO / "rules" / "runtime" / "kforge-runtime-env.pth").read_text().splitlines()
                if "refuse_at_start()" in line)


def _doit_at_start(folder, *args, how="-m"):
    """doit run in folder, its interpreter starting with the .pth's start-up line (PTH_LINE) run as site-packages'
    .pth runs it."""
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PTH_LINE + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    command = [sys.executable, "-m", "doit"] if how == "-m" else [str(Path(sys.executable).parent / "doit")]
    return subprocess.run([*command, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["-m", "script"])
def test_an_empty_argument_from_a_folder_without_kforges_pyproject_is_one_line(tmp_path, how):
    """From a folder whose pyproject.toml does not name kforge's loader, doit's parser read the command line first:
    `doit -f PROJ/dodo.py info ''` was an IndexError traceback. The start-up line stops it in one line."""
    proc = _doit_at_start(tmp_path, "-f", str(tmp_path / "p" / "dodo.py"), "info", "", how=how)
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr
    assert "argument 4 is empty: it names no task" in proc.stderr


def test_a_fifo_at_pyproject_toml_stops_doit_in_one_line_not_for_ever(tmp_path):
    """doit opens the pyproject.toml of the folder it starts in before anything else: a FIFO there blocked it."""
    os.mkfifo(tmp_path / "pyproject.toml")
    proc = _doit_at_start(tmp_path, "list")
    assert proc.returncode == 3 and "pyproject.toml: not a file (a FIFO or pipe)" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_the_pth_kforge_installs_runs_the_start_up_line():
    """The two tests above run the .pth's start-up line as sitecustomize; site runs a .pth's lines that begin with
    `import` only, so every line of it must."""
    lines = (REPO / "rules" / "runtime" / "kforge-runtime-env.pth").read_text().splitlines()
    assert PTH_LINE.startswith("import ") and all(line.startswith("import ") for line in lines)


RUNNER_RULE = ("-n (--process) takes a whole number: 0 runs one task at a time in doit's own process, N >= 1 runs N "
               "worker processes (at most one per CPU this process may use); leave it out for one per CPU")


def test_a_number_of_tasks_at_once_or_a_parallel_type_doit_cannot_use_is_one_line_and_exit_3(tmp_path):
    """`doit -n -1 T` printed a summary of nothing, then a RuntimeError traceback from kforge's runner; with
    `-P thread` it built nothing and exited 0; `-n abc` was doit's two-line parse error. Every way getopt reads
    the option is refused before anything is loaded; 0 (doit's own serial runner) and N >= 1 build."""
    from tests.support import doit, make_project
    root = make_project(tmp_path / "p")
    target = "scale:fp16-b256-w4@sm_90a"
    for args, shown, why in ((["-n", "-1"], "-n -1", "below 0"), (["--process=-2"], "--process -2", "below 0"),
                             (["-n-1", "-P", "thread"], "-n -1", "below 0"), (["-an-1"], "-n -1", "below 0"),
                             (["-n", "abc"], "-n abc", "not a whole number"),
                             (["-n", "1.5", "archs=sm_90a"], "-n 1.5", "not a whole number")):
        proc = doit(root, *args, target, check=False)
        assert proc.returncode == 3 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr == f"kforge: doit {shown}: {why}; {RUNNER_RULE}\n", proc.stderr
    proc = doit(root, "-n", "1", "-P", "Thread", target, check=False)
    assert proc.returncode == 3 and proc.stderr == ("kforge: doit -P Thread: no parallel type of doit's; -P "
                                                    "(--parallel-type) takes process (the default) or thread\n")
    assert not (root / "out" / "sm_90a").exists()   # nothing built
    doit(root, "-n", "0", target)   # one at a time, in doit's own process
    assert (root / "out" / "sm_90a" / "scale").is_dir()


def test_kforges_table_of_doits_options_is_doits_own_and_kforges_commands():
    """project_config.DOIT_OPTIONS (what the start-up line checks [tool.doit] against) is every option of doit's
    commands, its dodo.py loader and kforge's commands, by name and type; the fixed choices are doit's."""
    import tomllib
    from doit.cmd_base import DoitCmdBase, DodoTaskLoader
    from doit.dependency import CHECKERS
    from doit.doit_cmd import DoitMain
    from kforge.base import project_config
    plugins = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["doit"]["plugins"]["command"]
    commands = [*DoitMain.DOIT_CMDS, *(getattr(importlib.import_module(location.split(":")[0]), location.split(":")[1])
                                       for location in plugins.values())]
    options = {}
    for command in commands:
        extra = [*command.base_options, *DodoTaskLoader.cmd_options] if issubclass(command, DoitCmdBase) else []
        for option in [*extra, *command.cmd_options]:
            assert options.setdefault(option["name"], option["type"]) is option["type"], option["name"]
            if option.get("choices"):
                assert project_config.DOIT_CHOICES[option["name"]] == tuple(c for c, _ in option["choices"])
    assert options == project_config.DOIT_OPTIONS
    assert project_config.DOIT_CHOICES["check_file_uptodate"] == tuple(CHECKERS)


@pytest.mark.parametrize("setting, said", [
    ('verbosity = "x"', "[tool.doit] verbosity = 'x': not a whole number; doit's verbosity takes a whole number"),
    ('num_process = "x"', "[tool.doit] num_process = 'x': not a whole number; doit's num_process takes a whole "
                          "number 0 or over (0: one task at a time)"),
    ("num_process = -1", "[tool.doit] num_process = -1: below 0; doit's num_process takes a whole number 0 or over "
                         "(0: one task at a time)"),
    ('loader = "nope"', "[tool.doit] loader = 'nope': no loader doit has; doit's loader takes one of 'kforge'"),
    ("dep_file = 5", "[tool.doit] dep_file = 5: is an integer; doit's dep_file takes a string"),
    ('[tool.doit.commands.run]\ncontinue = "maybe"', "[tool.doit.commands.run] continue = 'maybe': not true or "
                                                     "false; doit's continue takes true or false"),
    ('[tool.doit.plugins.reporter]\nmine = "mine"', "[tool.doit.plugins.reporter] mine = 'mine': not where a plugin "
                                                   "is; doit takes \"module:attribute\" there"),
    ("doit.cfg", "[GLOBAL] verbosity = 'x': not a whole number; doit's verbosity takes a whole number"),
])
def test_a_doit_setting_of_another_type_or_no_choice_of_doits_is_one_line_and_exit_3(tmp_path, setting, said):
    """[tool.doit] verbosity = "x" was a CmdParseError traceback, loader = "nope" a KeyError one (exit code 1):
    every value doit's option parser or plugin lookup takes from pyproject.toml or doit.cfg is checked by the
    start-up line, before doit reads it; nothing is built."""
    from tests.support import make_project
    root = make_project(tmp_path / "p")
    pyproject = root / "pyproject.toml"
    if setting == "doit.cfg":
        (root / "doit.cfg").write_text("[GLOBAL]\nverbosity = x\n")
    elif setting.startswith("loader"):
        pyproject.write_text(pyproject.read_text().replace('loader = "kforge"', setting))
    else:
        pyproject.write_text(pyproject.read_text().replace('loader = "kforge"\n', f'loader = "kforge"\n{setting}\n'))
    proc = _doit_at_start(root, "scale:fp16-b256-w4@sm_90a")
    where = root / ("doit.cfg" if setting == "doit.cfg" else "pyproject.toml")
    assert proc.returncode == 3 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"kforge: {where}: {said}"), proc.stderr
    assert proc.stderr.rstrip().endswith("fix the value, or remove the line"), proc.stderr
    assert not (root / "out" / "sm_90a").exists()


def test_a_command_whose_output_reader_went_away_stops_quietly_with_sigpipes_exit_code(tmp_path):
    """`doit list --all | head -1`, `doit info FAMILY | head -1`: a BrokenPipeError traceback from doit's catch-all
    (exit code 3). Now nothing is said and the exit code is a shell's for a tool SIGPIPE stopped (141)."""
    from tests.support import doit, make_project
    root = make_project(tmp_path / "p")
    read, write = os.pipe()
    os.close(read)   # a reader that went away before the first line
    try:
        for args in (["list", "--all"], ["info", "scale"], ["info", "scale:fp16-b256-w4@sm_90a"]):
            env = dict(os.environ, PYTHONPATH=str(REPO))
            proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=env, stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
            assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr[-2000:])   # 128 + SIGPIPE
    finally:
        os.close(write)
    assert "scale:fp16-b256-w4@sm_90a" in doit(root, "list", "--all").stdout   # a reader that stays reads it all
