"""Where kforge meets doit: DOIT_CONFIG, and every change kforge makes to how doit runs, installed by config()
from dodo.py. Through doit's plugin points: the backend (edge/backend.py), the reporter, the commands
(edge/commands.py) and the task Loader; where doit 0.37 has none, its internals are replaced here only
(DOIT_PATCHES): the runner (a queue kept ahead of the workers, a cap on compiles, workers that die with the master)
and tasks that run after failed dependencies. Also: SIGTERM as Ctrl-C, an interrupt in one line, no cyclic GC while
the task graph is built, one build at a time per out/ (store/run_lock.py).
"""
from __future__ import annotations

import difflib
import gc
import importlib
import importlib.metadata
import os
import queue
import shlex
import signal
import stat
import sys
import time
from pathlib import Path

from doit import cmd_run
from doit.cmd_base import Command, DodoTaskLoader
from doit.control import ExecNode, TaskControl
from doit.doit_cmd import DoitMain
from doit.exceptions import InvalidCommand, InvalidTask
from doit.runner import JobHold, MRunner, MThreadRunner

from kforge.store import artifact, guard, run_lock
from kforge.base import cpus, project_config, settings
from kforge.edge import backend as doit_backend
from kforge.plan import keys
from kforge.report import reporter as report
from kforge.store.inputs import InputIndex
from kforge.base.layout import Layout
from kforge.share.local_cache import LocalCache


def pause_gc_until_tasks_run() -> None:
    """No cyclic GC until tasks run (the reporter then calls _resume_gc): what dodo.py and doit allocate until
    then lives until exit, and the collector scanned it again and again (~50 ms of a 1,152-target no-op run)."""
    gc.disable()


def _resume_gc() -> None:
    gc.freeze()   # the task graph: long-lived, never garbage, never scanned again
    gc.enable()


def config(root: Path, catalog) -> dict:
    """DOIT_CONFIG for dodo.py, after installing kforge's runner and hooks."""
    dependency_backend = backend()   # first: a missing one stops the run before it takes the lock
    layout = Layout(root)
    # doit opens its sqlite3 file in out/ before any task runs: the one directory made outside an action
    try:
        layout.out.mkdir(exist_ok=True)
    except FileExistsError:   # a file, or a link to nothing, of that name
        sys.stderr.write(f"kforge: {layout.out} is not a folder: kforge keeps its builds there; move it away and run "
                         f"again\n")
        raise SystemExit(2)
    _sigterm_as_interrupt()
    _interrupt_without_traceback()   # Ctrl-C while waiting for the lock: one line
    # before the tasks are generated: that is when what is up to date is decided
    run_lock.hold(layout, run_lock.command())
    guard.start_scratch(layout)   # what killed runs left in out/.kforge/tmp goes; this run's goes when it ends
    reporter = type("BuildReporter", (report.BuildReporter,), {
        "report_path": str(layout.build_report),
        "key_index": artifact.KeyIndex.of(layout.built_keys),
        "local_cache": local_cache(),
        "saved_at_end": (keys.ToolVersions.of(layout.tool_versions), InputIndex.of(layout.observed_inputs), catalog),
        "before_first_task": staticmethod(_resume_gc),
        # a family that did not load has no targets to tell its artifacts from orphans: none are named then
        "find_orphans": staticmethod(list if catalog.broken else lambda: guard.no_targets(
            layout, [t.out_dir for t in catalog.targets], settings.get("archs"))[0])})
    # the cap on workers: none where compiles run on a cluster, not on this machine's CPUs
    max_workers = settings.get("max_compiles") if settings.get("executor") is None else None
    cap_reason = settings.source("max_compiles") or f"the {report.plural(max_workers, 'CPU')} this process may use"
    install_runner(prefetch=settings.get("prefetch"), max_workers=max_workers, cap_reason=cap_reason,
                   keep_hub_s=settings.get("keep_hub"))
    _run_after_failed_deps()
    return {
        "backend": dependency_backend,
        "dep_file": str(layout.doit_db),
        "continue": True,            # one failed target never stops the others
        "reporter": reporter,
        "default_tasks": [f.name for f in catalog.families] + [b.name for b in catalog.broken] + ["package"],
        "num_process": max_workers or cpus.available(),   # a plain `doit` compiles on every CPU it may use
    }


