"""Replacing a file atomically: write a temp file beside it, then rename, so readers see the old file or the new
one, never half of one. The temp name has the pid and a random part (two threads of one process, or two
processes, may replace the same file at once), and a failed write leaves no temp file behind."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path

from kforge.store.guard import guard


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


def write_inside(out: Path, path: Path, data: bytes, mode: int | None = None) -> None:
    """atomic_write of one of kforge's files under out/, its directory created: never through a link that
    leads outside out/ (out_dir.guard, OutsideOut)."""
    guard(out, path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, mode)


def atomic_symlink(path: Path, target: Path) -> None:
    with replacing(path) as tmp:
        os.symlink(target, tmp)


class JsonState:
    """A JSON object kept in out/.kforge/ across runs (the key index, tool versions): one instance per file
    in a process, read once while tasks are generated, saved by the reporter at the end of a run if it changed.
    An unreadable file, or JSON that is not an object, counts as empty."""
    _open: dict[tuple[type, Path], "JsonState"] = {}

    @classmethod
    def of(cls, path: Path):
        if (cls, path) not in JsonState._open:
            JsonState._open[(cls, path)] = cls(path)
        return JsonState._open[(cls, path)]

    def __init__(self, path: Path):
        self.path = path
        try:
            found = json.loads(path.read_bytes())
        except (OSError, ValueError):
            found = {}
        self.entries: dict = found if isinstance(found, dict) else {}
        self.changed = False

    def save(self) -> None:
        if self.changed:   # out/.kforge/<file>: out/ is two levels up
            write_inside(self.path.parents[1], self.path, json.dumps(self.entries, separators=(",", ":")).encode())
            self.changed = False
