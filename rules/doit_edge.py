"""Where kforge meets doit: DOIT_CONFIG, and every change kforge makes to how doit runs, installed explicitly
by config() from dodo.py. Each patch of doit's internals says why in one line.

  - the runner: doit_runner.PrefetchRunner / CappedThreadRunner replace doit's MRunner / MThreadRunner
    (a queue kept ahead of the workers, a cap on parallel compiles, workers that die with the master);
  - tasks that run after failed dependencies (`doit package` ships what built, lists what failed);
  - SIGTERM ends a run as Ctrl-C does, and an interrupt ends with one line, not a traceback;
  - the reporter (report.py): progress, summary, out/build-report.json, the key index kept current, the local
    cache trimmed to its limit;
  - no cyclic garbage collection while the catalog and the task graph are built (pause_gc_until_tasks_run);
  - doit's sqlite3 dependency file read in one query, not one per task (_read_dependency_file_at_once);
  - doit's state not saved (a full disk) is one line, not a traceback that skips the summary (_save_state_when_space_allows);
  - one build at a time in one out/: a command that runs tasks waits for another one's end (run_lock.py).
The commands forget/info/clean/prune/cache are doit plugins declared in pyproject.toml (doit_commands.py).
"""
from __future__ import annotations

import functools
import gc
import os
import signal
import sqlite3
import sys
from pathlib import Path

from doit.control import ExecNode
from doit.dependency import DatabaseException, SqliteDB

from kforge import artifact, cpus, doit_runner, keys, out_dir, report, run_lock, scratch, settings
from kforge.inputs import InputIndex
from kforge.layout import Layout
from kforge.local_cache import LocalCache


def pause_gc_until_tasks_run() -> None:
    """Called by dodo.py first: no cyclic garbage collection until doit starts running tasks.

    What dodo.py and doit allocate until then (the catalog, thousands of task dicts, doit's Task objects and
    task graph) lives until the process exits; Python's collector, triggered every 700 allocations, would
    scan the growing heap again and again for garbage that is not there: measured, ~50 ms of a 1,152-target
    no-op run, more than the rest of kforge's own code in it. The reporter's initialize() (doit calls it once
    the tasks are loaded, before the first runs) freezes what was built, so that later collections skip it,
    and resumes collection (_resume_gc). A command that runs no task (`doit list`) ends without collecting.
    """
    gc.disable()


def _resume_gc() -> None:
    gc.freeze()   # the task graph: long-lived, never garbage, never scanned again
    gc.enable()


def config(root: Path, catalog) -> dict:
    """DOIT_CONFIG for dodo.py, after installing kforge's runner and hooks."""
    layout = Layout(root)
    # doit opens its sqlite3 file in out/ as soon as any command starts, before a task runs: the one
    # directory created outside an action.
    layout.out.mkdir(exist_ok=True)
    _sigterm_as_interrupt()
    _interrupt_without_traceback()   # Ctrl-C while waiting for the lock: one line
    # before the tasks are generated: that is when what is up to date is decided
    run_lock.hold(layout.out, run_lock.command())
    scratch.start(layout.out)   # what killed runs left in out/.kforge/tmp goes; this run's goes when it ends
    reporter = type("BuildReporter", (report.BuildReporter,), {
        "report_path": str(layout.build_report),
        "key_index": artifact.KeyIndex.of(layout.built_keys),
        "local_cache": local_cache(),
        "saved_at_end": (keys.ToolVersions.of(layout.tool_versions), InputIndex.of(layout.observed_inputs), catalog),
        "before_first_task": staticmethod(_resume_gc),
        # a family that did not load has no targets to tell its artifacts from orphans: none are named then
        "find_orphans": staticmethod(list if catalog.broken else functools.partial(
            out_dir.orphaned, layout.out, [t.out_dir for t in catalog.targets], option("archs")))})
    _run_after_failed_deps()
    _read_dependency_file_at_once()
    _save_state_when_space_allows()
    max_workers, cap_reason = _compile_cap()
    doit_runner.install(prefetch=option("prefetch"), max_workers=max_workers, cap_reason=cap_reason)
    return {
        "backend": "sqlite3",
        "dep_file": str(layout.doit_db),
        "continue": True,            # one failed target never stops the others
        "reporter": reporter,
        "default_tasks": [f.name for f in catalog.families] + [b.name for b in catalog.broken] + ["package"],
        "num_process": max_workers or cpus.available(),   # a plain `doit` compiles on every CPU it may use
    }


_options: list = []   # this run's settings.Options, parsed on first use


def local_cache() -> LocalCache | None:
    """This run's local cache (rules/local_cache.py), or None with local_cache=off."""
    directory = option("local_cache")
    return None if directory is None else LocalCache(directory, option("local_cache_limit"))


def option(name: str):
    """A setting's value for this run (rules/settings.py); a malformed setting, any of them: one line naming
    it and exit code 2."""
    if not _options:
        try:
            _options.append(settings.options())
        except ValueError as e:
            sys.stderr.write(f"kforge: {e}\n")
            raise SystemExit(2)
    return getattr(_options[0], name)


