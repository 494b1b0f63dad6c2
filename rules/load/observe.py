"""What a process reads beyond the toolchain, and the name each file goes by on any machine: a compile's inputs
are what its process read, as gcc -MD writes them into a depfile (reading a library's source to guess misses a
module imported by a computed name, a data file read at import).

How: one audit hook (PEP 578): every way Python reads a file raises "open" (the import system's io.open_code
too), listings raise "os.listdir" / "os.scandir", ctypes "ctypes.dlopen"; an extension module is found by the
__file__ of each module that appeared; an environment variable the library's code reads is an input `$NAME`
(_ObservedEnviron). What is recorded and what is not, and why: docs/observed_inputs.md.

What runs is what was read: a module outside the toolchain runs the bytes its import read, never a .pyc (Python
takes a .pyc by the source's mtime in seconds and size: a same-size edit within a second ran old code while the
new content was recorded). Their code is kept in this user's cache by the sha256 of bytes, path and magic
(_KeptBytecode): flag_gems's import in a fresh project, 4.6 s compiled, is 3.0 s kept.

Names: a file is named relative to the deepest of the project root and the module path's entries it lies in
(`kfl/ops/scale.py`), first by the path it was opened by (a link in the project stays in the project); a package a
meta-path finder maps to a folder of its own (an editable install) is named `<package>/...`; resolve() finds a
name again as Python would.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import importlib.util
import itertools
import json
import marshal
import os
import stat
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple


# the distributions whose files (and whose requirements' files) are the toolchain, not inputs
TOOLCHAIN = ("triton", "torch", "flydsl", "kforge", "doit")


class Base(NamedTuple):
    """A folder files are named relative to, and the prefix their names get there: "" for the project and the
    module path's entries, "<package>/" for a package a meta-path finder maps to a folder of its own."""
    folder: str
    prefix: str = ""


def bases(root: str, path: Iterable[str] | None = None) -> tuple[Base, ...]:
    """Where files are named from, deepest first: the project, the module path's entries and the packages
    meta-path finders map (finder_packages), each folder as given and as resolved."""
    found = {Base(form) for p in (root, *(sys.path if path is None else path))
             for form in (as_opened(_absolute(p or ".")), os.path.realpath(p or ".")) if form}
    found |= {Base(form, package + "/") for package, folder in finder_packages()
              for form in (folder, os.path.realpath(folder))}
    return tuple(sorted((b for b in found if os.path.isdir(b.folder)), key=lambda b: (-len(b.folder), b)))


def name_of(path: str, folders: tuple[Base, ...]) -> str:
    """`path` relative to the deepest of `folders` holding it: first as opened (a link is named where it lies),
    else as resolved; the absolute resolved path when none holds it."""
    for form in (as_opened(_absolute(path)), os.path.realpath(path)):
        for base in folders if form else ():
            if form.startswith(base.folder + os.sep):
                return base.prefix + form[len(base.folder) + 1:]
    return os.path.realpath(path)


def search_path(root: str) -> tuple[str, ...]:
    """Where resolve() looks, in order: the project (first on every compile's path), then the module path."""
    return tuple(dict.fromkeys(r for r in (os.path.realpath(p or ".") for p in (root, *sys.path)) if os.path.isdir(r)))


def resolve(name: str, folders: tuple[str, ...]) -> str | None:
    """The file (or, for `<folder>/`, the folder) a name stands for here: the first of search_path's folders
    that has it, else, for `<package>/...`, the folder a meta-path finder maps the package to."""
    exists = os.path.isdir if name.endswith("/") else os.path.isfile   # `<folder>/`: a listing
    if os.path.isabs(name):
        return name if exists(name) else None
    for folder in folders:
        candidate = os.path.join(folder, name)
        if exists(candidate):
            return candidate
    package, _, rest = name.partition("/")
    folder = finder_folder(package) if rest else None
    candidate = os.path.join(folder, rest) if folder else None
    return candidate if candidate and exists(candidate) else None


