"""Open kernel bundles (made by `doit package`), check them, and pick the artifact a caller asks for.

A bundle is one arch's wheel (or its unpacked package directory): manifest.json, its sha256 (manifest.sha256) and
the binaries it names. Nothing is trusted: the manifest must match its digest, a binary path must stay inside the bundle, and a binary must match its sha256 and be an ELF file for the
bundle's arch before a driver sees it. Whatever a bundle holds, reading it gives a result, BundleError or
NoMatchingKernel, without waiting on anything: only regular files are read, and only up to a size limit.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import posixpath
import re
import stat
import weakref
import zipfile
import zlib
from pathlib import Path

from . import schema
from .schema import BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, ENTRY_FIELDS, MANIFEST, MANIFEST_DIGEST, few

MAX_JSON_BYTES = 64 << 20     # a manifest or tuning table (a real manifest is ~1 MB)
MAX_BINARY_BYTES = 256 << 20  # one kernel binary
CHUNK = 1 << 16               # inflated at a time from an archive member
_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
# What zipfile raises on a damaged archive or member, besides BadZipFile: corrupt deflate data, a method
# or encryption it does not read, a record that ends early or holds nonsense.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError, ValueError)


class BundleError(ValueError):
    """A bundle that is malformed, tampered with, or not for this device."""


class NoMatchingKernel(LookupError):
    """Nothing in the bundles fits the request; the message lists what there is."""


class Bundle:
    """One arch's bundle: a .whl/.zip file or a directory holding manifest.json."""

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            self._root = self.path.resolve()
            self._zip, self._prefix = None, ""
        else:
            try:   # zipfile would open a FIFO and wait for a writer: open_regular refuses it first
                file = open_regular(self.path)
                weakref.finalize(self, file.close)   # a ZipFile leaves a file it was handed open
                self._zip = zipfile.ZipFile(file)
            except _ZIP_ERRORS as e:
                raise BundleError(f"{self.path}: not a bundle ({e}); expected a .whl/.zip file or a directory "
                                  f"with {MANIFEST}") from None
            self._prefix = self._find_manifest_dir()
        data = self._read(MANIFEST, MAX_JSON_BYTES)
        self._check_digest(data)
        self.manifest = _parse_json(data, f"{self.path}: unreadable {MANIFEST}")
        self._check_manifest()
        self.arch: str = self.manifest["arch"]
        self.vendor: str = self.manifest["vendor"]
        self.artifacts: list[dict] = self.manifest["artifacts"]
        self.failed: list[dict] = self.manifest["failed"]
        # the config an autotuner picked per key when the application was recorded (serve.py reads it)
        self.autotune: list[dict] = self.manifest.get("autotune", [])

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, arch={self.arch}, {len(self.artifacts)} artifacts)"

    def find(self, kernel: str, config: dict | str | None = None) -> dict:
        """The one artifact of `kernel` whose config has every given value (or whose config id is `config`)."""
        mine = [e for e in self.artifacts if isinstance(e, dict) and e.get("kernel") == kernel]
        if not mine:
            kernels = sorted({_show(e.get("kernel"), quote=False) for e in self.artifacts if isinstance(e, dict)})
            raise NoMatchingKernel(f"{self.path} ({self.arch}) has no kernel {kernel!r}; it has: {few(kernels)}"
                                   + self._failed_note(kernel))
        hits = [e for e in mine if matches(e, config)]
        if len(hits) == 1:
            self._check_entry(hits[0])
            return hits[0]
        listing = few((_show(e.get("config_id"), quote=False) for e in mine), sep="\n  ")
        what = "matches no" if not hits else f"matches {len(hits)}"
        raise NoMatchingKernel(f"{kernel} config {config!r} {what} artifact in {self.path} ({self.arch})"
                               + ("; give more config values" if hits else "")
                               + f". Its {kernel} configs:\n  {listing}" + self._failed_note(kernel, config))

    def binary(self, entry: dict) -> bytes:
        """The entry's binary, only once it is proven to be what the manifest says and for this arch."""
        data = self._read(entry["binary"], MAX_BINARY_BYTES)
        try:
            schema.check_binary(data, entry["sha256"], self.arch, entry["symbol"])
        except schema.BinaryRefused as e:
            raise BundleError(f"{self.path}: {entry['binary']} refused: {e}; the bundle was altered or "
                              f"corrupted, or is not for this arch: reinstall or rebuild it") from None
        return data

    def tuned(self, kernel: str) -> dict:
        """The kernel's tuning table shipped in this bundle (ranked configs per tuned shape)."""
        from .select import NoTunedConfig, check_table
        tables = self.manifest.get("tuned")
        info = tables.get(kernel) if isinstance(tables, dict) else None
        if not isinstance(info, dict):
            raise NoTunedConfig(f"{self.path} ({self.arch}) has no tuning table for {kernel!r}; tune it on a "
                                f"{self.arch} GPU (out/tune/{self.arch}/{kernel}.json) and run `doit package`")
        data = self._read(info.get("path"), MAX_JSON_BYTES)
        if hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise BundleError(f"{self.path}: {info['path']} does not match its sha256 in the manifest; reinstall "
                              f"or rebuild the bundle")
        table = _parse_json(data, f"{self.path}: unreadable {info['path']}")
        check_table(table, f"{self.path}: {info['path']}")
        return table

    def find_for_shape(self, kernel: str, shape: dict[str, int], where: dict | None = None) -> tuple[dict, str]:
        """(artifact, why) of the config the tuning table picks for `shape` (select.choose)."""
        from .select import choose
        entries = {e["config_id"]: e for e in self.artifacts if isinstance(e, dict) and e.get("kernel") == kernel
                   and isinstance(e.get("config_id"), str)}   # any other is refused where find() picks it
        config_id, why = choose(self.tuned(kernel), shape, entries, where)
        return self.find(kernel, config_id), why

    def load(self, kernel: str, config: dict | str | None = None):
        """The kernel, loaded into the current GPU context (which the caller knows is of this arch)."""
        return self.kernel(self.find(kernel, config))

    def kernel(self, entry: dict, device: int | None = None, binary: bytes | None = None):
        """A picked entry, checked (unless its checked `binary` is given) and loaded (in a thread with no GPU context,
        into `device`'s primary one)."""
        from .launch import Kernel
        return Kernel(entry, self.binary(entry) if binary is None else binary, self.vendor, device)

    def _failed_note(self, kernel: str, config=None) -> str:
        bad = [f for f in self.failed if isinstance(f, dict) and f.get("kernel") == kernel and matches(f, config)]
        return "".join(f"\n  ({_show(f.get('config_id'), quote=False)}: {_show(f.get('status'), quote=False)} at "
                       f"build time: {_show(_first_line(f['error']), quote=False, limit=200)})"
                       for f in bad[:5] if f.get("error"))

    def _find_manifest_dir(self) -> str:
        dirs = [n[:-len(MANIFEST)] for n in self._zip.namelist() if n.count("/") == 1 and n.endswith("/" + MANIFEST)]
        if len(dirs) != 1:
            raise BundleError(f"{self.path}: expected one <package>/{MANIFEST} in the archive, found {len(dirs)}")
        return dirs[0]

    def _read(self, relative: str, limit: int) -> bytes:
        relative = safe_relative(relative, self.path)
        if self._zip is not None:
            return self._read_member(relative, limit)
        try:
            full = (self._root / relative).resolve()
        except (OSError, RuntimeError) as e:   # RuntimeError: a symlink loop
            raise BundleError(f"{self.path}: cannot resolve {relative} ({e}); reinstall or rebuild the "
                              f"bundle") from None
        if not full.is_relative_to(self._root):   # a symlink that leads out of the bundle
            raise BundleError(f"{self.path}: {relative} resolves outside the bundle ({full}); refused")
        try:
            return read_regular(full, limit)
        except OSError as e:
            raise BundleError(f"{self.path}: cannot read {relative} ({e}); reinstall or rebuild the bundle") from None

    def _read_member(self, relative: str, limit: int) -> bytes:
        try:
            info = self._zip.getinfo(self._prefix + relative)
        except KeyError:
            raise BundleError(f"{self.path}: {relative} is named in the manifest but not in the archive") from None
        if info.file_size > limit:   # a member that says it is too big is refused unread
            raise BundleError(f"{self.path}: {relative} is {info.file_size} bytes, over the loader's limit of "
                              f"{limit}; refused")
        try:
            return read_member(self._zip, info, limit)
        except OverLimit:
            raise BundleError(f"{self.path}: {relative} inflates past the loader's limit of {limit} bytes; "
                              f"refused") from None
        except _ZIP_ERRORS as e:
            raise BundleError(f"{self.path}: cannot read {relative} from the archive ({e}); reinstall or rebuild "
                              f"it") from None

    def _check_digest(self, data: bytes) -> None:
        """The manifest is the one `doit package` wrote: each binary is proven by the sha256 the manifest gives
        it, and the manifest by the digest written beside it."""
        try:
            digest = self._read(MANIFEST_DIGEST, 100)
        except BundleError:   # not there, not a file, or longer than a digest: none to prove the manifest by
            digest = None
        if digest is None or digest.strip() != hashlib.sha256(data).hexdigest().encode():
            why = "has no" if digest is None else "does not match its"
            raise BundleError(f"{self.path}: {MANIFEST} {why} {MANIFEST_DIGEST}: the bundle was altered after "
                              f"`doit package` wrote it, or by a kforge before the digest; refused: package it "
                              f"again (`doit package`)")

    def _check_manifest(self) -> None:
        m = self.manifest
        where = f"{self.path}: {MANIFEST}"
        if not isinstance(m, dict) or m.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"{where} is not a kforge bundle manifest; rebuild it with `doit package`")
        if m.get("format_version") != BUNDLE_FORMAT_VERSION:
            raise BundleError(f"{where} has format_version {_show(m.get('format_version'))}; this loader reads "
                              f"{BUNDLE_FORMAT_VERSION}: rebuild the bundle with a matching kforge")
        for key, kind in (("arch", str), ("vendor", str), ("artifacts", list), ("failed", list)):
            if not isinstance(m.get(key), kind):
                raise BundleError(f"{where}: {key!r} must be a {kind.__name__}; rebuild it with `doit package`")
        tuned = m.get("autotune", [])
        if not (isinstance(tuned, list) and all(
                isinstance(t, dict) and isinstance(t.get("kernel"), str) and isinstance(t.get("config"), dict)
                and isinstance(t.get("key"), list) for t in tuned)):
            raise BundleError(f"{where}: 'autotune' must be a list of {{kernel, key, config}}; rebuild it with "
                              f"`doit package`")
        for key in ("arch", "vendor"):   # names such as sm_90a and nvidia: they go into messages and file names
            if not _NAME.fullmatch(m[key]):
                raise BundleError(f"{where}: {key!r} is {_show(m[key])}, not a name of letters, digits and _; "
                                  f"rebuild it with `doit package`")
        from .archs import ARCHS
        known = ARCHS.get(m["arch"])   # the vendor picks the driver: a cubin must never reach HIP, nor a code
        if known is None or known.vendor != m["vendor"]:   # object the CUDA driver
            pairs = ", ".join(f"{a.name}: {a.vendor}" for a in ARCHS.values())
            raise BundleError(f"{where}: arch {_show(m['arch'])} with vendor {_show(m['vendor'])} is not an arch "
                              f"this loader knows with its vendor ({pairs}); rebuild it with `doit package`")

    def _check_entry(self, e: dict) -> None:
        """An entry is checked when it is picked: a process loading one kernel does not pay for the rest."""
        where = f"{self.path}: {MANIFEST}: artifact {_show(e.get('target'))}"
        for key, kind in ENTRY_FIELDS.items():
            if not isinstance(e.get(key), kind):
                raise BundleError(f"{where} needs {key!r} as a {kind.__name__}")
        if e["arch"] != self.arch:
            raise BundleError(f"{where} is for {_show(e['arch'], quote=False)}, the bundle is for {self.arch}; refused")
        safe_relative(e["binary"], self.path)


