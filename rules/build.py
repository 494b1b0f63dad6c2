"""The doit action of a compile target: warm the toolchain once per process, compile in a warm child."""
from __future__ import annotations

import functools
import importlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from doit.exceptions import TaskFailed

from kforge import artifact, isolate, remote_cache
from kforge.doit_runner import tasks_to_run
from kforge.targets import Target

# toolchain name (as in specs) -> module with warm(root), setup(arch), compile_one((target, scratch)) -> dict,
# ARCH_PER_PROCESS: True when the compiler fixes its arch per process (FlyDSL reads it from the env), False
# when it takes the arch per compile (Triton), so that one server serves every arch; IMPORT_IN: where a build
# imports the compiler by default (see import_place); WARM_BEFORE_FORK: whether the doit master may import it
# before forking its workers.
TOOLCHAIN_MODULES = {"triton": "kforge.triton_compile", "flydsl": "kforge.flydsl_compile"}
DEFAULT_TIMEOUT_S = 600.0

# This process's compile servers by (toolchain, arch or None), least recently used first. A server that is kept
# keeps its compiler's warm state (the first compile in a fresh one pays MLIR/LLVM set-up again); the cap
# bounds memory at a few compilers per doit worker (the default catalog has three archs).
MAX_SERVERS = 3
_servers: dict[tuple[str, str], isolate.Server] = {}


def compile_target(target: Target, root: str, timeout: float = DEFAULT_TIMEOUT_S,
                   cache_cfg: remote_cache.CacheConfig | None = None, executor: str | None = None):
    """doit python-action: returns saved values on success, TaskFailed (naming target and config) on failure.
    With a remote cache, a verified hit replaces the compile (the compiler is not even imported for it), and a
    fresh build is uploaded. With executor="dask://HOST:PORT" the compile runs on that Dask cluster."""
    cache = remote_cache.cache_for(cache_cfg)
    if cache is not None:
        start = time.monotonic()
        if cache.fetch(target):
            return {"seconds": round(time.monotonic() - start, 4), "from_cache": True,
                    "cache_warnings": cache.drain_warnings()}
    if executor is not None:
        from kforge import dask_executor   # imports distributed: only where a cluster is used
        outcome = dask_executor.compile_remote(target, root, timeout, executor, compile_here)
    else:
        outcome = compile_here(target, root, timeout)
    if not outcome.ok:
        return _fail(target, outcome.error, outcome.traceback)
    values = {"seconds": round(outcome.seconds, 4), **outcome.result}
    if cache is not None:
        cache.store(target)
        values["cache_warnings"] = cache.drain_warnings()
    return values


# Two knobs for A/B runs of bench/build_speed.py, read from the environment (doit workers and servers inherit it):
#   KFORGE_IMPORT_COMPILER_IN: where a doit build imports each compiler (default: the toolchain's IMPORT_IN):
#     master: once, in the doit master, before it forks its workers, which inherit it (only for a toolchain
#       whose import starts no threads),
#     worker: in each doit worker, before it forks its compile servers, which inherit it,
#     server: in each compile server, after the fork, as a process pool's worker does;
#   KFORGE_SERVER_GC: off (default): compile servers run without Python's cyclic collector (rules/isolate.py
#     says why), on: with it.
ENV_CHOICES = {"KFORGE_IMPORT_COMPILER_IN": ("master", "worker", "server"), "KFORGE_SERVER_GC": ("off", "on")}


def import_place(backend) -> str:
    return os.environ.get("KFORGE_IMPORT_COMPILER_IN") or backend.IMPORT_IN


def check_environment() -> None:
    """In the doit master, before any task runs: a misspelt value stops the build, naming the variable."""
    for name, choices in ENV_CHOICES.items():
        value = os.environ.get(name)
        if value and value not in choices:
            raise ValueError(f"{name}={value!r} in the environment: expected one of {', '.join(choices)} "
                             f"(or leave it unset)")


def warm_before_fork(tasks: dict, selected: list[str], root: str) -> None:
    """Run in the doit master before `doit -n N` forks: import the compiler of the local compiles that will
    run, once, so that the N workers inherit it (Triton: 0.5 s of import and toolchain hash each, measured
    on the H100 host), for each toolchain imported in the master (import_place). Nothing is imported when
    everything is up to date: a no-op run stays fast."""
    runs = [(t.meta or {}).get("kforge_compile") for t in tasks_to_run(tasks, selected)]
    for toolchain in sorted({info["toolchain"] for info in runs if info and info["runs_here"]}):
        backend = importlib.import_module(TOOLCHAIN_MODULES[toolchain])
        if import_place(backend) == "master" and backend.WARM_BEFORE_FORK:
            try:
                backend.warm(root)
            except Exception:   # each target reports an unusable toolchain itself, by name
                pass


def compile_here(target: Target, root: str, timeout: float) -> isolate.Outcome:
    """Compile in this machine's warm compile server for the target's toolchain (and arch)."""
    backend = importlib.import_module(TOOLCHAIN_MODULES[target.toolchain])
    import_in_server = import_place(backend) == "server"
    if not import_in_server:
        try:
            backend.warm(root)
        except Exception as e:   # a toolchain that cannot even import fails every target clearly
            return isolate.Outcome(False, 0.0, error=_unusable(target, e))
    scratch_root = Path(target.out_dir).parents[2] / ".kforge" / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f"{target.arch}-{target.kernel}-", dir=scratch_root)
    try:
        return _server_for(target, backend, root, import_in_server).call((target, scratch), timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _server_for(target: Target, backend, root: str, import_in_server: bool) -> isolate.Server:
    wanted = (target.toolchain, target.arch if backend.ARCH_PER_PROCESS else None)
    server = _servers.pop(wanted, None)
    if server is None:
        setup = functools.partial(_server_setup, target, backend, root, import_in_server)
        collect_garbage = os.environ.get("KFORGE_SERVER_GC") == "on"
        server = isolate.Server(backend.compile_one, setup, collect_garbage=collect_garbage)
        while len(_servers) >= MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
    _servers[wanted] = server   # now the most recently used
    return server


def _server_setup(target: Target, backend, root: str, import_here: bool) -> None:
    """Once in each fresh compile server, after the fork."""
    if import_here:
        try:
            backend.warm(root)
        except Exception as e:
            raise RuntimeError(_unusable(target, e)) from None
    if backend.ARCH_PER_PROCESS:
        backend.setup(target.arch)


def _unusable(target: Target, e: Exception) -> str:
    return f"the {target.toolchain} toolchain is not usable in this environment: {e}"


def _fail(target: Target, error: str, traceback: str = "") -> TaskFailed:
    message = (f"{target.name} failed\n  spec: {target.spec_path}\n  config: {dict(target.config)}\n"
               f"  error: {error}\n  retry alone: doit {target.name}")
    kept = f"{message}\n\nTraceback in the compiler's process:\n{traceback}" if traceback else message
    artifact.write_error(Path(target.out_dir), target.key, kept)
    return TaskFailed(message)

