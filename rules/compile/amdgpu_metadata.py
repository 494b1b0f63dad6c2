"""The kernel ABI an AMD code object declares in its NT_AMDGPU_METADATA note, read without ROCm: what a HIP loader
needs per kernel (kernarg layout and size, LDS bytes, wavefront size, work-group limits). The note is msgpack, of
which the decoder below reads what code objects use.
"""
from __future__ import annotations

import struct

from kforge_runtime import elf as elf_mod

NT_AMDGPU_METADATA = 32
KERNEL_FIELDS = (".name", ".symbol", ".kernarg_segment_size", ".kernarg_segment_align",
                 ".group_segment_fixed_size", ".private_segment_fixed_size", ".wavefront_size",
                 ".max_flat_workgroup_size", ".reqd_workgroup_size", ".sgpr_count", ".vgpr_count",
                 ".agpr_count", ".sgpr_spill_count", ".vgpr_spill_count")
ARG_FIELDS = (".name", ".offset", ".size", ".value_kind", ".address_space", ".actual_access")


class MetadataError(ValueError):
    pass


def read(data: bytes) -> dict:
    """The whole metadata map of an AMD code object."""
    parsed = elf_mod.parse(data)
    for section in parsed.sections:
        if not section.name.startswith(".note"):
            continue
        for name, note_type, desc in _notes(data[section.offset:section.offset + section.size]):
            if name == b"AMDGPU" and note_type == NT_AMDGPU_METADATA:
                try:
                    value, _ = _unpack(desc, 0)
                except (IndexError, struct.error, UnicodeDecodeError, TypeError, RecursionError) as e:
                    raise MetadataError(f"AMDGPU metadata note is corrupt or cut short ({type(e).__name__})") from None
                if not isinstance(value, dict):
                    raise MetadataError("AMDGPU metadata note is not a map")
                kernels = value.get("amdhsa.kernels", [])
                if not (isinstance(kernels, list) and all(isinstance(k, dict) for k in kernels)):
                    raise MetadataError("AMDGPU metadata: amdhsa.kernels is not a list of maps")
                return value
    raise MetadataError("no AMDGPU metadata note (NT_AMDGPU_METADATA) in the code object")


def kernel_abi(data: bytes, symbol: str) -> dict:
    """What a loader needs to launch kernel `symbol` of this code object (field names without the dot)."""
    meta = read(data)
    for kernel in meta.get("amdhsa.kernels", []):
        if symbol in (kernel.get(".name"), kernel.get(".symbol", "").removesuffix(".kd")):
            abi = {f[1:]: kernel[f] for f in KERNEL_FIELDS if f in kernel}
            abi["args"] = [{f[1:]: a[f] for f in ARG_FIELDS if f in a} for a in kernel.get(".args", [])]
            abi["code_object_version"] = meta.get("amdhsa.version", [])
            return abi
    names = [k.get(".name") for k in meta.get("amdhsa.kernels", [])]
    raise MetadataError(f"kernel {symbol!r} not in the code object's metadata; it has {names}")


def kernel_names(data: bytes) -> list[str]:
    return [k.get(".name") for k in read(data).get("amdhsa.kernels", [])]


def _notes(blob: bytes):
    pos = 0
    while pos + 12 <= len(blob):
        namesz, descsz, note_type = struct.unpack_from("<III", blob, pos)
        pos += 12
        name = blob[pos:pos + namesz].rstrip(b"\0")
        pos += (namesz + 3) & ~3
        desc = blob[pos:pos + descsz]
        pos += (descsz + 3) & ~3
        yield name, note_type, desc


FIXED = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",   # floats and ints
         0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
SIZED = {0xD9: ("str", ">B"), 0xDA: ("str", ">H"), 0xDB: ("str", ">I"),   # the kind, then its length's format
         0xC4: ("bin", ">B"), 0xC5: ("bin", ">H"), 0xC6: ("bin", ">I"), 0xDC: ("array", ">H"),
         0xDD: ("array", ">I"), 0xDE: ("map", ">H"), 0xDF: ("map", ">I")}


def _unpack(b: bytes, i: int):
    """One msgpack value at b[i:] -> (value, next index)."""
    t, i = b[i], i + 1
    if t <= 0x7F:
        return t, i
    if t >= 0xE0:
        return t - 0x100, i
    if t in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[t], i
    if t in FIXED:
        return struct.unpack_from(FIXED[t], b, i)[0], i + struct.calcsize(FIXED[t])
    if t <= 0xBF:   # fixmap, fixarray, fixstr: the length in the type byte
        kind, n = ("map", t & 0x0F) if t <= 0x8F else ("array", t & 0x0F) if t <= 0x9F else ("str", t & 0x1F)
    elif t in SIZED:
        kind, fmt = SIZED[t]
        n, i = struct.unpack_from(fmt, b, i)[0], i + struct.calcsize(fmt)
    else:
        raise MetadataError(f"unsupported msgpack type byte 0x{t:02x} in AMDGPU metadata")
    if kind == "array":
        return _values(b, i, n)
    if kind == "map":
        values, i = _values(b, i, 2 * n)
        return dict(zip(values[::2], values[1::2])), i
    if i + n > len(b):   # a string or blob cut short is an error, not a shorter value
        raise IndexError("a string or blob runs past the end of the note")
    data = bytes(b[i:i + n])
    return (data.decode() if kind == "str" else data), i + n


def _values(b: bytes, i: int, n: int):
    out = []
    for _ in range(n):
        value, i = _unpack(b, i)
        out.append(value)
    return out, i
