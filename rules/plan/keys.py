"""Action keys: one sha256 over everything a target's binary depends on.

The same key decides doit's up-to-date check (it is compared with the key saved in the artifact's meta.json)
and names the artifact's provenance: the remote cache looks artifacts up by it (rules/share/remote_cache.py).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import subprocess
from pathlib import Path

from kforge.base import stamps
from kforge.base.archs import ARCHS
from kforge.plan import amd_linker
from kforge.store.files import JsonState
from kforge_runtime import schema

# Environment variables that change what a compiler emits: every one with these prefixes, and Triton's knobs
# without one (triton 3.6's knobs.py and the list of cache-invalidating variables in its libtriton: each of these
# changed binaries built here, ptxas's options included). Cache, dump and log settings don't change them.
_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "AMDGCN_", "FLYDSL_")
_ENV_NAMES = {"DISABLE_LLVM_OPT", "DISABLE_MMA_V3", "DISABLE_MMA_V5", "DISABLE_PTXAS_OPT", "PTXAS_OPTIONS",
              "USE_IR_LOC", "ALLOW_LHS_TMEM_LAYOUT_CONVERSION"}
# TRITON_PTXAS*_PATH: which ptxas runs is in the key by its version line, not by where it lies (machines
# with ptxas elsewhere still share cache entries). TRITON_OVERRIDE_DIR: by its content (_override).
_ENV_IGNORED = {"TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH",
                "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
                "TRITON_CACHE_MANAGER", "TRITON_PRINT_AUTOTUNING", "TRITON_ALWAYS_COMPILE",
                "TRITON_STORE_BINARY_ONLY", "TRITON_KERNEL_DUMP", "TRITON_LIBCUDA_PATH", "MLIR_ENABLE_TIMING",
                "TRITON_CACHE_AUTOTUNING", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_REDIS_HOST", "TRITON_REDIS_PORT",
                "TRITON_REDIS_KEY_FORMAT", "FLYDSL_RUNTIME_CACHE_DIR", "FLYDSL_RUNTIME_ENABLE_CACHE", "FLYDSL_DUMP_DIR",
                "FLYDSL_AUTOTUNE_CACHE_DIR", "FLYDSL_GPU_ARCH"}   # FLYDSL_GPU_ARCH: kforge sets it per target


def compiler_env() -> tuple[tuple[str, str], ...]:
    found = [(k, v) for k, v in os.environ.items()
             if (k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES) and k not in _ENV_IGNORED]
    override = _override()
    return tuple(sorted(found + ([("TRITON_OVERRIDE_DIR content", override)] if override else [])))


def _override() -> str | None:
    """With TRITON_KERNEL_OVERRIDE on, Triton compiles the IR files of its override folder instead of its own:
    the sha256 of their names and contents (None when it is off)."""
    if os.environ.get("TRITON_KERNEL_OVERRIDE", "").strip().lower() not in ("1", "true", "on", "yes"):
        return None
    folder = Path(os.environ.get("TRITON_OVERRIDE_DIR") or
                  Path(os.environ.get("TRITON_HOME") or Path.home()) / ".triton" / "override")
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else ():
        digest.update(f"{path.relative_to(folder)}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


def ptxas_path(sm: int) -> Path | None:
    """The ptxas Triton uses for this SM (ptxas-blackwell from sm_100 on), honouring Triton's overrides."""
    name = "ptxas-blackwell" if sm >= 100 else "ptxas"
    override = os.environ.get(f"TRITON_{name.upper().replace('-', '_')}_PATH")
    if override and Path(override).is_file():
        return Path(override)
    tdir = amd_linker.triton_dir()
    default = tdir / "backends" / "nvidia" / "bin" / name if tdir else None
    return default if default and default.is_file() else None


class ToolVersions(JsonState):
    """`tool --version`'s last line, remembered by (path, size, mtime) in out/.kforge/tools.json because running
    a tool costs ~25 ms. Read while tasks are generated; saved by the reporter at the end of a run."""

    @staticmethod
    def well_shaped(entries: dict) -> bool:   # a version of another type would go into every key
        return all(isinstance(v, str) for v in entries.values())

    def __call__(self, tool: Path | None) -> str:
        if tool is None:
            return "missing"
        st = tool.stat()
        stamp = f"{tool}:{st.st_size}:{st.st_mtime_ns}"
        if stamp not in self.entries:
            try:
                out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=60)
                lines = out.stdout.strip().splitlines()
                line = lines[-1] if out.returncode == 0 and lines else f"unusable (exit {out.returncode})"
            except (OSError, subprocess.SubprocessError) as e:   # not executable, hangs: its targets say so
                line = f"unusable ({type(e).__name__})"
            self.entries[stamp] = line
            self.changed = True
        return self.entries[stamp]


@functools.lru_cache(maxsize=None)
def toolchain_fingerprint(toolchain: str, vendor: str, sm: int, cache_file: Path) -> tuple[tuple[str, str], ...]:
    """What identifies the compiler for one (toolchain, arch family). Writes nothing."""
    versions = ToolVersions.of(cache_file)
    parts = [(toolchain, package_version(toolchain))]
    if toolchain == "triton" and vendor == "nvidia":
        parts.append(("ptxas", versions(ptxas_path(sm))))
    if toolchain == "flydsl":   # "missing": its targets fail with the fix; the key notes the absence
        parts.append(("ld.lld", amd_linker.key_part(versions)))
    return tuple(parts)


def fingerprint_for(toolchain: str, arch: str, cache_file: Path) -> tuple[tuple[str, str], ...]:
    """toolchain_fingerprint for a target's toolchain and arch name."""
    a = ARCHS[arch]
    return toolchain_fingerprint(toolchain, a.vendor, a.target_arch if isinstance(a.target_arch, int) else 0,
                                 cache_file)


def action_key(payload: dict) -> str:
    """sha256 of the canonical JSON of everything that goes into a build (rules/plan/targets.py builds the payload)."""
    return stamps.digest({"schema": schema.ARTIFACT_SCHEMA, **payload})
