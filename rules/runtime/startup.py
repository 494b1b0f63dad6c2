"""KFORGE_RECORD=FILE and KFORGE_SERVE=DIR[,DIR...][,strict][,preload][,report][,verify]: record or serve every Python
process of an application, whatever starts it (docs/libraries.md).

kforge-runtime-env.pth, installed with kforge, calls start() at interpreter start where a variable is set: the paths
are made absolute (a child started elsewhere finds the same files) and applied at the import that runs Triton's
module (after_import.py), so a process that never imports Triton pays for nothing more. A KFORGE_SERVE value that
cannot be applied stops the process there with one line (serving asked for and silently not done would compile); a
bad KFORGE_RECORD is one warning (recording never stops a process). An empty variable is an unset one.
"""
from __future__ import annotations

import os
import sys

from .after_import import AfterImport

FLAGS = ("strict", "preload", "report", "verify")


_started = False


def start() -> None:
    """Run by the .pth line when a variable is set: the paths made absolute, apply() at `import triton`. Once
    per process: a .pth found in two site directories (a venv and the user's) must not serve it twice."""
    global _started
    if _started:
        return
    _started = True
    record, served = os.environ.get("KFORGE_RECORD"), os.environ.get("KFORGE_SERVE")
    if record:
        from .record import record_problem
    if record and record_problem(record) is None:
        os.environ["KFORGE_RECORD"] = os.path.abspath(record)
    if served and _parts(served):   # a bare word that names nothing here stays as given: a mistyped flag
        os.environ["KFORGE_SERVE"] = ",".join(p if p in FLAGS or not (os.sep in p or os.path.exists(p))
                                              else os.path.abspath(p) for p in _parts(served))
    if "triton" in sys.modules:   # start() called by hand, after the import
        apply()
    else:
        sys.meta_path.insert(0, AfterImport("triton", apply))


def _stop(message: str):
    """A KFORGE_SERVE value that cannot be applied ends the process with one line (SystemExit: no traceback)."""
    from .schema import one_line
    sys.stderr.write(f"kforge: {one_line(message)}\n")
    raise SystemExit(2) from None


def apply() -> None:
    """Record and serve this process as the variables say, once Triton is imported."""
    record, served = os.environ.get("KFORGE_RECORD"), os.environ.get("KFORGE_SERVE")
    if served:   # checked first: a bad value stops the process before anything is installed
        paths, flags = parse_serve(served)
    if record:
        from .record import Recorder, record_problem
    if record and record_problem(record) is not None:   # recording never stops a process: a warning
        from .schema import one_line
        sys.stderr.write(f"kforge record: {one_line(record_problem(record))}; nothing is recorded in this process\n")
    elif record:
        Recorder(record).install()
    if served:
        from .bundle import BundleError
        from .library import Library
        from .serve import serve
        try:
            library = Library(*paths)
        except BundleError as e:
            _stop(f"KFORGE_SERVE: {e}")
        server = serve(library, strict="strict" in flags, verify="verify" in flags)
        server.preload_at_first_call = "preload" in flags
        if "report" in flags:
            import atexit
            atexit.register(lambda: sys.stderr.write(f"kforge serve (pid {os.getpid()}): {server.summary()}\n"))


def parse_serve(value: str) -> tuple[list[str], set[str]]:
    """(bundle paths, flags) of KFORGE_SERVE=DIR[,DIR...][,strict][,preload][,report]."""
    parts = _parts(value)
    paths, flags = [p for p in parts if p not in FLAGS], {p for p in parts if p in FLAGS}
    if not paths:
        _stop(f"KFORGE_SERVE={value!r} names no bundle; set it to DIR[,strict][,preload] (a bundle wheel or "
              f"directory, or out/dist)")
    for path in paths:
        problem = not_a_bundle(path)
        if problem is not None:
            _stop(f"KFORGE_SERVE{problem}")
    return paths, flags


def not_a_bundle(path: str, flags: bool = True) -> str | None:
    """What keeps `path` from being a bundle to serve (a message's tail), None for a folder or a zip file. Only its
    kind and first bytes are read: a FIFO never blocks the import, a device is never read."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        if flags and os.sep not in path:   # a bare word: most likely a flag mistyped
            return (f": {path!r} is neither a flag ({', '.join(FLAGS)}) nor a bundle that exists; set it to "
                    f"DIR[,strict][,preload][,report][,verify]")
        return (f" names {path}, which does not exist; build and package the bundles there (doit package) or fix "
                f"the path")
    if stat.S_ISDIR(mode):
        return None
    if not stat.S_ISREG(mode):
        from .bundle import file_kind
        return f" names {path}, which is {file_kind(mode)}, not a bundle (a wheel `doit package` wrote, or out/dist)"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return f" names {path}, which cannot be read ({e.strerror or e})"
    if magic != b"PK\x03\x04":
        return (f" names {path}, which is not a bundle (not a wheel or zip file); name a wheel `doit package` "
                f"wrote, or out/dist")
    return None


def _parts(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]
