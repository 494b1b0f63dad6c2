"""Is what a target's compile read still the same: the depfile check.

Each artifact's meta.json lists the files its compile actually read beyond the toolchain, by name and sha256,
and the folders it listed (`<folder>/`, the sha256 of the names in it) (rules/load/observe.py records them;
rules/compile/core.py writes them). A target is up to date only while every
one of them still has that content, besides its key matching (rules/store/artifact.py). The check is stat-first, as
doit's own file_dep check is: out/.kforge/observed-inputs.json remembers, per file, where its name resolved
and the identity (inode, mtime, ctime, size: rules/base/stamps.py) its content was hashed at, and per meta.json
(by its identity) the set of inputs it lists, so a no-op run reads no meta.json and hashes nothing: it stats
each distinct file once. The sets are shared (a family's targets usually read the same files).
"""
from __future__ import annotations

import hashlib
import json

from kforge.load import observe
from kforge.base import stamps
from kforge.base.layout import Layout
from kforge.store.files import JsonState, opened


class InputIndex(JsonState):
    """The saved identities and digests (see the module docstring); read while tasks are generated, saved by
    the reporter at the end of the run."""

    def __init__(self, path, root: str | None = None):
        super().__init__(path)   # another kforge's, a restored cache's: dropped unless _well_shaped
        self.folders = observe.search_path(str(root) if root is not None else str(Layout.holding(path).root))
        if self.entries.get("folders") != list(self.folders):   # another module path: names resolve anew
            self.entries = {"folders": list(self.folders), "files": {}, "sets": {}, "targets": {}}
            self.changed = True
        self.files, self.sets, self.targets = (self.entries.setdefault(k, {}) for k in ("files", "sets", "targets"))
        self._now: dict[str, str | None] = {}        # name -> digest, this run
        self._verdict: dict[str, str | None] = {}    # set id -> the first changed name, or None

    def unchanged(self, meta_path: str, meta_identity: list | None) -> bool:
        """Every input the artifact's meta.json lists has the content it was built from."""
        return self.changed_input(meta_path, meta_identity) is None

    def changed_input(self, meta_path: str, meta_identity: list | None) -> str | None:
        """The name of the first input whose content changed (or that is gone), None when none did.
        An artifact that lists no inputs (built before they were recorded) counts as changed."""
        entry = self.targets.get(meta_path)
        if not (isinstance(entry, list) and entry[0] == meta_identity and entry[1] in self.sets):
            listed = listed_inputs(meta_path)
            if listed is None:
                return "(no recorded inputs)"
            set_id = hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]
            self.sets[set_id], self.targets[meta_path] = listed, [meta_identity, set_id]
            self.changed = True
            entry = self.targets[meta_path]
        set_id = entry[1]
        if set_id not in self._verdict:
            self._verdict[set_id] = self.first_changed(self.sets[set_id])
        return self._verdict[set_id]

    def first_changed(self, listed: list) -> str | None:
        """The first name of `listed` ([[name, sha256], ...], well_formed) whose content here is not the one listed."""
        return next((n for n, d in listed if self.digest(n) != d), None)

    def digest(self, name: str) -> str | None:
        """sha256 of the file the name resolves to now (None: no such file), hashed only if its identity moved; of
    the folder's listing for `<folder>/`."""
        if name not in self._now:
            saved = self.files.get(name)
            path = observe.resolve(name, self.folders)   # each run: a file put earlier on the path shadows it
            found = None
            if path is not None:
                identity = stamps.identity(path)
                if saved and saved[:2] == [path, identity]:
                    found = saved[2]
                else:   # `<folder>/`: its listing (a folder's identity moves when a name is added or removed)
                    found = _listing(path) if name.endswith("/") else _sha256(path)
                    self.files[name] = [path, identity, found]
                    self.changed = True
            self._now[name] = found
        return self._now[name]


    @staticmethod
    def well_shaped(entries: dict) -> bool:
        return _well_shaped(entries)


def _well_shaped(entries: dict) -> bool:
    """Whether a saved index has exactly the shape InputIndex writes, down to every entry."""
    files, sets, targets, folders = (entries.get(k) for k in ("files", "sets", "targets", "folders"))
    if not (isinstance(files, dict) and isinstance(sets, dict) and isinstance(targets, dict)
            and isinstance(folders, list) and all(isinstance(f, str) for f in folders)):
        return False
    return (all(isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and isinstance(v[1], list)
                and isinstance(v[2], (str, type(None))) for v in files.values())
            and all(isinstance(v, list) and well_formed(v) for v in sets.values())
            and all(isinstance(v, list) and len(v) == 2 and isinstance(v[1], str) for v in targets.values()))


def listed_inputs(meta_path: str) -> list | None:
    """meta.json's "inputs" ([[name, sha256], ...]), None when it has none or cannot be read."""
    try:
        with opened(meta_path) as f:
            found = json.loads(f.read()).get("inputs")
    except (OSError, ValueError, AttributeError):
        return None
    return found if well_formed(found) else None


def well_formed(inputs) -> bool:
    """Whether meta.json's "inputs" is [[name, sha256], ...] of strings (it may come from a cache: untrusted)."""
    return isinstance(inputs, list) and all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x)
                                            for x in inputs)


def _listing(path: str) -> str | None:
    try:
        return observe.listing_digest(path)
    except OSError:
        return None


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:   # a chunk at a time: a module may read 16 bytes of a file of gigabytes
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
