"""Scratch files live under out/.kforge/tmp/, never in the system's temp directory, and outlive no run.

Each compile gets a folder there holding its compile log and everything the compiler writes to its temp
directory (the compile server's TMPDIR points there while it compiles: Triton's .ptx/.o/.log files, ptxas's own),
named after the run's doit master, <pid>-<what>-<random>, and removed after its compile. What a killed compile
leaves goes when the master exits (atexit), and what a run killed outright leaves (SIGKILL, a power cut) when
the next run starts: every folder whose run is no longer alive.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

from kforge.base.layout import Layout
from kforge.store.guard import guard

_run: int | None = None   # this run's doit master (forked workers inherit it); None: not in a doit run


def start(layout: Layout) -> None:
    """In the doit master, before any worker forks: sweep what dead runs left, remove this run's at exit."""
    global _run
    _run = os.getpid()
    sweep(layout)
    atexit.register(sweep, layout, _run)


def folder(layout: Layout, what: str) -> str:
    """A fresh scratch folder for one compile under out/.kforge/tmp/ (OutsideOut when a link leads out)."""
    root = guard(layout.out, layout.scratch / "x").parent
    root.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{_run or os.getpid()}-{what}-", dir=root)


def sweep(layout: Layout, run: int | None = None) -> None:
    """Remove the scratch folders of `run`, or (None) of every run that is no longer alive."""
    root = layout.scratch
    try:
        guard(layout.out, root / "x")
        entries = list(os.scandir(root))
    except (OSError, ValueError):   # no scratch folder yet, or a link leading out of out/: nothing to remove there
        return
    for entry in entries:
        owner = entry.name.split("-", 1)[0]
        mine = owner == str(run) if run is not None else not (owner.isdigit() and _alive(int(owner)))
        if mine:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@contextlib.contextmanager
def as_tmpdir(path: str):
    """The process's temp directory is `path` for the block: Python's tempfile and the tools it starts (TMPDIR)."""
    before_env, before_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    try:
        yield
    finally:
        tempfile.tempdir = before_tempdir
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    return True
