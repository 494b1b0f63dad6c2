"""The catalog (specs -> families and targets), kept in out/.kforge/catalog.json between runs.

Loading the specs and computing 1,000+ targets is most of a no-op run, so the saved catalog is used while its stamp
(one digest of every file it came from, by identity, of each environment variable its probes' imports read, by
value, and of kforge, Python, the settings and the toolchains) holds.
Else a kept catalog of the same content (out/.kforge/catalogs/: a revert, a branch switched back) is taken, else the
specs load family by family, each unchanged one taken unprobed. A catalog with a broken family is never taken whole;
a family whose probe failed on what it read is saved with that error, which the next loads replay unprobed while
what it read holds, for REPLAY_SECONDS at most (never a crash, a timeout, memory or the OS: entry_probe.unsteady).
Paths are saved by their place (Places), so a project or virtualenv at another path takes its catalog where the bytes
hold.
docs/caching.md says what each level compares.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import kforge
import kforge_runtime
from kforge_runtime.schema import one_line
from kforge.plan import keys
from kforge.base import stamps
from kforge.store import guard
from kforge.store.files import read_bytes, read_state, write_inside
from kforge.base.layout import Layout
from kforge.base.errors import SpecError
from kforge.base.target import Target
from kforge.base.project_config import PYPROJECT, kforge_table, read_user_file
from kforge.load.observe import VARIABLE, variable_digest

FORMAT = "kforge-catalog-14"   # 14: paths under the project and the Python environment saved by place (Places)
KEPT = 4   # catalogs by content in out/.kforge/catalogs/
# kforge's own code: the build system and the runtime (its schema and arch table shape targets too)
KFORGE_CODE = (Path(kforge.__file__).resolve().parent, Path(kforge_runtime.__file__).resolve().parent)


class Places:
    """The catalog's paths as saved: under the project, the Python environment or installation by that folder's
    name and the rest, any other as it is. Keys hold no absolute path (bench/reproducible.py), so a family taken
    from a copy made elsewhere is the one computed here."""

    MARK = "\0"   # no path holds a NUL: "\0project/specs/a.toml" is a saved place, never a file's name

    def __init__(self, root: Path):
        folders = [("project", os.path.abspath(root)), ("project-real", os.path.realpath(root)),
                   ("env", sys.prefix), ("env-real", os.path.realpath(sys.prefix)),
                   ("python", sys.base_prefix), ("python-real", os.path.realpath(sys.base_prefix))]
        self._folders = dict(folders)
        # the innermost folder a path lies in names it (an environment inside the project is the environment);
        # between folders that are one (a project path without links), the first
        self._innermost = sorted(((n, f) for n, f in folders if f != os.sep), key=lambda nf: -len(nf[1]))

    def saved(self, path: str) -> str:
        """A path (or a "path:line") as the catalog saves it."""
        for name, folder in self._innermost:
            if path.startswith(folder) and path[len(folder):len(folder) + 1] in ("", os.sep):
                return f"{self.MARK}{name}{path[len(folder):]}"
        return path

    def actual(self, saved: str) -> str:
        """A saved path as it lies now (KeyError for a place this kforge does not name: a damaged file)."""
        if not saved.startswith(self.MARK):
            return saved
        name, sep, rest = saved[1:].partition(os.sep)
        return self._folders[name] + sep + rest


class Family(NamedTuple):
    """What the tasks need of a spec beyond its targets."""
    name: str
    description: str
    path: str       # the spec file
    tuned: bool     # has a [tune] table (`doit tune` loads the spec itself)


class Unloaded(NamedTuple):
    """A family its probe's answer failed: replayed while what the probe read holds (Catalog._replays)."""
    name: str       # as `failed` lists it
    asked: str      # the family's name as it asked the probe (Probe.reads_of)
    claims: bool    # its name was taken (a failure after its spec loaded): another family of that name clashes
    files: set      # what its targets' sources read before the failure (the probe's reads are added later)
    error: str      # as `failed` holds it: its place first


def _unloaded(name: str, where: str, error: SpecError, asked: set[str], claims: bool, files: set) -> Unloaded | None:
    """Unloaded when the error is a probe's steady answer (not kforge's own reading of a file that may be fixed, nor
    a crash, a timeout, memory or the OS), the family asked that probe alone, and the error names its place first
    (to be named anew when it moves); else None: loaded again next time."""
    from kforge.load.entry_probe import ProbeFailed
    if not (isinstance(error, ProbeFailed) and error.steady) or len(asked) != 1 or \
            not str(error).startswith(f"{where}: "):
        return None
    return Unloaded(name, next(iter(asked)), claims, files, str(error))


# how long a probe's failure is replayed: what it may hang on beyond what the probe watches (a library found through
# a .pth or an import finder elsewhere, a tool it runs, a file it tests for) is seen this long after, at the latest
REPLAY_SECONDS = 600


def _unloaded_fingerprint(archs, root: Path) -> str:
    """What a probe's failure may hang on besides what it read: the toolchain's versions (torch and triton are not
    inputs), the module path and the listing of each of its folders (a folder added to it, or a package, a
    dist-info, a .pth or an import finder installed in one, may hold what was missing) but the project's own
    folder and the running script's (a module the project gains is where the probe's import looked in vain: one
    of what it read) and the archs it was asked for."""
    from kforge.load.observe import TOOLCHAIN, listing_digest
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    skipped = {os.path.realpath(root), script}   # `doit` puts its script's folder first, `python -m doit` the cwd
    folders = [os.path.realpath(folder or ".") for folder in sys.path]

    def listing(folder: str) -> str | None:
        try:
            return None if folder in skipped else listing_digest(folder)
        except OSError:   # not there, or not a folder
            return None
    return stamps.digest({"toolchain": [keys.package_version(d) for d in TOOLCHAIN], "archs": archs,
                          "path": [(folder, listing(folder)) for folder in folders if folder not in skipped]})


