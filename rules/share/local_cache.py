"""The local cache: every artifact this user built or fetched, kept by its action key outside any checkout, so a
revert, a branch switch, `git bisect` or a second worktree installs it instead of compiling it again.

    <dir>/<key[:2]>/<key>     one entry: a JSON header line, then meta.json's bytes and the binary's
    <dir>/<key[:2]>/<key>-<inputs>   an earlier entry of the same key whose compile read other contents
    <dir>/<key[:2]>/.<key>.<pid>.<random>.tmp   an entry being written (files.atomic_write), then renamed

<dir> (`local_cache=`) is shared by every checkout of the user: keys hold no path of a checkout. An entry is
untrusted (a full disk, another tool, a hand edit): artifact.accept checks it before anything is written to out/,
and a refused one is deleted. Two targets of one key (a family copied under another name) store over each other's
entry: said as what it is, not as damage.

A key does not cover what the compile read beside the kernel's sources (meta.json's "inputs": a config file a
library reads at import): an entry is taken only where every such file has the content it lists, and storing one
for other contents keeps the one it replaces as `<key>-<inputs>` (the first 16 hex digits of the sha256 of its
list), so a revert of such a file installs too. A hit sets the entry's mtime ("last used": atime is not kept on
most mounts); trim() deletes the least recently used entries until the whole is within the limit.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

from kforge.store import artifact
from kforge.store.artifact import ArtifactCache, Candidate, CompileResult
from kforge.store.files import atomic_write, opened
from kforge.store.guard import json_of

FORMAT = "kforge-local-1"
HEADER_LIMIT = 64 << 10   # bytes of an entry's header line (a real one is ~150)
ENTRY_LIMIT = (256 << 20) + (1 << 20)   # the loader's limit on a binary (runtime/bundle.py) plus meta.json
STALE_TMP_S = 3600   # a temp file this old was left by a killed writer (a live one renames within seconds)
KEY = re.compile(r"[0-9a-f]{64}(-[0-9a-f]{16})?")   # only names like these are ever deleted: a cache at a wrong
TEMP = re.compile(r"\.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp")   # directory (home, say) loses nothing else
_store_failed: set[str] = set()   # cache directories this process could not write, and places holding what the
#                                   cache did not write (NotOurs): warned once, not per target


class NotOurs(OSError):
    """What lies where the cache would make a folder of entries or an entry is not the cache's (a user's file named
    79 in a local_cache=~/documents, a link): left as it is, that entry not stored, one warning naming it."""

    def __init__(self, path: Path, what: str, stored: str):
        self.path = str(path)
        super().__init__(f"local cache {path} is {what}, which kforge did not write: it is left as it is, and {stored} "
                         f"not stored there; point local_cache= at a folder of its own (or set local_cache=off)")


class LocalCache(NamedTuple):   # a NamedTuple: in every compile task's action arguments
    root: str    # the cache directory (absolute)
    limit: int   # bytes the entries may take in all (`local_cache_limit=`)


class Usage(NamedTuple):
    entries: int
    size: int
    evicted: int = 0
    evicted_size: int = 0


def entry_path(cache: LocalCache, key: str) -> Path:
    return Path(cache.root) / key[:2] / key


class Source(ArtifactCache):
    """The local cache as an ArtifactCache: lookup, refused, took (marks the entry used), keep."""
    lookup_span = "local cache lookup"   # the build trace's names for its phases
    keep_span = "local cache store"

    def __init__(self, cache: LocalCache):
        self.cache = cache
        self.picked: dict[str, Path] = {}   # key -> the entry lookup() read last: what refused() and took() mean

    def lookup(self, target) -> Candidate | None:
        """The target's entry whose compile read what is here now (see the module docstring), unchecked otherwise;
        None when there is none, ValueError when one cannot be read (the installer checks the rest)."""
        try:
            paths = _entries_of(self.cache, target.key)
        except OSError as e:   # a shard that cannot be listed: a miss with a warning
            raise ValueError(str(e)) from None
        for path in paths:
            self.picked[target.key] = path
            try:
                files = unpack(_read(path), target.key)
            except (FileNotFoundError, NotADirectoryError):   # trimmed meanwhile; or the cache folder is a file
                continue
            except OSError as e:   # unreadable, or no entry (a link, a FIFO): a miss with a warning, as a refused one
                raise ValueError(e.strerror or str(e)) from None
            if _read_here(target, files):
                return Candidate(files, CompileResult(from_local_cache=True))
        return None

    def refused(self, target, error: Exception) -> list[str]:
        """An unreadable or refused entry is deleted (the build replaces it), with one warning naming it. One that
        is another target's of the same key, whole, is not damage: said as what it is, and left."""
        path = self.picked.get(target.key, entry_path(self.cache, target.key))
        other = _other_targets(path, target)
        if other is not None:
            return [f"local cache entry {path} holds {other}'s artifact, not {target.name}'s: the two targets share "
                    f"one action key (the same module, entry, config and arch under two names), so each one's build "
                    f"replaces the other's entry; this is not corruption. Compiling {target.name} here; to take both "
                    f"from the cache, build that kernel under one name (drop the copied family, or the record line "
                    f"a TOML family builds too)"]
        _discard(path)
        return [f"local cache entry {path} for {target.name} refused ({error}); compiling it here (its build "
                f"replaces the entry)"]

    def took(self, target) -> None:
        # "last used": trim() keeps it; the entry itself, never what a link put in its place leads to
        with contextlib.suppress(OSError):   # evicted meanwhile, or a read-only cache: the hit stands
            os.utime(self.picked.get(target.key, entry_path(self.cache, target.key)), follow_symlinks=False)

    def keep(self, target) -> list[str]:
        return store(self.cache, target)


