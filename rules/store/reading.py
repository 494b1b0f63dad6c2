"""Reading back a file kforge wrote under out/, as untrusted data: out/ may come from another kforge, a restored CI
cache or an archive. Below every other module of the store (the guard reads what it may delete with it)."""
from __future__ import annotations

import errno
import os
import stat


READ_LIMIT = 256 << 20   # bytes of any one file kforge reads back from out/ (the loader's limit on a binary)


class NotAFile(OSError):
    """What lies at the place of a file kforge wrote in out/ is not one it can read back (a link, a FIFO, a
    device, a folder, a file over READ_LIMIT): an OSError, so that every reader treats it as unreadable."""


def opened(path, limit: int = READ_LIMIT):
    """A file kforge wrote under out/, opened for reading as untrusted data: out/ may come from another kforge, a
    restored CI cache or an archive. Never through a link (a state file leading out of out/), never blocking on
    a FIFO nor reading a device, never more than `limit` bytes: NotAFile says which. FileNotFoundError as open's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotAFile(errno.ELOOP, "is a symbolic link, not a file kforge wrote", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            from kforge_runtime.bundle import file_kind   # the one wording; the loader imported on this error only
            raise NotAFile(errno.EINVAL, f"is {file_kind(st.st_mode)}, not a file kforge wrote", str(path))
        if st.st_size > limit:
            raise NotAFile(errno.EFBIG, f"is {st.st_size} bytes, over the {limit} kforge reads", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def printable(text: str, keep: str = "") -> str:
    """Text read back from out/ (untrusted: an error.txt or a folder name from a restored cache) as it may reach a
    terminal: each control character (an escape sequence's ESC, a carriage return) but those in `keep` is shown as
    U+FFFD. A text with none (the usual case, a message of up to a MiB) is returned as it is, checked at C speed."""
    if text.translate(dict.fromkeys(map(ord, keep))).isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else "\ufffd" for c in text)


def read_bytes(path, limit: int = READ_LIMIT) -> bytes:
    """The bytes of a file kforge wrote under out/ (opened()), at most `limit` of them."""
    with opened(path, limit) as f:
        return f.read(limit + 1)