class Broken(NamedTuple):
    """A family that did not load (its spec, its import, its heuristics): one failed task; the rest build."""
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
        self.broken: list[Broken] = []   # families that did not load (never saved: the next load tries again)
        self._fresh: dict | None = None   # a catalog loaded from the specs or kept, not saved yet
        self.places = Places(root)
        self.loaded_from = ""   # "saved", "kept" or "specs": where load() found it

    def load(self, keep_going: bool = False, taken: frozenset[str] = frozenset()) -> "Catalog":
        """A family that does not load is a SpecError, or with keep_going one entry of `broken`, named apart from
        the families and from `taken` (the project's own tasks)."""
        folders = catalog_folders(self.root)
        spec_files = catalog_files(self.root, folders)
        _make_work_folder(self.root)   # where the probes import, and the compile servers after this load
        saved = read_state(self.path, _well_shaped)   # untrusted: one not of this format is dropped with a warning
        try:
            if saved is not None and covers(saved["archs"], self.archs) and \
                    saved["stamp"] == self._stamp(folders, spec_files, self._read_of(saved), saved["toolchains"],
                                                  saved["installed"]):
                self._take(saved)
                self.loaded_from = "saved"
                return self
            if saved is not None and self._from_kept(folders, spec_files, saved):
                self.loaded_from = "kept"
                return self._saved_now()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):   # a damaged file (a path that is a
            self.families, self.targets, self.tuned = [], [], []                # number...): load the specs instead
        from kforge.load import installed
        with installed.shared():   # an installed module's closure walked once, not once per family of it
            self._from_specs(folders, spec_files, saved, keep_going, taken)
        return self if self._fresh is None else self._saved_now()

    def _from_specs(self, folders: list[Path], spec_files: list[Path], saved: dict | None, keep_going: bool,
                    taken: frozenset[str]) -> None:
        from kforge.declare import records
        from kforge.load.entry_probe import Probe
        archs = self.archs if saved is None else _union(saved["archs"], self.archs)
        contents: dict[str, str | None] = {}
        reusable = self._reusable(saved, archs, contents)
        fingerprint = functools.cache(lambda: _unloaded_fingerprint(archs, self.root))   # once a load, if asked
        replays = self._replays(saved, fingerprint, contents)
        unloaded: dict[tuple[str, str], dict] = {}   # a family its probe's answer failed, by (name, where): its saved
        # entry, or what makes it
        failed: list[tuple[str, str, str]] = []   # (name, spec file, error) of each family that did not load
        read: set[Path] = set()   # what the Python catalog files read
        done: list[tuple[Family, list[Target], dict | None]] = []   # per family: a reused one's entry, else None
        computed: dict[str, set] = {}   # a computed family's name -> the files and variables ($NAME) it read
        try:
            named: dict[str, str] = {}
            clashes: dict[str, list[str]] = {}   # a name given again -> the other files that give it
            ran: dict[str, dict] = {}   # each Python catalog file's inputs and declarations, for the next load
            kept_files = self._kept_files(saved, contents)
            for declared in declarations(self.root, spec_files, read, failed, kept_files, ran, contents):
                key = _declared_key(declared)
                if key in reusable:
                    entry, family, targets = reusable.pop(key)
                    family, targets = _moved(family, targets, declared.where)
                    if family.name not in named:
                        named[family.name] = family.path
                        done.append((family, targets, entry))
                        continue
                replay = replays[key].pop(0) if replays.get(key) else None
                if replay is not None and not (replay["claims"] and replay["name"] in named):   # failed so before
                    if replay["claims"]:
                        named[replay["name"]] = declared.where
                    failed.append((replay["name"], declared.where, f"{declared.where}: {replay['error']}"))
                    unloaded[replay["name"], declared.where] = {**replay, "replayed": True}
                    continue
                found = self._compute(declared, archs, named, failed, clashes)
                if isinstance(found, Unloaded):
                    if key is not None:
                        unloaded[found.name, declared.where] = {"key": key, "where": declared.where, "found": found}
                elif found is not None:
                    family, targets, files = found
                    computed[family.name] = files
                    done.append((family, targets, {"key": key}))
            for name, others in clashes.items():   # which of them was meant? neither is built: the first fails too
                done = [d for d in done if d[0].name != name]
                computed.pop(name, None)
                unloaded = {at: u for at, u in unloaded.items() if at[0] != name}
                failed.append((name, named[name], f"{named[name]}: kernel name {name!r} is also given by "
                                                  f"{', '.join(others)}; target names must be unique: rename one "
                                                  f"[kernel] name (neither builds until then)"))
            bad_files = {path for _, path, _ in failed}
            record_files = [f for f in spec_files if f.suffix == ".jsonl" and _rel(f, self.root) not in bad_files]
            self.tuned = [t for t in records.tuned_choices(record_files, self.root, record_archs(self.root))
                          if archs is None or t["arch"] in archs]
            fresh = [(u["found"].asked, u["found"].files) for u in unloaded.values() if "found" in u]
            for name, files in [*computed.items(), *fresh]:   # what importing its modules read: heuristics, data
                # files, and `$NAME`, a variable they read (kept a name: a Path would fold a "/" in it)
                files.update(f if f.startswith(VARIABLE) else Path(f) for f in Probe.reads_of(name))
        finally:
            Probe.close_all()   # the children that answered for autotuned / heuristics entries, if any ran
        self.families = [family for family, _, _ in done]
        self.targets = records.without_duplicates([t for _, targets, _ in done for t in targets])
        self.loaded_from = "specs"
        grouped = _grouped(failed)
        self.broken = _named_apart(grouped, {f.name for f in self.families} | set(taken))
        for i, ((name, path, _), broken) in enumerate(zip(grouped, self.broken)):   # by the name its task has
            if (name, path) in unloaded:
                unloaded[name, path]["task"] = broken.name
                if unloaded[name, path].get("replayed"):
                    self.broken[i] = broken._replace(error=f"{broken.error} (replayed: it failed so from these inputs "
                                                           f"before; `doit forget {broken.name}` loads it again)")
        if self.broken and not keep_going:
            raise SpecError(self.broken[0].error)
        entries = [entry if name not in computed else
                   self._entry(entry["key"], name, sorted(map(str, computed[name])), targets, contents)
                   for (name, _, _, _), targets, entry in done]
        # a family with a recorded target another family builds depends on the others: computed every time
        kept = {id(t) for t in self.targets}
        entries = [{**entry, "key": ""} if any(id(t) not in kept for t in targets) else entry
                   for entry, (_, targets, _) in zip(entries, done)]
        files = sorted({str(p) for p in read} | {self.places.actual(f) for e in entries for f, _ in e["inputs"]})
        toolchains = sorted({(t.toolchain, t.arch) for t in self.targets})
        installed = sorted({e["installed"] for e in entries if e["installed"]})
        whole = not self.broken   # else saved family by family only (the module's docstring says why)
        self._fresh = {"format": FORMAT, "archs": archs,
                       "stamp": self._stamp(folders, spec_files, files, toolchains, installed) if whole else "",
                       "content": self._stamp(folders, spec_files, files, toolchains, installed, stamps.content)
                       if whole else "",
                       "read": [self.places.saved(f) for f in files], "toolchains": toolchains,
                       "installed": installed, "context": self._context, "per_family": entries,
                       "catalog_files": {self.places.saved(f): _ran_at(r, self.places.saved) for f, r in ran.items()},
                       "families": [[*f[:2], self.places.saved(f.path), f.tuned] for f in self.families],
                       "tuned": self.tuned, **_encode(self.targets, self.places),
                       "unloaded": [self._unloaded_entry(u, fingerprint, contents) for u in unloaded.values()]}
        self._only()

    def refuse(self, why: dict[str, str], taken: set[str]) -> None:
        """The families named in `why` (name -> one line: why that name cannot be) listed broken, not built; the
        broken entries take no name of `taken` (the project's own tasks)."""
        refused = [(f.name, f.path, why[f.name]) for f in self.families if f.name in why]
        if refused:
            self.families = [f for f in self.families if f.name not in why]
            self.targets = [t for t in self.targets if t.kernel not in why]
            self.broken += _named_apart(refused, {*taken, *(f.name for f in self.families),
                                                  *(b.name for b in self.broken)})

    def _compute(self, declared: "Declared", archs, named: dict[str, str], failed: list,
                 clashes: dict[str, list[str]]) -> tuple | None:
        """(Family, its targets, the files they came from), or when it did not load (an entry of `failed`), None, or
        Unloaded where its probe's answer failed it, as it will while what the probe read holds."""
        from kforge.declare.spec import spec_from_tables
        from kforge.load.entry_probe import Probe
        from kforge.plan.targets import build_targets
        asked_before = set(Probe.used)
        try:
            spec = spec_from_tables(declared.tables, declared.where, self.root, recorded=declared.recorded)
        except SpecError as e:
            failed.append((declared.failed_name, declared.failed_where, str(e)))
            return _unloaded(declared.failed_name, declared.where, e, set(Probe.used) - asked_before, False, set())
        if spec.name in named:
            clashes.setdefault(spec.name, []).append(spec.path)
            failed.append((spec.name, spec.path, f"{spec.path}: kernel name {spec.name!r} is already used by "
                                                 f"{named[spec.name]}; target names must be unique: rename one "
                                                 f"[kernel] name (neither builds until then)"))
            return None
        named[spec.name] = spec.path
        files: set[Path] = set()
        try:
            targets = build_targets([spec], self.root, archs, files)
        except SpecError as e:
            failed.append((spec.name, spec.path, str(e)))
            return _unloaded(spec.name, declared.where, e, set(Probe.used) - asked_before, True, files)
        return Family(spec.name, spec.description, spec.path, spec.tune is not None), targets, files

    def _entry(self, key: str, name: str, files: list[str], targets: list[Target], contents: dict) -> dict:
        """What the next load needs to take this family unprobed: its declaration's key, its inputs by content
        (None: not there) and what else its targets' keys hold."""
        toolchains = sorted({(t.toolchain, t.arch) for t in targets})
        module = next((t.module for t in targets if t.module and not in_project(t.source, self.root)), "")
        return {"key": key, "name": name, "inputs": [[self.places.saved(f), _content(f, contents)] for f in files],
                "toolchains": toolchains, "installed": module,
                "fingerprint": self._fingerprint(toolchains, module)}

    def _reusable(self, saved: dict | None, archs, contents: dict) -> dict:
        """{declaration key: (entry, Family, targets)} of the saved catalog's families that still hold."""
        try:
            if saved is None or saved.get("context") != self._context or not covers(saved["archs"], archs):
                return {}
            families = {f[0]: self._family(f) for f in saved["families"]}
            found, targets = {}, None
            for entry in saved["per_family"]:
                if entry["name"] not in families or not isinstance(entry["key"], str) or \
                        any(_content(self.places.actual(f), contents) != digest for f, digest in entry["inputs"]) or \
                        self._fingerprint(entry["toolchains"], entry["installed"]) != entry["fingerprint"]:
                    continue
                if targets is None:
                    targets = {}
                    for t in _decode(saved["groups"], saved["signatures"], saved["targets"], self.places):
                        targets.setdefault(t.kernel, []).append(t)
                found[entry["key"]] = (entry, families[entry["name"]],
                                       [t for t in targets.get(entry["name"], ()) if archs is None or t.arch in archs])
            return found
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):   # a damaged file: every family is
            return {}                                                           # computed

    def _kept_files(self, saved: dict | None, contents: dict) -> dict:
        """{Python catalog file: its inputs and declarations} of the saved catalog, for those not to run again."""
        try:
            if saved is None or saved.get("context") != self._context:
                return {}
            actual = self.places.actual
            files = {actual(f): _ran_at(ran, actual) for f, ran in saved["catalog_files"].items()}
            return {f: ran for f, ran in files.items()
                    if all(_content(p, contents) == digest for p, digest in ran["inputs"])}
        except (KeyError, TypeError, ValueError, AttributeError):   # a damaged file: every catalog file runs
            return {}

    def _replays(self, saved: dict | None, fingerprint, contents: dict) -> dict[str, list[dict]]:
        """{declaration key: its saved entries} of the families whose probe failed them last time (one per
        declaration of those tables), while all they read and _unloaded_fingerprint hold, for REPLAY_SECONDS: their
        error is replayed, their modules not imported again."""
        try:
            if saved is None or not saved.get("unloaded") or saved.get("context") != self._context:
                return {}
            now, found = time.time(), {}
            for e in saved["unloaded"]:
                if isinstance(e["key"], str) and isinstance(e["name"], str) and isinstance(e["error"], str) \
                        and isinstance(e["claims"], bool) and isinstance(e["since"], (int, float)) \
                        and 0 <= now - e["since"] < REPLAY_SECONDS and e["fingerprint"] == fingerprint() \
                        and all(_content(self.places.actual(f), contents) == digest for f, digest in e["inputs"]):
                    found.setdefault(e["key"], []).append(e)
            return found
        except (KeyError, TypeError, ValueError, AttributeError):   # a damaged file: every such family loads again
            return {}

    def _unloaded_entry(self, unloaded: dict, fingerprint, contents: dict) -> dict:
        """What the next load needs to replay a family's failure: the error without its place (a line added above
        its family() call moves it), what it read by content, and the fingerprint (a replayed one: as saved)."""
        if "found" not in unloaded:
            return {k: v for k, v in unloaded.items() if k != "replayed"}
        found, where = unloaded["found"], unloaded["where"]
        return {"key": unloaded["key"], "name": found.name, "task": unloaded.get("task", found.name),
                "claims": found.claims, "since": int(time.time()),
                "error": found.error[len(where) + 2:], "fingerprint": fingerprint(),
                "inputs": [[self.places.saved(f), _content(f, contents)] for f in sorted(map(str, found.files))]}

    def _family(self, saved: list) -> Family:
        name, description, path, tuned = saved
        return Family(name, description, self.places.actual(path), tuned)

    def _read_of(self, saved: dict) -> list[str]:
        """The files a saved catalog read besides its spec files, where they lie now."""
        return [self.places.actual(f) for f in saved["read"]]

    def _fingerprint(self, toolchains: list, module: str) -> str:
        """What a family's targets' keys hold besides its files."""
        return stamps.digest({"toolchains": self._fingerprints(toolchains),
                              "installed": self._found(module) if module else None})

    def _fingerprints(self, toolchains: list) -> list:
        return [keys.fingerprint_for(chain, arch, Layout(self.root).tool_versions) for chain, arch in toolchains]

    @functools.cached_property   # once per load: it hashes every file of kforge
    def _context(self) -> str:
        """What every family of a catalog was computed in (not where the project lies: Places)."""
        return stamps.digest({
            "format": FORMAT, "python": sys.version, "max_configs": self.max_configs, "env": keys.compiler_env(),
            "code": [(folder, rel, stamps.content(path)) for folder, rel, path in self._code],
            "pyproject": stamps.content(str(self.root / PYPROJECT))})

    @functools.cached_property
    def _code(self) -> list[tuple[int, str, str]]:
        """kforge's own modules: (which of its code folders, path in it, path), sorted."""
        return sorted({(i, str(p.relative_to(folder)), str(p))
                       for i, folder in enumerate(KFORGE_CODE) for p in folder.rglob("*.py")})

    def _found(self, module: str) -> str | None:
        """Where an installed kernel module is found now, as saved: another copy first on the path (PYTHONPATH,
        another environment) is another catalog, even when the files the saved one read are unchanged."""
        from kforge.load import installed
        try:
            return self.places.saved(str(installed.find(module).path))
        except installed.NotInstalled:
            return None

    def _only(self) -> None:
        """Keep the targets and tuned picks of the archs asked for."""
        if self.archs is not None:
            self.targets = [t for t in self.targets if t.arch in self.archs]
            self.tuned = [t for t in self.tuned if t["arch"] in self.archs]

    def _saved_now(self) -> "Catalog":
        try:   # now, not only at the end of a build: `doit list`, `info` and `prune` find it next time too
            self.save()
        except (OSError, ValueError):   # a full disk, a read-only out/, a link out of out/ (OutsideOut): the
            pass                          # end of a run tries again, and says so
        return self

    def _take(self, saved: dict) -> None:
        """A saved catalog's families and, for the archs asked for, its targets and tuned picks."""
        self.families = [self._family(f) for f in saved["families"]]
        self.targets = _decode(saved["groups"], saved["signatures"], saved["targets"], self.places)
        self.tuned = list(map(_tuned_pick, saved["tuned"]))
        self._only()

    def _from_kept(self, folders: list[Path], spec_files: list[Path], saved: dict) -> bool:
        """Take the kept catalog of the inputs' content now, if any: saved, stamped by the identities of now."""
        lists = self._read_of(saved), saved["toolchains"], saved["installed"]
        content = self._stamp(folders, spec_files, *lists, stamps.content)
        for archs in dict.fromkeys((self.archs, None)):
            try:
                kept = json.loads(read_bytes(Layout(self.root).kept_catalogs / _kept_name(content, archs)))
                if kept["format"] != FORMAT or kept["content"] != content or not covers(kept["archs"], self.archs):
                    continue
                self._take(kept)
            # none, or damaged
            except (OSError, KeyError, TypeError, ValueError, IndexError, RecursionError, AttributeError):
                self.families, self.targets, self.tuned = [], [], []
                continue
            self._fresh = {**kept, "stamp": self._stamp(folders, spec_files, *lists)}   # the same lists: same digest
            return True
        return False

    def save(self) -> None:
        """Keep a catalog loaded from the specs (or a kept one) for the next run, and among the kept ones."""
        if self._fresh is not None:
            out, kept = Layout(self.root).out, Layout(self.root).kept_catalogs
            data = json.dumps(self._fresh, separators=(",", ":")).encode()
            write_inside(out, self.path, data)
            if self._fresh["content"]:   # "": a catalog with a broken family, never taken whole
                write_inside(out, kept / _kept_name(self._fresh["content"], self._fresh["archs"]), data)
            for old in sorted(kept.glob("*.json"), key=lambda f: f.stat().st_mtime_ns, reverse=True)[KEPT:]:
                old.unlink(missing_ok=True)
            self._fresh = None

    def _stamp(self, folders: list[Path], spec_files: list[Path], read: list[str], toolchains: list,
               installed: list[str], of=stamps.identity) -> str:
        """The digest of everything the catalog came from, each file by `of`: its identity (with the project's
        path), or its content (each file named by its place); each variable a probe read (`$NAME`) by its value,
        as a compile's record holds it: os.environ is read, nothing is stat'ed."""
        # the folders are in by identity too: a spec file added to one changes its mtime
        files = sorted({*map(str, spec_files), *read, str(self.root / PYPROJECT), *map(str, folders)})
        by_content = of is stamps.content
        name = self.places.saved if by_content else str
        return stamps.digest({   # not the archs: a catalog says which it holds, and serves any of them
            "format": FORMAT, "python": sys.version, "installed": [(m, self._found(m)) for m in installed],
            "max_configs": self.max_configs, "env": keys.compiler_env(), "toolchains": self._fingerprints(toolchains),
            "files": [(name(f), variable_digest(f[len(VARIABLE):]) if f.startswith(VARIABLE) else of(f))
                      for f in files],
            "code": [(folder, rel, of(path)) for folder, rel, path in self._code],
            **({} if by_content else {"root": str(self.root), "code_folders": list(map(str, KFORGE_CODE))})})


