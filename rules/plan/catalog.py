"""The catalog (specs -> families and targets), kept in out/.kforge/catalog.json between runs.

Loading specs and computing 1,000+ targets (parsing every kernel source for its imports, hashing them, one
action key per target) is most of a no-op run. Its result depends only on files and settings that can be
checked without doing that work: the list of spec files and each of them, every kernel source and project
module the targets were computed from, every file the probe read importing a family's module (its heuristics,
its config files: rules/load/entry_probe.py) and every folder it listed (a config file added there), the project
files an import looked for and did not find (one created there would change what the import finds), kforge's
own code, the toolchain fingerprints, the compiler
environment, the Python, where each installed kernel module is found (which copy of a package an import finds),
the project's path and the settings that shape the catalog. The saved catalog is
used only while the digest of all of those (files by identity: inode, mtime, ctime, size) is the one saved with it;
anything else, a damaged file included, loads it again. It is saved as soon as it is loaded from the specs,
whatever the command (`doit list`, `info` and `prune` then find it too), and holds the targets of the archs it
was loaded for: it serves a run for those or fewer (`archs=` of a build, none for `doit list`: every arch).

The last KEPT catalogs loaded from the specs are also kept in out/.kforge/catalogs/, each named by the digest of
the same inputs taken by content (each file's bytes, each folder's names) instead of identity. When the saved
catalog's stamp no longer holds, that digest (over the saved catalog's lists of files) names the kept catalog
made from exactly these contents, if any: a revert, or a switch back to a recent branch, rewrites the sources
(new identities, the same bytes) and finds its catalog there instead of loading every spec again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

import kforge
import kforge_runtime
from kforge.plan import keys
from kforge.base import stamps
from kforge.store.files import write_inside
from kforge.base.layout import Layout
from kforge.base.errors import SpecError
from kforge.base.target import Target
from kforge.base.project_config import PYPROJECT, kforge_table

FORMAT = "kforge-catalog-12"   # 12: a target's key without its sources (early cutoff)
KEPT = 4   # catalogs by content in out/.kforge/catalogs/
# kforge's own code: the build system and the runtime (its schema and arch table shape targets too); one
# folder in a checkout, two where kforge is installed
KFORGE_CODE = (Path(kforge.__file__).resolve().parent, Path(kforge_runtime.__file__).resolve().parent)


class Family(NamedTuple):
    """What the tasks need of a spec beyond its targets."""
    name: str
    description: str
    path: str       # the spec file
    tuned: bool     # has a [tune] table (`doit tune` loads the spec itself)


class Broken(NamedTuple):
    """A family that did not load: its spec is wrong, its module cannot be imported, or the import (its
    heuristics, its pruner) failed or ran past catalog_timeout. It is one failed task; the rest build."""
    name: str    # the family's name, or the spec file's when it cannot be read (unique among the tasks)
    path: str    # the spec file (a Python catalog's: the file and line of the call)
    error: str   # one line: what failed, where (the library's file:line) and the fix if known

    def line(self) -> str:
        return f"family {self.name} did not load: {self.error}"


class Catalog:
    def __init__(self, root: Path, archs: tuple[str, ...] | None, max_configs: int):
        self.root, self.archs, self.max_configs = root, archs, max_configs
        self.path = Layout(root).state / "catalog.json"
        self.families: list[Family] = []
        self.targets: list[Target] = []
        self.tuned: list[dict] = []   # autotuners' recorded picks (rules/declare/records.py), for the bundles
        self.broken: list[Broken] = []   # families that did not load (never saved: the next run tries again)
        self._fresh: dict | None = None   # a catalog loaded from the specs or kept, not saved yet
        self.loaded_from = ""   # "saved", "kept" or "specs": where load() found it

    def load(self, keep_going: bool = False) -> "Catalog":
        """From the saved catalog when its stamp still holds, else from a kept one made from the same content,
        else from the specs (SpecError, ValueError). A family that does not load is a SpecError, or with
        keep_going one entry of `broken` (the others load)."""
        folders = catalog_folders(self.root)
        spec_files = catalog_files(self.root, folders)
        saved = self._read_saved()
        try:
            if saved is not None and covers(saved["archs"], self.archs) and \
                    saved["stamp"] == self._stamp(folders, spec_files, saved["read"], saved["toolchains"],
                                                  saved["installed"]):
                self._take(saved)
                self.loaded_from = "saved"
                return self
            if saved is not None and self._from_kept(folders, spec_files, saved):
                self.loaded_from = "kept"
                return self._saved_now()
        except (KeyError, TypeError, ValueError, IndexError):   # a damaged file: load the specs instead
            self.families, self.targets, self.tuned = [], [], []
        from kforge.plan.targets import build_targets   # only here: a run that finds its saved catalog loads no spec
        read: set[Path] = set()
        from kforge.load.entry_probe import Probe
        failed: list[tuple[str, str, str]] = []   # (name, spec file, error) of each family that did not load
        lost: set[int] = set()

        def fails(spec, error: SpecError) -> None:   # keep going, as a build does past a failed target
            lost.add(id(spec))
            failed.append((spec.name, spec.path, str(error)))
        try:
            specs = load_specs(self.root, spec_files, read, failed)
            from kforge.declare.records import without_duplicates
            self.targets = without_duplicates(build_targets(specs, self.root, self.archs, read, fails))
            specs = [s for s in specs if id(s) not in lost]
            bad_files = {f for f in spec_files if any(_rel(f, self.root) == path for _, path, _ in failed)}
            self.tuned = tuned_choices(self.root, [f for f in spec_files if f not in bad_files], self.archs)
            read.update(map(Path, Probe.read))   # what importing the modules read: heuristics, data files
        finally:
            Probe.close_all()   # the child that answered for autotuned / heuristics entries, if one ran
        self.families = [Family(s.name, s.description, s.path, s.tune is not None) for s in specs]
        self.loaded_from = "specs"
        self.broken = _named_apart(failed, {f.name for f in self.families})
        if self.broken and not keep_going:
            raise SpecError(self.broken[0].error)
        if self.broken:   # not saved: the next run loads the specs again, and finds what was fixed
            return self
        toolchains = sorted({(t.toolchain, t.arch) for t in self.targets})
        files = sorted(str(p) for p in read)
        installed = sorted({s.module for s in specs if s.module})
        self._fresh = {"format": FORMAT, "archs": self.archs,
                       "stamp": self._stamp(folders, spec_files, files, toolchains, installed),
                       "content": self._stamp(folders, spec_files, files, toolchains, installed, stamps.content),
                       "read": files, "toolchains": toolchains, "installed": installed,
                       "families": [list(f) for f in self.families], "tuned": self.tuned,
                       **_encode(self.targets)}
        return self._saved_now()

    def _saved_now(self) -> "Catalog":
        try:   # now, not only at the end of a build: `doit list`, `info` and `prune` find it next time too
            self.save()
        except (OSError, ValueError):   # a full disk, a read-only out/, a link out of out/ (OutsideOut): the
            pass                          # end of a run tries again, and says so
        return self

    def _take(self, saved: dict) -> None:
        """The families and, for the archs asked for, the targets and tuned picks of a saved catalog (it may
        hold more archs: one loaded for every arch serves a build for one)."""
        wanted = set(self.archs) if self.archs is not None else None
        self.families = [Family(*f) for f in saved["families"]]
        self.targets = [t for t in _decode(saved["groups"], saved["signatures"], saved["targets"])
                        if wanted is None or t.arch in wanted]
        self.tuned = [t for t in saved["tuned"] if wanted is None or t["arch"] in wanted]

    def _from_kept(self, folders: list[Path], spec_files: list[Path], saved: dict) -> bool:
        """Load the kept catalog made from inputs of the same content as now, for these archs or for all, if
        there is one (see the module's docstring); it becomes the saved catalog, stamped by the identities of
        now."""
        lists = saved["read"], saved["toolchains"], saved["installed"]
        content = self._stamp(folders, spec_files, *lists, stamps.content)
        for archs in dict.fromkeys((self.archs, None)):
            try:
                kept = json.loads((Layout(self.root).kept_catalogs / _kept_name(content, archs)).read_bytes())
                if kept["format"] != FORMAT or kept["content"] != content or not covers(kept["archs"], self.archs):
                    continue
                self._take(kept)
            except (OSError, KeyError, TypeError, ValueError, IndexError):   # none, or a damaged one
                self.families, self.targets, self.tuned = [], [], []
                continue
            self._fresh = {**kept, "stamp": self._stamp(folders, spec_files, *lists)}   # the same lists: same digest
            return True
        return False

    def save(self) -> None:
        """Keep a catalog loaded from the specs (or a kept one) for the next run, and among the kept ones
        (right after it is loaded; the end of a run tries again if that failed)."""
        if self._fresh is not None:
            out, kept = Layout(self.root).out, Layout(self.root).kept_catalogs
            data = json.dumps(self._fresh, separators=(",", ":")).encode()
            write_inside(out, self.path, data)
            write_inside(out, kept / _kept_name(self._fresh["content"], self._fresh["archs"]), data)
            for old in sorted(kept.glob("*.json"), key=lambda f: f.stat().st_mtime_ns, reverse=True)[KEPT:]:
                old.unlink(missing_ok=True)
            self._fresh = None

    def _read_saved(self) -> dict | None:
        try:
            saved = json.loads(self.path.read_bytes())
            return saved if isinstance(saved, dict) and saved.get("format") == FORMAT else None
        except (OSError, ValueError):
            return None

    def _stamp(self, folders: list[Path], spec_files: list[Path], read: list[str], toolchains: list,
               installed: list[str], of=stamps.identity) -> str:
        """The digest of everything the catalog came from, each file by `of`: its identity, or its content."""
        # the folders are in by identity too: a spec file added to one changes its mtime
        files = [*map(str, spec_files), *read, str(self.root / PYPROJECT), *map(str, folders)]
        code = sorted({str(p) for folder in KFORGE_CODE for p in folder.rglob("*.py")})
        fingerprints = [keys.fingerprint_for(toolchain, arch, Layout(self.root).tool_versions)
                        for toolchain, arch in toolchains]
        return stamps.digest({   # not the archs: a catalog says which it holds, and serves any of them
            "format": FORMAT, "root": str(self.root), "python": sys.version,
            "installed": [(m, _found(m)) for m in installed],
            "max_configs": self.max_configs, "env": keys.compiler_env(), "toolchains": fingerprints,
            "files": [(f, of(f)) for f in sorted(set(files) | set(code))]})




def covers(held: list | None, wanted: tuple[str, ...] | None) -> bool:
    """Whether a catalog loaded for the archs `held` (None: every arch) holds every target for `wanted`."""
    return held is None or (wanted is not None and set(wanted) <= set(held))


def _kept_name(content: str, archs) -> str:
    return f"{content}-{'-'.join(sorted(archs)) if archs is not None else 'all'}.json"


def _found(module: str) -> str | None:
    """Where an installed kernel module is found now: another copy first on the path (PYTHONPATH, another
    environment) is another catalog, even when the files the saved one read are unchanged."""
    from kforge.load import installed
    try:
        return str(installed.find(module).path)
    except installed.NotInstalled:
        return None


def catalog_folders(root: Path) -> list[Path]:
    """Where the project's specs are: specs/, or the folders `[tool.kforge] catalog` in its pyproject.toml
    lists, each a folder relative to the project or an installed package by import name
    (`catalog = ["specs", "mylib.kforge_specs"]`). SpecError for an entry that is neither."""
    config = kforge_table(root)
    entries = config.get("catalog", ["specs"]) if isinstance(config, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, str) and e for e in entries):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: expected a non-empty list of folders (relative to "
                        f"the project) or installed packages (by import name), got {entries!r}")
    folders = []
    for entry in entries:
        folder = (root / entry).resolve()
        if folder.is_dir() and (root.resolve() == folder or root.resolve() in folder.parents):
            folders.append(folder)
            continue
        from kforge.load import installed
        try:
            found = installed.find(entry)
        except installed.NotInstalled as e:
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {entry!r} is neither a folder of the project "
                            f"nor an installed package ({e})") from None
        if found.path.name != "__init__.py":
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {entry} is a module, not a package; name the "
                            f"package whose folder holds the spec files")
        folders.append(found.path.parent)
    return folders


def catalog_files(root: Path, folders: list[Path] | None = None) -> list[Path]:
    """Every spec of the project: *.toml specs, *.py catalogs (rules/declare/python_catalog.py) and *.jsonl record files
    (rules/declare/records.py) in its catalog folders. A .py file whose name starts with `_` (`__init__.py`,
    `_helpers.py`) is a helper, not a catalog."""
    files = []
    for folder in catalog_folders(root) if folders is None else folders:
        files += sorted(f for f in folder.glob("*.toml"))
        files += sorted(f for f in folder.glob("*.py") if not f.name.startswith("_"))
        files += sorted(folder.glob("*.jsonl"))   # record files (rules/declare/records.py)
    return files


def load_specs(root: Path, files: list[Path] | None = None, read: set[Path] | None = None,
               failed: list | None = None) -> list:
    """Every family of the project's specs, checked; `read` collects what Python catalogs read. A file that
    fails is a SpecError, or, given `failed`, one (name, file, error) there and the others load."""
    from kforge.declare import python_catalog as declare, records
    from kforge.declare.spec import load_spec, spec_from_tables
    files = catalog_files(root) if files is None else files
    if not files:
        raise SpecError(f"{root / 'specs'}: no specs found (*.toml spec files, *.py catalogs or *.jsonl records)")
    specs = []
    extra = record_archs(root)
    for f in files:
        try:
            if not f.is_file():   # a FIFO would block the read, a link to /dev/zero never end it
                kind = "a folder" if f.is_dir() else "a pipe, a device or a broken link"
                raise SpecError(f"{_rel(f, root)}: not a regular file ({kind}); remove it from the catalog folder")
            if f.suffix == ".py":
                specs += declare.load(f, root, read, failed)
            elif f.suffix == ".jsonl":
                specs += [spec_from_tables(tables, where, root, recorded=True)
                          for tables, where in records.families(f, root, extra)]
            else:
                specs.append(load_spec(f, root))
        except SpecError as e:
            if failed is None:
                raise
            failed.append((_family_name(f), _rel(f, root), str(e)))
    return specs


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _family_name(path: Path) -> str:
    """The name a spec file gives its family, read as plainly as possible (it did not load); else the file's."""
    import tomllib
    from kforge.declare.spec import NAME_RE
    try:
        name = tomllib.loads(path.read_text(encoding="utf-8"))["kernel"]["name"] if path.suffix == ".toml" else None
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    return name if isinstance(name, str) and NAME_RE.match(name) else path.stem


def _named_apart(failed: list[tuple[str, str, str]], taken: set[str]) -> list[Broken]:
    """Broken entries whose names are task names of their own: a name a family that loaded (or another broken
    one) has, or a kforge task's, gets a suffix."""
    import re
    from kforge.declare.spec import NAME_RE, RESERVED_NAMES
    found = []
    for name, path, error in failed:
        if not NAME_RE.match(name):   # a file's name: as a task name
            name = re.sub(r"[^a-z0-9_]", "_", name.lower()).lstrip("_0123456789") or "family"
        candidate, n = name, 1
        while candidate in taken or candidate in RESERVED_NAMES:
            n += 1
            candidate = f"{name}_broken" + (str(n - 1) if n > 2 else "")
        taken.add(candidate)
        found.append(Broken(candidate, path, error if error.startswith(path) else f"{path}: {error}"))
    return found


def tuned_choices(root: Path, files: list[Path], archs: tuple[str, ...] | None) -> list[dict]:
    """The autotuners' picks in the catalog's record files, for the archs built."""
    from kforge.declare import records
    extra = record_archs(root)
    return [t for f in files if f.suffix == ".jsonl" for t in records.tuned_choices(f, root, extra)
            if archs is None or t["arch"] in archs]


def record_archs(root: Path) -> tuple[str, ...]:
    """`[tool.kforge] record_archs`: archs every record is built for besides the one it was recorded on."""
    from kforge.base.archs import ARCHS
    config = kforge_table(root)
    archs = config.get("record_archs", []) if isinstance(config, dict) else []
    if not isinstance(archs, list) or not all(a in ARCHS for a in archs):
        raise SpecError(f"{PYPROJECT}: [tool.kforge] record_archs: expected a list of archs ({', '.join(ARCHS)}), "
                        f"got {archs!r}")
    return tuple(archs)


# A target's fields, stored once per (family, arch) group or once per target. Its layout is stored as the
# project root; every path of the target is asked of it (rules/base/layout.py).
SHARED = ("kernel", "arch", "spec_path", "toolchain", "source", "module", "entry", "divisible_by_16",
          "source_digests", "toolchain_versions", "layout", "env", "notes", "device_model", "setup")
OWN = ("config_id", "constexprs", "options", "config", "key", "key_without_sources")


def _encode(targets: list[Target]) -> dict:
    groups: dict[str, int] = {}
    signatures: dict[str, int] = {}
    rows = []
    for t in targets:
        shared = [str(t.layout.root) if f == "layout" else getattr(t, f) for f in SHARED]
        group = groups.setdefault(json.dumps(shared), len(groups))
        signature = signatures.setdefault(json.dumps(t.signature), len(signatures))
        rows.append([group, signature, *(getattr(t, f) for f in OWN), *([t.placeholders] if t.placeholders else [])])
    return {"groups": [json.loads(g) for g in groups], "signatures": [json.loads(s) for s in signatures],
            "targets": rows}


def _decode(groups: list, signatures: list, rows: list) -> list[Target]:
    pairs = lambda values: tuple(map(tuple, values))
    shared = [dict(zip(SHARED, (*g[:7], tuple(g[7]), pairs(g[8]), pairs(g[9]), Layout.of(g[10]), pairs(g[11]),
                                pairs(g[12]), g[13], tuple(g[14]))))
              for g in groups]
    signature = [pairs(s) for s in signatures]
    def placeholders(rest: list) -> tuple:
        return tuple((n, kind, tuple(v) if isinstance(v, list) else v) for n, kind, v in rest[0]) if rest else ()
    return [Target(**shared[group], config_id=config_id, signature=signature[sig], constexprs=pairs(constexprs),
                   options=pairs(options), config=pairs(config), key=key, key_without_sources=key_without_sources,
                   placeholders=placeholders(rest))
            for group, sig, config_id, constexprs, options, config, key, key_without_sources, *rest in rows]
