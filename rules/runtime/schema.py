"""The data contract between the build and the loader: file names, formats, versions, and the check a binary
passes before it is written, packed or loaded. Stdlib only: the build imports it as kforge_runtime.schema,
and every bundle ships a copy with the loader.
"""
from __future__ import annotations

import hashlib
import re

from .elf import ElfError, check_binary as check_elf

# One artifact: out/<arch>/<kernel>/<config_id>/{<binary>, meta.json} (rules/base/layout.py).
# Bump ARTIFACT_SCHEMA when meta.json's fields or a binary's content rules change: it is part of every
# action key, so every target rebuilds.
ARTIFACT_SCHEMA = 6   # 2: AMD artifacts carry kernel_abi; 3: Triton binaries carry no checkout path or
#                       mtime; 4: nor the path of the virtualenv Triton is installed in; 5: nor any other
#                       path, for every function a kernel reaches, however wrapped; 6: Triton artifacts with
#                       tensor descriptor arguments carry tensordesc_meta (the loader passes them with it)
META = "meta.json"     # written last, by rename: its presence means "built"
ERROR = "error.txt"    # a failed compile's message ("key: <key>" first), never counts as built
# The file names an artifact may hold (and a cache entry or a bundle may name): no separator, no "..".
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")

# One bundle: a wheel holding the package kforge_kernels_<arch>/ with manifest.json, the binaries under
# <kernel>/<config_id>/, and this runtime. The manifest's "artifacts" are meta.json's fields, with "binary"
# made bundle-relative and the compile "options" added; "failed" lists what was not built, and why.
BUNDLE_FORMAT = "kforge-bundle"
BUNDLE_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ENTRY_FIELDS = {"target": str, "kernel": str, "config_id": str, "config": dict, "arch": str, "binary": str,
                "sha256": str, "symbol": str, "signature": list, "threads_per_block": int, "shared": int,
                "toolchain": str}
_WHEEL = re.compile(r"kforge_kernels_([A-Za-z0-9_]+?)(-.*\.whl|)$")


SHOWN = 10   # names an error message lists before counting the rest


def few(names, shown: int = SHOWN, sep: str = ", ") -> str:
    """Names for an error message: the first `shown`, the rest counted (a bundle of a million kernels must not
    make a message of megabytes)."""
    names = list(names)
    more = f"{sep.rstrip()} and {len(names) - shown} more" if len(names) > shown else ""
    return sep.join(map(str, names[:shown])) + more


class BinaryRefused(ValueError):
    """A binary that is not the one its record describes, or not real code for its arch."""


def dist_name(arch: str) -> str:
    return f"kforge_kernels_{arch}"


def wheel_name(dist: str, version: str) -> str:
    return f"{dist}-{version}-py3-none-any.whl"


def arch_of_bundle_file(name: str) -> str | None:
    """The arch in a bundle's file name as `doit package` writes it, or None for other names."""
    match = _WHEEL.match(name)
    return match.group(1) if match else None


def is_plain_name(name) -> bool:
    return isinstance(name, str) and PLAIN_NAME.fullmatch(name) is not None


def check_binary(data: bytes, sha256, arch: str, symbol) -> None:
    """The binary has the recorded sha256, and is an ELF for `arch` whose kernel `symbol` has real code.
    The build checks what it writes and installs with this, the packager what it packs, the loader what
    it hands a driver."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        shown = sha256 if isinstance(sha256, str) and len(sha256) <= 64 else f"{str(sha256)[:64]!r}..."
        raise BinaryRefused(f"sha256 {digest} does not match the recorded {shown}")   # one line, short
    try:
        check_elf(data, arch, symbol)
    except ElfError as e:
        raise BinaryRefused(str(e)) from None