def _make_work_folder(root: Path) -> None:
    """out/.kforge/work/, where the probes and compile servers import an installed library (guard.work_folder);
    where it cannot be (a link leading out of out/, a file there) that is one warning, and the imports run in the
    project folder until it is fixed."""
    work = Layout(root).work
    try:
        guard.work_folder(Layout(root))
    except (guard.OutsideOut, OSError) as e:
        # a link leading out, or a file or FIFO there, is said here; what keeps out/.kforge itself from being made (a
        # file in its place, a read-only out/) is said where kforge writes its state
        if isinstance(e, guard.OutsideOut) or (os.path.lexists(work) and not os.path.isdir(work)):
            why = e if isinstance(e, guard.OutsideOut) else f"{work}: {e.strerror or e}"
            sys.stderr.write(f"kforge: warning: {why}; until then a library's import runs in the project folder\n")


def forget_unloaded(root: Path, names: set[str] | None) -> None:
    """Drop the replayed failures of these families (None: every one): the next load imports their modules again
    (`doit forget NAME`)."""
    path = Layout(root).state / "catalog.json"
    saved = read_state(path, _well_shaped)
    if saved is None or not isinstance(saved.get("unloaded"), list):
        return
    kept = [e for e in saved["unloaded"] if names is not None and not (isinstance(e, dict) and e.get("task") in names)]
    if kept != saved["unloaded"]:
        write_inside(Layout(root).out, path, json.dumps({**saved, "unloaded": kept}, separators=(",", ":")).encode())