def _other_targets(path: Path, target) -> str | None:
    """The target an entry the installer refused was stored by, where that is another target of this very key and
    arch and the entry is whole (sealed right, its binary its sha256); None for damage, a foreign or tampered
    entry, refused as such."""
    try:
        files = unpack(_read(path), target.key)
        meta = json.loads(files[artifact.META])
        other, binary = meta["target"], files[meta["binary"]]
        whole = meta.get("seal") == artifact.seal(meta) and meta.get("sha256") == artifact.sha256(binary)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    same_key = meta.get("key") == target.key and meta.get("arch") == target.arch
    return other if isinstance(other, str) and other != target.name and same_key and whole else None


def store(cache: LocalCache, target) -> list[str]:
    """Keep the target's artifact, just built or fetched, under its key: warnings (one per process for a cache
    directory that cannot be written; the build itself goes on)."""
    path = entry_path(cache, target.key)
    try:
        files = artifact.files_of(Path(target.out_dir))
        inputs = _inputs_id(files)
        data = pack(target.key, files, inputs)
        _folder_of_entries(path.parent)
        if path.is_dir() and not path.is_symlink():   # atomic_write would delete a folder there (files.replacing)
            raise NotOurs(path, "a folder", "this key's entry is")
        _keep_other_inputs(path, inputs)
        atomic_write(path, data)
        return []
    except NotOurs as e:
        if e.path in _store_failed:
            return []
        _store_failed.add(e.path)
        return [str(e)]
    except OSError as e:
        if cache.root in _store_failed:
            return []
        _store_failed.add(cache.root)
        return [f"local cache {cache.root} not writable ({e.strerror or e}); building without storing there "
                f"({problem(cache) or 'free space, fix its permissions, or set local_cache=off'})"]


