"""The compile core: compile_here(target, root, timeout) -> isolate.Outcome (result: artifact.Candidate), lowered by
the target's backend in a context server below the build's tree of warm servers, then checked(). Nothing here writes
in out/: the doit action installs the candidate as it installs a cache's (artifact.install checks its binary).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING

import kforge
from kforge.store import artifact, guard
from kforge.store import inputs as inputs_index
from kforge.load import device_model, isolate, kept_hub, observe, shared_env, sources
from kforge.store.artifact import Candidate, CompileResult, Cutoff, Unchanged
from kforge.base.archs import ARCHS, DoesNotFit, check_shared
from kforge.base.layout import Layout
from kforge.base.target import Target
from kforge.plan.catalog import in_project
from kforge_runtime import schema

if TYPE_CHECKING:   # imported where a compile runs (backend_of): a no-op run imports this module, not those
    from kforge.compile.lowering import Backend, Lowered

# Compile servers form a tree per build, each forked from the one above, so that each import is paid once: the
# hub (forked by doit's master before its workers: start_hub) imports the toolchain; a library server per
# (toolchain, environment, top-level package, ...) imports the package; a package server per package on the way to
# the kernel's module imports it on top of its parent's, in a fresh import's order (`fla` -> `fla.ops`: 4.4 s, paid
# once for all its families); the last forks a private package server per asking process (a doit worker), which
# forks a context server per import context: it imports the kernel's module and compiles. Same code in the same
# order as a fresh import: each target's record holds what a process of its own would read (packages that import
# each other get a branch each). 16 workers each importing torch, Triton and liger-kernel took 20-28 s before their
# first compile (docs/benchmarks.md). Each level keeps its servers, least recently used first, within caps that
# bound memory (a fresh context server pays MLIR/LLVM set-up again at its first compile).
MAX_SERVERS = 6    # library servers of the hub
MAX_PACKAGES = 3   # package servers per library or package server
MAX_PRIVATE = 3    # private package servers a process that compiles keeps
MAX_CONTEXTS = 4   # context servers per private package server
PACKAGE_SLACK_S = 60   # a target's timeout is the context server's; each level above gets this much more
_servers: dict[tuple, isolate.Server] = {}    # in the hub: its library servers
_packages: dict[str, isolate.Server] = {}     # in a library or package server: the package servers below it
_minders: list[int] = []                      # in the last package server: its private copies' minders
_contexts: dict[tuple, isolate.Server] = {}   # in a private package server: its context servers
# in a process that compiles: its private package servers, per (thread, build) (doit -P thread, a Dask worker's
# threads): one thread taking a server never closes another's, which may be compiling
_private: dict[tuple, dict[tuple, isolate.Attached]] = {}
_private_lock = threading.Lock()


def backend_of(toolchain: str) -> Backend:
    """The toolchain's backend, imported only in a process that compiles (Triton targets never import FlyDSL)."""
    from kforge.compile import lowering
    if toolchain == "triton":
        from kforge.compile import triton_backend  # noqa: F401  (enters itself in BACKENDS)
    elif toolchain == "flydsl":
        from kforge.compile import flydsl_backend  # noqa: F401  (enters itself in BACKENDS)
    return lowering.BACKENDS[toolchain]   # another name: a backend registered by hand (tests)


def checked(target: Target, lowered: Lowered) -> Candidate:
    """In the compile server: the artifact's files with meta.json, once what was lowered fits the target's shared
    memory (else DoesNotFit, a deterministic failure)."""
    if not schema.is_plain_name(lowered.binary_name):
        raise RuntimeError(f"the {target.toolchain} backend named the binary {lowered.binary_name!r}")
    meta = artifact.meta(target, binary_name=lowered.binary_name, binary=lowered.binary, symbol=lowered.symbol,
                         num_warps=lowered.num_warps, warp_size=lowered.warp_size, shared=lowered.shared,
                         **lowered.fields)
    check_shared(ARCHS[target.arch], lowered.shared, "tuned" in dict(target.notes))
    return Candidate(artifact.files(lowered.binary_name, lowered.binary, meta),
                     CompileResult(compile_seconds=round(lowered.compile_seconds, 4), sha256=meta["sha256"]))


