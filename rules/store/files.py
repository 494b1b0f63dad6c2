"""Replacing a file atomically: write a temp file beside it, then rename, so readers see the old file or the new
one, never half of one. The temp name has the pid and a random part (two threads of one process, or two
processes, may replace the same file at once), and a failed write leaves no temp file behind."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
from pathlib import Path

from kforge.store.guard import NotAFile, guard, opened, read_bytes  # noqa: F401  (files.opened, files.read_bytes)


@contextlib.contextmanager
def replacing(path: Path):
    """Yields a temp path beside `path`; once the block has written it, it replaces `path`. Every caller writes
    kforge's own files in out/, so a directory found where the file belongs (a damaged out/) is removed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)


def write_inside(out: Path, path: Path, data: bytes) -> None:
    """atomic_write of one of kforge's files under out/, its directory created: never through a link that
    leads outside out/ (guard.guard, OutsideOut)."""
    guard(out, path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def remove_entry(path: Path) -> None:
    """Remove one of kforge's files if it is there (a link as a link); a directory found where the file belongs
    (a damaged out/) goes with what it holds."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        shutil.rmtree(path)


def atomic_symlink(path: Path, target: Path) -> None:
    with replacing(path) as tmp:
        os.symlink(target, tmp)


def read_state(path: Path, well_shaped) -> dict | None:
    """The JSON object a state file of out/.kforge/ holds, None when there is none; one that cannot be read, is not
    JSON, or is not a JSON object of the shape this kforge writes (well_shaped) is dropped now with one warning (a
    link as a link), so that it is rebuilt and said once, not at every command until a build replaces it."""
    try:
        found = json.loads(read_bytes(path))
        why = None if isinstance(found, dict) and well_shaped(found) else "is not in the shape this kforge writes"
    except (FileNotFoundError, NotADirectoryError):   # NotADirectoryError: out/.kforge a file (run_lock says so)
        return None
    except NotAFile as e:
        why = e.strerror
    except OSError as e:
        why = f"cannot be read ({e.strerror or e})"
    except (ValueError, RecursionError):
        why = "is not JSON (cut short or damaged)"
    if why is not None:
        sys.stderr.write(f"kforge: {path} {why}; it is dropped and rebuilt\n")
        with contextlib.suppress(OSError, ValueError):   # read-only out/, or a link on the way out of it
            remove_entry(guard(Path(path).parents[1], Path(path)))
        return None
    return found


class JsonState:
    """A JSON object kept in out/.kforge/ across runs (the key index, tool versions): one instance per file in a
    process, read once while tasks are generated (read_state: untrusted, dropped unless well_shaped), saved by
    the reporter at the end of a run if it changed."""
    _open: dict[tuple[type, Path], "JsonState"] = {}

    @classmethod
    def of(cls, path: Path):
        if (cls, path) not in JsonState._open:
            JsonState._open[cls, path] = cls(path)
        return JsonState._open[cls, path]

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict = read_state(path, self.well_shaped) or {}
        self.changed = False

    @staticmethod
    def well_shaped(entries: dict) -> bool:
        """Whether a saved object has the shape the subclass writes (each checks its own)."""
        return True

    def save(self) -> None:
        if self.changed:   # out/.kforge/<file>: out/ is two levels up
            write_inside(self.path.parents[1], self.path, json.dumps(self.entries, separators=(",", ":")).encode())
            self.changed = False
