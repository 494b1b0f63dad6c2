"""Distributed compiles on a Dask cluster: `doit -n 64 -P thread executor=dask://HOST:PORT`. A target's compile runs
as one task, in a worker's warm compile servers with a private scratch out/; what comes back is a candidate the
action installs as a local compile's. Dask reruns the task of a worker that died. The workers need kforge, its
toolchains and the project's kernels importable: the same checkout path, or the same code installed.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kforge.load import isolate
from kforge.base import settings

RETRIES = 2   # a task whose worker dies is run again on another one, up to this many times
_clients: dict[str, object] = {}
_lock = threading.Lock()   # doit's thread workers share one client per scheduler
# this build's id, as workers tell builds apart: each gets compile servers of its own there (the modules a server
# imported are another build's sources: rules/compile/core.py, _hub_of); made in doit's process before it forks
# its workers (edge/dodo_tasks.py), so that every worker of one build sends the same
BUILD = uuid.uuid4().hex


def scheduler_address(executor: str) -> str:
    """dask://HOST:PORT (checked by rules/base/settings.py) -> tcp://HOST:PORT (the scheduler's address)."""
    return "tcp://" + executor.removeprefix(settings.DASK)


def compile_remote(target, root: str, timeout: float, executor: str, compile_into) -> isolate.Outcome:
    """compile_into(target, private_root, root, timeout, build) -> Outcome (the compile core's) run on a worker, in
    this build's compile servers there; its result is the artifact.Candidate the worker sends back, untrusted
    (checked by the installer as a cache entry is)."""
    start = time.monotonic()
    try:
        future = _client(executor).submit(run_on_worker, compile_into, target, root, timeout, BUILD, pure=False,
                                          retries=RETRIES)
        ok, seconds, result = future.result()
    except Exception as e:   # the cluster is unreachable, or the task's workers kept dying
        return isolate.Outcome(False, time.monotonic() - start,
                               error=f"on the Dask cluster {executor}: {type(e).__name__}: {e}")
    if not ok:
        return isolate.Outcome(False, seconds, error=result)
    return isolate.Outcome(True, seconds, result=result)


def run_on_worker(compile_into, target, root: str, timeout: float, build: str):
    """On a Dask worker: compile with a private out/ for its scratch files; (ok, seconds, candidate | error)."""
    from distributed import get_worker
    # inside the worker's own folder: Dask purges a killed worker's, where a finally here never runs
    scratch = Path(tempfile.mkdtemp(prefix="kforge-", dir=get_worker().local_directory))
    try:
        outcome = compile_into(target, scratch, root, timeout, build)
        if not outcome.ok:
            return False, outcome.seconds, outcome.error
        candidate = outcome.result
        return True, outcome.seconds, candidate._replace(
            result=candidate.result._replace(compiled_on=get_worker().address))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _client(executor: str):
    with _lock:
        if executor not in _clients:
            from distributed import Client
            _clients[executor] = Client(scheduler_address(executor), timeout=30)
        return _clients[executor]
