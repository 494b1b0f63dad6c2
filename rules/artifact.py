"""The on-disk artifact: out/<arch>/<kernel>/<config_id>/{<binary>, meta.json}.

meta.json is the "done" marker and is written last, by rename: a killed build leaves either no meta.json
or the previous complete one, never a half artifact that counts as built.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from rules import elf
from rules.archs import ARCHS

META = "meta.json"
ERROR = "error.txt"


class ArtifactError(ValueError):
    pass


def is_current(meta_path: str, key: str) -> bool:
    """True when the artifact at meta_path was built from exactly this action key."""
    try:
        with open(meta_path, "rb") as f:
            return json.loads(f.read()).get("key") == key
    except (OSError, ValueError, AttributeError):
        return False


def write(directory: Path, binary_name: str, binary: bytes, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for stale in (META, ERROR):   # un-mark first: from here until the last rename it is not built
        _unlink(directory / stale)
    atomic_write(directory / binary_name, binary)
    atomic_write(directory / META, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())


def write_error(directory: Path, key: str, message: str) -> None:
    """Keep a failed compile's message beside where its artifact would be (it never counts as built)."""
    directory.mkdir(parents=True, exist_ok=True)
    _unlink(directory / META)
    atomic_write(directory / ERROR, f"key: {key}\n{message}\n".encode())


def load(directory: Path) -> tuple[dict, bytes]:
    """meta.json and its binary, checked: sha256, ELF machine/arch flags, non-trivial kernel code."""
    meta_path = directory / META
    try:
        meta = json.loads(meta_path.read_text())
        binary = (directory / meta["binary"]).read_bytes()
    except (OSError, ValueError, KeyError) as e:
        raise ArtifactError(f"{directory}: unreadable artifact ({e}); rebuild it with `doit {_task(directory)}`")
    digest = hashlib.sha256(binary).hexdigest()
    if digest != meta.get("sha256"):
        raise ArtifactError(f"{directory / meta['binary']}: sha256 {digest} does not match meta.json's "
                            f"{meta.get('sha256')}; the file is corrupt or was replaced; "
                            f"rebuild with `doit forget {meta.get('target')} && doit {meta.get('target')}`")
    arch = ARCHS.get(meta.get("arch", ""))
    if arch is None:
        raise ArtifactError(f"{meta_path}: unknown arch {meta.get('arch')!r}")
    try:
        elf.check_binary(binary, arch, meta["symbol"])
    except elf.ElfError as e:
        raise ArtifactError(f"{directory / meta['binary']}: {e}") from None
    return meta, binary


def remove(directory: str) -> None:
    """`doit clean` for one target: drop its whole artifact directory."""
    shutil.rmtree(directory, ignore_errors=True)


def _task(directory: Path) -> str:
    arch, kernel, cid = directory.parts[-3:]
    return f"{kernel}:{cid}@{arch}"


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file beside path, then rename: readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
