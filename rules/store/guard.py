"""What kforge may read, write and delete under out/: out/ may come from another kforge, a restored CI cache or an
archive, and a link planted in it must never carry a write or a delete outside it.

Reading back (opened): never through a link, never blocking on a FIFO nor reading a device, bounded; text from it
reaches a terminal without control characters (printable). Writing: every write or removal passes guard(out, path):
a path's parent directories, links followed, lie inside out/ (itself maybe a link, as the user chose); the entry
itself is never followed (files replaced by rename, links unlinked as links). Deleting (`doit clean`, `prune`,
`forget`): only what kforge wrote in an artifact folder (kforge_files); a folder holding anything else is kept, said
in one line; folders left empty go up to, never including, out/; one that cannot be deleted (immutable, another
owner's) is one line too (NotRemoved), never a traceback.

Scratch: compilers' temp files live under out/.kforge/tmp/, never the system's temp directory: a folder per compile,
<pid of the run's doit master>-<what>-<random>, removed after it; a killed compile's go when the master exits
(atexit), a run killed outright's when the next run starts.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kforge.base.archs import ARCHS
from kforge.base.stamps import seal
from kforge_runtime import schema
from kforge_runtime.schema import ERROR, META

READ_LIMIT = 256 << 20   # bytes of any one file kforge reads back from out/ (the loader's limit on a binary)
META_LIMIT = 64 << 20   # a meta.json past this is no artifact's (its inputs list runs ~100 bytes a file read)
KEY_LINE = re.compile(rb"key: [0-9a-f]{64}")   # error.txt's first line as write_error writes it: an action key
BINARY_SUFFIXES = tuple(sorted({f".{a.binary_ext}" for a in ARCHS.values()}))
TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp")   # rules/store/files.py's replacing()


# --- reading back -----------------------------------------------------------------------------------------------

class NotAFile(OSError):
    """What lies at the place of a file kforge wrote in out/ is not one it can read back (a link, a FIFO, a
    device, a folder, a file over READ_LIMIT): an OSError, so that every reader treats it as unreadable."""


def opened(path, limit: int = READ_LIMIT):
    """A file kforge wrote under out/, opened for reading as untrusted data (see the module's docstring): NotAFile
    for a link, a FIFO, a device, a folder or more than `limit` bytes; FileNotFoundError as open's."""
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


def read_bytes(path, limit: int = READ_LIMIT) -> bytes:
    """The bytes of a file kforge wrote under out/ (opened()), at most `limit` of them."""
    with opened(path, limit) as f:
        return f.read(limit + 1)


def json_of(data):
    """json.loads of bytes read back from out/ or a cache, which anyone may have written: JSON nested deeper than
    the parser recurses is a ValueError like any other damage, not a RecursionError past every caller's handler."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def printable(text: str, keep: str = "") -> str:
    """Text read back from out/ as it may reach a terminal: each control character (an escape sequence's ESC, a
    carriage return) but those in `keep` shown as U+FFFD. A text with none is checked at C speed."""
    if text.translate(dict.fromkeys(map(ord, keep))).isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else "\ufffd" for c in text)


# --- which files are kforge's -----------------------------------------------------------------------------------

def kforge_meta(path: Path) -> dict | None:
    """The meta.json at `path` when kforge wrote it, else None: a JSON object whose seal matches its fields (one
    without a seal must have every field kforge writes, with its type), naming a binary by a plain name."""
    try:
        with opened(path, META_LIMIT) as f:
            meta = json.loads(f.read(META_LIMIT + 1))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or not schema.is_plain_name(meta.get("binary")):
        return None
    sealed = meta["seal"] == seal(meta) if "seal" in meta else schema.wrong_field(meta, schema.ARTIFACT_FIELDS) is None
    return meta if sealed else None


def kforge_error(path: Path) -> bool:
    """Whether the error.txt at `path` is one kforge wrote: a file whose first line is "key: <key>", the key a
    sha256 (rules/plan/keys.py's action_key) as every target's is."""
    try:
        with opened(path) as f:
            head = f.read(4096).split(b"\n", 1)
    except OSError:
        return False
    return len(head) == 2 and KEY_LINE.fullmatch(head[0]) is not None


def kforge_files(directory: Path) -> list[Path]:
    """The files in `directory` that kforge wrote, never a link: its meta.json and the binary it names, its error.txt,
    a killed write's temp file, and beside kforge's error.txt with no meta.json of kforge's, an ELF .cubin or
    .hsaco (an older kforge kept the binary on failure)."""
    found = []
    meta = kforge_meta(directory / META)
    if meta is not None:
        found += [directory / META, directory / meta["binary"]]
    failed = kforge_error(directory / ERROR)
    if failed:
        found.append(directory / ERROR)
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    found += [directory / n for n in names if TEMP_NAME.fullmatch(n)]
    if failed and meta is None:
        found += [directory / n for n in names if n.endswith(BINARY_SUFFIXES) and _elf(directory / n)]
    return [p for p in dict.fromkeys(found) if _plain_file(p)]


def _plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _elf(path: Path) -> bool:
    try:
        with opened(path) as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


# --- writing and deleting ---------------------------------------------------------------------------------------

class OutsideOut(ValueError):
    pass


class NotRemoved(OSError):
    """What kforge would delete under out/ cannot be deleted (an immutable folder, a read-only mount, a root-owned
    out/ that Docker left): an OSError as the failed unlink was (a compile's handler of OSError says it), in one
    line naming the folder and the fix."""


def guard(out: Path, path: Path) -> Path:
    """`path` itself, when writing or deleting it stays inside out/ (see the module's docstring); else OutsideOut
    in one line naming the link that leads out and the fix."""
    root = _resolved(Path(out))
    parent = _resolved(Path(path).parent)
    if parent == root or root in parent.parents:
        return Path(path)
    raise OutsideOut(f"{_leading_link(Path(out), Path(path))} leads outside out/ ({parent}); kforge writes and "
                     f"deletes nothing outside out/: remove the link and run again")


def _resolved(path: Path) -> Path:
    """path.resolve(); OutsideOut where symbolic links on the way form a loop (Python's RuntimeError, or ELOOP)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as e:
        raise OutsideOut(f"{path}: symbolic links on the way to it form a loop ({e}); kforge writes and deletes "
                         f"nothing there: remove the link and run again") from None


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


class Outside:
    """Which targets' artifact folders lead outside out/ through a link (out/<arch>, its kernel folder or the folder
    itself a link): never read through, the target failed (its compile refuses to write there); the compile tasks
    and the package ask. One scan a folder for links, a set lookup a target: a no-op run asks for thousands."""

    def __init__(self, out: Path):
        self.out = str(out)
        self._kernels: dict[tuple[str, str], set[str] | None] = {}   # the links in a kernel folder; None: one on
        self._links: dict[str, set[str]] = {}                        # the way to it

    def why(self, t) -> str | None:
        """The line naming the link that leads the target's folder out, or None."""
        linked = self._kernels.get((t.arch, t.kernel), ())
        if linked == ():
            linked = self._kernels[t.arch, t.kernel] = None if t.arch in self._in(self.out) or \
                t.kernel in self._in(os.path.join(self.out, t.arch)) else \
                self._in(os.path.join(self.out, t.arch, t.kernel))
        if linked is None or t.config_id in linked:
            try:
                guard(Path(self.out), Path(t.meta_path))   # every link on the way followed
            except OutsideOut as e:
                return str(e)
        return None

    def _in(self, folder: str) -> set[str]:
        """The names of the links in folder (none where it is not there)."""
        if folder not in self._links:
            try:
                with os.scandir(folder) as entries:
                    self._links[folder] = {e.name for e in entries if e.is_symlink()}
            except OSError:
                self._links[folder] = set()
        return self._links[folder]


def remove_file(out: Path, path: Path) -> None:
    """Delete a file of kforge's under out/ if it is there (a link is removed as a link): guarded; NotRemoved (one
    line) where it cannot be."""
    _delete(guard(out, path))


def remove_artifact_dir(out: Path, directory: Path) -> bool:
    """Delete one artifact directory's files that kforge wrote (a link or file in its place goes as an entry), then
    the directory and the parents it leaves empty; one holding a user's file is kept, said on stderr. True if
    something was deleted; OutsideOut if the path is not strictly inside out/; NotRemoved (one line) where a file
    or the folder cannot be deleted, with what could be deleted gone and meta.json or error.txt kept; nothing is
    deleted where the folder's parent cannot be written (the folder would be left empty, no longer kforge's)."""
    guard(out, directory)
    out = _resolved(out)
    path = _resolved(directory.parent) / directory.name   # the parents resolved, the entry itself not followed
    if out not in path.parents:   # out/ itself
        raise OutsideOut(f"{directory} is not inside {out}: kforge deletes nothing outside out/")
    if path.is_symlink() or path.is_file():
        _delete(path)
    elif path.is_dir():
        mine = kforge_files(path)
        if not mine:
            return False
        if not _writable(path.parent):   # the folder could be emptied but not removed: an empty folder left at an
            raise NotRemoved(               # artifact's place would be taken for a user's; so nothing is deleted
                f"cannot delete {printable(str(path))}: the folder it is in cannot be written, so nothing in it was "
                f"deleted: make {printable(str(path.parent))} writable (`chattr -i` it, or `chown` it to you: a "
                f"root-owned out/ that Docker left, say) or delete it as its owner, then run again")
        # meta.json and error.txt last: a folder left half deleted still says it is kforge's (clean and prune
        # take it again, once it is writable), and a meta.json whose binary went is a stale target, rebuilt
        for file in sorted(mine, key=lambda f: f.name in (META, ERROR)):
            _delete(file)
        try:
            path.rmdir()
        except FileNotFoundError:   # another clean took it meanwhile
            pass
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):   # its parent cannot be written
                raise _not_removed(e, path) from None
            # not empty: what is left is not kforge's
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


def _delete(path: Path) -> None:
    """Unlink `path` (a file, or a link as a link): any OSError but "not there" as NotRemoved."""
    try:
        path.unlink()
    except FileNotFoundError:   # another clean took it meanwhile
        pass
    except OSError as e:
        raise _not_removed(e, path) from None


def _writable(folder: Path) -> bool:
    """Whether entries in `folder` may be deleted, as the kernel asks before an unlink or rmdir (write and search
    permission, with the effective ids): false for an immutable folder, a read-only mount, another owner's."""
    ids = os.access in os.supports_effective_ids
    return os.access(folder, os.W_OK | os.X_OK, effective_ids=ids)


def _not_removed(e: OSError, path: Path) -> NotRemoved:
    """The one line for `path` that could not be deleted and the fix: the folder it is in, whose write permission an
    unlink needs, or where that folder can be written, the file itself (`chattr +i` on the file, another owner's in
    a sticky folder); the command goes on with the other targets."""
    said = f"cannot delete {printable(str(path))} ({e.strerror or e}): "
    if path.is_dir() and not path.is_symlink() or not _writable(path.parent):
        return NotRemoved(said + f"make {printable(str(path.parent))} writable (`chattr -i` it, or `chown` it to "
                                 f"you: a root-owned out/ that Docker left, say) or delete it as its owner, then run "
                                 f"again")
    return NotRemoved(said + f"the file itself refuses it, though its folder can be written: `chattr -i` it (an "
                             f"immutable file) or delete it as its owner, then run again")


def no_targets(layout, current: Iterable[str], archs: Iterable[str] | None = None) -> tuple[list[Path], list[Path]]:
    """The entries at an artifact's place in out/ that no current target owns (configs dropped from a sweep,
    deleted specs), for the given archs (default: all): (those kforge wrote; a user's, which prune keeps), sorted."""
    current = {os.path.normpath(p) for p in current}
    found = layout.artifact_dirs(sorted(set(archs or ARCHS) & set(ARCHS)))
    kforges, others = [], []
    for path in sorted(Path(p) for p in found if os.path.normpath(p) not in current):
        (kforges if written_by_kforge(path) else others).append(path)
    return kforges, others


def written_by_kforge(directory: Path) -> bool:
    """Whether an entry at an artifact's place is one kforge wrote: a real directory holding kforge's meta.json or
    error.txt (a link, or a folder without either, is someone else's)."""
    return not directory.is_symlink() and directory.is_dir() and \
        (kforge_meta(directory / META) is not None or kforge_error(directory / ERROR))


# --- scratch --------------------------------------------------------------------------------------------------

_run: int | None = None   # this run's doit master (forked workers inherit it); None: not in a doit run


def start_scratch(layout) -> None:
    """In the doit master, before any worker forks: sweep what dead runs left, remove this run's at exit."""
    global _run
    _run = os.getpid()
    sweep_scratch(layout)
    atexit.register(sweep_scratch, layout, _run)


def scratch_folder(layout, what: str) -> str:
    """A fresh scratch folder for one compile under out/.kforge/tmp/ (OutsideOut when a link leads out)."""
    root = guard(layout.out, layout.scratch / "x").parent
    root.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{_run or os.getpid()}-{what}-", dir=root)


def work_folder(layout) -> str:
    """out/.kforge/work/, made: the working folder of the processes that import a family's module (the catalog's
    probe, a compile's library server). A library writing into its working folder at import (unsloth_zoo's
    ./unsloth_compiled_cache/, rewritten by every import) writes inside out/, never into the project, and what it
    reads back there is no input. OutsideOut when a link leads out."""
    folder = guard(layout.out, layout.work / "x").parent
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def sweep_scratch(layout, run: int | None = None) -> None:
    """Remove the scratch folders of `run`, or (None) of every run that is no longer alive."""
    root = layout.scratch
    try:
        guard(layout.out, root / "x")
        entries = list(os.scandir(root))
    except (OSError, ValueError):   # no scratch folder yet, or a link leading out of out/: nothing to remove there
        return
    for entry in entries:
        owner = entry.name.split("-", 1)[0]
        mine = owner == str(run) if run is not None else not (owner.isdigit() and _alive(int(owner)))
        if mine:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@contextlib.contextmanager
def as_tmpdir(path: str):
    """The process's temp directory is `path` for the block: Python's tempfile and the tools it starts (TMPDIR)."""
    before_env, before_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    try:
        yield
    finally:
        tempfile.tempdir = before_tempdir
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    return True