def check_settings() -> None:
    """Every setting parsed before the catalog loads (a malformed one: one line, exit code 2). An unknown
    `name=value` may be a project task's own: only a near miss is a warning (`arch=gfx942` built the defaults)."""
    from doit import doit_cmd
    given = doit_cmd._CMDLINE_VARS or {}   # what doit took off the command line (doit.get_var reads it)
    if "" in given:
        sys.stderr.write(f"kforge: `={given['']}` on the command line sets no name: write name=value (archs=sm_90a)\n")
        raise SystemExit(2)
    for name, value in given.items():
        near = name not in settings.SETTINGS and difflib.get_close_matches(name, settings.SETTINGS, n=1, cutoff=0.75)
        if near:
            sys.stderr.write(f"kforge: warning: {name}={value} is no setting of kforge's; did you mean {near[0]}=? (a "
                             f"task of the project may read it: then ignore this)\n")
    try:
        settings.options()
    except ValueError as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)


REPLACED = ("forget", "info", "clean")   # doit commands kforge replaces (rules/edge/commands.py)
ADDED = ("prune", "cache")   # kforge's commands doit does not have


def check_command(root: Path) -> None:
    """`doit forget|info|clean|prune|cache` running without kforge's command (doit takes plugin commands from the
    pyproject.toml where it starts: from elsewhere `forget` kept the artifact): one line, exit code 2."""
    frame = run_lock.command_frame()
    if frame is None:
        return
    command, words = frame.f_locals["self"], frame.f_locals.get("args")   # doit's run: the tasks it was given
    name = getattr(command, "name", "")
    if name == "run" and isinstance(words, list) and words and words[0] in ADDED:
        name = words[0]
    elif not (name in REPLACED and not type(command).__module__.startswith("kforge.")):
        return
    where = shlex.quote(guard.printable(str(root)))   # a path with a space pasted into cd as it is
    sys.stderr.write(f"kforge: `doit {name}` ran doit's own command, not kforge's: doit takes kforge's commands "
                     f"from [tool.doit.plugins.command] in the pyproject.toml of the folder it starts in; start "
                     f"it in {where}, or name them in that pyproject.toml as README shows\n")
    raise SystemExit(2)


def local_cache() -> LocalCache | None:
    directory = settings.get("local_cache")
    return None if directory is None else LocalCache(directory, settings.get("local_cache_limit"))


def backend() -> str:
    """kforge's backend's name, once sure doit has it (an install's metadata older than it: a TypeError traceback)."""
    try:
        registered = any(e.group == "doit.BACKEND" and e.name == doit_backend.NAME
                         for e in importlib.metadata.distribution("kforge").entry_points)
    except importlib.metadata.PackageNotFoundError:
        registered = False
    if not registered:
        sys.stderr.write(f"kforge: doit has no backend {doit_backend.NAME!r}: kforge's installed metadata predates "
                         f"it; install kforge again (`pip install -e .` in its checkout)\n")
        raise SystemExit(2)
    return doit_backend.NAME


# the modules of doit's commands that check the names they are given with a check_tasks_exist of their own
NAME_CHECKING_COMMANDS = ("cmd_clean", "cmd_forget", "cmd_ignore", "cmd_list", "cmd_resetdep")

