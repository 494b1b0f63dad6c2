"""What a compile backend is and hands back, and the table a backend's module enters it in when core.backend_of
imports it: below the core and every backend, so neither reaches up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


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
class Backend:
    """One toolchain's lowering, as the compile core drives it."""
    lower: Callable[..., Lowered]   # (target, scratch dir) -> Lowered, in the compile server; writes no file
    warm: Callable[[str], None]     # (root): import the compiler and pay its one-time set-up, in the build's hub
    # True when the compiler fixes its arch per process (FlyDSL reads it from the environment): one server per
    # arch, set up with setup(arch); False (Triton): one server for every arch
    arch_per_process: bool
    setup: Callable[[str], None] | None = None   # (arch): once in each server of an arch_per_process backend
    # True when lower() imports the target's module by its name (both real backends): the compile core then
    # imports it first, timed as the server's "import", and knows a failed import when it sees one
    imports_module: bool = False
    # (target) -> the toolchain's own digest of what the kernel compiles from (Triton's JIT cache key), after the
    # import: two builds of one key whose sources digest alike give the same code (core.py's early cutoff)
    source_key: Callable | None = None


BACKENDS: dict[str, Backend] = {}   # toolchain (as in specs) -> its backend, set by its module as it is imported
