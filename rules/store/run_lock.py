"""One build at a time in one out/: a command that runs tasks holds out/.kforge/run.lock (fcntl.flock) from
before its tasks are generated to its exit; a second one says so in one line and waits. Waiting, not sharing the
work: what is up to date is decided when the tasks are generated, so two runs that generated theirs at once would
both compile everything. The OS releases the lock however its holder exits: no stale lock to remove by hand.
Commands that only read (`doit list`, `doit info`) take no lock.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time

from kforge.base import settings
from kforge.base.layout import Layout
from kforge.store.guard import OutsideOut, guard

READ_ONLY = {"list", "info", "help", "dumpdb", "tabcompletion"}   # doit commands that change nothing in out/

_held: list[int] = []   # the lock's descriptor, open until the process exits (the OS then releases the lock)


def _lock_fix(code: int | None) -> str:
    """What to do when the lock file cannot be opened, by why."""
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "out/ is not writable here: make it writable (or build in a checkout whose out/ is)"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full: free space and run again"
    return "remove it (a link or a folder where the lock file belongs) and run again"


def hold(layout: Layout, command: str | None) -> None:
    """Take the lock for `command` (a doit command's name; None: not run by a doit command); wait for it, with
    one line, while another run holds it."""
    if command is None or command in READ_ONLY or _held:
        return
    path = layout.state / "run.lock"
    problem = _not_a_folder(layout)
    if problem is not None:
        sys.stderr.write(f"kforge: {problem}\n")
        raise SystemExit(2)
    try:
        guard(layout.out, path).parent.mkdir(parents=True, exist_ok=True)   # never through a link leading outside out/
        # O_NONBLOCK: a FIFO or a device where the lock belongs is refused below, never waited on
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OutsideOut as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)
    except OSError as e:
        sys.stderr.write(f"kforge: {path}: cannot open the run lock ({e.strerror}); {_lock_fix(e.errno)}\n")
        raise SystemExit(2)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):   # it would take the lock, then fail writing its holder (EINVAL) as a traceback
        from kforge_runtime.bundle import file_kind   # the one wording
        os.close(fd)
        sys.stderr.write(f"kforge: {path} is {file_kind(mode)}, not the run lock kforge writes; remove it and run "
                         f"again\n")
        raise SystemExit(2)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
        sys.stderr.write(f"kforge: waiting for {holder} to finish: one build at a time in {layout.out} ({path}; Ctrl-C "
                         f"stops waiting)\n")
        sys.stderr.flush()
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)   # who holds it, for the next one's line
    shown = " ".join(["doit", *map(_hide_secret, sys.argv[1:])])   # as typed; `command` is doit's name ("run")
    os.pwrite(fd, f"`{shown}` (pid {os.getpid()}, since {time.strftime('%H:%M:%S')})".encode(), 0)
    _held.append(fd)


def _not_a_folder(layout: Layout) -> str | None:
    """The line for what stands where a build keeps a folder, out/.kforge (the lock's) or out/<arch>, when it is no
    folder (a file, a link to one or to nothing): the lock's line named out/.kforge/run.lock, a path that cannot
    be, as the thing to remove; each target of an arch failed with `Not a directory`, naming no culprit."""
    from kforge.base.archs import ARCHS
    for place in (layout.state, *map(layout.arch_dir, ARCHS)):
        if os.path.lexists(place) and not os.path.isdir(place):
            what = "its state (the run lock, indexes, the catalog)" if place == layout.state else \
                f"the {place.name} builds"
            kind = "a file" if not os.path.islink(place) else f"a link to {os.path.realpath(place)}" \
                if os.path.exists(place) else "a link to nothing"
            return f"{place} is {kind}, not a folder: kforge keeps {what} there; remove it and run again"
    return None


def _hide_secret(arg: str) -> str:
    """`cache_key=...` as `cache_key=(hidden)`: the lock file is readable by whoever reads out/."""
    name = arg.split("=", 1)[0]
    return f"{name}=(hidden)" if "=" in arg and getattr(settings.SETTINGS.get(name), "secret", False) else arg


def command() -> str | None:
    """The name of the doit command loading dodo.py, or None."""
    frame = command_frame()
    return None if frame is None else frame.f_locals["self"].name


def command_frame():
    """The frame of the doit command running (its `self` a doit Command), or None. doit passes the command to
    nothing dodo.py sees, so it is found on the stack: DoitCmdBase.execute() imports dodo.py."""
    from doit.cmd_base import Command
    frame = sys._getframe(1)
    while frame is not None and not isinstance(frame.f_locals.get("self"), Command):
        frame = frame.f_back
    return frame