# doit's internals kforge replaces, for want of a plugin point in doit 0.37.0, and why: only here, each checked
# against doit's code by tests/edge/test_config.py, so that a doit that moved them fails a test, not a build.
DOIT_PATCHES = {
    "doit.cmd_run.MRunner": "doit's `run` picks its process runner by this name (install_runner)",
    "doit.cmd_run.MThreadRunner": "and its thread runner (install_runner)",
    "doit.control.ExecNode.parent_status": "doit never runs a task after a failed task_dep (_run_after_failed_deps)",
    "doit.doit_cmd.DoitMain.process_args": "doit takes `name=value` settings off the command line there, before any "
                                           "command or dodo.py runs, reading each argument's first character: an "
                                           "empty one was an IndexError traceback (check_arguments)",
    "doit.control.TaskControl._filter_tasks": "a name no task has is doit's three-line 'Invalid parameter' there, "
                                              "naming none that is close (check_arguments)",
    **{f"doit.{command}.check_tasks_exist": "and `'NAME' is not a task.` in each command that checks names itself"
       for command in NAME_CHECKING_COMMANDS},
    "doit.cmd_base.Command.parse_execute": "every command runs there, inside doit's catch-all: output to a reader "
                                           "that went away (`doit list | head -1`) was a BrokenPipeError traceback "
                                           "(check_arguments)",
}
# how a command other than a build ends once the reader of its output went away: the exit code a shell shows for
# a tool SIGPIPE stopped (`seq 1000000 | head -1`), with nothing said (a build goes on: report.reader_gone)
READER_GONE_EXIT = 128 + signal.SIGPIPE


class Loader(DodoTaskLoader):
    """doit's dodo.py loader, named in pyproject.toml: imported before doit reads the command line, so it installs
    check_arguments."""

    def __init__(self):
        super().__init__()
        check_arguments()

    def setup(self, opt_values):
        """doit's -f and -d, checked before doit imports: a blank one or a -f that names no .py file is one line
        and exit code 3 (-f '' or a folder ran nothing and exited 0)."""
        dodo, folder = str(opt_values.get("dodoFile")), opt_values.get("cwdPath")
        seek = opt_values.get("seek_file")   # -k looks for the name in the parent folders
        # -f is taken from the folder doit starts in, not from -d
        problem = ("-d", folder, "names no folder") if folder is not None and not str(folder).strip() else \
            ("-f", dodo, "is blank") if not dodo.strip() else \
            ("-f", dodo, "is a folder") if not seek and os.path.isdir(dodo) else \
            ("-f", dodo, "is not a Python file") if not seek and os.path.exists(dodo) and not dodo.endswith(".py") \
            else None
        if problem is not None:
            flag, value, why = problem
            sys.stderr.write(f"kforge: doit {flag} {shlex.quote(str(value))} {why}: name the project's dodo.py "
                             f"(doit -f PROJ/dodo.py) or its folder (doit -d PROJ), or leave the option out\n")
            raise SystemExit(3)
        super().setup(opt_values)


def check_arguments() -> None:
    """A doit command line checked before doit's parser reads it (a blank argument: a script's unset variable,
    `doit info "$T"`): one line and exit code 3, before anything is loaded or changed. A name that selects no task
    (a typo in a target's arch or config id) is one line naming the closest, once the tasks are known. A command
    whose output's reader went away (`doit list --all | head -1`) stops there, quietly (READER_GONE_EXIT)."""
    def process_args(doit_process_args, self, cmd_args):
        problem = blank_argument(cmd_args) or command_problem(self.config, cmd_args) or runner_problem(self, cmd_args)
        if problem is not None:
            sys.stderr.write(problem + "\n")
            raise SystemExit(3)
        return doit_process_args(self, cmd_args)

    def filter_tasks(doit_filter_tasks, self, selection):
        try:
            return doit_filter_tasks(self, selection)
        except InvalidCommand as e:
            if e.not_found is None:
                raise
            raise InvalidCommand(unknown_name(str(e.not_found), list(self.tasks), command=True)) from None

    def tasks_exist(doit_tasks_exist, tasks, names, skip_wildcard=False):
        try:
            return doit_tasks_exist(tasks, names, skip_wildcard)
        except InvalidCommand:
            unknown = next((n for n in names if n not in tasks and not (skip_wildcard and "*" in n)), None)
            if unknown is None:
                raise
            raise InvalidCommand(unknown_name(unknown, list(tasks))) from None

    def parse_execute(doit_parse_execute, self, in_args):
        try:
            result = doit_parse_execute(self, in_args)
            sys.stdout.flush()   # what is still buffered fails here, not in Python's flush at exit
            return result
        except BrokenPipeError:
            report.to_devnull(sys.stdout)   # Python's flush at exit writes what is left there
            raise SystemExit(READER_GONE_EXIT) from None

    _wrap(DoitMain, "process_args", process_args)
    _wrap(Command, "parse_execute", parse_execute)
    _wrap(TaskControl, "_filter_tasks", filter_tasks)
    for command in NAME_CHECKING_COMMANDS:
        _wrap(importlib.import_module(f"doit.{command}"), "check_tasks_exist", tasks_exist)


