"""Writing and deleting inside out/ only: the one guard every write or removal under out/ passes, and the
artifact directories that belong to no target.

guard(out, path) is the check: a path is written or deleted only when its parent directories, links followed,
lie inside out/ (out/ itself may be a link: the whole tree is then elsewhere, as the user chose). The entry
itself is never followed: files are replaced by rename and links unlinked as links. So a link planted under
out/ (out/dist leading to a home directory, say) never carries a write or a delete outside it.
`doit clean`, `prune` and `forget` delete kforge's own files in artifact directories out/<arch>/<kernel>/<config_id>/
(rules/store/owned.py says which), never a user's file placed there; a directory that then holds something else is
kept, said in one line; directories left empty are removed up to, never including, out/ itself.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from kforge.base.archs import ARCHS
from kforge.store import owned
from kforge.store.reading import printable
from kforge_runtime.schema import ERROR, META


class OutsideOut(ValueError):
    pass


def guard(out: Path, path: Path) -> Path:
    """`path` itself, when writing or deleting it stays inside out/ (see the module's docstring); else OutsideOut
    in one line naming the link that leads out and the fix."""
    root = Path(out).resolve()
    parent = Path(path).parent.resolve()
    if parent == root or root in parent.parents:
        return Path(path)
    raise OutsideOut(f"{_leading_link(Path(out), Path(path))} leads outside out/ ({parent}); kforge writes and "
                     f"deletes nothing outside out/: remove the link and run again")


def _leading_link(out: Path, path: Path) -> str:
    """The first link on the way from out/ to `path` that leads outside out/ (or `path` when none does)."""
    root = out.resolve()
    try:
        parts = path.relative_to(out).parts[:-1]
    except ValueError:   # not under out/ at all
        return str(path)
    step = out
    for part in parts:
        step = step / part
        if step.is_symlink() and not (step.resolve() == root or root in step.resolve().parents):
            return f"{step} (a symbolic link)"
    return str(path)


def remove_file(out: Path, path: Path) -> None:
    """Delete a file of kforge's under out/ if it is there (a link is removed as a link): guarded."""
    guard(out, path).unlink(missing_ok=True)


def remove_artifact_dir(out: Path, directory: Path) -> bool:
    """Delete one artifact directory's files that kforge wrote (owned.kforge_files; a symlink or file standing in
    the directory's place goes as an entry), then the directory and the parents it leaves empty. A directory that
    still holds something (a user's file placed inside) is kept, said on stderr in one line. True if something
    was deleted; OutsideOut if the path is not strictly inside out/."""
    guard(out, directory)
    out = out.resolve()
    path = directory.parent.resolve() / directory.name   # the parents resolved, the entry itself not followed
    if out not in path.parents:   # out/ itself
        raise OutsideOut(f"{directory} is not inside {out}: kforge deletes nothing outside out/")
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        mine = owned.kforge_files(path)
        if not mine:
            return False
        for file in mine:
            file.unlink(missing_ok=True)
        try:
            path.rmdir()
        except OSError:   # not empty: what is left is not kforge's
            left = sorted(os.listdir(path)) if path.is_dir() else []
            shown = ", ".join(printable(str(n)) for n in left[:3]) + (" ..." if len(left) > 3 else "")
            sys.stderr.write(f"kforge: kept {printable(str(directory))}: it holds files kforge did not write "
                             f"({shown}); kforge's own were deleted, delete the rest yourself if it is not yours\n")
            return True
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


def orphaned(layout, current: Iterable[str], archs: Iterable[str] | None = None) -> list[Path]:
    """The artifact directories in out/ (layout.artifact_dirs) that are no current target's (configs dropped
    from a sweep, deleted specs), for the given archs (default: every arch kforge knows); only those kforge
    wrote (written_by_kforge): a folder a user keeps there is never an orphan (no_targets lists those too)."""
    return no_targets(layout, current, archs)[0]


def no_targets(layout, current: Iterable[str], archs: Iterable[str] | None = None) -> tuple[list[Path], list[Path]]:
    """The entries at an artifact's place in out/ that no current target owns: (those kforge wrote, the others,
    which prune keeps), each sorted."""
    current = {os.path.normpath(p) for p in current}
    found = layout.artifact_dirs(sorted(set(archs or ARCHS) & set(ARCHS)))
    kforges, others = [], []
    for path in sorted(Path(p) for p in found if os.path.normpath(p) not in current):
        (kforges if written_by_kforge(path) else others).append(path)
    return kforges, others


def written_by_kforge(directory: Path) -> bool:
    """Whether an entry at an artifact's place is one kforge wrote: a real directory holding its meta.json (sealed
    as kforge seals it) or a failure's error.txt (first line "key: "), as rules/store/owned.py tells them. A link,
    or a folder without either (a user's saved profile, or one holding a meta.json or error.txt of its own), is
    someone else's."""
    return not directory.is_symlink() and directory.is_dir() and \
        (owned.kforge_meta(directory / META) is not None or owned.kforge_error(directory / ERROR))
