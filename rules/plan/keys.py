"""Action keys: one sha256 over everything a target's binary depends on. It decides doit's up-to-date check
(against the key in the artifact's meta.json) and names the artifact in the caches (rules/share/remote_cache.py).
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
from pathlib import Path

from kforge.base import stamps
from kforge.base.archs import ARCHS
from kforge.plan import amd_linker
from kforge.store.files import JsonState
from kforge_runtime import schema, source_key

# The environment variables that change what a compiler emits (kforge_runtime.schema: serving compares them too).
compiler_env = schema.code_environment


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
    """`tool --version`'s last line, remembered by (path, size, mtime) in out/.kforge/tools.json (a run costs
    ~25 ms); saved by the reporter at the end of a run."""

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
    a = ARCHS[arch]
    return toolchain_fingerprint(toolchain, a.vendor, a.target_arch if isinstance(a.target_arch, int) else 0,
                                 cache_file)


def action_key(payload: dict) -> str:
    """sha256 of a build's payload (rules/plan/targets.py) with the version of meta.json's triton_source_key: a
    target built before that changed is built again."""
    return stamps.digest({"schema": schema.ARTIFACT_SCHEMA, "source_key": source_key.KEY_VERSION, **payload})
