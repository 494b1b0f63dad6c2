"""The artifact, out/<arch>/<kernel>/<config_id>/{<binary>, meta.json}: made in the compile server (meta, files),
installed (install: the one way into out/, for a cache entry through arrive() or a compile's candidate, each checked
once by accept: untrusted until it passes), read back (is_current, KeyIndex, cutoff, load, error.txt's failure).

meta.json is the "done" marker, written last by rename: a killed build leaves no meta.json or the previous complete
one, never a half artifact that counts as built.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import NamedTuple

from kforge.base import stamps
from kforge.base.archs import ARCHS
from kforge.base.stamps import seal
from kforge.store import guard
from kforge.store.guard import kforge_meta, printable
from kforge.store.files import JsonState, atomic_write, opened, read_bytes, remove_entry
from kforge.store.inputs import InputIndex, well_formed
from kforge_runtime import schema, source_key
from kforge_runtime.schema import COMPILE_TIME, ERROR, META


class ArtifactError(ValueError):
    pass


class BinaryRefused(ArtifactError):
    """The binary is not the one meta.json describes (sha256) or no code for the target's arch (the ELF checks):
    `reason` says which."""

    def __init__(self, reason: str):
        super().__init__(f"its binary is refused: {reason}")
        self.reason = reason


# --- made: in the compile server --------------------------------------------------------------------------------

def meta(target, *, binary_name: str, binary: bytes, symbol: str, num_warps: int, warp_size: int,
         shared: int, **toolchain_fields) -> dict:
    """meta.json's content: the fields every artifact has, whatever compiled it (schema.ARTIFACT_FIELDS, the one
    definition the loader reads them by), plus the toolchain's own."""
    from kforge.load.device_model import DEVICES   # only where artifacts are written (a no-op run reads them)
    arch = ARCHS[target.arch]
    made = {
        "schema": schema.ARTIFACT_SCHEMA,
        "target": target.name,
        "kernel": target.kernel,
        "config_id": target.config_id,
        "config": dict(target.config),
        "arch": target.arch,
        "vendor": arch.vendor,
        "toolchain": target.toolchain,
        "binary": binary_name,
        "sha256": sha256(binary),
        "size": len(binary),
        "symbol": symbol,
        "num_warps": num_warps,
        "warp_size": warp_size,
        "threads_per_block": num_warps * warp_size,
        "shared": shared,
        "signature": [{"name": a, "type": t} for a, t in target.signature if t not in COMPILE_TIME],
        "constexprs": dict(target.constexprs),
        "source": {"module": target.module, "entry": target.entry, "digests": dict(target.source_digests)},
        "toolchain_versions": dict(target.toolchain_versions),
        "key": target.key,
        **({"key_without_sources": target.key_without_sources} if target.key_without_sources else {}),
        **({"env": dict(target.env)} if target.env else {}),
        # what the module's import saw (rules/load/device_model.py): the reference GPU's name, the set-up hooks run
        **({"device_model": DEVICES[target.arch].name} if target.device_model else {}),
        **({"setup": list(target.setup)} if target.setup else {}),
        **toolchain_fields,
    }
    wrong = schema.wrong_field(made, schema.ARTIFACT_FIELDS)
    if wrong is not None or not schema.is_signature(made["signature"]):   # the loader would refuse it
        raise ArtifactError(f"{target.name}: meta.json's {wrong or 'signature'!r} is missing or of the wrong type "
                            f"(a toolchain field overrode it?)")
    return made


def files(binary_name: str, binary: bytes, meta: dict) -> dict[str, bytes]:
    """A compile's artifact as files (files_of's form): the binary, and meta.json sealed as install() writes it."""
    return {META: meta_bytes(meta), binary_name: binary}


def meta_bytes(meta: dict) -> bytes:
    """meta.json's bytes as kforge writes them: sealed, sorted, one field a line."""
    return (json.dumps({**meta, "seal": seal(meta)}, indent=1, sort_keys=True) + "\n").encode()


def _unsealed(meta) -> bool:
    """Whether meta.json's seal disagrees with its fields (one written before seals were is taken as it is)."""
    return isinstance(meta, dict) and "seal" in meta and meta["seal"] != seal(meta)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- checked and installed: the one installer -------------------------------------------------------------------

