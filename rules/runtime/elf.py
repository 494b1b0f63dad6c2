"""Just enough ELF reading to check a GPU binary: which arch it is for, and that the kernel has real code (the loader
before a driver sees it, and the build for every binary it writes).

The input is untrusted: every offset, size, index and count is checked against the file before it is used, so a
malformed file gives ElfError, and the work is bounded by the file's size and the limits below.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from .archs import ARCHS

EM_CUDA = 190
EM_AMDGPU = 224
ELFOSABI_CUDA_V7 = 0x33   # CUDA <= 12 ELF ABI: SM in e_flags[7:0], "a" variant flag 0x800
ELFOSABI_CUDA_V8 = 0x41   # CUDA 13 ELF ABI: SM in e_flags[15:8], "a" variant flag 0x8
EF_AMDGPU_MACH = 0xFF
AMDGPU_MACH = {a.amdgpu_mach: a.name for a in ARCHS.values() if a.amdgpu_mach is not None}
STT_FUNC = 2
SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 0, 2, 3, 8
MIN_KERNEL_BYTES = 16     # an AMD kernel that is only s_endpgm is 4 bytes: not a kernel
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")   # Elf64_Shdr
SYMBOL = struct.Struct("<IBBHQQ")               # Elf64_Sym
MAX_SYMBOLS = 1 << 16     # a GPU binary has tens; a table claiming more is refused, not read
MAX_NAME = 4096           # bytes of a name looked at: longer names are cut (and match no kernel)


class ElfError(ValueError):
    pass


class Section(NamedTuple):   # NamedTuple, not a dataclass: cheaper to import at every cold start
    name: str
    offset: int
    size: int
    type: int = 1   # sh_type; SHT_NOBITS sections take no bytes of the file


class Elf(NamedTuple):
    machine: int
    osabi: int
    flags: int
    sections: tuple[Section, ...]
    symbols: tuple[tuple[str, int, int], ...]   # (name, type, size): size 0 unless its section holds it all


def parse(data: bytes) -> Elf:
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    flags, = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    if shnum == 0:   # also what extended numbering (>= 0xff00 sections) looks like: no GPU binary has that many
        raise ElfError("no section table")
    if shentsize != SECTION_HEADER.size:
        raise ElfError(f"section headers of {shentsize} bytes, expected {SECTION_HEADER.size}")
    if shoff + shnum * shentsize > len(data):
        raise ElfError("truncated section table")
    raw = list(SECTION_HEADER.iter_unpack(data[shoff:shoff + shnum * shentsize]))
    for i, (_, sh_type, _, _, off, size, *_) in enumerate(raw):
        if sh_type not in (SHT_NULL, SHT_NOBITS) and off + size > len(data):
            raise ElfError(f"section {i} (offset {off}, {size} bytes) lies outside the {len(data)}-byte file")
    names = _string_table(raw, shstrndx, "the section name table (e_shstrndx)") if shstrndx else (0, 0)
    sections = tuple(Section(_cstr(data, names, r[0], f"section {i}'s name"), r[4], r[5], r[1])
                     for i, r in enumerate(raw))
    return Elf(machine, data[7], flags, sections, _symbols(data, raw))


def _string_table(raw, index: int, what: str) -> tuple[int, int]:
    """(offset, size) of a string table: names are read in place (as many tables as a file may claim, each as large
    as the file, would take too long to copy)."""
    if index >= len(raw) or raw[index][1] != SHT_STRTAB:
        raise ElfError(f"{what} is section {index}, which is not a string table")
    return raw[index][4], raw[index][5]


def _symbols(data: bytes, raw) -> tuple[tuple[str, int, int], ...]:
    out = []
    for i, (_, sh_type, _, _, off, size, link, _, _, entsize) in enumerate(raw):
        if sh_type != SHT_SYMTAB:
            continue
        if entsize != SYMBOL.size or size % SYMBOL.size:
            raise ElfError(f"symbol table (section {i}) has entries of {entsize} bytes and {size} bytes in all; "
                           f"expected a multiple of {SYMBOL.size}")
        if len(out) + size // SYMBOL.size > MAX_SYMBOLS:
            raise ElfError(f"more than {MAX_SYMBOLS} symbols: not a kernel binary")
        strs = _string_table(raw, link, f"symbol table (section {i})'s string table (sh_link)")
        for st_name, st_info, _, st_shndx, st_value, st_size in SYMBOL.iter_unpack(data[off:off + size]):
            name = _cstr(data, strs, st_name, f"a symbol name (section {i})")
            out.append((name, st_info & 0xF, st_size if _holds(raw, st_shndx, st_value, st_size) else 0))
    return tuple(out)


def _holds(raw, index: int, value: int, size: int) -> bool:
    """Whether section `index` holds the symbol's bytes (its sh_addr is where its bytes start)."""
    if index >= len(raw) or raw[index][1] in (SHT_NULL, SHT_NOBITS):   # also SHN_ABS, SHN_COMMON, ...
        return False
    start = value - raw[index][3]
    return 0 <= start and start + size <= raw[index][5]


def _cstr(data: bytes, table: tuple[int, int], offset: int, what: str) -> str:
    """The NUL-terminated name at `offset` in the string table at (table offset, size) of `data`."""
    start, size = table
    if offset and offset >= size:   # 0 is the empty name, also of a missing table
        raise ElfError(f"{what} starts at {offset}, outside its {size}-byte string table")
    end = start + min(size, offset + MAX_NAME)
    nul = data.find(b"\0", start + offset, end)
    return data[start + offset:nul if nul >= 0 else end].decode("utf-8", "replace")


def binary_arch(elf: Elf) -> str:
    """The arch name kforge uses ("sm_90a", "gfx942") for the code in this ELF file."""
    if elf.machine == EM_CUDA:   # CUDA 13's ELF ABI moved the SM to e_flags[15:8], the "a" flag to 0x8
        v8 = elf.osabi == ELFOSABI_CUDA_V8
        sm, specific = ((elf.flags >> 8) & 0xFF, elf.flags & 0x8) if v8 else (elf.flags & 0xFF, elf.flags & 0x800)
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
        code = next((s.size for s in elf.sections if s.name == f".text.{symbol}" and s.type != SHT_NOBITS), 0)
    else:
        code = max((size for name, typ, size in elf.symbols if name == symbol and typ == STT_FUNC), default=0)
    if code < MIN_KERNEL_BYTES:
        raise ElfError(f"kernel {symbol!r} has {code} bytes of code (an empty or missing kernel)")
