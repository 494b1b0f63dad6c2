"""Is what a target's compile read still the same: the depfile check. meta.json lists the files its compile read
beyond the toolchain by name and sha256, and the folders it listed (`<folder>/`: the sha256 of its names); a target
is up to date only while each still has that content. Stat-first, as doit's file_dep check: observed-inputs.json
remembers per file where its name resolved and the identity it was hashed at, and per meta.json (by identity) the
set of inputs it lists (a family's targets share one), so a no-op run reads no meta.json and hashes nothing.

The compile servers leave what they hashed in out/.kforge/hashed/ (learn), taken for a file whose identity is still
the one hashed: the first no-op after a build stats an input instead of hashing it again (2 GiB: 11.2 s).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from pathlib import Path

from kforge.load import observe
from kforge.base import stamps
from kforge.base.layout import Layout
from kforge.store.files import JsonState, opened, read_state, remove_entry, write_inside
from kforge.store.guard import guard, json_of

LEARNED = "hashed"        # out/.kforge/hashed/<pid>-<hex>.json: {real path: [identity, sha256]} a server hashed
LEARNED_LIMIT = 200_000   # entries kept for files no target's check has asked about yet (the oldest go first)
LEARNED_FILES = 1000      # files of out/.kforge/hashed/ read at once (more: the rest at the next run)


class InputIndex(JsonState):
    """The saved identities and digests (see the module docstring); read while tasks are generated, saved by
    the reporter at the end of the run."""

    def __init__(self, path, root: str | None = None):
        super().__init__(path)   # another kforge's, a restored cache's: dropped unless well_shaped
        self.folders = observe.search_path(str(root) if root is not None else str(Layout.holding(path).root))
        if self.entries.get("folders") != list(self.folders):   # another module path: names resolve anew
            self.entries = {"folders": list(self.folders), "files": {}, "sets": {}, "targets": {}}
            self.changed = True
        self.files, self.sets, self.targets = (self.entries.setdefault(k, {}) for k in ("files", "sets", "targets"))
        self.learned = self.entries.setdefault("learned", {})
        self._taken = _take_learned(Path(path).parent / LEARNED, self.learned)   # deleted once saved
        self.changed = self.changed or bool(self._taken)
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
        the folder's listing for `<folder>/`; of an environment variable's value for `$NAME`."""
        if name.startswith(observe.VARIABLE):   # `$NAME`: an environment variable, as this process sees it
            return observe.variable_digest(name[len(observe.VARIABLE):])
        if name not in self._now:
            saved = self.files.get(name)
            path = observe.resolve(name, self.folders)   # each run: a file put earlier on the path shadows it
            found = None
            if path is not None:
                identity = stamps.identity(path)
                known = self.learned.pop(os.path.realpath(path), None) if not name.endswith("/") else None
                if saved and saved[:2] == [path, identity]:
                    found = saved[2]
                else:   # `<folder>/`: its listing (a folder's identity moves when a name is added or removed)
                    hashed_by_a_server = known is not None and identity is not None and known[0] == identity
                    found = known[1] if hashed_by_a_server else _listing(path) if name.endswith("/") else \
                        stamps.content(path)
                    self.files[name] = [path, identity, found]
                    self.changed = True
            self._now[name] = found
        return self._now[name]

    def save(self) -> None:
        """Save the index, then delete the servers' files it took in (their digests are in it now)."""
        if len(self.learned) > LEARNED_LIMIT:
            for stale in list(self.learned)[:len(self.learned) - LEARNED_LIMIT]:
                del self.learned[stale]
        super().save()
        for taken in self._taken:
            with contextlib.suppress(OSError, ValueError):   # read-only out/, a link leading out: read again next time
                remove_entry(guard(self.path.parents[1], taken))
        self._taken = []

    @staticmethod
    def well_shaped(entries: dict) -> bool:
        """Whether a saved index has exactly the shape InputIndex writes, down to every entry."""
        files, sets, targets, folders = (entries.get(k) for k in ("files", "sets", "targets", "folders"))
        if not (isinstance(files, dict) and isinstance(sets, dict) and isinstance(targets, dict)
                and isinstance(folders, list) and all(isinstance(f, str) for f in folders)):
            return False
        return (all(isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and isinstance(v[1], list)
                    and isinstance(v[2], (str, type(None))) for v in files.values())
                and all(isinstance(v, list) and well_formed(v) for v in sets.values())
                and all(isinstance(v, list) and len(v) == 2 and isinstance(v[1], str) for v in targets.values())
                and isinstance(entries.get("learned", {}), dict) and _learned_shape(entries.get("learned", {})))


def learn(layout: Layout, hashed: dict) -> None:
    """Leave what a compile server hashed ({resolved path: [identity, sha256]}, each file's identity the same
    before and after hashing and not changed within RACY_S) for the doit process's index to take in."""
    if hashed:
        write_inside(layout.out, layout.state / LEARNED / f"{os.getpid()}-{secrets.token_hex(4)}.json",
                     json.dumps(hashed, separators=(",", ":")).encode())


def _take_learned(folder: Path, into: dict) -> list[Path]:
    """Merge the servers' files in `folder` into `into`; the files read (one of another shape is dropped with one
    warning, as every state file is)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:LEARNED_FILES]
    except OSError:
        return []
    taken = []
    for name in names:
        found = read_state(folder / name, _learned_shape)
        if found is not None:
            into.update(found)
            taken.append(folder / name)
    return taken


def _learned_shape(entries: dict) -> bool:
    """{path: [identity, sha256]}: an identity is stamps.identity's [inode, mtime_ns, ctime_ns, size]."""
    return all(isinstance(v, list) and len(v) == 2 and isinstance(v[1], str) and isinstance(v[0], list)
               and len(v[0]) == 4 and all(type(x) is int for x in v[0]) for v in entries.values())


def listed_inputs(meta_path: str) -> list | None:
    """meta.json's "inputs" ([[name, sha256], ...]), None when it has none or cannot be read."""
    try:
        with opened(meta_path) as f:
            found = json_of(f.read()).get("inputs")
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