class Declared(NamedTuple):
    """One family as a spec file declares it, before it is checked: its tables and how messages name it."""
    tables: dict
    where: str          # the spec file, or a Python catalog's file and line, or a record file and kernel
    recorded: bool      # from a record file (rules/declare/records.py)
    failed_name: str    # the name a failure of it is listed by
    failed_where: str


def declarations(root: Path, files: list[Path], read: set[Path] | None = None, failed: list | None = None,
                 kept: dict | None = None, ran: dict | None = None, contents: dict | None = None) -> list[Declared]:
    """Every family the spec files declare, unchecked; `read` collects what Python catalogs read. A file that
    fails is a SpecError, or given `failed` one (name, file, error) there. A Python catalog file in `kept` is not
    run again; `ran` gets each one's inputs and declarations."""
    from kforge.declare import records
    from kforge.declare.spec import listed_name, read_tables
    if not files:   # the folders as configured: `catalog = ["docs"]` was reported as specs/
        raise SpecError(f"{', '.join(map(str, catalog_folders(root)))}: no specs found (*.toml spec files, *.py "
                        f"catalogs or *.jsonl records); add one there, or name the folder holding them in "
                        f"{PYPROJECT}'s [tool.kforge] catalog")
    found = []
    extra = record_archs(root)
    for f in files:
        rel = _rel(f, root)
        try:
            if not f.is_file():   # a FIFO would block the read, a link to /dev/zero never end it
                kind = "a folder" if f.is_dir() else "a pipe, a device or a broken link"
                raise SpecError(f"{rel}: not a regular file ({kind}); remove it from the catalog folder")
            if f.suffix == ".py":
                declared = _catalog_file(f, root, read, (kept or {}).get(str(f)), ran, contents)
                found += [Declared(tables, where, False, listed_name(name, f.stem), where)
                          for tables, where, name in declared]
            elif f.suffix == ".jsonl":
                found += [Declared(tables, where, True, _family_name(f), rel)
                          for tables, where in records.families(f, root, extra)]
            else:
                found.append(Declared(read_tables(f, root), rel, False, _family_name(f), rel))
        except SpecError as e:
            if failed is None:
                raise
            failed.append((_family_name(f), rel, str(e)))
    return found