def _compile_cap() -> tuple[int | None, str]:
    """(most workers, why) for this run: None when compiles run on a cluster, not on this machine's CPUs."""
    if option("executor") is not None:
        return None, ""
    cap = option("max_compiles")
    return cap, settings.source("max_compiles") or f"the {report.plural(cap, 'CPU')} this process may use"


def _run_after_failed_deps() -> None:
    """Let tasks whose meta says after_failed_deps run once their dependencies ended, failed or not.

    doit never runs a task one of whose task_dep failed, and has no option for it: its ExecNode.parent_status
    is wrapped. `doit package` must run anyway, to ship what was built and list what failed; it still waits
    for every compile, and the run still exits non-zero.
    """
    if getattr(ExecNode.parent_status, "kforge", False):
        return
    doit_parent_status = ExecNode.parent_status

    def parent_status(self, parent_node):
        if parent_node.run_status == "failure" and (self.task.meta or {}).get("after_failed_deps"):
            return
        doit_parent_status(self, parent_node)
    parent_status.kforge = True
    ExecNode.parent_status = parent_status


def _read_dependency_file_at_once() -> None:
    """doit's sqlite3 backend reads a task's row the first time the task is looked at: one query and one JSON
    decode per task, on every run, a no-op included (~30 ms of a 1,152-target one). SqliteDB._get_task_data
    is wrapped to read every row's text in one query when the file is opened (SqliteDB.__init__, which also
    starts afresh from a damaged file), decoding each when its task is looked at; remove and remove_all drop
    what was read, so `doit forget` never sees a row it deleted."""
    if getattr(SqliteDB._get_task_data, "kforge", False):
        return
    doit_init, doit_remove, doit_remove_all = SqliteDB.__init__, SqliteDB.remove, SqliteDB.remove_all
    query = "select task_id, cast(task_data as text) as data from doit"   # no JSON converter runs on it

    def __init__(self, name, codec, **kwargs):
        """Opened and read at once; a damaged file (a killed disk write, a truncated copy) is moved aside
        with one line and started afresh: it holds nothing a build needs (keys live in each meta.json)."""
        try:
            doit_init(self, name, codec, **kwargs)
            self._kforge_rows = {r["task_id"]: r["data"] for r in self._conn.execute(query)}
        except (sqlite3.DatabaseError, DatabaseException) as e:
            aside = f"{name}.damaged"
            os.replace(name, aside)
            sys.stderr.write(f"kforge: {name} is damaged ({str(e).splitlines()[0]}); moved to {aside} and "
                             f"started afresh: nothing built is lost (each artifact's key is in its meta.json)\n")
            doit_init(self, name, codec, **kwargs)
            self._kforge_rows = {}

    def _get_task_data(self, task_id):
        data = self._kforge_rows.pop(task_id, None)   # read when the file was opened
        return self.codec.decode(data) if data is not None else {}

    def remove(self, task_id):
        self._kforge_rows.pop(task_id, None)
        doit_remove(self, task_id)

    def remove_all(self):
        self._kforge_rows = {}   # the table is empty now
        doit_remove_all(self)
    _get_task_data.kforge = True
    SqliteDB.__init__, SqliteDB._get_task_data = __init__, _get_task_data
    SqliteDB.remove, SqliteDB.remove_all = remove, remove_all


def _save_state_when_space_allows() -> None:
    """doit writes its sqlite3 file once, at the end of a run, before the reporter's summary: on a full disk
    sqlite3's "database or disk is full" was a traceback, exit code 3, no summary and no build-report.json.
    SqliteDB.dump is wrapped: a failed write is one line and the run ends as usual. sqlite3 rolls the
    transaction back, so the file stays as the last run left it; nothing built is lost (keys live in meta.json)."""
    if getattr(SqliteDB.dump, "kforge", False):
        return
    doit_dump = SqliteDB.dump

    def dump(self):
        try:
            doit_dump(self)
        except (sqlite3.Error, OSError) as e:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            sys.stderr.write(f"kforge: {self.name}: doit's state was not saved ({str(e).splitlines()[0]}); nothing "
                             f"built is lost: the next run checks every target by its meta.json\n")
    dump.kforge = True
    SqliteDB.dump = dump


def _sigterm_as_interrupt() -> None:
    """SIGTERM ends a build like Ctrl-C: doit stops its workers and saves its state.

    Only in the doit master. A forked worker restores the default action as it starts (rules/doit_runner.py);
    until then it inherits this handler, which must not raise there: the master stops its workers with
    SIGTERM and stops reading their queue, so a worker that raised KeyboardInterrupt would block on that
    queue at exit. A worker dies at once instead (its compile child follows, via PDEATHSIG).
    """
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
    """An interrupted build ends with one line, not a Python traceback from wherever doit was waiting. The
    exit status stays Python's for an unhandled KeyboardInterrupt (killed by SIGINT: 130 in a shell)."""
    default = sys.excepthook

    def hook(kind, value, traceback):
        if issubclass(kind, KeyboardInterrupt):
            sys.stderr.write("kforge: interrupted. Every task finished so far is kept; run the same command "
                             "again to do the rest.\n")
        else:
            default(kind, value, traceback)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = hook
