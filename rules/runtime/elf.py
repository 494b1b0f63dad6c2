"""Just enough ELF reading to check a GPU binary: which arch it is for, and that the kernel has real code.

Part of the runtime (no imports outside it): the loader checks a bundle's binaries with it before the
driver sees them, and the build checks every binary it writes with the same code.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

EM_CUDA = 190
EM_AMDGPU = 224
ELFOSABI_CUDA_V7 = 0x33   # CUDA <= 12 ELF ABI: SM in e_flags[7:0], "a" variant flag 0x800
ELFOSABI_CUDA_V8 = 0x41   # CUDA 13 ELF ABI: SM in e_flags[15:8], "a" variant flag 0x8
EF_AMDGPU_MACH = 0xFF
AMDGPU_MACH = {0x3F: "gfx90a", 0x4C: "gfx942", 0x4F: "gfx950"}   # EF_AMDGPU_MACH_AMDGCN_* values
STT_FUNC = 2
MIN_KERNEL_BYTES = 16     # an AMD kernel that is only s_endpgm is 4 bytes: not a kernel


class ElfError(ValueError):
    pass


class Section(NamedTuple):   # NamedTuple, not a dataclass: cheaper to import at every cold start
    name: str
    offset: int
    size: int


class Elf(NamedTuple):
    machine: int
    osabi: int
    flags: int
    sections: tuple[Section, ...]
    symbols: tuple[tuple[str, int, int], ...]   # (name, type, size)


def parse(data: bytes) -> Elf:
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    flags, = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    if shoff + shnum * shentsize > len(data) or shstrndx >= max(shnum, 1):
        raise ElfError("truncated section table")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    sections = tuple(Section(_cstr(names, r[0]), r[4], r[5]) for r in raw)
    return Elf(machine, data[7], flags, sections, _symbols(data, raw))


def _symbols(data: bytes, raw) -> tuple[tuple[str, int, int], ...]:
    out = []
    for sh_name, sh_type, _, _, off, size, link, _, _, entsize in raw:
        if sh_type != 2 or not entsize:   # SHT_SYMTAB
            continue
        strs = data[raw[link][4]:raw[link][4] + raw[link][5]]
        for i in range(size // entsize):
            st_name, st_info, _, _, _, st_size = struct.unpack_from("<IBBHQQ", data, off + i * entsize)
            out.append((_cstr(strs, st_name), st_info & 0xF, st_size))
    return tuple(out)


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else None].decode("utf-8", "replace")


def binary_arch(elf: Elf) -> str:
    """The arch name kforge uses ("sm_90a", "gfx942") for the code in this ELF file."""
    if elf.machine == EM_CUDA:
        sm, specific = cuda_sm(elf)
        return f"sm_{sm}{'a' if specific else ''}"
    if elf.machine == EM_AMDGPU:
        mach = elf.flags & EF_AMDGPU_MACH
        return AMDGPU_MACH.get(mach, f"an AMD GPU with e_flags mach 0x{mach:x}")
    return f"ELF machine {elf.machine} (not a GPU)"


def check_binary(data: bytes, arch: str, symbol: str) -> None:
    """Raise ElfError unless `data` is a binary for `arch` holding a non-trivial kernel `symbol`."""
    elf = parse(data)
    found = binary_arch(elf)
    if found != arch:
        raise ElfError(f"the binary is for {found}, expected {arch}")
    if elf.machine == EM_CUDA:
        code = next((s.size for s in elf.sections if s.name == f".text.{symbol}"), 0)
    else:
        code = max((size for name, typ, size in elf.symbols if name == symbol and typ == STT_FUNC), default=0)
    if code < MIN_KERNEL_BYTES:
        raise ElfError(f"kernel {symbol!r} has {code} bytes of code (an empty or missing kernel)")


def cuda_sm(elf: Elf) -> tuple[int, bool]:
    if elf.osabi == ELFOSABI_CUDA_V8:
        return (elf.flags >> 8) & 0xFF, bool(elf.flags & 0x8)
    return elf.flags & 0xFF, bool(elf.flags & 0x800)
