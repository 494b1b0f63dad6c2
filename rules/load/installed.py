"""Kernels in installed packages (`module = "liger_kernel.ops.rms_norm"` in a spec): found on sys.path and read
without importing them (importing a library runs its code and usually imports torch), keyed by the content of
what the kernel's module executes within its own distribution, plus that distribution's name and version.

What a module's key covers: its own file, every module of the same top-level package it imports (absolute or
relative, transitively), and the __init__.py of each package those lie in (importing runs them). Imports made
by those __init__.py files are not followed: a library's top-level __init__ often imports every one of its
modules, which would make one edited kernel file rebuild every target of the library.
"""
from __future__ import annotations

import contextlib
import functools
import re
import sys
from pathlib import Path

from kforge.load import observe, sources

DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# a file's name holds at most 255 bytes: a longer part of a module name names no file an import finds, and
# looking it up fails ("File name too long")
PART_MAX = 255


# within shared(): {"closure": {key: closure}, "find": {(name, sys.path): Module or NotInstalled}}; else None
_shared: dict | None = None


@contextlib.contextmanager
def shared():
    """Within it, each module is found and its closure computed once (a catalog load: liger's 133 families are of
    18 modules). Only within it: what an import finds on the path can change between loads."""
    global _shared
    outer, _shared = _shared, {"closure": {}, "find": {}} if _shared is None else _shared
    try:
        yield
    finally:
        _shared = outer


def _once(kind: str, key, compute):
    """compute(), or what it gave for `key` earlier in this shared(); a NotInstalled it raised is given, not raised."""
    if _shared is None:
        return compute()
    if key not in _shared[kind]:
        try:
            _shared[kind][key] = compute()
        except NotInstalled as e:
            _shared[kind][key] = e
    return _shared[kind][key]


class NotInstalled(LookupError):
    """The module is not on sys.path; the message says where it was looked for."""


class Module:
    """An installed module: its file, the sys.path entry it was found under, its package folder."""

    def __init__(self, name: str, path: Path, base: Path, misses: tuple[Path, ...] = ()):
        self.name, self.path, self.base = name, path, base
        self.package_dir = base / name.split(".")[0]   # the top-level package: what "its distribution" holds
        # where the top-level package was looked for in vain before base: one created there would shadow it
        self.misses = misses

    def closure(self) -> tuple[Path, ...]:
        """The files the module's import executes within its package (see the module docstring), sorted."""
        return _once("closure", (self.path, self.base, self.package_dir), self._walk)

    def _walk(self) -> tuple[Path, ...]:
        seen: set[Path] = set()
        todo = [self.path]
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            if p.name != "__init__.py" or p == self.path:
                todo += [q for q in _imports(p, self.base) if self._inside(q)]
            todo += [q for q in sources.package_inits(p, self.base) if q not in seen]
        return tuple(sorted(seen))

    def distribution(self) -> tuple[str, str]:
        """(name, version) of the installed distribution that holds the package, or ("", "") for a package
        that no distribution records (a folder put on PYTHONPATH): then only file contents key it."""
        return _distribution(str(self.base), self.name.split(".")[0])

    def _inside(self, path: Path) -> bool:
        return self.package_dir in path.parents or path == self.package_dir.with_suffix(".py")


def find(name: str) -> Module:
    """The installed module `name`, found as Python's path finder would find it (first sys.path entry that has
    it; a package's __init__.py before a module file), without importing anything. NotInstalled if none."""
    found = _once("find", (name, tuple(sys.path)), lambda: _find(name))
    if isinstance(found, NotInstalled):
        raise NotInstalled(*found.args)
    return found


def _find(name: str) -> Module:
    if not DOTTED.match(name):
        raise NotInstalled(f"{_short(name)!r} is not a dotted module name (e.g. liger_kernel.ops.rms_norm)")
    parts = name.split(".")
    if max(map(len, parts)) > PART_MAX:
        raise NotInstalled(f"{_short(name)!r} is not a module name: a part of it is longer than a file's name may "
                           f"be ({PART_MAX} characters); fix the name")
    misses: list[Path] = []
    for entry in sys.path:
        base = Path(entry or ".").resolve()
        found = _resolve(base, parts)
        if found is not None:
            return Module(name, found, base, tuple(misses))
        misses += [base / parts[0] / "__init__.py", base / f"{parts[0]}.py"]
    # after the path finder, as an import would: a package an editable install's finder maps to its folder
    folder = observe.finder_folder(parts[0])
    if folder is not None:
        base = Path(folder).parent
        found = _resolve(base, parts) if Path(folder).name == parts[0] else None
        if found is not None:
            return Module(name, found, base, tuple(misses))
        raise NotInstalled(f"{name}: its package {parts[0]} is mapped by an import finder to {folder}, where kforge "
                           f"does not find the module (a folder of another name than the package's is not followed); "
                           f"install the package without -e, or fix the name")
    raise NotInstalled(f"no {_short(name)} on this Python's module path ({sys.executable}); install the package "
                       f"that provides it into the environment kforge runs in, or fix the name")


def _short(name: str) -> str:
    """A module name as a message shows it: a name of thousands of characters cut short."""
    return name if len(name) <= 200 else f"{name[:60]}... ({len(name)} characters)"


def _resolve(base: Path, parts: list[str]) -> Path | None:
    """base/a/b/c.py or base/a/b/c/__init__.py, every folder on the way a package (regular or namespace)."""
    folder = base.joinpath(*parts[:-1])
    with contextlib.suppress(OSError):   # a path too long for the file system (parts of 255 characters): no module
        if not folder.is_dir():
            return None
        for candidate in (folder / parts[-1] / "__init__.py", folder / f"{parts[-1]}.py"):
            if candidate.is_file():   # named as it lies under base, though a link on the way may lead elsewhere
                return candidate
    return None


def _imports(path: Path, base: Path) -> list[Path]:
    """The module files an import statement of path names (sources.import_names), resolved under base (absolute)
    or path's package (relative)."""
    found = []
    package = path.parent
    for level, dotted in sources.import_names(path):
        start = base if level == 0 else sources.up(package, level - 1)
        for name in dotted:
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):   # importing a.b.c runs a, a.b and a.b.c
                f = _resolve(start, parts[:depth]) if start.is_dir() else None
                if f is not None:
                    found.append(f)
    return found


@functools.lru_cache(maxsize=None)
def _distribution(base: str, top: str) -> tuple[str, str]:
    """The dist-info folder in base whose top_level.txt or RECORD names the package `top`."""
    for info in sorted(Path(base).glob("*.dist-info")):
        try:
            # errors="replace", as _metadata reads METADATA: another package's file that is not UTF-8 broke the family
            top_level, record = info / "top_level.txt", info / "RECORD"
            names = (top_level.read_text(errors="replace").split() if top_level.is_file() else
                     [line.split("/", 1)[0] for line in record.read_text(errors="replace").splitlines() if "/" in line])
        except OSError:
            continue
        if top in names:
            meta = _metadata(info)
            if meta.get("Name") and meta.get("Version"):
                return meta["Name"], meta["Version"]
    return "", ""


def _metadata(info: Path) -> dict[str, str]:
    """Name and Version from a dist-info METADATA file (its header lines: no email parser needed)."""
    found = {}
    with contextlib.suppress(OSError):
        for line in (info / "METADATA").read_text(errors="replace").splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            if key in ("Name", "Version"):
                found[key] = value.strip()
    return found