class OverLimit(ValueError):
    """An archive member that inflates past the limit its reader sets."""


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """An archive member's bytes, inflated a chunk at a time and never past `limit` (OverLimit) nor the size its
    headers give: zipfile's read() of a whole member inflates the whole stream before it cuts it there (a member
    claiming 12 kB that inflates to 1 GiB took 2 GB and 5 s before its CRC failed); the CRC is checked on what
    was read. Shared with `doit package`, which reads the wheels it finds in out/dist/ (untrusted too)."""
    if info.file_size > limit:
        raise OverLimit(info.filename)
    chunks, size = [], 0
    with archive.open(info) as member:
        while chunk := member.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise OverLimit(info.filename)
            chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(data: bytes, unreadable: str):
    """json.loads without the garbage collector: the manifest's many small containers would otherwise
    set off collections that walk the whole heap (large in a process that imported torch)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:   # RecursionError: arrays or objects nested too deeply
        raise BundleError(f"{unreadable} ({_show(str(e), quote=False, limit=200)}); rebuild the bundle with "
                          f"`doit package`") from None
    finally:
        if was_enabled:
            gc.enable()


def open_regular(path):
    """`path` opened for reading, if it is a regular file (else OSError). O_NONBLOCK: a FIFO or a device
    opens at once instead of waiting for a writer, and is then refused; O_NOCTTY: a terminal is not taken."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{path} is {file_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, limit: int) -> bytes:
    """A regular file's bytes; OSError for anything else, or for more than `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)   # not fstat's size: the file may grow while it is read
    if len(data) > limit:
        raise OSError(f"{path} is over the loader's limit of {limit} bytes")
    return data


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message: the one wording, the runtime's and kforge's."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a terminal or character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _show(value, quote: bool = True, limit: int = 80) -> str:
    """A manifest value for a one-line message: scalars cut short, containers only named (the repr of a deeply
    nested one would overflow the stack)."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    text = value if not quote and isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _first_line(text):
    return (text.splitlines() or [""])[0] if isinstance(text, str) else text


def matches(entry: dict, config: dict | str | None) -> bool:
    if config is None:
        return True
    if isinstance(config, str):
        return entry.get("config_id") == config
    values = entry.get("config")
    return isinstance(values, dict) and all(k in values and values[k] == v for k, v in config.items())


def safe_relative(name, bundle: Path) -> str:
    """A manifest path must be relative, normalized and inside the bundle: no '..', no absolute path."""
    if (not isinstance(name, str) or not name or "\\" in name or not name.isprintable() or name.startswith("/")
            or posixpath.normpath(name) != name or name.split("/")[0] in ("..", ".")
            or ":" in name.split("/")[0]):   # isprintable: no NUL, control character or lone surrogate
        raise BundleError(f"{bundle}: the manifest names {_show(name)}, a path outside the bundle or not "
                          f"normalized; refused")
    return name
