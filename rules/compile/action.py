"""The doit action of a compile target: the artifact arrives from the first source that has one (the local cache,
the remote cache, else a compile here or on a Dask cluster), installed by artifact.install, then kept in the caches
before it. The outcome as one artifact.CompileResult, or a TaskFailed naming the target, its spec and config."""
from __future__ import annotations

import contextlib
import os
import time

from doit.exceptions import TaskFailed

from kforge.store import artifact
from kforge.share import local_cache, remote_cache
from kforge.compile.core import compile_here, compile_into
from kforge.store.guard import OutsideOut
from kforge.base.target import Target

DEFAULT_TIMEOUT_S = 600.0
RETRY_HINT = "retry alone:"   # a replayed failure drops it: the retry would replay it too (forget is the way)


def compile_target(target: Target, root: str, timeout: float = DEFAULT_TIMEOUT_S,
                   cache_cfg: remote_cache.CacheConfig | None = None, executor: str | None = None,
                   local: local_cache.LocalCache | None = None):
    """doit python-action: the result's values, or TaskFailed. A cache hit replaces the compile (the compiler is
    not even imported). With executor="dask://HOST:PORT" the compile runs on that Dask cluster."""
    try:
        return _compile_target(target, root, timeout, cache_cfg, executor, local)
    except OutsideOut as e:   # a link out of out/: its message names the link and the fix
        return _fail(target, f"cannot write in out/: {e}")
    except OSError as e:   # out/ unwritable (a full disk): one line, the run goes on
        return _fail(target, f"cannot write in out/: {e}; free space (or fix out/) and run again")


def _compile_target(target: Target, root: str, timeout: float, cache_cfg, executor: str | None, local):
    saved = artifact.saved_failure(target)
    if saved is not None and saved.startswith(artifact.SKIPPED):   # skipped from this very key and inputs
        return {"skipped": saved.removeprefix(artifact.SKIPPED)}
    if saved is not None:   # a deterministic failure of this very key and inputs: the compile would give it again
        head, _, rest = saved.partition("\n")
        rest = "\n".join(line for line in rest.splitlines() if not line.startswith(f"  {RETRY_HINT}"))
        return TaskFailed(f"{head}\n  not compiled again: it failed so from this key and these inputs "
                          f"(out/{os.path.relpath(target.error_path, target.layout.out)}); `doit forget "
                          f"{target.name}` compiles it again\n{rest}")
    start = time.monotonic()
    caches = [c for c in (local and local_cache.Source(local), remote_cache.cache_for(cache_cfg)) if c is not None]
    spans: list[tuple] = []
    warnings: list[str] = []
    for i, cache in enumerate(caches):
        looking = time.time()
        arrived, refused = artifact.arrive(target, cache)
        spans.append((cache.lookup_span, looking, time.time()))
        warnings += refused
        if arrived is not None:
            for nearer in caches[:i]:   # the next checkout, revert or branch switch finds it there
                warnings += nearer.keep(target)
            seconds = time.monotonic() - start
            break
    else:   # no cache had it: a compile
        if executor is not None:
            from kforge.share import dask_executor   # imports distributed: only where a cluster is used
            made_by = "the Dask cluster"
            outcome = dask_executor.compile_remote(target, root, timeout, executor, compile_into)
        else:
            made_by, outcome = "the compiler", compile_here(target, root, timeout, artifact.cutoff(target))
        if not outcome.ok and "skipped" in (outcome.facts or {}):
            return _skip(target, outcome.facts["skipped"], outcome.facts.get("inputs"))
        if not outcome.ok:
            return _fail(target, outcome.error, outcome.traceback, (outcome.facts or {}).get("inputs"))
        arrived, seconds, writing = outcome.result, outcome.seconds, time.time()
        try:   # a candidate is checked as a cache entry is (bound to the target, ELF for its arch); Unchanged
            artifact.install(target, arrived)   # (early cutoff) renews meta.json's inputs alone
        except artifact.ArtifactError as e:
            here = executor is None and isinstance(e, artifact.BinaryRefused)   # the line it always had
            return _fail(target, f"bad binary from {target.toolchain}: {e.reason}" if here else
                         f"the artifact from {made_by} is bad: {e}")
        spans += [*arrived.result.spans, ("write", writing, time.time())]
        for cache in caches:
            keeping = time.time()
            warnings += cache.keep(target)
            spans.append((cache.keep_span, keeping, time.time()))
    for cache in caches:
        warnings += cache.drain_warnings()
    # the source's CompileResult completed with the action's own facts, as doit keeps it
    return arrived.result._replace(seconds=round(seconds, 4), cache_warnings=tuple(warnings), spans=tuple(spans),
                                   worker=os.getpid()).values()


def _skip(target: Target, reason: str, inputs: list | None) -> dict:
    """A library autotuner's config that cannot run on the arch (DoesNotFit): kept in error.txt as skipped with what
    the compile read, so that it stays skipped until those change; the task succeeds."""
    _keep_error(target, f"{artifact.SKIPPED}{reason}", inputs)
    return {"skipped": reason}


def _fail(target: Target, error: str, traceback: str = "", inputs: list | None = None) -> TaskFailed:
    """The failure, kept in error.txt; `inputs` (what the compile read) only for a deterministic one, which the
    next runs then report from there without compiling (artifact.saved_failure)."""
    retry = f"doit {target.name}" if inputs is None else \
        f"doit forget {target.name} && doit {target.name} (a plain retry replays it: it fails so from these inputs)"
    message = (f"{target.name} failed\n  spec: {target.spec_path}\n  config: {dict(target.config)}\n"
               f"  error: {error}\n  {RETRY_HINT} {retry}")
    _keep_error(target, f"{message}{artifact.TRACEBACK}{traceback}" if traceback else message, inputs)
    return TaskFailed(message)


def _keep_error(target: Target, text: str, inputs: list | None) -> None:
    with contextlib.suppress(OSError):   # a full disk: reported all the same, compiled again next time
        artifact.write_error(target, text, inputs)