class CompileResult(NamedTuple):
    """One compile target's outcome, filled by the compile and the doit action; doit keeps it as the task's values
    (values()), the report reads it back (of())."""
    seconds: float = 0.0                   # the whole action: cache lookups, compile and write
    compile_seconds: float | None = None   # the compiler alone (None: fetched from a cache)
    sha256: str | None = None
    from_cache: bool = False               # installed from the remote cache
    compiled_on: str | None = None         # the Dask worker's address, for a compile that ran on a cluster
    cache_warnings: tuple[str, ...] = ()
    spans: tuple = ()   # (phase, start, end) by the wall clock (comparable across processes): the build trace
    worker: int | None = None              # the pid of the doit worker that ran the action: a row of the trace
    from_local_cache: bool = False         # installed from the local cache (rules/share/local_cache.py)
    unchanged: bool = False                # not compiled: early cutoff (Unchanged), only meta.json's inputs renewed

    def values(self) -> dict:
        """As doit saves a python-action's result: a dict of JSON values, only the fields that are set."""
        return {k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
                for k, v in self._asdict().items()
                if v is not None and v is not False and v != ()}   # 0.0 is a value (and 0.0 == False)

    @classmethod
    def of(cls, values: dict | None) -> "CompileResult":
        """A task's saved values (values()'s form) as the result again; keys it does not know are ignored."""
        values = values or {}
        known = {k: values[k] for k in cls._fields if k in values}
        for k in ("cache_warnings", "spans"):
            if k in known:
                known[k] = tuple(tuple(x) if isinstance(x, list) else x for x in known[k])
        return cls(**known)

    @property
    def origin(self) -> str:
        """Where the artifact came from (rules/report/reporter.py's ORIGINS)."""
        return ("local cache" if self.from_local_cache else "remote cache" if self.from_cache else
                "unchanged" if self.unchanged else "compiled")


class Candidate(NamedTuple):
    """An artifact a source offers, not yet checked (files_of's form), and what the source knows of its making."""
    files: dict
    result: CompileResult = CompileResult()


class Cutoff(NamedTuple):
    """What a compile server needs to tell whether out/'s artifact is still the one its inputs give (cutoff()): its
    meta.json, sealed and with its binary intact, and the names of the inputs that changed."""
    meta: dict
    changed: tuple


class Unchanged(NamedTuple):
    """A compile server's answer instead of a candidate (early cutoff): its meta.json is the Cutoff's, inputs
    renewed."""
    meta: dict
    result: CompileResult


class ArtifactCache(ABC):
    """What every artifact cache implements (rules/share/), as a source arrive() takes artifacts from and a store
    the compile action keeps them in. A new cache is checked by tests/store/test_artifact_cache.py."""
    lookup_span: str   # the build trace's names for the cache's two phases
    keep_span: str

    @abstractmethod
    def lookup(self, target) -> Candidate | None:
        """The target's entry, unchecked; None on a miss; ValueError when one is there but cannot be read."""

    @abstractmethod
    def refused(self, target, error: Exception) -> list[str]:
        """The installer refused what lookup() offered: drop it, and say so (warnings)."""

    @abstractmethod
    def keep(self, target) -> list[str]:
        """Store the target's artifact, as installed in out/, under its key: warnings."""

    def took(self, target) -> None:
        """The installer took what lookup() offered (a cache that ages entries by use marks it)."""

    def drain_warnings(self) -> list[str]:
        """What the cache has to say beyond its calls' own warnings (a server gone slow or down), once."""
        return []


def arrive(target, source: ArtifactCache) -> tuple[Candidate | None, list[str]]:
    """Ask a cache for the target's artifact and install what it offers: (the installed candidate or None,
    warnings). An unreadable or refused entry is a miss with the source's warning. An OSError writing out/ (or
    OutsideOut) is out/'s, not the entry's: raised."""
    try:
        candidate = source.lookup(target)
    except ValueError as e:   # an entry is there but cannot be read
        return None, source.refused(target, e)
    if candidate is None:
        return None, []
    try:
        meta = install(target, candidate)
    except ArtifactError as e:
        return None, source.refused(target, e)
    source.took(target)
    # its key is what the catalog knows; what its compile read must have the same content here too
    listed = meta.get("inputs")
    if not well_formed(listed) or InputIndex.of(target.layout.observed_inputs).first_changed(listed) is not None:
        return None, []
    return candidate, []


