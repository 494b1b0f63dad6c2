"""Distributed compiles on a Dask cluster: `doit -n 64 -P thread executor=dask://HOST:PORT`.

Each compile target's action sends its compile to the cluster as one task and writes the artifact that comes
back into out/ atomically, as a local compile would; doit's up-to-date logic is unchanged, and so is local
execution, the default. On a worker the compile runs in that worker's warm compile servers (rules/compile/core.py),
into a private scratch project's out/. Dask reschedules the task of a worker that died (a crash, a kill); a compile
that fails on its own is reported like a local failure. The workers need kforge, its toolchains and the
project's kernels importable: the same checkout path, or the same code installed.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
import time
from pathlib import Path

from kforge.store import artifact
from kforge.load import isolate
from kforge.base import settings
from kforge.base.layout import Layout

RETRIES = 2   # a task whose worker dies is run again on another one, up to this many times
_clients: dict[str, object] = {}
_lock = threading.Lock()   # doit's thread workers share one client per scheduler


def scheduler_address(executor: str) -> str:
    """dask://HOST:PORT (checked by rules/base/settings.py) -> tcp://HOST:PORT (the scheduler's address)."""
    return "tcp://" + executor.removeprefix(settings.DASK)


def compile_remote(target, root: str, timeout: float, executor: str, compile_into) -> isolate.Outcome:
    """compile_into(target, private_root, root, timeout) -> Outcome runs on a worker (the compile core's,
    sent by reference); the artifact it sends back is checked and installed here."""
    start = time.monotonic()
    try:
        future = _client(executor).submit(run_on_worker, compile_into, target, root, timeout, pure=False,
                                          retries=RETRIES)
        ok, seconds, result, files = future.result()
    except Exception as e:   # the cluster is unreachable, or the task's workers kept dying
        return isolate.Outcome(False, time.monotonic() - start,
                               error=f"on the Dask cluster {executor}: {type(e).__name__}: {e}")
    if not ok:
        return isolate.Outcome(False, seconds, error=result)
    try:
        artifact.install(target, files)   # bound to this target; the checks a local artifact passed
    except artifact.ArtifactError as e:
        return isolate.Outcome(False, seconds, error=f"the artifact from the Dask cluster is bad: {e}")
    return isolate.Outcome(True, seconds, result=result)


def run_on_worker(compile_into, target, root: str, timeout: float):
    """On a Dask worker: compile into a private out/, return (ok, seconds, result | error, files)."""
    from distributed import get_worker
    scratch = Path(tempfile.mkdtemp(prefix="kforge-dask-"))
    try:
        outcome = compile_into(target, scratch, root, timeout)
        if not outcome.ok:
            return False, outcome.seconds, outcome.error, {}
        result = dataclasses.replace(outcome.result, compiled_on=get_worker().address)
        private = Layout(scratch).artifact_dir(target.arch, target.kernel, target.config_id)
        return True, outcome.seconds, result, artifact.files_of(private)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _client(executor: str):
    with _lock:
        if executor not in _clients:
            from distributed import Client
            _clients[executor] = Client(scheduler_address(executor), timeout=30)
        return _clients[executor]
