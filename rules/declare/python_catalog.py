"""Python catalogs: a catalog file (specs/*.py, or one named by [tool.kforge] catalog) calls family(...) once per
kernel family, as a Pants BUILD file declares targets; loops, helper functions and data files are allowed.

    from kforge.declare import family

    for norm in ("rms_norm", "layer_norm"):
        family(name=f"lib_{norm}", module=f"mylib.ops.{norm}", entry="fwd_kernel", toolchain="triton",
               signature={"x_ptr": "*{dtype}", "n": "i32", "BLOCK": "constexpr"},
               sweep={"dtype": ["bf16", "fp16"], "BLOCK": [1024, 4096], "num_warps": [4, 8]})

family() takes the keys of a TOML spec's [kernel] table as arguments and its other tables by name
(`arch={"gfx942": {"num_warps": 8}}`), checked as a TOML spec is, messages naming the file and line of the call.
Every file it reads and module it imports (outside the standard library) is kept with the catalog: editing one
runs it again (rules/plan/catalog.py).
"""
from __future__ import annotations

import functools
import os
import runpy
import sys
import sysconfig
import traceback
from pathlib import Path

from kforge.base.errors import SpecError
from kforge.declare.spec import SCHEMA   # family() takes the TOML spec's tables
from kforge.declare.spec_model import shown_path
from kforge.declare import spec_model

KERNEL_KEYS = tuple(SCHEMA["kernel"])
TABLES = tuple(t for t in SCHEMA if t != "kernel")

_declared: list | None = None   # (tables, file, line, name) of each family() call, while a catalog file runs
_opened: set[str] | None = None   # files opened while a catalog file runs
_root: Path | None = None       # the project whose catalog file runs
_running: str | None = None     # the catalog file that runs, as its code names it


def family(**arguments) -> None:
    """Declare one kernel family (see the module docstring)."""
    filename, line = _call_site(sys._getframe(1))
    where = f"{shown_path(Path(filename), _root) if _root else filename}:{line}"
    if _declared is None:
        raise SpecError(f"{where}: family() is called by a catalog file while kforge loads it "
                        f"(specs/*.py, or a catalog named by [tool.kforge] in pyproject.toml)")
    unknown = [a for a in arguments if a not in KERNEL_KEYS + TABLES]
    if unknown:
        raise SpecError(f"{where}: family() got unknown argument {spec_model.shown(unknown[0], 60)}; allowed: "
                        f"{', '.join(KERNEL_KEYS + TABLES)}")
    called = f"{where}: family {spec_model.shown(arguments.get('name'), 60)}"
    tables = {"kernel": {k: _plain(arguments[k], f"{called}: [kernel] {k}") for k in KERNEL_KEYS
                         if arguments.get(k) is not None}}
    tables.update({t: _plain(arguments[t], f"{called}: [{t}]") for t in TABLES if arguments.get(t) is not None})
    _declared.append((tables, filename, line, arguments.get("name")))


def _call_site(caller) -> tuple[str, int]:
    """Where a family() call is named: the outermost line of the running catalog file on the stack, so that a
    wrapper (`def family(**kw): _family(env=ENV, **kw)`, in the file or a helper module) names the line that
    declared each family, not its own line; else (a helper module declaring families as it is imported, no catalog
    running) the caller's."""
    found, frame = caller, caller
    while frame is not None and not frame.f_code.co_filename.startswith("<frozen importlib"):
        if _running is not None and frame.f_code.co_filename == _running:
            found = frame
        frame = frame.f_back
    return found.f_code.co_filename, found.f_lineno


def declarations(path: Path, root: Path, read: set[Path]) -> list[tuple[dict, str, object]]:
    """Run one catalog file in a bounded child (rules/load/load_guard.py): (tables, where, name) of each family()
    call, unchecked (SpecError when the file fails or declares none). `read` collects what it read and imported."""
    from kforge.load import load_guard
    shown = shown_path(path, root)
    declared, files = load_guard.run(lambda: _run(path, root, shown), shown)
    read.update(map(Path, files))
    if not declared:
        raise SpecError(f"{shown}: declares no family; call kforge.declare.family(...) in it")
    return [(tables, f"{shown_path(Path(filename), root)}:{line}: family {spec_model.shown(name, 60)}", name)
            for tables, filename, line, name in declared]


def _run(path: Path, root: Path, shown: str) -> tuple[list, list[str]]:
    """In load()'s child: run the file; (each family() call's arguments, the files it read and imported)."""
    global _declared, _opened, _root, _running
    _install_open_hook()
    before = set(sys.modules)
    _declared, _opened, _root, _running = [], set(), root, str(path)
    try:
        runpy.run_path(str(path), run_name="kforge_catalog")
    except (SpecError, MemoryError):   # MemoryError: load_guard names the setting to raise
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as e:   # the user's code failed or exited: one line
        raise SpecError(f"{shown}{_failing_line(e, path)}: the catalog file failed: {type(e).__name__}: {e}; "
                        f"fix it, or run `python {shown}` to see the traceback") from None
    finally:
        declared, opened = _declared, _opened
        _declared = _opened = _root = _running = None
    # what it imported now, and what it imports that an earlier import had loaded
    names = (set(sys.modules) - before) | _imported_names(path)
    modules = (getattr(sys.modules.get(name), "__file__", None) for name in names)
    return declared, [str(Path(f).resolve()) for f in (*opened, *modules) if f and _watched(f)]


def _plain(value, at: str):
    """Python values as TOML gives them: tuples as lists, at any depth, and every key a string (else SpecError
    naming it: the checks that follow, and the catalog's JSON, take no other key)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v, at) for v in value]
    if isinstance(value, dict):
        odd = next((k for k in value if not isinstance(k, str)), value)
        if odd is not value:
            raise SpecError(f"{at} {spec_model.shown(odd, 60)}: a key of type {type(odd).__name__}; keys are names "
                            f"(strings)")
        return {k: _plain(v, f"{at} {spec_model.shown(k, 60)}") for k, v in value.items()}
    return value


@functools.cache
def _install_open_hook() -> None:
    """An audit hook recording every file opened while a catalog file runs (it cannot be removed: idle otherwise)."""
    def hook(event, args):
        if _opened is not None and event == "open" and isinstance(args[0], str):
            _opened.add(os.path.abspath(args[0]))
    sys.addaudithook(hook)


STDLIB = tuple(os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib"))


def _imported_names(path: Path) -> set[str]:
    """Every module (and parent package) an absolute import statement of the file names."""
    import ast
    from kforge.load.sources import parse
    found = set()
    for node in ast.walk(parse(path)):
        dotted = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                  [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in dotted:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


def _watched(path: str) -> bool:
    """Not the standard library (the stamp holds Python's version) and not bytecode (its source is kept)."""
    if path.endswith(".pyc") or not os.path.isfile(path):
        return False
    return not (path.startswith(STDLIB) and "site-packages" not in path and "dist-packages" not in path)


def _failing_line(error: BaseException, path: Path) -> str:
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) ==
             os.path.abspath(path)]
    return f":{lines[-1]}" if lines else ""