def install(target, arrived: Candidate | Unchanged) -> dict:
    """Put the target's artifact in place: the binary, then meta.json, each by rename (an error.txt goes). A
    Candidate is checked first (accept: nothing written when it fails); Unchanged rewrites meta.json alone, renewed
    for the target's key and sources. Returns meta.json's content."""
    if isinstance(arrived, Unchanged):
        meta = {**arrived.meta, "key": target.key,
                "source": {**arrived.meta["source"], "digests": dict(target.source_digests)}}
        meta_json, binary_name, binary = meta_bytes(meta), None, None
    else:
        meta, binary_name, binary, meta_json = accept(target, arrived.files)
    directory = guard.guard(target.layout.out, Path(target.out_dir) / META).parent   # never through a link out
    directory.mkdir(parents=True, exist_ok=True)
    if binary is not None:
        _drop_binary(directory, keep=binary_name)   # another symbol's, of the build before
        for stale in (META, ERROR):   # un-mark first: from here until the last rename it is not built
            remove_entry(directory / stale)
        atomic_write(directory / binary_name, binary)
    atomic_write(directory / META, meta_json)
    return meta


def accept(target, files: dict[str, bytes]) -> tuple[dict, str, bytes, bytes]:
    """Check an artifact received as files (files_of's form) for `target`, from any source: plain file names,
    exactly meta.json and the binary it names, meta.json bound to the target (check_bound) and sealed right, the
    binary its sha256 and ELF code for the TARGET's arch (never the arch meta.json claims). Writes nothing: (meta
    less its seal, binary name, binary, meta.json's bytes: as it came, or relabelled and sealed anew), or
    ArtifactError in one line."""
    try:
        for name in files:
            plain_name(name)
        made = guard.json_of(files[META])
        sealed_right = not _unsealed(made)
        meta = relabelled(target, made) if sealed_right else made
        check_bound(target, meta)
        binary_name = meta.get("binary")
        if set(files) != {META, binary_name}:
            raise ArtifactError(f"it holds {_brief(sorted(files))}, not exactly {META} and the binary it names "
                                f"({_brief(binary_name)})")
        if not sealed_right:
            raise ArtifactError("its meta.json's seal does not match its fields")
        binary = files[binary_name]
        schema.check_binary(binary, meta.get("sha256"), target.arch, meta.get("symbol"))
    except schema.BinaryRefused as e:
        raise BinaryRefused(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:   # ArtifactError is a ValueError; json_of: nesting too deep is one
        raise ArtifactError(str(e) if isinstance(e, ArtifactError) else f"its {META} is unreadable ({e})") from None
    if meta is not made:
        return meta, binary_name, binary, meta_bytes(meta)
    meta.pop("seal", None)
    return meta, binary_name, binary, files[META]


# what names the target a meta.json is for: its field -> the target's attribute
BOUND_FIELDS = {"target": "name", "kernel": "kernel", "config_id": "config_id", "arch": "arch", "key": "key"}


def relabelled(target, meta: dict) -> dict:
    """meta.json as this target's where it was made for the same kernel, arch and key under another name (a record
    that gains or loses a line renames configs, named by what tells its lines apart, whose binaries stay the
    same); anything else is left for check_bound."""
    if not isinstance(meta, dict) or any(meta.get(f) != getattr(target, f) for f in ("kernel", "arch", "key")):
        return meta
    labels = {"target": target.name, "config_id": target.config_id, "config": _config_as_json(target)}
    if all(meta.get(f) == v for f, v in labels.items()):
        return meta
    return {**{f: v for f, v in meta.items() if f != "seal"}, **labels}


def check_bound(target, meta) -> None:
    """ArtifactError unless meta.json is the target's own: its target, kernel, config id, config, arch and key
    equal the target's. A meta.json is data: one copied, fetched or returned for another target (another arch's
    binary under this target's key, say) must never stand in for this one."""
    if not isinstance(meta, dict):
        raise ArtifactError("its meta.json is not a JSON object")
    for field, attribute in BOUND_FIELDS.items():
        if meta.get(field) != getattr(target, attribute):
            raise ArtifactError(f"its meta.json says {field} {_brief(meta.get(field))}, the target's is "
                                f"{_brief(getattr(target, attribute))}")
    if meta.get("config") != _config_as_json(target):
        raise ArtifactError(f"its meta.json's config {_brief(meta.get('config'))} is not the target's "
                            f"{dict(target.config)}")
    # a record line's target: built from the code its lines were recorded from, as its compile checks (a cache's
    # entry of the same key from other code was installed where the compile fails, triton_backend.py)
    recorded = source_key.comparable(target.recorded_code)
    if recorded and source_key.tagged(str(meta.get("triton_source_key"))) not in recorded \
            and meta.get("source_key_unstable") is not True:
        raise ArtifactError(f"it was built from other code (source key {_brief(meta.get('triton_source_key'), 12)}) "
                            f"than its record lines were recorded from")


def _config_as_json(target) -> dict:
    """The target's config as meta.json's, read back, holds it (a tuple is a list there)."""
    return json.loads(json.dumps(dict(target.config)))


def _brief(value, limit: int = 80) -> str:
    """A value from an untrusted meta.json, for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def plain_name(name) -> str:
    """A file name that stays inside its artifact directory: no separator, no '..', no absolute path."""
    if not schema.is_plain_name(name):
        raise ArtifactError(f"file name {_brief(name)} is not a plain file name (letters, digits, '_', '.', '+', '-'; "
                            f"no '/' and not starting with '.')")
    return name


# --- read back --------------------------------------------------------------------------------------------------

def is_current(meta_path: str, key: str) -> bool:
    """True when the artifact at meta_path was built from exactly this action key and its binary is intact."""
    return _built_from(_read_artifact(meta_path), key)


def _built_from(found: tuple | None, key: str) -> bool:
    """Whether _read_artifact found meta.json holding `key` and the binary it names intact."""
    return found is not None and found[1] == key and found[3] is not None


def current_meta(meta_path: str, key: str) -> dict | None:
    """meta.json's content (less its seal) when that artifact was built from exactly this key, else None."""
    try:
        meta = json.loads(read_bytes(meta_path))
    except (OSError, ValueError, RecursionError):   # RecursionError: JSON nested deeper than the parser goes
        return None
    if not isinstance(meta, dict) or meta.get("key") != key or _unsealed(meta):
        return None
    meta.pop("seal", None)
    return meta


def cutoff(target) -> Cutoff | None:
    """What the compile server needs for an early cutoff (else None: it compiles): the artifact in out/ is intact
    and has the toolchain's source digest, and either its key is the target's (inputs it read changed) or only
    the key's sources differ (a source was edited: whether the kernel's code can change is the server's to say)."""
    found = _read_artifact(target.meta_path)   # meta.json sealed and its binary intact, whatever its key
    meta = current_meta(target.meta_path, found[1]) if found is not None and found[1] and found[3] else None
    if meta is None or not (meta["key"] == target.key or target.key_without_sources and
                            meta.get("key_without_sources") == target.key_without_sources):
        return None
    if not well_formed(meta.get("inputs")) or not isinstance(meta.get("triton_source_key"), str):
        return None
    index = InputIndex.of(target.layout.observed_inputs)
    built_from = (meta.get("source") or {}).get("digests") or {}
    changed = {name for name, digest in meta["inputs"] if index.digest(name) != digest} | \
        {name for name, digest in target.source_digests if built_from.get(name) != digest}
    return Cutoff(meta, tuple(sorted(changed))) if changed else None


class KeyIndex(JsonState):
    """For each meta.json: its key and whether the binary beside it is the one it names, remembered by the file
    identities (inode, mtime, ctime, size) of both, so that a no-op run stats two files a target instead of reading
    meta.json and hashing its binary. Both are only ever replaced by rename (a new inode): matching identities mean
    unchanged content; anything else is read and hashed again. Only a hint: the files on disk decide."""

    @staticmethod
    def well_shaped(entries: dict) -> bool:   # each entry as _read_artifact gives it
        return all(isinstance(v, list) and len(v) == 4 and isinstance(v[0], (list, type(None)))
                   and isinstance(v[1], (str, type(None))) and isinstance(v[2], str)
                   and isinstance(v[3], (list, type(None))) for v in entries.values())

    def __init__(self, path):
        super().__init__(path)
        # meta.json identities as is_current stat'ed them in this process, dropped when the target's task runs:
        # the bundle's up-to-date check (ship/package.py) reuses them instead of stat'ing every meta.json again
        self.seen: dict[str, list | None] = {}

    def is_current(self, meta_path: str, key: str) -> bool:
        """meta.json holds `key` and the binary it names is there with the sha256 it records."""
        meta_stamp = self.seen[meta_path] = stamps.identity(meta_path)
        if meta_stamp is None:
            return False
        entry = self.entries.get(meta_path)
        if entry is not None and entry[0] == meta_stamp:   # well_shaped, or _remember's
            if entry[1] != key:
                return False
            if entry[3] is not None and stamps.identity(os.path.join(os.path.dirname(meta_path), entry[2])) == entry[3]:
                return True
        return _built_from(self._remember(meta_path), key)

    def refresh(self, meta_path: str) -> None:
        """After the target's task ran (built or failed): remember a freshly built artifact (read and hashed
        once), so that the next run only stats it."""
        self.seen.pop(meta_path, None)
        self._remember(meta_path)

    def _remember(self, meta_path: str) -> tuple | None:
        found = _read_artifact(meta_path)
        if found is not None:
            self.entries[meta_path] = list(found)
            self.changed = True
        return found

    def meta_identity(self, meta_path: str) -> list | None:
        """meta.json's identity: as is_current saw it, unless the target's task ran since; else stat'ed now."""
        return self.seen[meta_path] if meta_path in self.seen else stamps.identity(meta_path)


def _read_artifact(meta_path: str) -> tuple | None:
    """(meta.json's identity, its key, its binary's name, the binary's identity if its sha256 matches meta.json's
    else None), or None when meta.json is unreadable. Each identity comes from the open file that was read."""
    try:
        with opened(meta_path) as f:
            meta_stamp, meta = stamps.identity(meta_path, f.fileno()), guard.json_of(f.read())
        if _unsealed(meta):
            return None
        key, name = meta.get("key"), plain_name(meta.get("binary"))
    except (OSError, ValueError, AttributeError):
        return None
    try:
        with opened(os.path.join(os.path.dirname(meta_path), name)) as f:
            stamp, digest = stamps.identity("", f.fileno()), hashlib.sha256(f.read()).hexdigest()
    except OSError:
        stamp = digest = None
    return meta_stamp, key if isinstance(key, str) else None, name, stamp if digest == meta.get("sha256") else None


def load(directory: Path) -> tuple[dict, bytes]:
    """meta.json and its binary, checked: its seal, the binary's sha256, ELF machine/arch flags, non-trivial
    kernel code."""
    meta_path = directory / META
    try:
        meta = guard.json_of(read_bytes(meta_path))
        meta["binary"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{directory}: unreadable artifact ({e}); delete the directory and build again")
    if _unsealed(meta):
        raise ArtifactError(f"{meta_path}: edited or damaged since it was built (its seal does not match its "
                            f"fields); build it again (doit)")
    return meta, binary_of(directory, meta)


def binary_of(directory: Path, meta: dict) -> bytes:
    """The binary a meta.json read and checked already names, checked: sha256, ELF machine/arch flags,
    non-trivial kernel code."""
    try:
        binary = read_bytes(directory / plain_name(meta["binary"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{directory}: unreadable artifact ({e}); delete the directory and build again")
    if meta.get("arch") not in ARCHS:
        raise ArtifactError(f"{directory / META}: unknown arch {_brief(meta.get('arch'))} (kforge's: "
                            f"{', '.join(ARCHS)}); delete {directory} and build again")
    try:   # the binary is the one meta.json describes (sha256) and real code for its arch (ELF checks)
        schema.check_binary(binary, meta.get("sha256"), meta["arch"], meta.get("symbol"))
    except schema.BinaryRefused as e:
        raise ArtifactError(f"{directory / str(meta.get('binary'))}: {e}; the file is corrupt or was replaced; "
                            f"delete {directory} and build again") from None
    return binary


def files_of(directory: Path) -> dict[str, bytes]:
    """meta.json and the binary it names, as bytes: what a remote cache or a remote worker moves."""
    meta_bytes = read_bytes(directory / META)
    binary = plain_name(guard.json_of(meta_bytes)["binary"])
    return {META: meta_bytes, binary: read_bytes(directory / binary)}


# error.txt: "key: <key>", then for a deterministic failure "inputs: <JSON>" (what its compile read), then the
# message (rules/compile/action.py's), then the compiler's traceback after TRACEBACK. Written and read only here.
TRACEBACK = "\n\nTraceback in the compiler's process:\n"
INPUTS = "inputs: "


class Failure(NamedTuple):
    """A failed compile's error.txt, read back."""
    key: str | None      # the key it failed from (None: not an error.txt kforge wrote)
    inputs: list | None  # what its compile read, for a deterministic failure; else None
    message: str         # the failure's message, then the traceback (TRACEBACK) if one was kept

    @property
    def without_traceback(self) -> str:
        return self.message.split(TRACEBACK, 1)[0].rstrip("\n")


def _drop_binary(directory: Path, keep: str | None = None) -> None:
    """Delete the binary the folder's meta.json (kforge's) names, unless it is `keep`: one meta.json no longer
    describes would be taken for a user's file by `doit clean`."""
    old = kforge_meta(directory / META)
    if old is not None and old["binary"] != keep:
        with contextlib.suppress(IsADirectoryError):   # not a file kforge wrote
            (directory / old["binary"]).unlink(missing_ok=True)


def write_error(target, message: str, inputs: list | None = None) -> None:
    """Keep a failed compile's message beside where its artifact would be; `inputs` ([[name, sha256], ...])
    marks a deterministic failure (saved_failure)."""
    try:
        directory = guard.guard(target.layout.out, Path(target.out_dir) / META).parent
    except guard.OutsideOut:
        return   # nothing written or removed there; the failure itself is reported as usual
    directory.mkdir(parents=True, exist_ok=True)
    _drop_binary(directory)   # so that the folder holds only error.txt of kforge's (guard.kforge_files)
    remove_entry(directory / META)
    read = f"{INPUTS}{json.dumps(inputs, separators=(',', ':'))}\n" if inputs is not None else ""
    atomic_write(directory / ERROR, f"key: {target.key}\n{read}{message}\n".encode())


MESSAGE_LIMIT = 1 << 20   # bytes of error.txt's message read back: a failure's message and traceback are shown
#                           whole below this; a restored or damaged error.txt of 200 MB cost `doit info` 44 s and
#                           2.4 GB read whole
INPUTS_LIMIT = 16 << 20   # its inputs line (~100 bytes a file the compile read); longer is no deterministic failure


def read_error(target) -> Failure | None:
    """The target's error.txt, or None when there is none (or it cannot be read): its key and inputs lines and at
    most MESSAGE_LIMIT bytes of its message, which then ends in a line saying where the rest is. The same file
    asked for again (doit info's state, then saved_failure) is not read again while its identity is the same.
    None too where a link on its way leads outside out/: what lies there is no failure of this build's."""
    try:
        guard.guard(target.layout.out, Path(target.error_path))
        with opened(target.error_path, limit=1 << 62) as f:   # any size: only its head is read
            st = os.fstat(f.fileno())
            identity = (target.error_path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if _last_error[0] == identity:   # written only by rename (write_error): a new inode, a new identity
                return _last_error[1]
            head = f.readline(4096).decode("utf-8", "replace").rstrip("\n")
            inputs_line = f.readline(INPUTS_LIMIT + 1) if f.peek(len(INPUTS)).startswith(INPUTS.encode()) else b""
            body = f.read(MESSAGE_LIMIT + 1)
    except (OSError, guard.OutsideOut):
        return None
    inputs = None
    if inputs_line.endswith(b"\n"):   # whole: one cut short is no record of what the compile read
        with contextlib.suppress(ValueError, RecursionError):
            inputs = json.loads(inputs_line.removeprefix(INPUTS.encode()))
    rest = body[:MESSAGE_LIMIT].decode("utf-8", "replace")
    if len(body) > MESSAGE_LIMIT:
        rest += (f"\n[... cut: {target.error_path} holds {st.st_size} bytes; the first {MESSAGE_LIMIT} of its message "
                 f"are shown]\n")
    # replayed in a build's summary and shown by doit info: a restored out/'s escape sequences never reach a terminal
    key = head.removeprefix("key: ") if head.startswith("key: ") else None
    _last_error[:] = [identity, Failure(key, inputs, printable(rest, "\n\t"))]
    return _last_error[1]


_last_error: list = [None, None]   # the last error.txt read_error read: (its path and identity, the Failure)


SKIPPED = "skipped: "   # error.txt's message of a target skipped, not failed (rules/compile/action.py's _skip)


def skipped(target) -> str | None:
    """Why the target is skipped (a library autotuner's config that does not fit its arch), as saved_failure."""
    saved = saved_failure(target)
    return saved.removeprefix(SKIPPED) if saved is not None and saved.startswith(SKIPPED) else None


def saved_failure(target, failure: Failure | None = None) -> str | None:
    """The message of the target's deterministic failure (a compile error, a resource check) while its key and
    every file its compile read are unchanged, so the compile would fail the same way; else None. `failure`: the
    error.txt the caller already read (read_error)."""
    failure = failure if failure is not None else read_error(target)
    if failure is None or failure.key != target.key or not isinstance(failure.inputs, list):
        return None
    index = InputIndex.of(target.layout.observed_inputs)
    if any(not isinstance(x, list) or len(x) != 2 or index.digest(x[0]) != x[1] for x in failure.inputs):
        return None
    return failure.without_traceback