def compile_here(target: Target, root: str, timeout: float, cutoff: Cutoff | None = None,
                 build: str | None = None) -> isolate.Outcome:
    """Compile in a context server below this process's private package server. With `cutoff` (artifact.cutoff)
    the server first tells whether a compile can give other code: if not, the result is Unchanged. With `build`
    (a Dask worker's: compile_into), in that build's own servers."""
    backend = backend_of(target.toolchain)
    scratch_dir = guard.scratch_folder(target.layout, f"{target.arch}-{target.kernel}")   # log and temp files
    started: list = []   # _connect's spans, when this target's server is started for it
    levels = import_levels(target)
    try:
        with _hub_of(build) as hub:
            with _private_lock:
                mine = _private.setdefault((threading.get_ident(), build), {})
                server = _kept(mine, (_library(target, backend), levels), MAX_PRIVATE, lambda: isolate.Attached(None))
            server.connect = functools.partial(_connect, hub, target, root, timeout, scratch_dir, started)
            for _ in range(2):   # once more where the servers above this one were killed (the hub, from outside)
                outcome = server.call((target, scratch_dir, timeout, cutoff), timeout + PACKAGE_SLACK_S,
                                      log_dir=scratch_dir)
                if not outcome.vanished:
                    break
        outcome = _exited_compiling(target, outcome, scratch_dir)
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    if outcome.ok and started:   # the time its server's start took, in the target's trace
        outcome = dataclasses.replace(outcome, result=_spans_first(outcome.result, started))
    return outcome


_builds: dict[str, isolate.Hub] = {}   # in a Dask worker: the hub of each build it compiles for, least recent first
_compiling: dict[str, int] = {}   # in a Dask worker: each build's compiles in flight
MAX_BUILDS = 2   # builds a Dask worker keeps a hub for, but for those with compiles in flight (each keeps its own)


@contextlib.contextmanager
def _hub_of(build: str | None):
    """The hub a compile's servers come from: this process's, or with `build` that build's own (in a Dask worker,
    whose servers outlive builds). A server imports a module once, and its servers are kept by package name:
    shared across builds, an edited kernel was compiled as the last build had imported it, or another project's
    package of the same name, while meta.json named the files as they are now. So a worker's build gets a hub of
    its own, as a local build does; the least recently used beyond MAX_BUILDS go once none of their compiles runs."""
    if build is None:
        yield _hub
        return
    with _private_lock:
        hub = _builds.pop(build, None) or isolate.Hub(_route)
        _builds[build] = hub
        _compiling[build] = _compiling.get(build, 0) + 1
        idle = [b for b in _builds if b not in _compiling]
        ended = idle[:max(0, len(_builds) - MAX_BUILDS)]
        gone = [s for key in [k for k in _private if k[1] in ended] for s in _private.pop(key).values()]
        gone += [_builds.pop(b) for b in ended]
    try:
        for server in gone:   # the ended builds' private servers, their hubs and every server below those
            server.close()
        yield hub
    finally:
        with _private_lock:
            _compiling[build] -= 1
            if not _compiling[build]:
                del _compiling[build]


COMPILING = "compiling.json"   # in a compile's scratch folder: its compile began, having read these inputs
# words of the machine's state, not of the kernel (memory, disk or processes running out, a quota, a read-only or
# failing disk, a folder it may not write): such an exit is compiled again. The system's own words for these errnos
# (os.strerror: what a compiler's "cannot open ...: <reason>" prints), with the runtime's words for memory.
SCARCE_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "EMFILE", "ENFILE", "ENOMEM", "EAGAIN")
SCARCE = re.compile("|".join(map(re.escape, sorted({
    *(os.strerror(getattr(errno, name)).lower() for name in SCARCE_ERRNOS if hasattr(errno, name)),
    "out of memory", "bad_alloc", "no space left"}))), re.IGNORECASE)


def _mark_compiling(scratch_dir: str, inputs: list) -> None:
    """In the context server, as the compile begins: what it has read so far (its imports, this server's earlier
    compiles), left for the asking process in case this one exits mid-compile with no answer (_exited_compiling).
    A compile's own reads die with it: these are the inputs its failure is replayed from."""
    with open(os.path.join(scratch_dir, COMPILING), "w") as f:
        json.dump(inputs, f)


