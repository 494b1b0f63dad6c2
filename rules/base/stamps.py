"""How kforge decides "is it current": a digest of an output's inputs is saved with it (a target's key in its
meta.json, a bundle's in out/.kforge/package-<arch>.json, a tuning table's in the table), and it is current while
the same digest comes out now.

Inputs enter a digest by content. A file's identity (inode, mtime, ctime, size) may stand for its content only
where a changed identity leads back to the content: the saved catalog (reloaded from the specs on any change) and
files only kforge writes, by rename. ctime makes it safe for files a user edits: no edit can set it back.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat


def digest(payload) -> str:
    """sha256 of the canonical JSON of payload (sorted keys, no spaces; tuples as lists)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()


def seal(meta: dict) -> str:
    """The sha256 of meta.json's other fields, written into it as "seal": one edited or damaged since its build
    is never current."""
    return digest({k: v for k, v in meta.items() if k != "seal"})


def identity(path: str, fd: int | None = None) -> list | None:
    """[inode, mtime_ns, ctime_ns, size] of a file (or of the open file fd), None when it is not there."""
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size]


def content(path: str) -> str | None:
    """The sha256 of a file's bytes, or of a folder's sorted entry names; None when it is neither or unreadable."""
    try:
        if os.path.isdir(path):
            return digest(sorted(os.listdir(path)))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO there never blocks the read
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):   # nor is a device read
                return None
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