def unknown_name(name: str, tasks: list[str], command: bool = False) -> str:
    """The line for a command-line name that is no task, family or target of the project (nor a doit command,
    where one may stand: `doit NAME`)."""
    from doit.doit_cmd import DoitMain
    if command and name in {c.get_name() for c in DoitMain.DOIT_CMDS} | set(ADDED):   # after a build's options
        return (f"kforge: {name!r} is a doit command, not a task: after a build's options (`doit -n 2 {name}`) "
                f"doit reads a name as a task; give the command first, `doit {name} ...`")
    shown = name if len(name) <= 120 else name[:117] + "..."
    close = difflib.get_close_matches(name, tasks, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"kforge: {shown!r} names no {'command, ' if command else ''}task, family or target of this project{hint} " \
           f"(`doit list --all` lists every target)"


def _wrap(owner, name: str, wrapper) -> None:
    """owner.name becomes wrapper(doit's own, *args), once: a second call keeps the first (DOIT_PATCHES); doit's
    own stays at the wrapper's `doit`."""
    doits = getattr(owner, name)
    if not getattr(doits, "kforge", False):
        wrapped = lambda *args, **kwargs: wrapper(doits, *args, **kwargs)   # noqa: E731  (bound as a method)
        wrapped.kforge, wrapped.doit = True, doits
        setattr(owner, name, wrapped)


def blank_argument(args: list[str]) -> str | None:
    """The line for a doit command line one of whose arguments is empty or blank, or None."""
    blank = next((i for i, arg in enumerate(args) if not arg.strip()), None)
    if blank is None:
        return None
    shown = shlex.join(["doit", *args])
    shown = shown if len(shown) <= 200 else shown[:197] + "..."
    return (f"kforge: `{shown}`: argument {blank + 1} is empty: it names no task, target or setting (an unset shell "
            f"variable?); give a name, or leave the argument out (`doit list --all` lists the targets)")


def command_problem(config, args: list[str]) -> str | None:
    """The line for a command that cannot run, or None: `doit dumpdb` (it opens dbm files; kforge's are SQLite: a
    dbm.error traceback), or one the pyproject.toml names at a place of kforge's where it is not (doit imported
    it only to run it: a 'Plugin COMMAND ...' traceback)."""
    words = [arg for arg in args if not arg.startswith("-") and "=" not in arg]
    if words[:1] == ["dumpdb"]:
        return ("kforge: `doit dumpdb` reads doit's dbm files; kforge keeps doit's state in SQLite at out/.doit.sqlite3: "
                "`sqlite3 out/.doit.sqlite3 .dump` shows it, `doit info NAME` a target's state")
    location = (config.get("COMMAND") or {}).get(words[0]) if words else None
    if not (isinstance(location, str) and location.startswith("kforge.") and ":" in location):
        return None
    module, _, name = location.partition(":")
    try:
        if hasattr(importlib.import_module(module), name):
            return None
        why = f"{module} has no {name}"
    except ImportError:
        why = f"kforge has no module {module}"
    right = f"kforge.edge.commands:{words[0].capitalize()}" if words[0] in REPLACED + ADDED else None
    fix = f"write `{words[0]} = \"{right}\"`" if right else "remove the line"
    return (f"kforge: pyproject.toml's [tool.doit.plugins.command] {words[0]} = {location!r}: {why}; {fix}, as "
            f"kforge's own pyproject.toml does")


# what -n (--process) and -P (--parallel-type) take: doit 0.37 ran `-n -1` into kforge's runner (a RuntimeError
# traceback after a summary of nothing; with -P thread nothing ran and the exit code was 0); `-n abc` was doit's
# two-line parse error and `-P Thread` a line naming no choice
PROCESS_RULE = ("-n (--process) takes a whole number: 0 runs one task at a time in doit's own process, N >= 1 runs N "
                "worker processes (at most one per CPU this process may use); leave it out for one per CPU")
PARALLEL_TYPES = ("process", "thread")


def process_problem(value) -> str | None:
    """Why a -n / num_process value cannot be used (doit reads it with int()), or None."""
    try:
        n = int(value) if isinstance(value, str) else value
    except ValueError:
        return "not a whole number"
    if isinstance(n, bool) or not isinstance(n, int):
        return f"not a whole number ({type(value).__name__})"
    return "below 0" if n < 0 else None


def runner_problem(main, args: list[str]) -> str | None:
    """The line for a -n or -P value doit's `run` cannot use, or None: the options read as doit's parser reads
    them (getopt over the command's own options: `-n -1`, `-n-1`, `--process=-1`, `-an-1` alike)."""
    import getopt
    from doit.cmdparse import CmdOption, CmdParse
    words = [arg for arg in args if arg.startswith("-") or "=" not in arg]   # doit takes name=value out first
    try:
        commands = main.get_cmds()
        explicit = bool(words) and words[0] in commands   # else doit runs `run`, the words its options and names
        command = commands.get_plugin(words[0] if explicit else "run")
    except Exception:   # a command that cannot be imported: doit says so itself
        return None
    options = list(command.cmd_options)
    if hasattr(command, "base_options"):   # a command that loads dodo.py: the loader's options and doit's own too
        options += [*command.base_options, *Loader.cmd_options]
    if not any(o["name"] in ("num_process", "par_type") for o in options):
        return None
    parser = CmdParse([CmdOption(o) for o in options])
    try:
        given, _ = getopt.getopt(words[explicit:], parser.get_short(), parser.get_long())
    except getopt.GetoptError:   # an option the command has not: doit's own line
        return None
    for flag, value in given:
        option = parser.get_option(flag)[0]
        shown = shlex.join([flag, value])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        if option.name == "num_process" and process_problem(value):
            return f"kforge: doit {shown}: {process_problem(value)}; {PROCESS_RULE}"
        if option.name == "par_type" and value not in PARALLEL_TYPES:
            return (f"kforge: doit {shown}: no parallel type of doit's; -P (--parallel-type) takes process (the "
                    f"default) or thread")
    return None


CONFIG_LIMIT = project_config.SIZE_LIMIT   # doit reads the whole file into memory


def start_problem(args: list[str], folder: str = ".") -> str | None:
    """What stops a doit command line before doit reads anything, in one line, or None: a blank argument (an
    IndexError in doit's parser), or a settings file doit reads first that is no file (a FIFO blocked doit for
    ever), far too large, or one doit cannot read."""
    problem = blank_argument(args)
    if problem is not None:
        return problem
    for name in project_config.DOIT_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):   # a link to nothing: doit passes it by too
            continue
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return (f"kforge: {os.path.abspath(path)}: not a file ({project_config.not_a_file(st.st_mode)}); "
                    f"doit reads its settings there before anything else: put the project's {name} in its place, "
                    f"or remove it")
        if st.st_size > CONFIG_LIMIT:
            return (f"kforge: {os.path.abspath(path)}: too large for a settings file (over {CONFIG_LIMIT >> 20} "
                    f"MiB), and doit reads it whole: put the project's {name} in its place")
    return project_config.doit_settings_problem(folder)