def _exited_compiling(target: Target, outcome: isolate.Outcome, scratch_dir: str) -> isolate.Outcome:
    """A context server that exited by itself during the compile. LLVM ends the process on some errors (its fatal
    errors, an inline asm constraint the arch lacks: the message printed, then exit(1)): an exit of its own with a
    code below a shell's for a signal (128+N), an error printed and no word of the machine's scarcity is the
    compiler's verdict on these inputs, said in its words and kept with what the compile read until it began, to be
    replayed (compile/action.py). A signal (the OOM killer's SIGKILL) is isolate's to say; an exit before the compile
    began (importing: no mark) keeps isolate's hint on sys.exit at import."""
    if outcome.ok or outcome.exit_code is None:
        return outcome
    try:
        with open(os.path.join(scratch_dir, COMPILING)) as f:
            inputs = json.load(f)
    except (OSError, ValueError):   # no mark, or one cut short: it died before the compile began
        return outcome
    code, printed = outcome.exit_code, outcome.output
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    said = (errors or lines or ["nothing printed"])[-1]
    verdict = code != 0 and not _killed(code) and bool(errors) and not SCARCE.search(printed)
    why = (f"a compiler error for this kernel on {target.arch}: if it cannot target {target.arch}, an [[exclude]] "
           f'with arch = "{target.arch}" in {target.spec_path} leaves it out' if verdict else
           "no verdict on the kernel (no error printed, or a sign of the machine's: memory, disk, permission, a "
           "signal's code): the next run compiles it again")
    error = f"the compiler exited with code {code} while compiling for {target.arch}: {said}\n{why}"
    return dataclasses.replace(outcome, error=error + isolate.headed(printed),
                               facts={"inputs": inputs} if verdict else None)


WAIT_SPAN_S = 0.01   # shorter: no span of its own


def _span(phase: str, start: float, end: float) -> tuple:
    return ((phase, start, end),) if end - start > WAIT_SPAN_S else ()


def _connect(hub: isolate.Hub, target: Target, root: str, timeout: float, scratch_dir: str, started: list) -> tuple:
    """A private package server for the target, from the build's hub: (connection, pid), or isolate.Unavailable.
    The spans of what the hub did go to `started`, after a "wait" behind others' requests."""
    asked = time.time()
    forked = hub.start()   # none yet (a compile outside a doit run, a Dask worker's build): its own, forked now
    conn, pid, answer = hub.connect((target, root, timeout, scratch_dir),
                                    timeout + PACKAGE_SLACK_S * (len(import_levels(target)) + 1))
    taken = answer["taken"]   # when the hub took the request up: before, it started, or served others'
    started[:] = [*_span("start" if forked else "wait", asked, taken), *map(tuple, answer["spans"])]
    return conn, pid


def _route(request: tuple, fd: int) -> dict:
    """In the hub, once per private package server a process asks for: the library server of the target's package
    context asked to fork one for the asker's socket `fd`. {"spans", "taken": when it was taken up}, or the error."""
    if isinstance(request, kept_hub.Keep):   # the build has ended: its toolchain kept for the next one
        return kept_hub.fork_keeper(request, _route, _forget_build)
    target, root, timeout, scratch_dir = request
    starting = time.time()
    backend = backend_of(target.toolchain)
    package = target.module.split(".")[0]
    installed = backend.imports_module and not in_project(target.source, root)   # a library's, not the project's
    if installed:
        _precompile_once(package)
    try:   # once per build: every server inherits the toolchain
        backend.warm(root)
    except Exception as e:   # a toolchain that cannot even import fails every target clearly
        return {"error": f"the {target.toolchain} toolchain is not usable in this environment: {e}"}
    if installed and "torch" not in sys.modules and _requires_torch(package):
        # imported once here, every server forked from the hub has it (each imports one kernel module, and would
        # pay torch's 1.6-2 s import again); kernels that do not need torch do not pay for it
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401  (part of the toolchain: never an input)
    started = time.time()
    setup = functools.partial(_server_setup, target, backend, root)
    server = _kept(_servers, _library(target, backend), MAX_SERVERS,
                   lambda: isolate.Server(functools.partial(in_context, backend), setup))
    outcome = server.call((target, scratch_dir, timeout), timeout + PACKAGE_SLACK_S * len(import_levels(target)),
                          log_dir=scratch_dir, handle=fd)
    _stop_precompiling(package)   # its library is imported (or failed to): no more use
    if not outcome.ok:
        return {"error": outcome.error, "traceback": outcome.traceback,
                **({"facts": outcome.facts} if outcome.facts else {})}
    return {"spans": (*_span("start", starting, started), *outcome.result), "taken": starting}


_precompiling: dict[str, int | None] = {}   # package -> the pid of the child compiling its sources (None: reaped)


