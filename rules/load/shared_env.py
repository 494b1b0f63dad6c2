"""What a library's import meets of the virtualenv it shares with kforge, whose requirements are pinned there
(pyproject.toml: Triton, torch, FlyDSL, doit). FlyDSL is kforge's, not the library's: under the device model it is
not importable (hide_flydsl), so a library that uses FlyDSL whenever it can takes its other path and its Triton
kernels build whatever FlyDSL it was written for (a module that cannot import without it has a set-up hook call
show_flydsl). An import that fails on a pinned package, on a dependency the environment lacks or on a native
extension that cannot load here is said in one line naming the library's line and the fix (explain).
"""
from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import traceback

from kforge.load import observe

HIDDEN = ("flydsl",)   # top-level packages a library's import does not see under the device model


_set_aside: dict = {}   # the hidden packages' modules this process had imported (a worker that built FlyDSL)


def hide_flydsl() -> None:
    """From now on `import flydsl` fails and importlib.util.find_spec("flydsl") is None in this process, as where
    FlyDSL is not installed (a server forked from a worker that imported it forgets it too)."""
    for name in [n for n in sys.modules if n.split(".")[0] in HIDDEN]:
        module = sys.modules.pop(name)
        if module is not None:
            _set_aside[name] = module
    for name in HIDDEN:
        sys.modules[name] = None   # the import system's own "not importable here": find_spec answers None


def show_flydsl() -> None:
    """Called by a family's set-up hook for a module that cannot import without FlyDSL: kforge's FlyDSL is
    importable again, the model staying on; modules hidden come back as they were (an extension loads once)."""
    for name in HIDDEN:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
    sys.modules.update(_set_aside)
    _set_aside.clear()


@functools.lru_cache(maxsize=None)
def pins() -> dict[str, str]:
    """{distribution: its requirement} for each package kforge pins to one version ("flydsl": "flydsl==0.4.2")."""
    import importlib.metadata as metadata
    try:
        requires = metadata.requires("kforge") or []
    except metadata.PackageNotFoundError:   # kforge run from a checkout that is not installed
        return {}
    found = {}
    for r in requires:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*==\s*[^;,\s]+\s*$", r)
        if m:
            found[m.group(1).lower().replace("_", "-")] = r.strip()
    return found


def explain(e: BaseException) -> bool:
    """If `e` is an import that failed on a package kforge pins (explain_pin), on a module a library's line
    imports and this environment lacks, on a library's native extension that cannot load here, or in any other
    error the library's code raised (whose message alone rarely says where: `RuntimeError: boom`, a recursion
    without end), its message becomes one line naming the library's line (and the fix where there is one; the
    extension by its name in the library), in the exception itself: its traceback stays. True if it was such a
    failure."""
    if explain_pin(e):
        return True
    place = library_line(e, code=False)
    if not place:
        return False
    if not isinstance(e, ImportError):
        if place not in str(e):
            before, shown = e.args, str(e)
            e.args = (f"{shown} (in {place})" if shown else f"(in {place})",)
            if str(e) != e.args[0]:   # a message its type makes another way (KeyError's repr, OSError's errno)
                e.args = before
        return True
    if isinstance(e, ModuleNotFoundError) and e.name:
        e.msg = f"No module named {e.name!r} (in {place}); install it in the environment that runs doit"
        return True
    if e.path and e.msg and place not in str(e.msg):   # a native extension that cannot load here (a CUDA build's)
        shown = observe.name_of(e.path, observe.bases(observe.project_root()))
        e.msg = f"{str(e.msg).replace(e.path, shown)} (in {place})"
        return True
    return False


def explain_pin(e: BaseException) -> bool:
    """If `e` is an import that failed on a package kforge pins, its message becomes one line naming the library's
    line, the pin and the fix; True if it was such a failure."""
    import importlib.metadata as metadata
    top = e.name.split(".")[0] if isinstance(e, ImportError) and e.name else None
    if top is None or not (top in HIDDEN or top.replace("_", "-") in pins()):
        return False
    pin, where = pins().get(top.replace("_", "-"), top), library_line(e)
    if top in HIDDEN and sys.modules.get(top, 0) is None:
        e.msg = (f"{where or 'the module'} imports {top}, which an import under the device model does not see: "
                 f"kforge's own {top} ({pin}) is for its FlyDSL families, so that a library using FlyDSL whenever "
                 f"it is importable builds its Triton kernels whatever FlyDSL it was written for; a module that "
                 f"cannot import without FlyDSL needs a set-up hook calling kforge.load.shared_env.show_flydsl() "
                 f"(docs/libraries.md)")
        return True
    try:
        version = metadata.version(top)
    except metadata.PackageNotFoundError:
        e.msg = f"{where + ': ' if where else ''}{top} is not installed; kforge requires {pin} (pip install kforge)"
        return True
    reason = str(e.msg or e).replace(f" ({e.path})", "") if e.path else str(e.msg or e)
    e.msg = (f"{where + ': ' if where else ''}{reason}: this environment's {top} is {version}, the version kforge "
             f"pins ({pin}), and the library was written for another; kforge builds with its pinned {top}, so "
             f"use a release of the library that works with {top} {version} (docs/libraries.md)")
    return True


def library_line(e: BaseException, code: bool = True) -> str:
    """'pkg/mod.py:12 (`from x import y`)': the innermost line of the exception's traceback outside the toolchain
    (a SyntaxError's file counts), with its code unless code=False; "" when there is none."""
    toolchain = observe.toolchain_dirs()
    skip = tuple(d + os.sep for d in toolchain)
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__)]
    if isinstance(e, SyntaxError) and e.filename:   # the file that does not parse is not a frame
        frames.append((e.filename, e.lineno))
    found = None
    for filename, line in frames:
        real = os.path.realpath(filename)
        if not filename.startswith("<") and not real.startswith(skip) and real not in toolchain:
            found = (filename, line)
    if found is None:
        return ""
    filename, lineno = found
    return shown_line(filename, lineno, linecache.getline(filename, lineno).split("  #")[0].strip() if code else "")


def shown_line(filename: str, lineno: int, text: str = "") -> str:
    """'pkg/mod.py:12 (`text`)', the file named as inputs are (relative to the project or the module path entry)."""
    shown = observe.name_of(filename, observe.bases(observe.project_root()))
    return f"{shown}:{lineno}" + (f" (`{text[:120]}`)" if text else "")

