"""The doit action of a compile target: warm the toolchain once per process, compile in a warm child."""
from __future__ import annotations

import functools
import importlib
import os
import shutil
import tempfile
from pathlib import Path

from doit.exceptions import TaskFailed

from rules import artifact, isolate
from rules.targets import Target

# toolchain name (as in specs) -> module with warm(root), setup(arch) and compile_one((target, scratch)) -> dict
TOOLCHAIN_MODULES = {"triton": "rules.triton_compile"}
DEFAULT_TIMEOUT_S = 600.0

# This process's compile server and the (toolchain, arch) it serves. One at a time keeps memory at one
# compiler per doit worker; targets come arch by arch within a family, so switching is rare and costs a fork.
_server: tuple[tuple[str, str], isolate.Server] | None = None


def compile_target(target: Target, root: str, timeout: float = DEFAULT_TIMEOUT_S):
    """doit python-action: returns saved values on success, TaskFailed (naming target and config) on failure."""
    backend = importlib.import_module(TOOLCHAIN_MODULES[target.toolchain])
    try:
        backend.warm(root)
    except Exception as e:   # a toolchain that cannot even import fails every target clearly
        return _fail(target, f"the {target.toolchain} toolchain is not usable in this environment: {e}")
    scratch_root = Path(target.out_dir).parents[2] / ".kforge" / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f"{target.arch}-{target.kernel}-", dir=scratch_root)
    try:
        outcome = _server_for(target, backend).call((target, scratch), timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not outcome.ok:
        return _fail(target, outcome.error)
    return {"seconds": round(outcome.seconds, 4), **outcome.result}


def _server_for(target: Target, backend) -> isolate.Server:
    global _server
    wanted = (target.toolchain, target.arch)
    if _server is None or _server[0] != wanted:
        if _server is not None:
            _server[1].close()
        _server = (wanted, isolate.Server(backend.compile_one, functools.partial(backend.setup, target.arch)))
    return _server[1]


def _fail(target: Target, error: str) -> TaskFailed:
    message = (f"{target.name} failed\n  spec: {target.spec_path}\n  config: {dict(target.config)}\n"
               f"  error: {error}\n  retry alone: doit {target.name}")
    artifact.write_error(Path(target.out_dir), target.key, message)
    return TaskFailed(message)


def timeout_from_env() -> float:
    return float(os.environ.get("KFORGE_COMPILE_TIMEOUT", DEFAULT_TIMEOUT_S))
