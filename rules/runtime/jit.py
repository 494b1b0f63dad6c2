"""The opt-in fallback: Triton JIT-compiles a kernel from its source when no bundle has it for this GPU.

The recipe comes from a bundle, which is not trusted: the module it names is imported only after the files that
import would run are found (as Python's path finder finds them, running nothing) and match the build's digests.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import os
import posixpath
import sys

from .bundle import read_regular
from .launch import LaunchError

FIX = "put the checkout the bundle was built from on PYTHONPATH, or rebuild the bundle from this one"
MAX_SOURCE_BYTES = 16 << 20
# Python's path finder tries these in this order in each directory: a compiled module beats foo.py.
_SUFFIXES = (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.SOURCE_SUFFIXES,
             *importlib.machinery.BYTECODE_SUFFIXES)


class JitKernel:
    """Same call as launch.Kernel: (grid, *args, stream=). Pointer arguments must be torch tensors here."""

    def __init__(self, recipe: dict):
        self.entry = recipe
        target = recipe.get("target")   # from the bundle; "kernel" is the name the caller asked for
        fit = isinstance(target, str) and target.isprintable() and len(target) <= 200
        self.name = target if fit else str(recipe.get("kernel"))
        if recipe.get("toolchain") != "triton":
            raise LaunchError(f"{self.name}: only Triton kernels can fall back to a JIT compile; build it (doit) "
                              f"and package it (doit package) for this GPU's arch")
        source, constexprs, options = (recipe.get(k, {}) for k in ("source", "constexprs", "options"))
        if not all(isinstance(v, dict) for v in (source, constexprs, options)):
            raise LaunchError(f"{self.name}: the bundle's recipe needs 'source', 'constexprs' and 'options' "
                              f"objects; rebuild the bundle with `doit package`")
        module = import_checked(source, self.name)
        entry = source.get("entry")
        self.fn = getattr(module, entry, None) if isinstance(entry, str) else None
        if self.fn is None:
            raise LaunchError(f"{self.name}: {module.__name__} has no kernel {entry!r:.80}; {FIX}")
        self.kwargs = {**constexprs, **{k: options[k] for k in ("num_warps", "num_stages") if k in options}}

    def __call__(self, grid, *args, stream: int = 0) -> None:
        if not stream:
            self.fn[tuple(grid)](*args, **self.kwargs)
            return
        import torch
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            self.fn[tuple(grid)](*args, **self.kwargs)


def import_checked(source: dict, name: str):
    """The module source["module"], imported only if every file source["digests"] records matches under the
    sys.path entry the import would load it from, and every package __init__.py it would run is recorded or runs
    nothing."""
    module, digests = source.get("module"), source.get("digests")
    if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
        raise LaunchError(f"{name}: the bundle names no importable kernel module ({module!r:.80}); rebuild "
                          f"the bundle with `doit package`")
    if not isinstance(digests, dict) or not digests:
        raise LaunchError(f"{name}: the bundle records no source digests for {module}, so its source cannot be "
                          f"checked before it is imported; rebuild the bundle with `doit package`")
    parts = module.split(".")
    found, runs = _locate(parts, name)
    if not found.endswith(".py"):
        raise LaunchError(f"{name}: importing {module} would load {found}, not Python source that a digest "
                          f"checks; remove it, or {FIX}")
    own = "/".join(parts) + ("/__init__.py" if os.path.basename(found) == "__init__.py" else ".py")
    if not found.replace(os.sep, "/").endswith("/" + own):   # a package whose __path__ was changed
        raise LaunchError(f"{name}: {module} is loaded from {found}, not from a {own} of a project; {FIX}")
    root = found[:-len(own)]
    if _in_python(root):   # anyone knows the digests of Python's own files
        raise LaunchError(f"{name}: {module} would be imported from {root}, inside Python's installation, where "
                          f"no kforge project's source is; {FIX}")
    if own not in digests:
        raise LaunchError(f"{name}: {own} is not among the sources the bundle recorded for {module}; "
                          f"rebuild the bundle with `doit package`")
    for relative, digest in digests.items():
        _check_file(root, relative, digest, name)
    for init in runs:
        relative = os.path.relpath(init, root).replace(os.sep, "/")
        if relative not in digests and not _runs_nothing(init):
            raise LaunchError(f"{name}: {init}, which importing {module} runs, is not among the sources the "
                              f"bundle recorded; make it hold only a docstring, or {FIX}")
    importlib.invalidate_caches()   # the import must see the directories as they were just checked
    try:
        loaded = importlib.import_module(module)
    except ImportError as e:   # what the checked source imports: triton, say
        raise LaunchError(f"{name}: {module} could not be imported ({e}); the JIT fallback needs triton and "
                          f"what {module} imports installed") from None
    if os.path.realpath(getattr(loaded, "__file__", None) or "") != os.path.realpath(found):   # another finder
        raise LaunchError(f"{name}: {module} was imported from {getattr(loaded, '__file__', None)}, not from the "
                          f"checked {found}; {FIX}")
    return loaded


def _locate(parts: list[str], name: str) -> tuple[str, list[str]]:
    """(file that importing the dotted `parts` loads, package __init__ files it runs on the way), found as
    Python's path finder would, importing nothing."""
    dirs, runs = sys.path, []
    for i, part in enumerate(parts):
        dotted, last = ".".join(parts[:i + 1]), i == len(parts) - 1
        loaded = sys.modules.get(dotted)
        if loaded is not None:   # already imported: nothing runs again, and the import goes on from it
            if not last:
                dirs = list(getattr(loaded, "__path__", None) or [])
                continue
            if not isinstance(getattr(loaded, "__file__", None), str):
                raise LaunchError(f"{name}: {dotted} is already imported, and not from a file; {FIX}")
            return loaded.__file__, runs
        kind, where = _find(part, dirs)
        if kind is None or (last and kind == "namespace"):
            raise LaunchError(f"{name}: cannot find {dotted} on sys.path; {FIX}")
        if last:
            return where, runs
        if kind == "module":
            raise LaunchError(f"{name}: {dotted} is the module {where}, not a package; {FIX}")
        if kind == "package":
            runs.append(where)
            dirs = [os.path.dirname(where)]
        else:   # a namespace package: no __init__ runs; its submodules are looked for in every portion
            dirs = where


