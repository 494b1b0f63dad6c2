"""Find an ld.lld that can link AMD code objects for FlyDSL (which runs $ROCM_PATH/llvm/bin/ld.lld), with or
without ROCm: ROCm's own, else a system lld, else the LLD inside Triton's libtriton (rules/plan/triton_lld.py: a
pip install alone builds FlyDSL targets), offered through a small folder that looks like a ROCm tree. Code object
v6 needs lld 17 or newer (Debian's lld 14 fails with "unknown abi version").
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from kforge.base import settings
from kforge.plan import triton_lld
from kforge.store.files import atomic_symlink, atomic_write
from kforge.store.guard import guard

TRITON = "triton"   # KFORGE_LD_LLD=triton (the setting ld_lld, rules/base/settings.py): the LLD inside Triton's libtriton
MIN_MAJOR = 17
NEWEST_GUESS = 22
INSTALL_HINT = ("set KFORGE_LD_LLD=triton (the LLD inside Triton's libtriton, which kforge installs), or point it "
                "at a working ld.lld >= 17 (ROCm's llvm/bin/ld.lld, or Debian/Ubuntu's lld: "
                "`apt-get install lld-19` as root)")


class LinkerMissing(RuntimeError):
    pass


def candidates(chosen: str | None) -> list[Path]:
    """Where to look, best first: the ld_lld setting (KFORGE_LD_LLD) if set to a path (then only it), ROCm's own
    linker, versioned system lld, plain ld.lld on PATH (Triton's LLD, find's last resort, is no file to look for)."""
    if chosen:
        return [] if chosen == TRITON else [Path(chosen)]
    found = [Path(rocm, "llvm", "bin", "ld.lld") for rocm in filter(None, (os.environ.get("ROCM_PATH"), "/opt/rocm"))]
    for major in range(NEWEST_GUESS, MIN_MAJOR - 1, -1):
        found += [f"/usr/lib/llvm-{major}/bin/ld.lld", shutil.which(f"ld.lld-{major}")]
    found.append(shutil.which("ld.lld"))
    return list(dict.fromkeys(Path(p) for p in found if p))


def version(path: Path) -> tuple[int, str] | None:
    """(major, version line) of a runnable lld, or None."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"LLD (\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return (int(m[1]), out.stdout.strip().splitlines()[0]) if out.returncode == 0 and m else None


def find(kforge_dir: Path) -> Path:
    """The first usable ld.lld; else Triton's, as a script under kforge_dir; else LinkerMissing saying what was
    tried and how to get one. KFORGE_LD_LLD=triton asks for Triton's alone (the same linker on every machine)."""
    chosen = settings.get("ld_lld")   # read once: find() and key_part() each decide from one value
    path, tried = _system_linker(chosen)
    if path is not None:
        return path
    if chosen in (None, TRITON):
        guard(kforge_dir.parent, kforge_dir / "triton-lld" / "ld.lld")   # kforge_dir: out/.kforge
        script = triton_lld_script(kforge_dir / "triton-lld")
        if script is not None:
            return script
        tried.append("Triton's LLD (triton is not installed, or has no libtriton)")
    seen = "; found but unusable: " + ", ".join(tried) if tried else ""
    raise LinkerMissing(f"FlyDSL needs ld.lld (LLVM {MIN_MAJOR} or newer) to link AMD code objects and none "
                        f"was found{seen}. Fix: {INSTALL_HINT}")


def key_part(version_of) -> str:
    """The `--version` line of the linker find() would pick, for action keys, writing nothing ("missing": none)."""
    chosen = settings.get("ld_lld")
    path, _ = _system_linker(chosen)
    if path is not None:
        return version_of(path)
    label = _triton_label() if chosen in (None, TRITON) else None
    return triton_lld.version_line(label) if label else "missing"


def _system_linker(chosen: str | None) -> tuple[Path | None, list[str]]:
    """(the first usable candidate or None, what was found but refused)."""
    tried = []
    for path in candidates(chosen):
        if not path.exists():
            if chosen:
                tried.append(f"{path} (KFORGE_LD_LLD: no such file)")
            continue
        v = version(path)
        if v and v[0] >= MIN_MAJOR:
            return path, tried
        tried.append(f"{path} ({v[1] if v else 'does not run'})")
    return None, tried


def triton_dir() -> Path | None:
    """The folder of the installed triton package (its libtriton, its ptxas), found without importing it."""
    spec = importlib.util.find_spec("triton")
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _libtriton() -> Path | None:
    folder = triton_dir()
    return folder / "_C" / "libtriton.so" if folder and (folder / "_C" / "libtriton.so").is_file() else None


def _triton_label() -> str | None:
    return f"triton=={importlib.metadata.version('triton')}" if _libtriton() else None


def triton_lld_script(directory: Path) -> Path | None:
    """directory/ld.lld: a shell script running triton_lld.py with this Python and Triton's libtriton (None
    without Triton), rewritten only when its text changes."""
    libtriton, label = _libtriton(), _triton_label()
    if libtriton is None:
        return None
    runner = Path(triton_lld.__file__).resolve()
    text = ("#!/bin/sh\n# written by kforge (rules/plan/amd_linker.py): FlyDSL's ld.lld is the LLD in Triton's libtriton\n"
            f"exec {shlex.join([sys.executable, '-I', str(runner), str(libtriton), label])} \"$@\"\n")
    script = directory / "ld.lld"
    if not (script.is_file() and script.read_text() == text):
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(script, text.encode(), mode=0o755)
    return script


def rocm_root_for(linker: Path, shim_dir: Path) -> Path:
    """A ROCM_PATH under which FlyDSL finds `linker` as llvm/bin/ld.lld."""
    if linker.parent.name == "bin" and linker.parent.parent.name == "llvm" and linker.name == "ld.lld":
        return linker.parent.parent.parent   # a ROCm tree already
    target = guard(shim_dir.parents[1], shim_dir / "llvm" / "bin" / "ld.lld")   # shim_dir: out/.kforge/rocm-shim
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.is_symlink() and os.readlink(target) == str(linker)):
        atomic_symlink(target, linker)
    return shim_dir
