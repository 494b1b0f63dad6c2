"""How kforge decides "is it current", for every output it makes: a digest of the output's inputs is saved
with the output, and the output is current while the same digest comes out now.

Inputs enter a digest by content (sources, specs, tool versions, binaries' sha256). A file's identity (inode,
mtime, ctime, size) may stand for its content only where a changed identity leads back to the content: the
saved catalog (plan/catalog.py), reloaded from the specs on any change, and files that only kforge writes, and
only ever by rename (meta.json, binaries, error.txt). ctime is what makes identity safe for files a user
edits: any write or utime sets it to the current time, and nothing but the clock can set it back, so an
in-place edit that keeps the size and restores the mtime still changes the identity. Where the digests are saved:
  - a compile target: its action key, in its meta.json (rules/plan/keys.py), with the identities of meta.json
    and its binary remembered in out/.kforge/built-keys.json so a no-op run need not re-hash (store/artifact.py);
  - a bundle: out/.kforge/package-<arch>.json (ship/package.py);
  - a tuning table: the table's own "key" (tune/tasks.py).
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
    """The sha256 of meta.json's other fields, which kforge writes into it as "seal": a meta.json edited or
    damaged after its build (a launch-relevant field changed, say) no longer matches and is never current."""
    return digest({k: v for k, v in meta.items() if k != "seal"})


def identity(path: str, fd: int | None = None) -> list | None:
    """[inode, mtime_ns, ctime_ns, size] of a file (or of the open file fd), None when it is not there."""
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size]


def content(path: str) -> str | None:
    """What a file holds, for a stamp by content (the catalog's kept copies, rules/plan/catalog.py): the sha256 of its
    bytes, or of a folder's sorted entry names; None when it is neither there nor readable."""
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