def _precompile_once(package: str) -> None:
    """At the first request for a library, a child compiles its sources into the kept bytecode (observe.precompile)
    on a CPU the build leaves idle while the hub imports it. The child holds none of the hub's files (a socket kept
    open would hide a dead hub from its askers), stops once the library is imported (_stop_precompiling: then it
    would take a CPU from the compiles) and dies with the hub, which reaps it at a later request."""
    for name, pid in _precompiling.items():
        if pid is not None and isolate.reaped(pid):
            _precompiling[name] = None
    if package in _precompiling:
        return
    hub = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            isolate.die_with_parent(hub)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            told: list[int] = []
            signal.signal(signal.SIGTERM, lambda *_: told.append(1))   # a whole file written, then out
            observe.precompile(package, stop=lambda: bool(told))
        finally:
            os._exit(0)
    _precompiling[package] = pid


def _stop_precompiling(package: str) -> None:
    pid = _precompiling.get(package)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


_hub = isolate.Hub(_route)   # this process's, or inherited from doit's master


def start_hub(keep: bool = False) -> None:
    """In doit's master, before it forks its workers: the build's hub. With `keep`, one forked by the project's
    keeper where one holds this environment's toolchain (rules/load/kept_hub.py)."""
    if not keep:
        _hub.start()
        return
    root = os.getcwd()
    # the request to keep it, but for how long, made as the hub is forked: its state, to be kept or not
    _kept_as[:] = [kept_hub.Keep(root, kept_hub.identity(root), 0, kforge.IMPORTED_NS)]
    _hub.start(attach=lambda: kept_hub.attach(root, _kept_as[0].identity))


def close_hub(keep_s: float = 0) -> None:
    """In doit's master, after its workers: with `keep_s`, a hub it forked itself first forks a keeper for the
    project's next build, which ends after keep_s seconds without one."""
    if keep_s and _kept_as and _hub.owner == os.getpid() and not _hub.attached:
        kept_hub.ask_to_keep(_hub, _kept_as[0]._replace(idle_s=keep_s))
    _kept_as.clear()
    _hub.close()


_kept_as: list = []   # in doit's master: the Keep its hub would be asked for, made when the hub was started


def _forget_build() -> None:
    """In a keeper, forked from a build's hub: the servers that hub forked are the build's, killed with it."""
    _servers.clear()
    _precompiling.clear()


@functools.lru_cache(maxsize=None)
def _requires_torch(package: str) -> bool:
    """Whether a distribution of this package requires torch (liger-kernel), or its __init__ imports torch as it
    runs (flag_gems, naming torch only under its extras)."""
    import importlib.metadata as metadata
    for dist in metadata.packages_distributions().get(package, ()):
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        if any(re.match(r"torch\b(?![-_.\w])", r) for r in requires if "extra ==" not in r):
            return True
    return _init_imports_torch(package)


