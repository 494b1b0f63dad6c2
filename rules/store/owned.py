"""Which files in an artifact folder kforge wrote: the only ones `doit clean`, `prune` and `forget` may delete.

An artifact folder out/<arch>/<kernel>/<config_id>/ holds, of kforge's, a meta.json sealed as kforge seals it (or,
from a kforge before seals, one with every field kforge writes), the binary that meta.json names, an error.txt
whose first line is "key: <the target's sha256 key>", and the temp file of a write that was killed
(".<name>.<pid>.<hex>.tmp"). A failure or a rebuild drops the binary the old meta.json named; a kforge before that
kept it beside error.txt: in a folder holding kforge's error.txt and no meta.json of kforge's, an ELF named
<symbol>.cubin or .hsaco is the binary that build left. Anything else there (a user's saved profile, notes, a
subfolder, a meta.json or error.txt of their own) is theirs.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from kforge.base.stamps import digest
from kforge.store.reading import opened
from kforge_runtime import schema
from kforge_runtime.archs import ARCHS
from kforge_runtime.schema import ERROR, META

META_LIMIT = 64 << 20   # a meta.json past this is no artifact's (its inputs list runs ~100 bytes a file read)
KEY_LINE = re.compile(rb"key: [0-9a-f]{64}")   # error.txt's first line as write_error writes it: an action key
BINARY_SUFFIXES = tuple(sorted({f".{a.binary_ext}" for a in ARCHS.values()}))
TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp")   # rules/store/files.py's replacing()


def seal(meta: dict) -> str:
    """The sha256 of meta.json's other fields, which kforge writes into it as "seal": a meta.json edited or
    damaged after its build (a launch-relevant field changed, say) no longer matches and is never current."""
    return digest({k: v for k, v in meta.items() if k != "seal"})   # the sha256 of their canonical JSON


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
    """The files in `directory` that kforge wrote (see the module's docstring), links never among them."""
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
