"""The doit action of a compile target: a local-cache hit, else a remote-cache hit, else a compile (here or on a
Dask cluster); what was fetched or built is kept in the local cache and a build uploaded. The outcome as a
CompileResult, or a TaskFailed naming the target, its spec and config."""
from __future__ import annotations

import os
import time
from pathlib import Path

from doit.exceptions import TaskFailed

from kforge.store import artifact
from kforge.share import local_cache, remote_cache
from kforge.compile.core import CompileResult, compile_here, compile_into
from kforge.store.guard import OutsideOut
from kforge.base.target import Target

DEFAULT_TIMEOUT_S = 600.0


def compile_target(target: Target, root: str, timeout: float = DEFAULT_TIMEOUT_S,
                   cache_cfg: remote_cache.CacheConfig | None = None, executor: str | None = None,
                   local: local_cache.LocalCache | None = None):
    """doit python-action: the result's values on success, TaskFailed on failure. A verified hit in the local
    cache, else in the remote cache, replaces the compile (the compiler is not even imported for it); what was
    fetched or built goes into the local cache, and a fresh build is uploaded. With executor="dask://HOST:PORT"
    the compile runs on that Dask cluster."""
    try:
        return _compile_target(target, root, timeout, cache_cfg, executor, local)
    except (OSError, OutsideOut) as e:   # out/ unwritable (a full disk, a link out of out/): one line, the run goes on
        return _fail(target, f"cannot write in out/: {e}; free space (or fix out/) and run again")


def _compile_target(target: Target, root: str, timeout: float, cache_cfg, executor: str | None, local):
    saved = artifact.saved_failure(target)
    if saved is not None:   # a deterministic failure of this very key and inputs: the compile would give it again
        head, _, rest = saved.partition("\n")
        return TaskFailed(f"{head}\n  not compiled again: it failed so from this key and these inputs "
                          f"(out/{os.path.relpath(target.out_dir, target.out)}/error.txt); `doit forget "
                          f"{target.name}` compiles it again\n{rest}")
    start, began = time.monotonic(), time.time()
    cache = remote_cache.cache_for(cache_cfg)
    spans: list[tuple] = []
    warnings: list[str] = []
    if local is not None:
        hit, warnings = local_cache.fetch(local, target)
        spans.append(("local cache lookup", began, time.time()))
        if hit and _read_the_same(target):   # as for a remote entry: what its compile read must match too
            return CompileResult(round(time.monotonic() - start, 4), from_local_cache=True, spans=tuple(spans),
                                 worker=os.getpid()).values()
    if cache is not None:
        looking = time.time()
        hit = cache.fetch(target)
        spans.append(("cache lookup", looking, time.time()))
        if hit and _read_the_same(target):   # an entry's key is what the catalog knows; what it read must match too
            if local is not None:   # the next checkout, revert or branch switch finds it here
                warnings += local_cache.store(local, target)
            return CompileResult(round(time.monotonic() - start, 4), from_cache=True,
                                 cache_warnings=(*warnings, *cache.drain_warnings()), spans=tuple(spans),
                                 worker=os.getpid()).values()
    if executor is not None:
        from kforge.share import dask_executor   # imports distributed: only where a cluster is used
        outcome = dask_executor.compile_remote(target, root, timeout, executor, compile_into)
    else:
        outcome = compile_here(target, root, timeout)
    if not outcome.ok:
        return _fail(target, outcome.error, outcome.traceback, (outcome.facts or {}).get("inputs"))
    written = outcome.result
    spans += written.spans
    if local is not None:
        storing = time.time()
        warnings += local_cache.store(local, target)
        spans.append(("local cache store", storing, time.time()))
    if cache is not None:
        uploading = time.time()
        cache.store(target)
        spans.append(("cache upload", uploading, time.time()))
        warnings += cache.drain_warnings()
    return CompileResult(round(outcome.seconds, 4), written.compile_seconds, written.sha256,
                         compiled_on=written.compiled_on, cache_warnings=tuple(warnings), spans=tuple(spans),
                         worker=os.getpid()).values()


def _read_the_same(target: Target) -> bool:
    """Whether the files the artifact's compile read (its meta.json lists them) have the same content here."""
    from kforge.base import stamps
    from kforge.store.inputs import InputIndex
    from kforge.base.layout import Layout
    index = InputIndex.of(Layout.around(target.out).observed_inputs)
    return index.unchanged(target.meta_path, stamps.identity(target.meta_path))


def _fail(target: Target, error: str, traceback: str = "", inputs: list | None = None) -> TaskFailed:
    """The failure, kept in error.txt; `inputs` (what the compile read) only for a deterministic one, which the
    next runs then report from there without compiling (artifact.saved_failure)."""
    message = (f"{target.name} failed\n  spec: {target.spec_path}\n  config: {dict(target.config)}\n"
               f"  error: {error}\n  retry alone: doit {target.name}")
    kept = f"{message}{artifact.TRACEBACK}{traceback}" if traceback else message
    try:
        artifact.write_error(Path(target.out_dir), target.key, kept, inputs)
    except OSError:   # a full disk: the failure is still reported (and in build-report.json when space allows)
        pass
    return TaskFailed(message)