def _init_imports_torch(package: str) -> bool:
    """Whether the package's __init__ imports torch at its top level (or in a try), read without importing it."""
    import ast
    import importlib.util
    try:   # a namespace package has no origin: TypeError
        body = sources.parse(Path(importlib.util.find_spec(package).origin)).body
    except (ImportError, ValueError, TypeError, AttributeError, OSError, SyntaxError):
        return False
    for node in body:
        for statement in [node, *(node.body if isinstance(node, ast.Try) else ())]:
            names = ([a.name for a in statement.names] if isinstance(statement, ast.Import) else
                     [statement.module or ""] if isinstance(statement, ast.ImportFrom) and not statement.level else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                return True
    return False


def compile_into(target: Target, private_root: Path, root: str, timeout: float,
                 build: str | None = None) -> isolate.Outcome:
    """compile_here with another project's out/ for its scratch files (a Dask worker's private one); with `build`
    (a Dask worker's: the doit process that sent it), in that build's own servers."""
    return compile_here(target._replace(layout=Layout(private_root)), root, timeout, build=build)


def in_context(backend: Backend, request: tuple) -> tuple:
    """In a library or package server, once per private package server asked for: the asker's socket handed to the
    next level's server, or at the last level to a copy of this server forked for it (compile_below). Its spans."""
    (target, scratch_dir, timeout), fd = request
    try:
        spans = _enter_package(target, backend)
        if _set_up:   # this server's own start (the family's environment, the recorder), with its first target
            spans = (("start", *_set_up), *spans)
            _set_up.clear()
        levels, below = import_levels(target), _level[0] + 1
        if below == len(levels):
            _minders[:] = [m for m in _minders if not isolate.reaped(m)]
            _minders.append(isolate.serve_on(os.dup(fd), functools.partial(compile_below, backend), _forked_private))
            return spans
        server = _kept(_packages, levels[below], MAX_PACKAGES, lambda: isolate.Server(
            functools.partial(in_context, backend), functools.partial(_forked_below, below)))
        outcome = server.call((target, scratch_dir, timeout), timeout + PACKAGE_SLACK_S * (len(levels) - below),
                              log_dir=scratch_dir, handle=fd)
    finally:
        os.close(fd)
    if not outcome.ok:
        raise isolate.Forwarded(outcome)
    return (*spans, *outcome.result)


def compile_below(backend: Backend, request: tuple) -> Candidate | Unchanged:
    """In a private package server, once per target: compiled in the context server of its import context."""
    target, scratch_dir, timeout, _ = request
    starting = time.time()
    server = _kept(_contexts, import_context(target), MAX_CONTEXTS,
                   lambda: isolate.Server(functools.partial(lower_and_check, backend)))
    server.start()
    started = time.time()
    outcome = server.call(request, timeout, log_dir=scratch_dir)
    if not outcome.ok:
        raise isolate.Forwarded(outcome)
    return _spans_first(outcome.result, _span("start", starting, started))   # its server forked for it


def _forked_private() -> None:
    """A private package server's set-up: the servers it inherited are its parent's."""
    _failed_import.clear()
    _packages.clear()
    _minders.clear()
    _contexts.clear()


def _kept(servers: dict, key, cap: int, new) -> isolate.Server:
    """The server kept for `key`, now the most recently used, else a new() one; the least recently used past `cap`
    closed."""
    server = servers.pop(key, None)
    if server is None:
        server = new()
        while len(servers) >= cap:
            servers.pop(next(iter(servers))).close()
    servers[key] = server
    return server


def import_levels(target: Target) -> tuple[str, ...]:
    """The packages a target's servers import, one level each (`fla`, `fla.ops`, `fla.ops.utils`); a top-level
    module is its own one level."""
    parts = target.module.split(".")
    return tuple(".".join(parts[:n]) for n in range(1, max(len(parts), 2)))


def package_context(target: Target) -> tuple:
    """What a library server imports: the top-level package, and the arch where the import sees one."""
    return target.module.split(".")[0], target.arch if target.device_model or target.setup else None


_level: list = [0]   # which of import_levels this server imports: 0 in a library server
_entered: list = [False]   # this server imported its level (_enter_package)
_failed_import: list = []   # this server's import that failed: (the error, its traceback), raised for every target


def _import_failed(error: Exception) -> None:
    shared_env.explain(error)   # an import that failed on one of kforge's pins says so
    if transient(error):
        error.kforge_retire = True   # the machine's state, not the package's: a fresh server imports it again
    else:
        _failed_import[:] = [error, error.__traceback__]


def _raise_failed_import() -> None:
    if _failed_import:
        error, traceback = _failed_import
        raise error.with_traceback(traceback)


def _forked_below(level: int) -> None:
    """A package server's set-up, after the fork: it imports the next level, and keeps servers of its own."""
    _level[0], _entered[0] = level, False
    _forked_private()


def _enter_package(target: Target, backend: Backend) -> tuple:
    """At a server's first target: in a library server, start recording and prepare the device model and set-up
    hooks; import its package. A failure here is never kept as the kernel's (a missing dependency is the
    environment's, and what the import failed to find is no file the record holds); the server fails every later
    target at once (_failed_import) rather than import it again (flag_gems's failing import took 2.5 s a target),
    but a transient one (a full disk, memory) retires it: a fresh one imports it again."""
    _raise_failed_import()
    level = _level[0]
    if _entered[0]:   # servers are kept by what they import: this target's
        return ()
    started = time.time()
    try:
        if level == 0:
            observe.Recorder.installed.start()
            # before the import, their reads every target's inputs too
            device_model.prepare(target.arch, target.device_model, target.setup)
        if backend.imports_module:
            importlib.import_module(import_levels(target)[level])
    except Exception as e:
        _import_failed(e)
        raise
    _entered[0] = True
    if not backend.imports_module:
        return ()
    # hashed once here, every server forked below starts with it (each paid 0.1-0.2 s for it: _InputsMemo)
    recorder = observe.Recorder.installed
    recorder.skip_out(str(target.layout.out))
    _inputs(recorder)
    return (("import", started, time.time()),)


def lower_and_check(backend: Backend, request: tuple) -> Candidate | Unchanged:
    """In a context server, once per target: meta.json gets the files the compile read (its depfile)."""
    _raise_failed_import()
    target, scratch_dir, _, cutoff = request
    importing = time.time()
    recorder = observe.Recorder.installed   # started before the imports: every target's record holds their reads
    recorder.skip_out(str(target.layout.out))   # where scratch_dir lies: the project's out/, or a private one
    try:
        with guard.as_tmpdir(scratch_dir):   # the compiler's temp files (Triton's, ptxas's) go with the folder
            imports = backend.imports_module and target.module not in sys.modules   # the server's one import,
            if imports:                                                            # timed on its own
                importlib.import_module(target.module)
            imports_done = time.time()
            if _imported[0] is None and backend.source_key is not None:   # before this server compiles anything
                _imported[0] = dict(_inputs(recorder))
            start = time.time()
            spans = (*((("import", importing, imports_done),) if imports else ()),
                     *_span("inputs", imports_done, start))
            if cutoff is not None and backend.source_key is not None:
                unchanged = _cut_off(target, backend, _imported[0], cutoff)
                if unchanged is not None:
                    return _spans_first(unchanged, (*spans, ("early cutoff", start, time.time())))
            _mark_compiling(scratch_dir, _inputs(recorder))
            try:
                lowered = backend.lower(target, scratch_dir)
            except (SystemExit, KeyboardInterrupt) as e:   # isolate would word it as the import's
                raise _exited(e) from None
        inputs = _inputs(recorder)
        _learn(target)
        lowered = dataclasses.replace(lowered, fields={**lowered.fields, "inputs": inputs})
        lowered_at = time.time()
        candidate = checked(target, lowered)
    except Exception as e:
        # the compiler's verdict on these inputs (a compile error, shared memory) is kept with what the compile
        # read (compile/action.py) and replayed; not the machine's state (transient)
        imported = not backend.imports_module or target.module in sys.modules
        if imported and not transient(e):
            e.kforge_facts = {"inputs": _inputs(recorder)}
            if isinstance(e, DoesNotFit):   # a library autotuner's config: skipped, not failed (compile/action.py)
                e.kforge_facts["skipped"] = str(e)
        if not imported:
            # the import failed partway: as in _enter_package, never replayed, and every later target fails so
            _import_failed(e)
        raise
    return _spans_first(candidate, (*spans, ("compile", start, lowered_at), ("check", lowered_at, time.time())))


def _exited(e: BaseException) -> RuntimeError:
    """An exit raised by code the compile ran (a @triton.constexpr_function), as the compile's error; the server
    retires (what the exit cut short may be half done)."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    what = f"called sys.exit({'' if e.code is None else repr(e.code)})" if isinstance(e, SystemExit) else \
        f"raised {type(e).__name__}"
    error = RuntimeError(f"the kernel's code {what} at {shared_env.shown_line(frame.filename, frame.lineno)} while "
                         f"compiling; code a compile runs must raise an exception instead")
    error.kforge_retire = True
    return error


def _spans_first(found: Candidate | Unchanged, spans) -> Candidate | Unchanged:
    """The candidate (or Unchanged) with these phases before its result's, for the build trace."""
    return found._replace(result=found.result._replace(spans=(*spans, *found.result.spans)))


_imported: list = [None]   # {name: sha256} of what this context server's imports read, before any compile


def _cut_off(target: Target, backend: Backend, imported: dict, cutoff: Cutoff) -> Unchanged | None:
    """Early cutoff: Unchanged when compiling cannot give other code than the artifact's: every input that changed
    was read by the imports (one the compile itself read could change the code in ways no digest covers) and the
    toolchain's digest of the kernel is the one it was built from. The inputs kept are the old ones with the
    imports' now: a file only the compile read is still watched."""
    if any(name not in imported for name in cutoff.changed) or \
            backend.source_key(target) != cutoff.meta["triton_source_key"]:
        return None
    inputs = sorted({**dict(cutoff.meta["inputs"]), **imported}.items())
    return Unchanged({**cutoff.meta, "inputs": [list(i) for i in inputs]}, CompileResult(unchanged=True))


def transient(error: BaseException) -> bool:
    """Whether a compile's failure may say nothing of its inputs, so that it must not be kept and replayed: a file
    that could not be written, memory that ran out, a tool out of time or killed by a signal (the OOM killer's
    SIGKILL), in its chain of causes."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (OSError, MemoryError, artifact.ArtifactError, subprocess.TimeoutExpired)):
            return True
        if isinstance(error, subprocess.CalledProcessError) and _killed(error.returncode):
            return True
        error = error.__cause__ or error.__context__
    return False


SIGNALS = 64   # signal numbers run 1..64 on Linux (SIGRTMAX)


def _killed(returncode) -> bool:
    """Whether a tool's exit status says a signal ended it: -N, or 128+N from a shell wrapper (a script standing in
    for ptxas). Taking a tool's own status in that range for a signal only costs a compile, never a wrong replay."""
    return isinstance(returncode, int) and (returncode < 0 or 128 < returncode <= 128 + SIGNALS)