def refuse_at_start() -> None:
    """Called by kforge's line in site-packages (rules/runtime/kforge-runtime-env.pth, run at every interpreter
    start) in a doit process: what start_problem names stops it before doit reads it. One line, exit code 3."""
    problem = start_problem(sys.argv[1:])
    if problem is not None:
        sys.stderr.write(problem + "\n")
        sys.stderr.flush()
        os._exit(3)   # Python is still starting: SystemExit here would be a fatal error with a traceback


def install_runner(prefetch: int | None = None, max_workers: int | None = None, cap_reason: str = "",
                   keep_hub_s: int = 0) -> None:
    """`doit -n N` uses PrefetchRunner (processes) or CappedThreadRunner (`-P thread`), with at most max_workers
    workers; `-n 0` keeps doit's serial runner."""
    PrefetchRunner.prefetch, PrefetchRunner.keep_hub_s = prefetch, keep_hub_s
    for runner in (PrefetchRunner, CappedThreadRunner):
        runner.max_workers, runner.cap_reason = max_workers, cap_reason
    cmd_run.MRunner, cmd_run.MThreadRunner = PrefetchRunner, CappedThreadRunner


def _run_after_failed_deps() -> None:
    """Tasks whose meta says after_failed_deps run after their dependencies, failed or not (doit never runs a task
    whose task_dep failed, and `doit package` must ship what built and list what failed)."""
    def parent_status(doit_parent_status, self, parent_node):
        if not (parent_node.run_status == "failure" and (self.task.meta or {}).get("after_failed_deps")):
            doit_parent_status(self, parent_node)
    _wrap(ExecNode, "parent_status", parent_status)