def _catalog_file(path: Path, root: Path, read: set[Path] | None, kept: dict | None, ran: dict | None,
                  contents: dict | None) -> list:
    """A Python catalog file's declarations: those it gave last time when `kept` holds them, else run it."""
    from kforge.declare import python_catalog
    if kept is not None:
        declared = [tuple(d) for d in kept["declared"]]
        own = {Path(p) for p, _ in kept["inputs"]}
    else:
        own = set()
        declared = python_catalog.declarations(path, root, own)
    if read is not None:
        read.update(own)
    # kept (as JSON) only when JSON holds it as it is: a family() given a set or an object is a broken family,
    # and the catalog, saved with the others, would fail to write it (the file then runs again next time)
    if ran is not None and (kept is not None or _plain_json(declared)):   # ran and contents: given together
        ran[str(path)] = kept or {"inputs": [[p, _content(p, contents)] for p in sorted({*map(str, own), str(path)})],
                                  "declared": [list(d) for d in declared]}
    return declared


def _declared_key(declared: Declared) -> str | None:
    """A family's declaration as the saved catalog keys it: its tables, not where they are (a line added above a
    family() call moves it: _moved). None for tables JSON does not hold (a family that does not load)."""
    if not _plain_json(declared.tables):
        return None
    return stamps.digest({"tables": declared.tables, "recorded": declared.recorded})