def _inputs(recorder: observe.Recorder) -> list[list[str]]:
    """What the compile read, named from the project and the module path as the server started with them, and
    from the packages import finders map (an editable install's)."""
    if _memo.holds(recorder):
        return _memo.inputs
    files = recorder.files()
    stats, settled = _stats(files)
    folders = observe.bases(*_named_from)
    inputs = observe.digests(files, folders, recorder.since_ns, recorder.folders(),
                             recorder.written, recorder.variables)
    # after hashing: opening the files to hash them adds their own names to what the recorder saw
    _memo.keep(recorder, files, stats, inputs, settled)
    _hashed.update(_learned(stats, inputs, folders, recorder.written))
    return inputs


_hashed: dict = {}   # {resolved path: [identity, sha256]} hashed here, not yet left for the doit process (_learn)


def _learned(stats: tuple, inputs: list, folders, written) -> dict:
    """What _inputs hashed that the doit process's index may take (store/inputs.py's learn): each file the same by
    stat after hashing as before, changed last more than RACY_S before (a change within the file system clock's
    tick leaves its stat as it was), and not written by the process (its digest is what it wrote)."""
    digests, own = dict(inputs), {os.path.realpath(p) for p in written}
    recent = time.time_ns() - int(RACY_S * 1e9)   # the stats were taken before this: a stricter bound than theirs
    found = {}
    for path, *was in (s for s in stats if len(s) == 6):
        real = os.path.realpath(path)
        name = observe.name_of(path, folders)
        digest = digests.get(observe.file_input_name(name))
        if digest is None or digest == observe.CHANGED or real in own or max(was[3], was[4]) >= recent:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] == was:
            found[real] = [[st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size], digest]   # stamps.identity's
    return found