def _sigterm_as_interrupt() -> None:
    """SIGTERM ends a build like Ctrl-C (doit saves its state). Only in the master: a forked worker that inherits
    the handler dies at once, since a KeyboardInterrupt would block its exit on a queue no one reads."""
    master = os.getpid()

    def handler(signum, frame):
        if os.getpid() != master:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise KeyboardInterrupt
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, handler)


def _interrupt_without_traceback() -> None:
    """An interrupted build ends with one line, not a traceback; the exit status stays Python's (130 in a shell)."""
    default = sys.excepthook

    def hook(kind, value, traceback):
        if issubclass(kind, KeyboardInterrupt):
            sys.stderr.write("kforge: interrupted. Every task finished so far is kept; run the same command "
                             "again to do the rest.\n")
        else:
            default(kind, value, traceback)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = hook


# --- the runner ------------------------------------------------------------------------------------------------
# doit's MRunner hands a worker its next task only after the master took in its last result (a round trip through
# a master that waits for a core too: ~1.3% fewer compiles running, bench/build_speed.py). PrefetchRunner keeps up
# to `prefetch` tasks queued beyond those running, each once doit's dispatcher released it.
DEATH_GRACE_S = 0.5   # a dead worker seen: how long results already sent are still taken in


class _CappedWorkers:
    """At most `max_workers` workers, so at most that many compiles at once (rules/base/cpus.py says why)."""
    max_workers: int | None = None   # None: no cap (compiles run elsewhere, e.g. on a Dask cluster)
    cap_reason = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.max_workers is not None and self.num_process > self.max_workers:
            sys.stderr.write(f"kforge: -n {self.num_process} is more than {self.cap_reason}: at most "
                             f"{self.max_workers} task{'s run' if self.max_workers > 1 else ' runs'} at once "
                             f"(max_compiles=N on the command line or KFORGE_MAX_COMPILES=N sets the cap)\n")
            self.num_process = self.max_workers


class CappedThreadRunner(_CappedWorkers, MThreadRunner):
    """`doit -n N -P thread`: doit's thread runner, with the cap."""