def _plain_json(value) -> bool:
    """Whether JSON holds value as it is (string keys; lists or tuples, strings, numbers, bools, None; no integer
    past the digits Python writes: json.dumps raises on 10**5000)."""
    from kforge.declare.spec_model import nested
    return all(all(isinstance(k, str) for k in v) if isinstance(v, dict) else   # bool is an int
               v is None or isinstance(v, (str, float, list, tuple)) or isinstance(v, int) and -2**63 <= v < 2**63
               for v in nested(value))


def _ran_at(ran: dict, place) -> dict:
    """A Python catalog file's inputs and declarations (_catalog_file) with each path as place() gives it."""
    return {"inputs": [[place(p), digest] for p, digest in ran["inputs"]],
            "declared": [[tables, place(where), name] for tables, where, name in ran["declared"]]}


def _moved(family: Family, targets: list[Target], where: str) -> tuple[Family, list[Target]]:
    if family.path == where:
        return family, targets
    return family._replace(path=where), [t._replace(spec_path=where) for t in targets]


def _union(held: list | None, wanted: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The archs a catalog loaded again is loaded for: those asked and those the saved one held."""
    return None if held is None or wanted is None else tuple(sorted({*held, *wanted}))


def _content(path: str, seen: dict) -> str | None:
    """A file's sha256, a folder's listing's (without __pycache__), None when neither is there; once per load. For
    `$NAME` (a probe's import read that environment variable: no file's path starts with `$`), its value's."""
    if path.startswith(VARIABLE):
        return variable_digest(path[len(VARIABLE):])
    if path not in seen:
        from kforge.load.observe import listing_digest
        try:
            seen[path] = listing_digest(path) if os.path.isdir(path) else stamps.content(path)
        except OSError:
            seen[path] = None
    return seen[path]


def in_project(source: str, root: Path | str) -> bool:
    """Whether a kernel's source is the project's own (its packages are no installed distribution's): the
    catalog keeps an installed module's fingerprint, the compile imports torch first for one that needs it."""
    return os.path.realpath(source).startswith(os.path.realpath(root) + os.sep)


SHAPE = {"stamp": str, "content": str, "read": list, "toolchains": list, "installed": list, "context": str,
         "per_family": list, "families": list, "tuned": list, "groups": list, "signatures": list, "targets": list}


def _well_shaped(saved: dict) -> bool:
    """A saved catalog of this format, each field of its type (what load() reads before its own checks)."""
    return (saved.get("format") == FORMAT and (saved.get("archs") is None or isinstance(saved.get("archs"), list))
            and all(isinstance(saved.get(k), t) for k, t in SHAPE.items()))


def _tuned_pick(pick) -> dict:
    """An autotuner's recorded pick (records.tuned_choices) as a saved catalog holds it, when it has that shape
    (ValueError: a damaged file; the bundles' manifests would carry it)."""
    if not (isinstance(pick, dict) and set(pick) == {"kernel", "arch", "key", "config", "lines"}
            and isinstance(pick["kernel"], str) and isinstance(pick["arch"], str) and isinstance(pick["key"], list)
            and isinstance(pick["config"], dict) and type(pick["lines"]) is int):
        raise ValueError("a tuned pick of another shape")
    return pick


def covers(held: list | None, wanted: tuple[str, ...] | None) -> bool:
    """Whether a catalog loaded for the archs `held` (None: every arch) holds every target for `wanted`."""
    return held is None or (wanted is not None and set(wanted) <= set(held))


def _kept_name(content: str, archs) -> str:
    return f"{content}-{'-'.join(sorted(archs)) if archs is not None else 'all'}.json"


def catalog_folders(root: Path) -> list[Path]:
    """Where the project's specs are: specs/, or the folders `[tool.kforge] catalog` in its pyproject.toml
    lists, each a folder relative to the project or an installed package by import name
    (`catalog = ["specs", "mylib.kforge_specs"]`). SpecError for an entry that is neither, that is the project's
    own folder (its dodo.py and pyproject.toml are no catalogs), or that names a folder an earlier one names."""
    entries = kforge_table(root).get("catalog", ["specs"])   # a list of names: kforge_table checks each key's type
    folders: dict[Path, str] = {}   # folder -> the entry that named it
    for entry in entries:
        if "\0" in entry:   # no path holds one: the OS call would fail naming no file and no key
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {repr(entry)[:100]} holds a NUL character; "
                            f"name a folder of the project or an installed package")
        try:
            folder = (root / entry).resolve()
            inside = folder.is_dir() and folder.is_relative_to(root.resolve())
        except OSError as e:   # a name too long for the file system
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {repr(entry)[:100]}: cannot look it up "
                            f"({e.strerror}); name a folder of the project or an installed package") from None
        if inside and folder == root.resolve():   # its dodo.py and pyproject.toml would load as catalogs
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {repr(entry)[:100]} is the project's own folder, "
                            f"whose dodo.py and pyproject.toml are no specs; keep the specs in a folder of their own "
                            f"(e.g. specs/) and name that")
        if not inside and folder.is_dir() and os.path.lexists(root / entry):   # kforge reads inside the project only
            parts = Path(entry).parts
            link = next((root.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)
                         if root.joinpath(*parts[:i]).is_symlink()), None)
            what = f"{_rel(link, root)}/ is a link to {folder}" if link else f"{entry} is {folder}"
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {what}, outside the project, and kforge reads the "
                            f"project's files only inside it; move that folder into the project (in place of the "
                            f"link), or install it as a package and name the package")
        if not inside:
            folder = _catalog_package(entry)
        if folder in folders:   # "specs" and "./specs": read twice, each spec clashed with itself; once, a typo hid
            raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {repr(entry)[:100]} is the folder "
                            f"{repr(folders[folder])[:100]} names too; name each folder once")
        folders[folder] = entry
    return list(folders)


