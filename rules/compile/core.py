"""The compile core: a backend lowers one Target to a binary; this module checks it and writes the artifact.

    compile_here(target, root, timeout) -> isolate.Outcome (result: Written)
        in this machine's warm compile server for the target's toolchain (and arch), a forked child:
        backend.lower(target, scratch) -> Lowered, then check_and_write(target, lowered)

A backend (triton_compile.py, flydsl_compile.py) only lowers: it never checks or writes files. Executors
that compile elsewhere (dask_executor.py) are handed compile_here; none imports the doit action (build.py).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kforge.store import artifact, scratch
from kforge.load import device_model, isolate, observe
from kforge.base.archs import ARCHS, check_shared
from kforge.base.layout import Layout
from kforge.base.target import Target
from kforge_runtime import schema

# toolchain (as in specs) -> its backend module, which has:
#   warm(root): import the compiler and pay its one-time set-up, once per process (before forking servers)
#   ARCH_PER_PROCESS: True when the compiler fixes its arch per process (FlyDSL reads it from the
#     environment): one server per arch, set up with setup(arch); False (Triton): one server for every arch
#   IMPORT_IN: "server" (each compile server imports the compiler after the fork) or "worker" (the doit worker
#     imports it once and its servers inherit it)
#   lower(target, scratch) -> Lowered
BACKENDS = {"triton": "kforge.compile.triton_backend", "flydsl": "kforge.compile.flydsl_backend"}

# This process's compile servers by (toolchain, arch or None), least recently used first. A server that is kept
# keeps its compiler's warm state (the first compile in a fresh one pays MLIR/LLVM set-up again); the cap
# bounds memory at a few compilers per doit worker (the default catalog has three archs).
MAX_SERVERS = 3
_servers: dict[tuple[str, str | None], isolate.Server] = {}


@dataclass(frozen=True)
class Lowered:
    """What a backend made of one target: the binary and what a launch needs to know about it."""
    binary: bytes
    binary_name: str      # file name in the artifact directory: <symbol>.cubin | <symbol>.hsaco
    symbol: str
    num_warps: int
    warp_size: int
    shared: int           # bytes of shared memory (LDS) one block uses
    compile_seconds: float
    fields: dict = field(default_factory=dict)   # the toolchain's own meta.json fields


@dataclass(frozen=True)
class Written:
    """An artifact now in place (what a compile server sends back)."""
    compile_seconds: float
    sha256: str
    compiled_on: str | None = None   # the Dask worker's address, for a compile that ran on a cluster
    spans: tuple = ()   # (phase, start, end) by the wall clock (comparable across processes): the build trace


@dataclass(frozen=True)
class CompileResult:
    """A compile target's outcome as the build report records it (doit keeps it as the task's values)."""
    seconds: float                 # the whole action: cache lookup, compile and write
    compile_seconds: float | None = None   # the compiler alone (None: fetched from the cache)
    sha256: str | None = None
    from_cache: bool = False       # installed from the remote cache
    compiled_on: str | None = None
    cache_warnings: tuple[str, ...] = ()
    spans: tuple = ()         # (phase, start, end) by the wall clock: cache lookup, compile, write, upload
    worker: int | None = None   # the pid of the doit worker that ran the action: a row of the build trace
    from_local_cache: bool = False   # installed from the local cache (rules/share/local_cache.py)

    def values(self) -> dict:
        """As doit saves a python-action's result: a dict of JSON values, only the fields that are set."""
        return {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()
                if v is not None and v is not False and v != ()}   # 0.0 is a value (and 0.0 == False)


def check_and_write(target: Target, lowered: Lowered) -> Written:
    """The one writer of compiled artifacts: the binary is real code for the target's arch and fits its
    shared memory; then binary and meta.json are written (meta.json last, by rename)."""
    arch = ARCHS[target.arch]
    if not schema.is_plain_name(lowered.binary_name):
        raise RuntimeError(f"the {target.toolchain} backend named the binary {lowered.binary_name!r}")
    meta = artifact.meta(target, binary_name=lowered.binary_name, binary=lowered.binary, symbol=lowered.symbol,
                         num_warps=lowered.num_warps, warp_size=lowered.warp_size, shared=lowered.shared,
                         **lowered.fields)
    try:
        schema.check_binary(lowered.binary, meta["sha256"], target.arch, lowered.symbol)
    except schema.BinaryRefused as e:
        raise RuntimeError(f"bad binary from {target.toolchain}: {e}") from None
    check_shared(arch, lowered.shared)
    artifact.write(Path(target.out_dir), lowered.binary_name, lowered.binary, meta)
    return Written(round(lowered.compile_seconds, 4), meta["sha256"])