def _learn(target: Target) -> None:
    """Leave what this server hashed for the doit process's index (a hint: a write that fails is dropped)."""
    if _hashed:
        with contextlib.suppress(OSError, ValueError):   # ValueError: OutsideOut, a link leading out of out/
            inputs_index.learn(target.layout, dict(_hashed))
        _hashed.clear()


class _InputsMemo:
    """The last _inputs of this process: one server's targets read the same files, and naming and hashing them
    again cost 12-16 ms a target (liger-kernel). It holds while all _inputs is computed from is as it was: the
    folders listed, the modules and module path (which name the files), what was read and written beyond what
    the recorder skips (a compile's scratch files) or names no input of (the /proc/self/statm a server reads
    after its first call: else every context server hashed every input again, 1 s each with transformers), and
    each input's stat. While a file changed less than RACY_S ago (a change within the clock's tick leaves its
    stat as it was), nothing is kept. Forked children inherit it, with what the imports above them read."""
    fixed: tuple | None = None
    seen: frozenset = frozenset()
    written: frozenset = frozenset()
    files: frozenset = frozenset()
    real: frozenset = frozenset()   # the inputs' resolved paths
    stats: tuple = ()
    inputs: list = []

    def holds(self, recorder: observe.Recorder) -> bool:
        if self.fixed is None or self.fixed != _fixed(recorder):
            return False
        seen, written = recorder.seen, recorder.written
        if not (self.seen <= seen and self.written <= written):
            return False
        # read since: only what the recorder skips by name (as opened, when that names the file), or what is no input
        if any(not (observe.as_opened(p) or "").startswith(recorder.skip) and recorder.is_input(p)
               for p in seen - self.seen):
            return False
        # written since: never an input (digests() trusts what the process wrote itself)
        if any(os.path.realpath(p) in self.real for p in written - self.written):
            return False
        if self.stats != _stats(self.files)[0]:
            return False
        self.seen, self.written = frozenset(seen), frozenset(written)
        return True

    def keep(self, recorder: observe.Recorder, files, stats: tuple, inputs: list, settled: bool) -> None:
        self.fixed = _fixed(recorder) if settled else None
        self.seen, self.written = frozenset(recorder.seen), frozenset(recorder.written)
        self.files, self.real = frozenset(files), frozenset(map(os.path.realpath, files))
        self.stats, self.inputs = stats, inputs


def _fixed(recorder: observe.Recorder) -> tuple:
    return (frozenset(recorder.listed.items()), frozenset(recorder.variables.items()), frozenset(sys.modules),
            recorder.skip, recorder.since_ns, tuple(sys.path), tuple(map(id, sys.meta_path)), *_named_from)


