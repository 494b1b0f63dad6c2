"""Every path kforge reads or writes under a project's out/, in one place.

    out/<arch>/<kernel>/<config_id>/{<binary>, meta.json | error.txt}   one target's artifact
    out/dist/kforge_kernels_<arch>-<version>.whl (+ .manifest.json)    `doit package`
    out/tune/<arch>/<kernel>.json                                      `doit tune`
    out/build-report.json, out/.doit.sqlite3                           the last run; doit's own state
    out/.kforge/                                                       kforge's private state (indexes, stamps,
                                                                       scratch, tool versions, linker shims)
    out/.kforge/wheels/                                                wheels a rebuild replaced (ship/package.py)
    out/.kforge/catalogs/                                              recent catalogs by content (plan/catalog.py)
    out/.kforge/work/                                                  where a library's import runs (store/guard.py)
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from kforge_runtime.schema import ERROR, META, dist_name

OUT = "out"   # at the project root; the only directory of the project kforge writes into (rules/share/local_cache.py
              # writes in the user's cache directory, outside every checkout)


def _path(parent: str, name: str) -> property:
    """A Layout property: `name` in the folder the property `parent` is."""
    return property(lambda self: getattr(self, parent) / name)


class Layout(NamedTuple):   # a NamedTuple, not a dataclass: cheaper to import, and every run imports it
    root: Path   # the project: where dodo.py, specs/ and out/ are

    @classmethod
    def of(cls, root) -> "Layout":
        return cls(Path(root))

    @classmethod
    def holding(cls, path) -> "Layout":
        """The layout whose out/ holds `path`: the nearest folder named out/ above it."""
        found = next((p for p in Path(path).parents if p.name == OUT), None)
        if found is None:
            raise ValueError(f"{path} is not inside an {OUT}/ folder")
        return cls(found.parent)

    out = _path("root", OUT)
    state = _path("out", ".kforge")
    scratch = _path("state", "tmp")   # compilers' private temp directories (one per compile, removed after it)
    work = _path("state", "work")   # the working folder of the processes importing a family's module (guard.py)
    built_keys = _path("state", "built-keys.json")
    observed_inputs = _path("state", "observed-inputs.json")
    tool_versions = _path("state", "tools.json")
    doit_db = _path("out", ".doit.sqlite3")
    build_report = _path("out", "build-report.json")
    dist = _path("out", "dist")
    tune = _path("out", "tune")
    verify = _path("out", "verify")
    kept_catalogs = _path("state", "catalogs")   # the last catalogs loaded, named by their content (plan/catalog.py)
    kept_wheels = _path("state", "wheels")   # the last wheels a rebuild replaced, by their names (ship/package.py)

    def arch_dir(self, arch: str) -> Path:
        return self.out / arch

    # A Target asks these for its paths (rules/base/target.py) as strings: a no-op run looks up thousands of them in
    # the key and input indexes, which are keyed by meta.json's path as a string.
    def artifact_path(self, arch: str, kernel: str, config_id: str) -> str:
        """out/<arch>/<kernel>/<config_id>: the one spelling of an artifact directory."""
        return f"{self.root}/{OUT}/{arch}/{kernel}/{config_id}"

    def meta_path(self, arch: str, kernel: str, config_id: str) -> str:
        return f"{self.artifact_path(arch, kernel, config_id)}/{META}"

    def error_path(self, arch: str, kernel: str, config_id: str) -> str:
        return f"{self.artifact_path(arch, kernel, config_id)}/{ERROR}"

    def artifact_dirs(self, archs) -> list[str]:
        """Every directory or link out/<arch>/<kernel>/<name> of the archs, as strings (a no-op run lists thousands:
        os.scandir); symlinked arch or kernel directories are not entered."""
        found = []
        for arch in archs:
            for family in _subdirs(self.arch_dir(arch)):
                with os.scandir(family) as entries:
                    found += [e.path for e in entries if e.is_dir() or e.is_symlink()]
        return found

    def manifest_copy(self, arch: str) -> Path:
        """A copy of a bundle's manifest beside its wheel, for people and CI logs to read."""
        return self.dist / f"{dist_name(arch)}.manifest.json"

    def package_stamp(self, arch: str) -> Path:
        return self.state / f"package-{arch}.json"

    def tuning_table(self, arch: str, kernel: str) -> Path:
        return self.tune / arch / f"{kernel}.json"


def _subdirs(directory: Path) -> list[str]:
    if directory.is_symlink():
        return []
    try:
        with os.scandir(directory) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