def _folder_of_entries(folder: Path) -> None:
    """Make `<cache>/<key[:2]>` a folder; anything else in its place (a file, a link) is NotOurs, never removed nor
    followed: two hex digits are a plausible name of a user's file (local_cache= at a wrong folder, home say)."""
    # the cache's own folder, where kforge makes it, is this user's alone whatever the umask: the kept bytecode
    # beside the entries keeps nothing in a group-writable one (rules/load/observe.py)
    os.makedirs(folder.parent, mode=0o700, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:
        if folder.is_symlink() or not folder.is_dir():
            raise NotOurs(folder, "a symbolic link" if folder.is_symlink() else "a file, not a folder",
                          f"every entry whose key starts with {folder.name} is") from None


def problem(cache: LocalCache) -> str | None:
    """What keeps the cache from holding entries, with its fix, when its folder is not a folder; None otherwise."""
    blocked = next((p for p in (Path(cache.root), *Path(cache.root).parents) if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        return f"{blocked} is a file, not a folder: remove it or point local_cache= elsewhere (or set local_cache=off)"
    return None


def _entries_of(cache: LocalCache, key: str) -> list[Path]:
    """The key's entries: `<key>` (the latest stored), then the others, the most recently used first; none where
    its folder is a link (never read nor deleted through: not the cache's, store() says so)."""
    if entry_path(cache, key).parent.is_symlink():
        return []
    found = [(_mtime(e.path), Path(e.path)) for e in _scan(entry_path(cache, key).parent)
             if e.name.startswith(key + "-") and KEY.fullmatch(e.name)]   # a refused one is deleted: only ours
    return [entry_path(cache, key), *(p for _, p in sorted(found, reverse=True))]


def _listed(files: dict[str, bytes]):
    """An artifact's "inputs" (what its compile read) as its meta.json lists them; None where it cannot be read."""
    try:
        return json_of(files.get(artifact.META, b"")).get("inputs")
    except (ValueError, AttributeError):
        return None


def _read_here(target, files: dict[str, bytes]) -> bool:
    """Whether the files an entry's compile read have the same content here; an entry that lists none, or a
    meta.json the installer will refuse, is left to the installer."""
    from kforge.store.inputs import InputIndex, well_formed
    listed = _listed(files)
    return not well_formed(listed) or InputIndex.of(target.layout.observed_inputs).first_changed(listed) is None


def _inputs_id(files: dict[str, bytes]) -> str:
    """The first 16 hex digits of the sha256 of an artifact's "inputs" list."""
    return hashlib.sha256(json.dumps(_listed(files)).encode()).hexdigest()[:16]


def _keep_other_inputs(path: Path, inputs: str) -> None:
    """Before an entry for other inputs takes `path`'s place: the one there moves beside it, named by its own."""
    try:
        data = _read(path, HEADER_LIMIT)   # never through a link, nor blocking on a FIFO planted there
        old = json_of(data[:data.find(b"\n")]).get("inputs")
    except (OSError, ValueError, AttributeError):   # none, or not ours to keep: replaced
        return
    if isinstance(old, str) and re.fullmatch(r"[0-9a-f]{16}", old) and old != inputs:
        with contextlib.suppress(OSError):   # another build moved it first
            os.replace(path, path.with_name(f"{path.name}-{old}"))


def _read(path: Path, limit: int = ENTRY_LIMIT + 1) -> bytes:
    """An entry's first `limit` bytes: never through a link nor from a FIFO or device (a read that could block or
    never end), nor past ENTRY_LIMIT (guard.opened's NotAFile says which)."""
    with opened(path, ENTRY_LIMIT) as f:
        return f.read(limit)


def pack(key: str, files: dict[str, bytes], inputs: str | None = None) -> bytes:
    """An entry's bytes: {"format", "key", "files": [[name, size], ...], "inputs"} as one JSON line, then each
    file's bytes ("inputs": _inputs_id of the files)."""
    header = json.dumps({"format": FORMAT, "key": key, "files": [[n, len(d)] for n, d in files.items()],
                         "inputs": _inputs_id(files) if inputs is None else inputs})
    return b"".join([header.encode(), b"\n", *files.values()])


def unpack(data: bytes, key: str) -> dict[str, bytes]:
    """The files of an entry: ValueError unless it is a whole entry of this format made for `key` (one moved or
    copied under another key is foreign)."""
    end = data.find(b"\n", 0, HEADER_LIMIT)
    if end < 0:
        raise ValueError(f"no {FORMAT} header line")
    try:
        header = json_of(data[:end])
        names_sizes = [(n, s) for n, s in header["files"]]
        given_key, given_format = header["key"], header["format"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"its header is unreadable ({e})") from None
    if given_format != FORMAT:
        raise ValueError(f"its format is {given_format!r}, not {FORMAT}")
    if given_key != key:
        raise ValueError(f"it was made for key {str(given_key)[:16]}..., not this target's {key[:16]}...")
    if not all(isinstance(n, str) and type(s) is int and s >= 0 for n, s in names_sizes):
        raise ValueError("its header's file list is not [name, size] pairs")
    body = memoryview(data)[end + 1:]
    if sum(s for _, s in names_sizes) != len(body) or len({n for n, _ in names_sizes}) != len(names_sizes):
        raise ValueError(f"its files take {len(body)} bytes, its header says "
                         f"{sum(s for _, s in names_sizes)} (a truncated or altered entry)")
    files, at = {}, 0
    for name, size in names_sizes:
        files[name] = bytes(body[at:at + size])
        at += size
    return files


def usage(cache: LocalCache) -> Usage:
    entries = _entries(cache)
    return Usage(len(entries), sum(size for _, size, _ in entries))


def trim(cache: LocalCache) -> Usage:
    """Delete the least recently used entries until the rest fit in the cache's limit, and temp files killed
    writers left: what is left and what went. Safe beside running builds (a reader keeps its open file)."""
    entries = sorted(_entries(cache, remove_stale=True))   # oldest use first
    total = sum(size for _, size, _ in entries)
    evicted = evicted_size = 0
    for _, size, path in entries:
        if total <= cache.limit:
            break
        _discard(path)
        total -= size
        evicted, evicted_size = evicted + 1, evicted_size + size
    return Usage(len(entries) - evicted, total, evicted, evicted_size)


def human(size: int) -> str:
    """Bytes for people: '7.1 KiB', '2.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024


def entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _entries(cache: LocalCache, remove_stale: bool = False) -> list[tuple[float, int, str]]:
    """(last used, size, path) of every entry: two levels of os.scandir."""
    found = []
    now = time.time()
    for shard in _scan(cache.root):
        if not (re.fullmatch(r"[0-9a-f]{2}", shard.name) and shard.is_dir(follow_symlinks=False)):
            continue
        for entry in _scan(shard.path):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:   # deleted meanwhile by another build's trim
                continue
            if KEY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                found.append((st.st_mtime, st.st_size, entry.path))
            elif remove_stale and TEMP.fullmatch(entry.name) and now - st.st_mtime > STALE_TMP_S:
                _discard(entry.path)
    return found


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _scan(directory) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _discard(path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
