"""Deleting inside out/: artifact directories that belong to no target, and removal that cannot leave out/.

`doit clean` and `doit prune` delete artifact directories out/<arch>/<kernel>/<config_id>/. A path is deleted
only when it lies strictly inside out/ once its parent directories are resolved; a symlink is removed as a
link, never followed; directories left empty are removed up to, never including, out/ itself.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from kforge.archs import ARCHS


class OutsideOut(ValueError):
    pass


def remove_artifact_dir(out: Path, directory: Path) -> bool:
    """Delete one artifact directory (or a symlink standing in its place) and the parents it leaves empty.
    True if something was deleted; OutsideOut if the path is not strictly inside out/."""
    out = out.resolve()
    path = directory.parent.resolve() / directory.name   # the parents resolved, the entry itself not followed
    if out not in path.parents:
        raise OutsideOut(f"{directory} is not inside {out}: kforge deletes nothing outside out/")
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        return False
    for parent in path.parents:
        if parent == out or out not in parent.parents:
            break
        try:
            parent.rmdir()   # only when empty
        except OSError:
            break
    return True


def orphaned(out: Path, current: Iterable[str], archs: Iterable[str] | None = None) -> list[Path]:
    """Entries out/<arch>/<kernel>/<config_id> that are the artifact directory of no current target (configs
    dropped from a sweep, deleted specs), for the given archs (default: every arch kforge knows). Cheap: three
    levels of os.scandir; symlinked arch or kernel directories are not entered."""
    current = {os.path.normpath(p) for p in current}
    found = []
    for arch in sorted(set(archs or ARCHS) & set(ARCHS)):
        for kernel in _subdirs(out / arch):
            with os.scandir(kernel) as entries:
                for entry in entries:
                    if (entry.is_dir() or entry.is_symlink()) and os.path.normpath(entry.path) not in current:
                        found.append(Path(entry.path))
    return sorted(found)


def _subdirs(directory: Path) -> list[str]:
    if directory.is_symlink():
        return []
    try:
        with os.scandir(directory) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
