"""Open kernel bundles (made by `doit package`), check them, and pick the artifact a caller asks for.

A bundle is one arch's wheel (or its unpacked package directory): manifest.json plus the binaries it
names. Nothing is trusted: the manifest is plain JSON (no pickle anywhere), each binary path must stay
inside the bundle, and each binary must match its sha256 and be an ELF file for the bundle's arch before
a driver sees it.
"""
from __future__ import annotations

import gc
import hashlib
import json
import posixpath
import zipfile
from pathlib import Path

from .elf import ElfError, check_binary

FORMAT = "kforge-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_ENTRY_FIELDS = {"target": str, "kernel": str, "config_id": str, "config": dict, "arch": str, "binary": str,
                 "sha256": str, "symbol": str, "signature": list, "threads_per_block": int, "shared": int,
                 "toolchain": str}


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
            try:
                self._zip = zipfile.ZipFile(self.path)
            except (OSError, zipfile.BadZipFile):
                raise BundleError(f"{self.path}: not a bundle (expected a .whl/.zip file or a directory with "
                                  f"{MANIFEST})") from None
            self._prefix = self._find_manifest_dir()
        try:
            self.manifest = _parse_json(self._read(MANIFEST))
        except (OSError, KeyError, ValueError) as e:
            raise BundleError(f"{self.path}: unreadable {MANIFEST} ({e}); rebuild it with `doit package`") from None
        self._check_manifest()
        self.arch: str = self.manifest["arch"]
        self.vendor: str = self.manifest["vendor"]
        self.artifacts: list[dict] = self.manifest["artifacts"]
        self.failed: list[dict] = self.manifest["failed"]

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, arch={self.arch}, {len(self.artifacts)} artifacts)"

    def find(self, kernel: str, config: dict | str | None = None) -> dict:
        """The one artifact of `kernel` whose config has every given value (or whose config id is `config`)."""
        mine = [e for e in self.artifacts if isinstance(e, dict) and e.get("kernel") == kernel]
        if not mine:
            kernels = sorted({str(e.get("kernel")) for e in self.artifacts if isinstance(e, dict)})
            raise NoMatchingKernel(f"{self.path} ({self.arch}) has no kernel {kernel!r}; it has: {', '.join(kernels)}"
                                   + self._failed_note(kernel))
        hits = [e for e in mine if matches(e, config)]
        if len(hits) == 1:
            self._check_entry(hits[0])
            return hits[0]
        listing = "\n  ".join(str(e.get("config_id")) for e in mine)
        what = "matches no" if not hits else f"matches {len(hits)}"
        raise NoMatchingKernel(f"{kernel} config {config!r} {what} artifact in {self.path} ({self.arch})"
                               + ("; give more config values" if hits else "")
                               + f". Its {kernel} configs:\n  {listing}" + self._failed_note(kernel, config))

    def binary(self, entry: dict) -> bytes:
        """The entry's binary, only once it is proven to be what the manifest says and for this arch."""
        data = self._read(entry["binary"])
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise BundleError(f"{self.path}: {entry['binary']} has sha256 {digest}, the manifest says "
                              f"{entry['sha256']}: the bundle was altered or corrupted; reinstall or rebuild it")
        try:
            check_binary(data, self.arch, entry["symbol"])
        except ElfError as e:
            raise BundleError(f"{self.path}: {entry['binary']} refused: {e}") from None
        return data

    def tuned(self, kernel: str) -> dict:
        """The kernel's tuning table shipped in this bundle (ranked configs per tuned shape)."""
        from .select import NoTunedConfig, check_table
        info = (self.manifest.get("tuned") or {}).get(kernel)
        if not isinstance(info, dict):
            raise NoTunedConfig(f"{self.path} ({self.arch}) has no tuning table for {kernel!r}; tune it on a "
                                f"{self.arch} GPU (out/tune/{self.arch}/{kernel}.json) and run `doit package`")
        data = self._read(info.get("path"))
        if hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise BundleError(f"{self.path}: {info.get('path')} does not match its sha256 in the manifest")
        table = _parse_json(data)
        check_table(table, f"{self.path}: {info.get('path')}")
        return table

    def find_for_shape(self, kernel: str, shape: dict[str, int], where: dict | None = None) -> tuple[dict, str]:
        """(artifact, why) of the config the tuning table picks for `shape` (arg name -> size), among the
        configs with the `where` values (e.g. {"dtype": "bf16"}) when the table ranks several kinds."""
        from .select import choose
        entries = {e.get("config_id"): e for e in self.artifacts if isinstance(e, dict) and e.get("kernel") == kernel}
        config_id, why = choose(self.tuned(kernel), shape, entries, where)
        return self.find(kernel, config_id), why

    def load(self, kernel: str, config: dict | str | None = None):
        """The kernel, loaded into the current GPU context (the caller knows the device is this arch)."""
        return self.kernel(self.find(kernel, config))

    def kernel(self, entry: dict):
        """A picked entry's binary, checked, loaded into the current GPU context and ready to launch."""
        from .launch import Kernel
        return Kernel(entry, self.binary(entry), self.vendor)

    def _failed_note(self, kernel: str, config=None) -> str:
        bad = [f for f in self.failed if isinstance(f, dict) and f.get("kernel") == kernel and matches(f, config)]
        return "".join(f"\n  ({f.get('config_id')}: {f.get('status')} at build time: {str(f['error']).splitlines()[0]})"
                       for f in bad[:5] if f.get("error"))

    def _find_manifest_dir(self) -> str:
        dirs = [n[:-len(MANIFEST)] for n in self._zip.namelist() if n.count("/") == 1 and n.endswith("/" + MANIFEST)]
        if len(dirs) != 1:
            raise BundleError(f"{self.path}: expected one <package>/{MANIFEST} in the archive, found {len(dirs)}")
        return dirs[0]

    def _read(self, relative: str) -> bytes:
        relative = safe_relative(relative, self.path)
        if self._zip is not None:
            try:
                return self._zip.read(self._prefix + relative)
            except KeyError:
                raise BundleError(f"{self.path}: {relative} is named in the manifest but not in the archive") from None
        full = (self._root / relative).resolve()
        if not full.is_relative_to(self._root):   # a symlink that leads out of the bundle
            raise BundleError(f"{self.path}: {relative} resolves outside the bundle ({full}); refused")
        return full.read_bytes()

    def _check_manifest(self) -> None:
        m = self.manifest
        where = f"{self.path}: {MANIFEST}"
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise BundleError(f"{where} is not a kforge bundle manifest")
        if m.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"{where} has format_version {m.get('format_version')!r}; this loader reads "
                              f"{FORMAT_VERSION}: rebuild the bundle with a matching kforge")
        for key, kind in (("arch", str), ("vendor", str), ("artifacts", list), ("failed", list)):
            if not isinstance(m.get(key), kind):
                raise BundleError(f"{where}: {key!r} must be a {kind.__name__}")

    def _check_entry(self, e: dict) -> None:
        """An entry is checked when it is picked: a process loading one kernel does not pay for the rest."""
        where = f"{self.path}: {MANIFEST}: artifact {e.get('target')!r}"
        for key, kind in _ENTRY_FIELDS.items():
            if not isinstance(e.get(key), kind):
                raise BundleError(f"{where} needs {key!r} as a {kind.__name__}")
        if e["arch"] != self.arch:
            raise BundleError(f"{where} is for {e['arch']}, the bundle is for {self.arch}; refused")
        safe_relative(e["binary"], self.path)


def _parse_json(data: bytes):
    """json.loads without the garbage collector: the manifest's many small containers would otherwise
    set off collections that walk the whole heap (large in a process that imported torch)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    finally:
        if was_enabled:
            gc.enable()


def matches(entry: dict, config: dict | str | None) -> bool:
    if config is None:
        return True
    if isinstance(config, str):
        return entry.get("config_id") == config
    values = entry.get("config")
    return isinstance(values, dict) and all(values.get(k, _MISSING) == v for k, v in config.items())


_MISSING = object()


def safe_relative(name, bundle: Path) -> str:
    """A manifest path must be relative, normalized and inside the bundle: no '..', no absolute path."""
    if (not isinstance(name, str) or not name or "\\" in name or "\0" in name or name.startswith("/")
            or posixpath.normpath(name) != name or name.split("/")[0] in ("..", ".")
            or ":" in name.split("/")[0]):
        raise BundleError(f"{bundle}: the manifest names {name!r}, a path outside the bundle or not normalized; "
                          f"refused")
    return name