def _find(part: str, dirs) -> tuple[str | None, object]:
    """("package", its __init__ file) | ("module", its file) | ("namespace", [dirs]) | (None, None): the first
    directory holding a package or a module wins; bare directories are a namespace package where none does."""
    portions = []
    for d in dirs:
        if not isinstance(d, str):
            continue
        base = os.path.join(d or os.curdir, part)   # "" on sys.path: the working directory
        if os.path.isdir(base):
            init = next((f for f in (os.path.join(base, "__init__" + s) for s in _SUFFIXES) if os.path.isfile(f)), None)
            if init:
                return "package", init
            portions.append(base)
        module = next((base + s for s in _SUFFIXES if os.path.isfile(base + s)), None)
        if module:
            return "module", module
    return ("namespace", portions) if portions else (None, None)


def _in_python(path: str) -> bool:
    """Whether `path` lies in the stdlib's or the installed packages' directories (no project's source is there)."""
    import site
    import sysconfig
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")] + list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    path = os.path.realpath(path)
    return any(os.path.commonpath([path, d]) == d for d in map(os.path.realpath, dirs))


def _check_file(root: str, relative, digest, name: str) -> None:
    if (not isinstance(relative, str) or not relative.isprintable() or relative.startswith("/") or "\\" in relative
            or posixpath.normpath(relative) != relative or ".." in relative.split("/")):
        raise LaunchError(f"{name}: the bundle records the source path {relative!r:.80}, which is not relative to "
                          f"a project; rebuild the bundle with `doit package`")
    path = os.path.join(root, *relative.split("/"))
    try:
        data = read_regular(path, MAX_SOURCE_BYTES)
    except OSError:
        raise LaunchError(f"{name}: {path} is missing (or unreadable, or not a regular file); {FIX}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise LaunchError(f"{name}: {path} differs from the source the bundle was built from; {FIX}")


def _runs_nothing(path: str) -> bool:
    """Whether a file holds at most a docstring and `from __future__` imports (read, never run)."""
    try:
        body = ast.parse(read_regular(path, MAX_SOURCE_BYTES)).body
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return all(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in body)