def _catalog_package(entry: str) -> Path:
    """The folder of the installed package a `[tool.kforge] catalog` entry names (SpecError if none)."""
    from kforge.load import installed
    try:
        found = installed.find(entry)
    except installed.NotInstalled as e:
        raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {repr(entry)[:100]} is neither a folder of the project "
                        f"nor an installed package ({e})") from None
    if found.path.name != "__init__.py":
        raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {entry[:100]} is a module, not a package; name the "
                        f"package whose folder holds the spec files")
    folder = found.path.parent
    # a library's own modules would each run as a catalog file (its imports, its side effects) and fail as one
    if not any(f.suffix != ".py" or _imports_kforge(f) for f in catalog_files(folder, [folder])) and \
            not any(map(_imports_kforge, folder.glob("_*.py"))):   # or a helper its catalogs import kforge by
        raise SpecError(f"{PYPROJECT}: [tool.kforge] catalog: {entry[:100]} is an installed package that holds no "
                        f"spec (no .toml or .jsonl, no .py importing kforge): a library, not a catalog; build its "
                        f"kernels from specs of your own that name them (`module = \"{entry[:60]}.<module>\"`, "
                        f"docs/libraries.md)")
    return folder


def _imports_kforge(path: Path) -> bool:
    """Whether a .py file of an installed package imports kforge (a catalog, or a helper of catalogs)."""
    import re
    try:
        return re.search(rb"^\s*(from|import)\s+kforge\b", path.read_bytes(), re.MULTILINE) is not None
    except OSError:
        return True   # read where it loads: its error names it there