def compile_here(target: Target, root: str, timeout: float) -> isolate.Outcome:
    """Compile in this machine's warm compile server for the target's toolchain (and arch)."""
    backend = importlib.import_module(BACKENDS[target.toolchain])
    import_in_server = backend.IMPORT_IN == "server"
    if not import_in_server:
        try:
            backend.warm(root)
        except Exception as e:   # a toolchain that cannot even import fails every target clearly
            return isolate.Outcome(False, 0.0, error=_unusable(target, e))
    scratch_dir = scratch.folder(Path(target.out), f"{target.arch}-{target.kernel}")   # log and temp files
    try:
        return _server_for(target, backend, root, import_in_server).call((target, scratch_dir), timeout,
                                                                         log_dir=scratch_dir)
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)


def compile_into(target: Target, private_root: Path, root: str, timeout: float) -> isolate.Outcome:
    """compile_here with the artifact written into another project's out/ (a Dask worker's private one)."""
    layout = Layout(private_root)
    directory = layout.artifact_dir(target.arch, target.kernel, target.config_id)
    return compile_here(target._replace(out=str(layout.out), out_dir=str(directory)), root, timeout)


def lower_and_write(backend, request: tuple) -> Written:
    """In the compile server, once per target: meta.json gets the files the compile read (its depfile)."""
    target, scratch_dir = request
    start = time.time()
    device_model.serving(target.kernel)
    recorder = _observed(target)
    try:
        with scratch.as_tmpdir(scratch_dir):   # the compiler's temp files (Triton's, ptxas's) go with the folder
            lowered = backend.lower(target, scratch_dir)
        inputs = observe.digests(recorder.files(), _folders[0], recorder.since_ns, recorder.folders())
        lowered = dataclasses.replace(lowered, fields={**lowered.fields, "inputs": inputs})
        lowered_at = time.time()
        written = check_and_write(target, lowered)
    except Exception as e:
        # the compiler's verdict on these inputs (a compile error, a resource check such as shared memory): the
        # same key and inputs give it again, so it is kept with what the compile read (rules/compile/action.py). Not so
        # a file that could not be written, or memory that ran out: the machine's state, not the inputs'.
        if not isinstance(e, (OSError, MemoryError, artifact.ArtifactError)):
            e.kforge_facts = {"inputs": observe.digests(recorder.files(), _folders[0], recorder.since_ns,
                                                        recorder.folders())}
        raise
    return dataclasses.replace(written, spans=(("compile", start, lowered_at), ("write", lowered_at, time.time())))


_folders: list[tuple[str, ...]] = [()]   # where the server names files from (observe.bases), set up once
_serving: list = [None]   # the modules the server's state was imported for


def _observed(target: Target) -> observe.Recorder:
    """The recorder of this server, reading for this target. What a compile reads is recorded from a fresh
    import of its module: a target of another module (or other "function" arguments) first drops the modules
    the previous ones imported (not the toolchain's), so each compile's record holds every file its import
    read, whatever the server compiled before; targets of one module share the import (and the record)."""
    recorder = observe.Recorder.installed
    functions = sorted(str(v).split(":")[0] for a, v in target.constexprs if (a, "function") in target.signature)
    # a module imported under the device model or after a set-up hook saw one arch: another arch imports it again
    per_arch = target.device_model or target.setup
    wanted = (target.module, functions, target.arch if per_arch else None)
    if _serving[0] != wanted:
        for name in recorder.owned_modules():
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        _serving[0] = None
        recorder.start()
        # before the module is imported: the model answers as this arch's reference GPU, the hooks run (again:
        # what they set up may live in the modules just dropped); their reads are this compile's inputs too
        device_model.prepare(target.arch, target.device_model, target.setup)
        _serving[0] = wanted
    return recorder


def _server_for(target: Target, backend, root: str, import_in_server: bool) -> isolate.Server:
    # the device model and set-up hooks change the process for good: families with others have servers of their own
    wanted = (target.toolchain, target.arch if backend.ARCH_PER_PROCESS else None, target.env, target.device_model,
              target.setup)
    server = _servers.pop(wanted, None)
    if server is None:
        setup = functools.partial(_server_setup, target, backend, root, import_in_server)
        server = isolate.Server(functools.partial(lower_and_write, backend), setup)
        while len(_servers) >= MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
    _servers[wanted] = server   # now the most recently used
    return server


def _server_setup(target: Target, backend, root: str, import_here: bool) -> None:
    """Once in each fresh compile server, after the fork: the family's [env] first (its module reads it when
    imported), then the compiler (the device model and set-up hooks come before each import: _observed)."""
    os.environ.update(dict(target.env))
    if import_here:
        try:
            backend.warm(root)
        except Exception as e:
            raise RuntimeError(_unusable(target, e)) from None
    if backend.ARCH_PER_PROCESS:
        backend.setup(target.arch)
    _folders[0] = observe.bases(root)
    observe.Recorder.install(root)   # after the compiler's import: the toolchain is no input


def _unusable(target: Target, e: Exception) -> str:
    return f"the {target.toolchain} toolchain is not usable in this environment: {e}"