def _stats(files) -> tuple[tuple, bool]:
    """Each file's identity, size and times (or its absence), and whether all changed last over RACY_S ago."""
    found, settled = [], True
    recent = time.time_ns() - int(RACY_S * 1e9)
    for path in sorted(files):
        try:
            st = os.stat(path)
        except OSError:
            found.append((path,))
            continue
        found.append((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        settled = settled and max(st.st_mtime_ns, st.st_ctime_ns) < recent
    return tuple(found), settled


RACY_S = 1.0   # far more than a file system clock's tick (Linux's: a few ms)


_memo = _InputsMemo()


_named_from: list = ["", ()]   # the project this server compiles for and its module path at start-up


def import_context(target: Target) -> tuple:
    """What a compile server imports: the target's module, its "function" arguments' modules, and its arch where
    the import sees one. A server imports one context, once: a library is never imported twice in a process (C++
    registries such as torch's operator library cannot be), nor used under another arch's device model."""
    functions = tuple(sorted(str(v).split(":")[0] for a, v in target.constexprs if (a, "function") in target.signature))
    return target.module, functions, target.arch if target.device_model or target.setup else None


def _library(target: Target, backend: Backend) -> tuple:
    """What a library server is kept by: its package context, and what changes the process for good."""
    return (target.toolchain, target.arch if backend.arch_per_process else None, target.env, target.device_model,
            target.setup, package_context(target))


def _server_setup(target: Target, backend: Backend, root: str) -> None:
    """Once in each fresh library server, after the fork: the family's [env] (its module reads it when imported),
    the arch of an arch_per_process backend, the working folder (out/.kforge/work/) and the recorder."""
    setting_up = time.time()
    inherited = dict(os.environ)
    os.environ.update(dict(target.env))
    fixed_address_layout()
    if backend.arch_per_process:
        backend.setup(target.arch)
    # an installed library's import runs in out/.kforge/work/ (guard.work_folder), the project's own modules in the
    # project (they may read a file by a path relative to it); a Dask worker's compile runs in the worker's folder
    if os.path.realpath(target.layout.root) == os.path.realpath(root) and \
            sources.project_source_problem(Path(target.source), Path(root)) is not None:
        with contextlib.suppress(OSError, ValueError):   # a link out of out/: the catalog's load warned of it
            observe.run_in(guard.work_folder(target.layout))
    _named_from[:] = [root, tuple(sys.path)]
    recorder = observe.Recorder.install(root)   # after the compiler's import: the toolchain is no input
    # what kforge set here (the family's [env], the arch a backend reads) is in the key, and is not what the
    # process that checks a target is up to date sees: never an observed input
    recorder.given |= {k for k, v in os.environ.items() if inherited.get(k) != v}
    _forget_project_modules(recorder)
    _set_up[:] = [setting_up, time.time()]


def _forget_project_modules(recorder: observe.Recorder) -> None:
    """The project's own modules that doit's master imported before it forked the hub (a dodo.py importing the
    kernels' package) forgotten: this server imports them again as a process of its own does (a Dask worker's),
    so that what they read is in each target's record. Inherited, their __init__ and what it read were missing,
    from the record of a local compile alone: meta.json differed from Dask's, and an edit of a file an __init__
    reads left the binary stale. Project source only (sources.project_source_problem): never a virtualenv's or
    a hidden folder's inside the project (a Dask worker's distributed, doit's own), nor the toolchain's (kforge's
    own checkout may be the project)."""
    project, root = recorder.root + os.sep, Path(recorder.root)
    for name, module in list(sys.modules.items()):
        where = vars(module).get("__file__") if isinstance(module, types.ModuleType) else None   # no __getattr__
        if isinstance(where, str) and where.endswith(".py") and name != "__main__":
            real = os.path.realpath(where)
            if real.startswith(project) and not real.startswith(recorder.skip) and real not in recorder.skip_files \
                    and sources.project_source_problem(Path(real), root) is None:
                del sys.modules[name]


_set_up: list = []   # a library server's set-up (start, end), reported with its first target


ADDR_NO_RANDOMIZE = 0x0040000   # <linux/personality.h>


def fixed_address_layout() -> None:
    """The programs this compile server runs (ptxas, ld.lld) start with one address-space layout, not a random one
    (inherited across fork and exec): ptxas for sm_100a gave two different cubins of the same PTX from run to run
    under randomization, one with it off (docs/correctness.md). Where it cannot be set (not Linux, a seccomp
    filter) builds stay correct, only such binaries' bytes may vary."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)   # query
    if current != -1 and not current & ADDR_NO_RANDOMIZE:
        libc.personality(current | ADDR_NO_RANDOMIZE)
