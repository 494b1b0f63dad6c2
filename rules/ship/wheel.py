"""Write a wheel byte for byte the same from the same files: fixed order, timestamps and permissions."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from kforge.store.files import replacing

FIXED_TIME = (1980, 1, 1, 0, 0, 0)   # the earliest a zip can store


def write_wheel(path: Path, dist: str, version: str, summary: str, files: dict[str, bytes]) -> None:
    """A pure-Python wheel holding `files` (archive name -> content) plus its dist-info, written atomically."""
    info = f"{dist}-{version}.dist-info"
    payload = dict(files)
    payload[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                   f"Summary: {summary}\n").encode()
    payload[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: kforge\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={_b64_digest(data)},{len(data)}" for name, data in sorted(payload.items())]
    payload[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w") as zf:   # never half a wheel
        for name in sorted(payload):   # dist-info sorts before the package ('-' < '/'): pip reads it either way
            entry = zipfile.ZipInfo(name, FIXED_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            entry.create_system = 3
            zf.writestr(entry, payload[name], compresslevel=6)


def _b64_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