def finder_packages() -> list[tuple[str, str]]:
    """(name, folder) of each imported top-level package that no module path entry holds and a meta-path finder
    other than the path finder maps to a folder (an editable install's). Only such modules are asked about: a
    finder's lookup may run code."""
    given = tuple(os.path.abspath(p or ".") + os.sep for p in sys.path)
    real = tuple(os.path.realpath(p or ".") + os.sep for p in sys.path)
    found = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__dict__", {}).get("__file__") if "." not in name else None   # no __getattr__ run
        if isinstance(where, str) and not where.startswith(given) and not os.path.realpath(where).startswith(real):
            folder = finder_folder(name)
            if folder is not None:
                found.append((name, folder))
    return found


@functools.lru_cache(maxsize=None)
def finder_folder(package: str) -> str | None:
    """The folder a meta-path finder other than the standard ones maps top-level package `package` to (None: none
    does, or the path finder finds it on sys.path first, as an import would)."""
    from importlib.machinery import BuiltinImporter, FrozenImporter, PathFinder
    if not package.isidentifier() or PathFinder.find_spec(package) is not None:
        return None
    for finder in sys.meta_path:
        if finder in (BuiltinImporter, FrozenImporter, PathFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(package, None)
        except Exception:   # a finder that cannot answer for this name: the next one may
            continue
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        if locations and os.path.isdir(locations[0]):
            return os.path.abspath(locations[0])
        if spec is not None:
            return None
    return None


@functools.lru_cache(maxsize=None)
def launchers() -> set[str]:
    """The files that started this process, resolved: the interpreter and the script it runs (bin/doit). A module
    that reads its import's stack (traceback.format_stack, warnings) reads them; they are never an input."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return {os.path.realpath(p) for p in (sys.executable, sys.argv[0] if sys.argv else None, main)
            if isinstance(p, str) and p and os.path.isfile(p)}


def toolchain_dirs() -> tuple[str, ...]:
    """The standard library and the folders of the toolchain distributions and everything they require."""
    import sysconfig
    # the base interpreter's: a virtualenv's own lib/pythonX.Y holds site-packages, which is not the toolchain
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")} | required_folders(TOOLCHAIN)
    import kforge
    import kforge_runtime   # kforge's own folders, wherever it is installed (editable: the checkout)
    dirs.update(os.path.dirname(os.path.realpath(m.__file__)) for m in (kforge, kforge_runtime))
    return tuple(sorted(dirs))


def required_folders(distributions: Iterable[str]) -> set[str]:
    """The folders of these installed distributions and of everything they require (not as an extra): each one's
    metadata folder, and each top-level package's folder and one-file module (both named; one of them is there)."""
    import importlib.metadata
    import re
    dirs: set[str] = set()
    todo, seen = list(distributions), set()
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            continue
        if getattr(dist, "_path", None) is not None:   # its own metadata (entry points, RECORD)
            dirs.add(os.path.realpath(dist._path))
        todo += [r for r in dist.requires or () if "extra ==" not in r]
        base = os.path.realpath(dist.locate_file(""))
        tops = (dist.read_text("top_level.txt") or "").split() or {
            f.parts[0] for f in dist.files or () if not f.parts[0].endswith((".dist-info", ".data"))
            and f.parts[0] not in ("..", "bin")}
        for top in tops:   # a package's folder, or a one-file module (typing_extensions.py)
            if re.fullmatch(r"[\w.-]+", top) and top.strip(".") and top != "bin":   # never a path out of it
                dirs.update((os.path.join(base, top), os.path.join(base, top + ".py")))
    return dirs


class Recorder:
    """Records the files this process reads while active (one audit hook per process, installed once)."""
    installed: "Recorder | None" = None

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        out = os.path.join(self.root, "out")   # out/ itself may be a link (to a scratch disk)
        self.skip = self._skip = tuple(dict.fromkeys((out + os.sep, os.path.realpath(out) + os.sep,
                                                      *(d + os.sep for d in toolchain_dirs()))))
        self.skip_files = {d for d in toolchain_dirs() if d.endswith(".py")} | launchers()
        self.start()   # the records, empty
        self.active, self.since_ns = False, 0
        self.given: set[str] = set()   # variables this process set itself (kforge, or the library): not inputs
        self._readers: dict[str, bool] = {}   # a reading frame's file -> whether it is the library's
        self._whole: set[tuple] = set()   # (code, line) where the whole environment was iterated
        self._listing = False   # the hook's own listdir raises the event too
        self.bytecode = bytecode_folder()   # _from_source's reads and writes there are kforge's own: never recorded
        self._own = (self.bytecode + os.sep,) if self.bytecode else ()
        # what _source made of each path, for the folders and skips it was asked with: a server's targets share
        # most of what was read, and resolving each path again cost 75 ms per target (liger-kernel)
        self._named: dict[str, str | None] = {}
        self._named_for: tuple = ()

    @classmethod
    def install(cls, root: str) -> "Recorder":
        if cls.installed is None:
            cls.installed = cls(root)
            sys.addaudithook(cls.installed._hook)
            if type(os.environ) is os._Environ:   # the one object every reader holds: its class, not a copy
                os.environ.__class__ = _ObservedEnviron
            _from_source(cls.installed.skip, cls.installed.bytecode)
        return cls.installed

    def skip_out(self, out: str) -> None:
        """Record nothing read under this compile's out/ as well (a Dask worker's private one, new for each compile,
        holds its scratch); the one before it no longer counts."""
        folder = os.path.realpath(out) + os.sep
        self.skip = self._skip if folder in self._skip else (*self._skip, folder)

    def start(self) -> None:
        """Forget what was recorded; record from now on."""
        self.seen: set[str] = set()
        self.written: set[str] = set()   # what the process itself wrote (opened to write, or renamed onto)
        self.listed: dict[str, str] = {}   # folder -> the digest of its listing when first listed
        # environment variables the library's code read -> variable_digest() as first read: a library that sets one
        # after reading it (os.environ.setdefault), or a variable kforge sets later in the process, is what the
        # build's own environment holds, which the check of a target compares
        self.variables: dict[str, str] = {}
        self.modules: set[str] = set(sys.modules)
        self.active, self.since_ns = True, time.time_ns()

    def _hook(self, event: str, args: tuple) -> None:
        # called for every audited event of the process: the cheap tests first
        if not self.active:
            return
        if event == "open":
            path, mode, flags = args
            path = os.fsdecode(path) if isinstance(path, bytes) else path
            if not isinstance(path, str):   # an open file descriptor: already opened by path
                return
            if path.startswith(self._own):   # kforge's own bytecode (_from_source), as it opens it
                return
            if (mode is not None and any(c in mode for c in "wax+")) or \
                    (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
                self.written.add(_absolute(path))   # a module generating a file it then imports
                return
            # as opened: a link is named where it lies; relative to the folder it was opened from
            self.seen.add(_absolute(path))
        elif event in LISTINGS:
            path = "." if args[0] is None else os.fsdecode(args[0]) if isinstance(args[0], bytes) else args[0]
            # the import system's listing (FileFinder's cache) is how it finds a module, not what it read
            if isinstance(path, str) and not self._listing and sys._getframe(1).f_code.co_filename != IMPORT_SYSTEM:
                self._list(_absolute(path))
        elif event == "os.rename":   # os.rename and os.replace: a file written beside and moved into place
            destination = os.fsdecode(args[1]) if isinstance(args[1], bytes) else args[1]
            if isinstance(destination, str) and not destination.startswith(self._own):
                self.written.add(_absolute(destination))
        elif event == "ctypes.dlopen":
            name = args[0]
            if isinstance(name, str) and os.sep in name:   # by path; a bare name is the dynamic linker's search
                self.seen.add(name)

    def read_variable(self, name: str, frame) -> None:
        """An environment variable read at `frame`: kept when the code reading it is the library's, a file that
        is an input where it lies, and the read is of that one variable (not at a line that went through every
        variable: a copy, dict(os.environ), a loop over its items)."""
        frame = _reader(frame)
        if frame is None or name in self.given or name in SESSION or (frame.f_code, frame.f_lineno) in self._whole:
            return
        where = frame.f_code.co_filename
        if where not in self._readers:
            self._readers[where] = False   # while it is decided: a read on the way (naming the folders) is no input
            self._readers[where] = os.path.isabs(where) and self._source(where, self._within()) is not None
        if self._readers[where] and name not in self.variables:
            self.variables[name] = variable_digest(name)

    def read_whole(self, frame) -> None:
        """The environment iterated at `frame`: the reads at the same line are of all of it, not of a variable."""
        frame = _reader(frame)
        if frame is not None:
            self._whole.add((frame.f_code, frame.f_lineno))

    def files(self) -> set[str]:
        """The absolute paths recorded since start(), as they were opened, filtered (see the module docstring)."""
        found = set(self.seen)
        for name in set(sys.modules) - self.modules:   # modules that appeared: their file (a dlopen'ed one too)
            module = sys.modules.get(name)
            where = vars(module).get("__file__") if module is not None else None   # vars: runs no __getattr__
            if isinstance(where, str):
                found.add(_absolute(where))
        named = self._names(found)
        return {named[p] for p in found} - {None}

    def is_input(self, path: str) -> bool:
        """Whether a file read would be one of files() (not so: what lies outside the project and the module path,
        such as /proc/self/statm, which a compile server reads for its memory bound)."""
        return self._names((path,))[path] is not None

    def _names(self, paths) -> dict[str, str | None]:
        within = self._within()
        if self._named_for != (within, self.skip):
            self._named, self._named_for = {}, (within, self.skip)
        named = self._named
        for path in set(paths) - named.keys():
            named[path] = self._source(path, within)
        return named

    def _list(self, path: str) -> None:
        """Keep the listing's digest the caller is about to see. Not the toolchain's, out/'s, nor the kept bytecode's
        folders (kforge lists that one to bound it: under PYTHONPATH=$HOME each build made the next one rebuild)."""
        if path not in self.listed and not (path + os.sep).startswith(self.skip + self._own):
            self._listing = True
            try:
                with contextlib.suppress(OSError):   # not a folder: the caller gets the error
                    self.listed[path] = listing_digest(path)
            finally:
                self._listing = False

    def folders(self) -> dict[str, str]:
        """{absolute real path: digest of its listing} of the folders listed since start(), filtered as files()
        are."""
        within = self._within()
        found = {self._folder(path, within): digest for path, digest in self.listed.items()}
        found.pop(None, None)
        return found

    def _within(self) -> tuple[str, ...]:
        """The folders (with a separator) whose files are inputs: the project, the module path as it is now (a
        library may add to it) and the packages import finders map."""
        return tuple(b.folder + os.sep for b in bases(self.root))

    def _folder(self, path: str, within: tuple[str, ...]) -> str | None:
        real = os.path.realpath(path)
        if (not os.path.isdir(real) or (real + os.sep).startswith(self.skip) or real.endswith(METADATA)
                or os.path.basename(real) == "__pycache__"):   # the interpreter's, changed by every import
            return None
        return _inside(path, real, within)

    def _source(self, path: str, within: tuple[str, ...]) -> str | None:
        if "__pycache__" in path and path.endswith(".pyc"):   # a cached module: its source is the input
            try:
                path = importlib.util.source_from_cache(path)
            except ValueError:
                return None
        real, opened = os.path.realpath(path), as_opened(path)
        if real.startswith(self.skip) or (opened or real).startswith(self.skip) or real in self.skip_files \
                or not os.path.isfile(real):
            return None
        if any(m + os.sep in real for m in METADATA):   # metadata, e.g. entry points a plugin lookup scans: the
            return None                                # version is keyed
        return _inside(path, real, within)


def _inside(path: str, real: str, within: tuple[str, ...]) -> str | None:
    """The path as opened when it names the file (as_opened) and lies strictly inside one of `within`, else the
    resolved one when that does; None when neither does."""
    opened = as_opened(path)
    return opened if opened and opened.startswith(within) else real if real.startswith(within) else None


def run_in(folder: str) -> None:
    """Make `folder` this process's working folder (a library server's, the probe's: out/.kforge/work/, where what a
    library writes into its working folder at import goes), the module path's relative entries ("" too) kept as the
    folders they meant."""
    here = os.getcwd()
    sys.path[:] = [p if os.path.isabs(p) else os.path.join(here, p) if p else here for p in sys.path]
    os.chdir(folder)


def project_root() -> str:
    """The project this process reads for: the installed Recorder's root (its working folder may be out/'s work
    folder: run_in), else the working folder."""
    return Recorder.installed.root if Recorder.installed is not None else os.getcwd()


def _absolute(path: str) -> str:
    """An opened path made absolute against the current folder, as the kernel does: no step is dropped."""
    return path if path.startswith(os.sep) else os.path.join(os.getcwd(), path)


def as_opened(path: str) -> str | None:
    """An absolute path as it was opened, without its empty and `.` steps; None with a `..` step (the kernel takes it
    after the links before it, which no text can follow)."""
    steps = [s for s in path.split(os.sep) if s not in ("", ".")]
    return os.sep + os.sep.join(steps) if path.startswith(os.sep) and ".." not in steps else None


def digests(files: Iterable[str], folders: tuple[Base, ...], since_ns: int = 0,
            listed: dict[str, str] | None = None, written: Iterable[str] = (),
            variables: Mapping[str, str] | None = None) -> list[list[str]]:
    """[[name, sha256 of its content], ...] sorted: what a process read, as a depfile records it; a listed folder
    is `<name>/` with the sha256 of its listing, a variable `$NAME` with its variable_digest(). A file changed since
    `since_ns` (while it was read: its ctime says so) is "changed-while-read", which no content matches, unless the
    process wrote it itself (`written`: a generated module), when what it wrote is the input."""
    found = {}
    own = {os.path.realpath(p) for p in written}
    for path in files:
        try:
            with open(path, "rb") as f:   # a chunk at a time: memory stays bounded whatever the file's size
                st = os.fstat(f.fileno())
                digest = hashlib.file_digest(f, "sha256").hexdigest() \
                    if st.st_ctime_ns < since_ns or not since_ns or os.path.realpath(path) in own else CHANGED
        except OSError:
            continue
        found[file_input_name(name_of(path, folders))] = digest
    for path, digest in (listed or {}).items():
        found[file_input_name(name_of(path, folders)) + "/"] = digest
    for variable, digest in (variables or {}).items():
        found[VARIABLE + variable] = digest
    return [[n, found[n]] for n in sorted(found)]


def _from_source(toolchain: tuple[str, ...], store: str | None) -> None:
    """Modules outside `toolchain` (folders, each ending in a separator) run what was read from their source, never
    a .pyc: the import system reads or writes none when cache_from_source raises NotImplementedError (as where
    bytecode is not supported), then hands the source's bytes to source_to_code, which takes their code from
    `store` (bytecode_folder(); None: compile every time)."""
    import importlib._bootstrap_external as external   # the import system's own module: its get_code looks it up
    cached, compile_source = external.cache_from_source, external.SourceLoader.source_to_code
    secret = _bytecode_key() if store is not None else None
    kept = _KeptBytecode(store, secret) if secret is not None else None
    decided: dict[str, bool] = {}
    folders: dict[str, str] = {}   # resolved once a folder: realpath takes a stat per step, for every import

    def outside(path) -> bool:
        if path not in decided:
            folder, name = os.path.split(path)
            if folder not in folders:
                folders[folder] = os.path.realpath(folder)
            real = os.path.realpath(path) if os.path.islink(path) else os.path.join(folders[folder], name)
            decided[path] = not real.startswith(toolchain)
        return decided[path]

    def cache_from_source(path, *args, **kwargs):
        if outside(path):
            raise NotImplementedError("kforge: compiled from its source")
        return cached(path, *args, **kwargs)

    def source_to_code(loader, data, path, *, _optimize=-1):
        key = kept.key(data, path, _optimize) if kept is not None and type(data) is bytes and isinstance(path, str) \
            and outside(path) else None
        code = kept.get(key) if key is not None else None
        if code is None:   # compiled here, not deeper: a SyntaxError's traceback gets one frame of kforge's
            code = compile_source(loader, data, path, _optimize=_optimize)
            if key is not None:
                kept.keep(key, code)
        return code
    external.cache_from_source = cache_from_source
    external.SourceLoader.source_to_code = source_to_code   # every source loader's, unless a loader has its own


PRECOMPILE_LIMIT = 10_000   # files one precompile() compiles at most (a package folder holding far more is data)


def precompile(package: str, stop: Callable[[], bool] = lambda: False) -> int:
    """An installed package's sources, and those of the distributions it requires outside the toolchain,
    compiled into the kept bytecode ahead of its import, as _from_source would: run by a child the build's hub
    forks, on a CPU that otherwise waits while the hub imports the toolchain (flag_gems's ~400 modules took 1.1 s of
    its 3.6 s import). What the store holds, the toolchain's files, files over 1 MiB and files that do not compile
    are left; `stop()` true ends it before the next file. Imports nothing; returns how many it compiled."""
    import importlib.metadata
    folder, secret = bytecode_folder(), _bytecode_key()
    try:
        spec = importlib.util.find_spec(package) if folder and secret and "." not in package else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return 0
    kept = _KeptBytecode(folder, secret)
    required = _as_imported(required_folders(importlib.metadata.packages_distributions().get(package, ())))
    done = 0
    for path in _package_files([*spec.submodule_search_locations, *required]):
        if done >= PRECOMPILE_LIMIT or stop():
            break
        try:
            if os.path.getsize(path) > 1 << 20:
                continue
            with open(path, "rb") as f:
                data = f.read()
            key = kept.key(data, path, -1)
            if kept.get(key) is None:
                kept.keep(key, compile(data, path, "exec", dont_inherit=True))
                done += 1
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):   # nested too deep: not kept
            continue
    return done


def _as_imported(paths: Iterable[str]) -> list[str]:
    """Resolved paths spelled as the import system will open them, under the first module path entry that holds
    them (a virtualenv reached through a link): kept bytecode is found by the path its source was read from."""
    entries = [(os.path.realpath(e) + os.sep, e.rstrip(os.sep) + os.sep) for e in sys.path if e and os.path.isdir(e)]
    spelled = []
    for path in sorted(paths):
        within = next(((real, given) for real, given in entries if path.startswith(real)), None)
        spelled.append(within[1] + path[len(within[0]):] if within else path)
    return spelled


def _package_files(places: list[str]) -> list[str]:
    """The .py files under these folders (and those named themselves), none of the toolchain's, each once;
    shallowest first, then as a walk by name finds them: an import reads a package's own modules more often than
    its subpackages' (flag_gems: 314 of its 417 files one or two folders deep, 54 of 947 deeper). An order read from
    the import statements cost more than it gained (flag_gems's import 3.7-4.2 s with it, 3.2 s without)."""
    toolchain = tuple(d + os.sep for d in toolchain_dirs())
    found: dict[str, None] = {}
    for place in places:
        real = os.path.realpath(place)
        if (real + os.sep).startswith(toolchain) or real.endswith((".dist-info", ".egg-info")):
            continue
        if place.endswith(".py") and os.path.isfile(place):
            found[place] = None
        for where, subs, files in os.walk(place):
            subs[:] = sorted(s for s in subs if s != "__pycache__")
            found.update((os.path.join(where, f), None) for f in sorted(files) if f.endswith(".py"))
    return sorted(found, key=lambda path: path.count(os.sep))   # stable: a walk's order within a depth


BYTECODE_KEY = "bytecode-key"   # in settings.user_cache_dir(): 32 random bytes, this user's, made once


def bytecode_folder() -> str | None:
    """This user's kept bytecode for this interpreter: <user cache>/bytecode/<cache tag>, or None where the
    interpreter has no bytecode or no home directory can be found (then every module compiles from source)."""
    folder, tag = _user_folder(), sys.implementation.cache_tag
    return os.path.join(folder, "bytecode", tag) if folder and tag else None


def _user_folder() -> str | None:
    """settings.user_cache_dir(), or None where no home directory can be found (a container's user without one)
    or `~` was left unexpanded: never a folder made where the process runs."""
    from kforge.base.settings import user_cache_dir
    try:
        folder = user_cache_dir()
    except (RuntimeError, KeyError, OSError):
        return None
    return folder if os.path.isabs(folder) else None


def _bytecode_key() -> bytes | None:
    """This user's key for kept bytecode (owner-only, 32 random bytes, made at first use), or None where it can be
    neither read nor made, or is not this user's alone (then nothing is kept). A kept file runs only if its HMAC
    under this key holds: bytecode another machine or user wrote (a restored CI cache) is compiled again."""
    folder = _user_folder()
    if folder is None:
        return None
    path = os.path.join(folder, BYTECODE_KEY)
    # made owner-only, and checked as _KeptBytecode checks its folders: a link there would take the key's writes
    with contextlib.suppress(OSError):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _own_folder(folder):
        return None
    for _ in range(2):
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                    return None
                key = f.read(33)
            return key if len(key) == 32 else None
        except FileNotFoundError:
            beside = f"{path}.{os.getpid()}.tmp"
            try:
                with open(os.open(beside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(os.urandom(32))
                os.link(beside, path)   # made whole or not at all; another process's, made first, is the one
            except FileExistsError:
                pass
            except OSError:
                return None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(beside)
        except OSError:
            return None
    return None


def _own_folder(path: str) -> bool:
    """Whether `path` is a folder (not a link) of this user's that no one else can write to."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


class _KeptBytecode:
    """Bytecode kept by what it was compiled from: a file named by the sha256 of the magic number, the optimization
    level, the source's path as given (the code's co_filename) and its bytes, so an edit of any size at any mtime
    misses it. Each file is the magic, that key, the HMAC-SHA256 (_bytecode_key) of the head and the marshalled
    code, then the code: one that does not hold together is compiled again and replaced, never run. New files are
    written beside and renamed into place: every server and build of this user's shares them."""

    # files kept at most: several times the largest import measured (liger-kernel with transformers, 4,472); beyond
    # it a process that writes one removes the oldest written, down to 3/4 of it
    LIMIT = 20_000

    def __init__(self, folder: str, secret: bytes):
        self.folder, self.magic, self.made = folder, importlib.util.MAGIC_NUMBER, False
        self.secret = secret
        self.own: bool | None = None   # whether the folder is this user's own (asked once)
        # the folders from the user's kforge folder down to this one (only itself if it lies elsewhere): a link or a
        # folder others can write to at any of them leads the writes away as surely as one at the last
        user, self.chain = _user_folder(), [folder]
        if user and folder.startswith(user + os.sep):
            while self.chain[0] != user:
                self.chain.insert(0, os.path.dirname(self.chain[0]))
        self.written = itertools.count()   # a name of its own for each file written beside

    def _own(self) -> bool:
        """Whether the folder, and each above it up to the user's kforge folder, is a folder (not a link) of this
        user's that no one else can write to: a link in the place of any would lead the writes and _bound's removals
        wherever it leads; others' write access lets them swap files under a reader. Otherwise nothing is kept."""
        if self.own is None:
            self.own = all(_own_folder(f) for f in self.chain)
        return self.own

    def key(self, source: bytes, path: str, optimize: int) -> tuple[str, bytes]:
        """(the file, the head it starts with) for the code of `source` read from `path`."""
        key = hashlib.sha256(b"%s\0%d\0%s\0" % (self.magic, sys.flags.optimize if optimize == -1 else optimize,
                                                   os.fsencode(path)))
        key.update(source)
        return os.path.join(self.folder, key.hexdigest()), self.magic + key.digest()

    def get(self, key: tuple[str, bytes]) -> types.CodeType | None:
        """The kept code, or None: none kept, or a file that does not hold together (never unmarshalled)."""
        where, head = key
        if not self._own():
            return None
        try:
            with open(where, "rb") as f:
                kept = f.read()
        except OSError:   # none yet (or unreadable: compiled, and written again if it can be)
            return None
        body = memoryview(kept)[len(head) + 32:]
        if not kept.startswith(head) or not hmac.compare_digest(self._mac(head, body), kept[len(head):len(head) + 32]):
            return None
        try:
            code = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            return None
        return code if type(code) is types.CodeType else None

    def keep(self, key: tuple[str, bytes], code: types.CodeType) -> None:
        """Write beside, then rename into place (a reader sees a whole file or none); a folder that cannot be
        written to (a read-only home, a full disk) keeps nothing, and the module still runs from its source."""
        where, head = key
        body = marshal.dumps(code)
        beside = f"{where}.{os.getpid()}-{next(self.written)}.tmp"
        try:
            if not self.made:   # asked again, of the folders as they are now
                for i, folder in enumerate(self.chain):   # each made only once the one above it passed: never
                    if not os.path.lexists(folder):        # through a link
                        with contextlib.suppress(FileExistsError):   # another process's, made meanwhile
                            os.makedirs(folder, mode=0o700) if i == 0 else os.mkdir(folder, 0o700)
                    if not _own_folder(folder):
                        self.own = False
                        return
                self.own = True
                self.made = True
                self._bound()
            with open(beside, "xb") as f:
                f.write(head + self._mac(head, body) + body)
            os.replace(beside, where)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(beside)

    def _mac(self, head: bytes, body) -> bytes:
        mac = hmac.new(self.secret, head, hashlib.sha256)
        mac.update(body)
        return mac.digest()

    def _bound(self) -> None:
        """At a process's first new file: beyond LIMIT files, the oldest written go (a file beside that a killed
        process left too). Another process may remove one at the same time, or be reading one: it compiles."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        if len(names) <= self.LIMIT:
            return
        written = []
        for name in names:
            with contextlib.suppress(OSError):   # removed meanwhile
                written.append((os.stat(os.path.join(self.folder, name)).st_mtime_ns, name))
        for _, name in sorted(written)[:len(written) - self.LIMIT * 3 // 4]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, name))


def _reader(frame):
    """The frame that read the environment: the first one outside os's and the mapping's own code."""
    while frame is not None and frame.f_code.co_filename in ENVIRON_CODE:
        frame = frame.f_back
    return frame


def file_input_name(name: str) -> str:
    """A file's name that cannot be read as a variable's: a file at the project's top named `$X` is `./$X`."""
    return "./" + name if name.startswith(VARIABLE) else name


def variable_digest(name: str) -> str:
    """sha256 of an environment variable's value as this process sees it; unset is not the empty string. Read past
    _ObservedEnviron: asking it would tell the recorder of the read again."""
    environ = os.environ
    try:   # a dodo.py may have put another mapping in its place, which records nothing
        value = os._Environ.__getitem__(environ, name) if isinstance(environ, os._Environ) else environ[name]
    except KeyError:
        value = None
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def listing_digest(folder: str) -> str:
    """sha256 of a folder's listing: its names, sorted, as a JSON list (unambiguous: {a, b} and one file named
    "a\\nb" differ), without __pycache__ (OSError if gone)."""
    names = sorted(n for n in os.listdir(folder) if n != "__pycache__")
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()


class _ObservedEnviron(os._Environ):
    """os.environ while a Recorder is installed: a read of one variable tells the recorder (get, `in` and
    os.getenv all read through __getitem__)."""

    def __getitem__(self, key):
        recorder = Recorder.installed
        if recorder is not None and recorder.active and isinstance(key, str):
            recorder.read_variable(key, sys._getframe(1))
        return super().__getitem__(key)

    def __iter__(self):
        recorder = Recorder.installed
        if recorder is not None and recorder.active:
            recorder.read_whole(sys._getframe(1))
        return super().__iter__()

    def __setitem__(self, key, value):
        recorder = Recorder.installed
        if recorder is not None and isinstance(key, str):   # what the process set, it reads back: no input
            recorder.given.add(key)
        super().__setitem__(key, value)


# The terminal a build runs in and the shell's own bookkeeping, which libraries read for how they print (termcolor's
# TERM, rich's COLUMNS): never inputs, so a build from another terminal stays current. HOME, USER and XDG_* stay
# inputs: a library may read a kernel's values from a file under them, which is not recorded (a user's folders are
# not), and CI too (a library may trim its autotune list under CI). A value that decides a kernel's code is given
# in the family's [env], which its key holds.
SESSION = frozenset((
    "TERM", "COLORTERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR",
    "CLICOLOR", "CLICOLOR_FORCE", "ANSI_COLORS_DISABLED", "PY_COLORS", "PWD", "OLDPWD", "SHLVL"))
CHANGED = "changed-while-read"
VARIABLE = "$"   # an input named $NAME is the environment variable NAME
# the frames of a read itself, as their code names its file (a frozen module's is "<frozen os>")
ENVIRON_CODE = frozenset(f.__code__.co_filename for f in (os.getenv, os._Environ.__getitem__, Mapping.get))
LISTINGS = ("os.listdir", "os.scandir")
METADATA = (".dist-info", ".egg-info")   # a distribution's metadata folder
IMPORT_SYSTEM = "<frozen importlib._bootstrap_external>"
