"""Find an ld.lld that can link AMD code objects for FlyDSL, with or without a ROCm install.

FlyDSL links with $ROCM_PATH/llvm/bin/ld.lld. A ROCm install's linker is used as is; otherwise a
system lld (Debian's lld-19) is offered to FlyDSL through a small folder that looks like a ROCm tree.
Code object v6 needs lld 17 or newer (Debian's lld 14 fails with "unknown abi version").
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

MIN_MAJOR = 17
NEWEST_GUESS = 22
INSTALL_HINT = ("install a ROCm toolkit (and set ROCM_PATH), or Debian/Ubuntu's lld: "
                "`sudo apt-get install lld-19` (any lld >= 17 works)")


class LinkerMissing(RuntimeError):
    pass


def candidates() -> list[Path]:
    """Where to look, best first: KFORGE_LD_LLD if set (then only it), ROCm's own linker, versioned system
    lld, plain ld.lld on PATH."""
    if os.environ.get("KFORGE_LD_LLD"):
        return [Path(os.environ["KFORGE_LD_LLD"])]
    found: list[Path] = []
    for rocm in filter(None, (os.environ.get("ROCM_PATH"), "/opt/rocm")):
        found.append(Path(rocm) / "llvm" / "bin" / "ld.lld")
    for major in range(NEWEST_GUESS, MIN_MAJOR - 1, -1):
        found.append(Path(f"/usr/lib/llvm-{major}/bin/ld.lld"))
        which = shutil.which(f"ld.lld-{major}")
        if which:
            found.append(Path(which))
    which = shutil.which("ld.lld")
    if which:
        found.append(Path(which))
    return list(dict.fromkeys(found))


def version(path: Path) -> tuple[int, str] | None:
    """(major, version line) of a runnable lld, or None."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"LLD (\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return (int(m[1]), out.stdout.strip().splitlines()[0]) if out.returncode == 0 and m else None


def find() -> Path:
    """The first usable ld.lld, or LinkerMissing saying what was tried and how to get one."""
    tried = []
    for path in candidates():
        if not path.exists():
            if os.environ.get("KFORGE_LD_LLD"):
                tried.append(f"{path} (KFORGE_LD_LLD: no such file)")
            continue
        v = version(path)
        if v and v[0] >= MIN_MAJOR:
            return path
        tried.append(f"{path} ({v[1] if v else 'does not run'})")
    seen = "; found but unusable: " + ", ".join(tried) if tried else ""
    raise LinkerMissing(f"FlyDSL needs ld.lld (LLVM {MIN_MAJOR} or newer) to link AMD code objects and none "
                        f"was found{seen}. Fix: {INSTALL_HINT}")


def rocm_root_for(linker: Path, shim_dir: Path) -> Path:
    """A ROCM_PATH under which FlyDSL finds `linker` as llvm/bin/ld.lld."""
    if linker.parent.name == "bin" and linker.parent.parent.name == "llvm" and linker.name == "ld.lld":
        return linker.parent.parent.parent   # a ROCm tree already
    target = shim_dir / "llvm" / "bin" / "ld.lld"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.is_symlink() and os.readlink(target) == str(linker)):
        tmp = target.with_name(f".ld.lld.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(linker)
        os.replace(tmp, target)
    return shim_dir