def catalog_files(root: Path, folders: list[Path] | None = None) -> list[Path]:
    """Every spec of the project: *.toml specs, *.py catalogs and *.jsonl record files in its catalog folders (a .py
    file whose name starts with `_`, `__init__.py` or `_helpers.py`, is a helper, not a catalog)."""
    files = []
    for folder in catalog_folders(root) if folders is None else folders:
        files += sorted(folder.glob("*.toml"))
        files += sorted(f for f in folder.glob("*.py") if not f.name.startswith("_"))
        files += sorted(folder.glob("*.jsonl"))   # record files (rules/declare/records.py)
    return files


def load_specs(root: Path, files: list[Path] | None = None, read: set[Path] | None = None) -> list:
    """Every family of the project's specs, checked (SpecError at the first that fails); `read` collects what
    Python catalogs read."""
    from kforge.declare.spec import spec_from_tables
    return [spec_from_tables(d.tables, d.where, root, recorded=d.recorded)
            for d in declarations(root, catalog_files(root) if files is None else files, read)]


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _family_name(path: Path) -> str:
    """The name a spec file gives its family, read as plainly as possible (it did not load); else the file's."""
    import tomllib
    from kforge.declare.spec import SPEC_LIMIT, listed_name
    try:   # read as read_tables reads it: a FIFO, a device or a file of gigabytes never read whole
        data = read_user_file(path, SPEC_LIMIT, "a spec", "") if path.suffix == ".toml" else None
        name = tomllib.loads(data.decode("utf-8"))["kernel"]["name"] if data is not None else None
    except (SpecError, ValueError, KeyError, TypeError, RecursionError):   # RecursionError: a value nested too deeply
        name = None
    return listed_name(name, path.stem)


def _grouped(failed: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Record families of one file that failed with one error (a kernel's lines of several argument types, its
    module missing) as one entry naming the first line and how many more: flag_gems's suite record had 93
    such families, of 19 kernels."""
    from kforge.declare.records import AT_LINES, at_lines
    merged: dict[tuple, list] = {}   # -> [name, spec file, error, its record lines read (or None), how many]
    for name, path, error in failed:
        m = AT_LINES.fullmatch(error)
        seen = merged.setdefault((path, m["where"], m["rest"]) if m else (len(merged),), [name, path, error, m, 0])
        seen[4] += 1 + int(m["more"] or 0) if m else 0
    return [(name, path, error if m is None else f"{at_lines(m['where'], int(m['first']), lines)}: {m['rest']}")
            for name, path, error, m, lines in merged.values()]


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
        found.append(Broken(candidate, path, one_line(error if error.startswith(path) else f"{path}: {error}")))
    return found


def record_archs(root: Path) -> tuple[str, ...]:
    """`[tool.kforge] record_archs`: archs every record is built for besides the one it was recorded on."""
    return tuple(kforge_table(root).get("record_archs", []))   # archs, each once: kforge_table checks them


# A target's fields, stored once per (family, arch) group or once per target; its layout as the project root.
SHARED = ("kernel", "arch", "spec_path", "toolchain", "source", "module", "entry", "divisible_by_16",
          "source_digests", "toolchain_versions", "layout", "env", "notes", "device_model", "setup", "defaulted",
          "heuristics", "recorded_code")
OWN = ("config_id", "constexprs", "options", "config", "key", "key_without_sources")
PATHS = ("spec_path", "source")   # saved by place (Places), as the layout's root


def _encode(targets: list[Target], places: Places) -> dict:
    groups: dict[str, int] = {}
    signatures: dict[str, int] = {}
    rows = []
    for t in targets:
        shared = [places.saved(str(t.layout.root)) if f == "layout" else
                  places.saved(getattr(t, f)) if f in PATHS else getattr(t, f) for f in SHARED]
        group = groups.setdefault(json.dumps(shared), len(groups))
        signature = signatures.setdefault(json.dumps(t.signature), len(signatures))
        rows.append([group, signature, *(getattr(t, f) for f in OWN), *([t.placeholders] if t.placeholders else [])])
    return {"groups": [json.loads(g) for g in groups], "signatures": [json.loads(s) for s in signatures],
            "targets": rows}


def _decode(groups: list, signatures: list, rows: list, places: Places) -> list[Target]:
    pairs = lambda values: tuple(map(tuple, values))
    actual = places.actual
    shared = [dict(zip(SHARED, (*g[:2], actual(g[2]), g[3], actual(g[4]), *g[5:7], tuple(g[7]), pairs(g[8]),
                                pairs(g[9]), Layout.of(actual(g[10])), pairs(g[11]), pairs(g[12]), g[13],
                                tuple(g[14]), tuple(g[15]), None if g[16] is None else tuple(g[16]), tuple(g[17]))))
              for g in groups]
    signature = [pairs(s) for s in signatures]
    def placeholders(rest: list) -> tuple:
        return tuple((n, kind, tuple(v) if isinstance(v, list) else v) for n, kind, v in rest[0]) if rest else ()
    return [Target(**shared[group], config_id=config_id, signature=signature[sig], constexprs=pairs(constexprs),
                   options=pairs(options), config=pairs(config), key=key, key_without_sources=key_without_sources,
                   placeholders=placeholders(rest))
            for group, sig, config_id, constexprs, options, config, key, key_without_sources, *rest in rows]