class PrefetchRunner(_CappedWorkers, MRunner):
    prefetch = None      # tasks queued beyond those running; None: one per worker
    keep_hub_s = 0       # seconds the hub is kept after the run for the project's next one (0: closed with it)

    def run_tasks(self, task_dispatcher):
        self.master_pid = os.getpid()
        result_q, job_q = self.Queue(), self.Queue()
        self._run_tasks_init(task_dispatcher)
        self.unfinished: set[str] = set()   # names of the tasks queued or running, whose result has not come back
        self.dispatcher_done = False
        self._queue_ahead(job_q, None)
        workers = [self.Child(target=self.execute_task_subprocess, args=(job_q, result_q, self.reporter.__class__))
                   for _ in range(min(self.num_process, len(self.unfinished)))]   # no more workers than tasks
        self.death_seen_at: float | None = None   # when a worker was first seen dead (_next_result)
        compile_core, kept_for = None, 0
        try:
            if workers:   # one hub per build serves the workers' compile servers (rules/compile/core.py)
                from kforge.compile import core as compile_core
                compile_core.start_hub(keep=self.keep_hub_s > 0)
            for worker in workers:
                worker.start()
            while self.unfinished:
                result = self._next_result(result_q, workers)
                if "exit" in result:   # a worker itself broke (not a task): doit's own handling
                    raise result["exit"](result["exception"])
                node = task_dispatcher.nodes[result["name"]]
                if "reporter" in result:
                    getattr(self.reporter, result["reporter"])(node.task)
                    continue
                self.unfinished.discard(node.task.name)
                self._process_result(node, node.task, result)
                self._queue_ahead(job_q, node)
            kept_for = self.keep_hub_s   # an interrupted run keeps nothing
        except (SystemExit, KeyboardInterrupt, Exception):
            job_q.cancel_join_thread()   # no worker will read the jobs still queued: exit without flushing them
            _stop(workers)
            raise
        finally:
            if compile_core is not None:
                compile_core.close_hub(keep_s=kept_for)
        for _ in workers:
            job_q.put(None)   # each worker runs its teardowns and exits
        for worker in workers:
            worker.join()
        while not result_q.empty():   # teardown reports; safe once the workers are joined
            result = result_q.get()
            getattr(self.reporter, result["reporter"])(task_dispatcher.tasks[result["name"]])

    def execute_task_subprocess(self, job_q, result_q, reporter_class):
        # a SIGKILLed master (a cancelled CI job) takes its workers with it: orphans would hold hundreds of MB each
        from kforge.load import isolate   # here: a no-op run forks no worker
        isolate.die_with_parent(self.master_pid)
        # the kernel's default: SIGTERM ends a worker whatever its threads do (the master's inherited Python
        # handler would run only once the main thread next runs Python)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        super().execute_task_subprocess(job_q, result_q, reporter_class)

    def _next_result(self, result_q, workers) -> dict:
        """The workers' next result; a worker killed from outside (doit's runner then waits forever) stops the run
        through doit's error path. Liveness is checked before every read (the others' results would keep the run
        going); results sent before the death was seen are still taken in."""
        while True:
            dead = [w for w in workers if not w.is_alive()]
            if dead and self.death_seen_at is None:
                self.death_seen_at = time.monotonic()
            timeout = 1.0 if not dead else max(0.0, self.death_seen_at + DEATH_GRACE_S - time.monotonic())
            try:
                return result_q.get(timeout=timeout)
            except queue.Empty:
                if dead:
                    how = ", ".join(f"pid {w.pid}, exit code {w.exitcode}" for w in dead)
                    raise InvalidTask(f"a doit worker process died ({how}) while running one of the tasks still "
                                      f"queued or running: {', '.join(sorted(self.unfinished))}. The run stopped; "
                                      f"everything finished is kept. Run the same command again to build the rest.")

    def _queue_ahead(self, job_q, completed) -> None:
        """Tell the dispatcher `completed` finished, then queue tasks until the queue is full, none is left, or the
        rest wait on running ones ("hold on")."""
        depth = self.num_process + (self.num_process if self.prefetch is None else self.prefetch)
        while not self.dispatcher_done and len(self.unfinished) < depth:
            job = self.get_next_job(completed)
            completed = None
            if job is None:       # nothing left to dispatch, or a failure stopped the run (no --continue)
                self.dispatcher_done = True
            elif job.type is JobHold.type:
                self.free_proc = 0   # doit's own bookkeeping for a hold; a later result asks again
                break
            elif not (self.tasks[job.name].actions or self.tasks[job.name].teardown):   # a group task: done here,
                node = self.task_dispatcher.nodes[job.name]   # with no worker round trip
                self.execute_task(node.task)   # reports it; runs no action
                self.process_task_result(node, None)
                completed = node
            else:
                job_q.put(job)
                self.unfinished.add(job.name)
        if not self.unfinished and not self.dispatcher_done:
            raise RuntimeError("doit's dispatcher holds tasks while none runs (a dependency cycle?)")


def _stop(workers, grace_s: float = 3.0) -> None:
    """SIGTERM every started worker, SIGKILL any alive after grace_s: an interrupted master exits only once its
    workers are joined, so one that outlived SIGTERM would hang the exit forever."""
    started = [w for w in workers if w.pid is not None]
    for worker in started:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in started:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()
