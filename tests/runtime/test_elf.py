"""ELF checks on real binaries from every arch: machine, arch flags, non-trivial kernel code."""
import struct

import pytest

from kforge_runtime import elf
from kforge.base.archs import ARCHS
from tests.conftest import ALL_ARCHS


def binary(built, arch):
    d = built / "out" / arch / "scale" / "fp16-b256-w4"
    return (d / f"scale_kernel.{ARCHS[arch].binary_ext}").read_bytes()


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_real_binary_passes(built, arch):
    elf.check_binary(binary(built, arch), arch, "scale_kernel")


@pytest.mark.parametrize("arch, other", [("sm_90a", "sm_80"), ("sm_80", "sm_90a"), ("sm_100a", "sm_90a"),
                                         ("gfx942", "gfx950"), ("gfx950", "gfx90a"), ("sm_90a", "gfx942")])
def test_binary_for_another_arch_is_refused(built, arch, other):
    with pytest.raises(elf.ElfError):
        elf.check_binary(binary(built, arch), other, "scale_kernel")


def test_sm90_without_a_variant_flag_is_refused(built):
    data = bytearray(binary(built, "sm_90a"))
    flags, = struct.unpack_from("<I", data, 48)
    struct.pack_into("<I", data, 48, flags & ~0x800)
    with pytest.raises(elf.ElfError, match="sm_90, expected sm_90a"):
        elf.check_binary(bytes(data), "sm_90a", "scale_kernel")


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942"])
def test_missing_or_empty_kernel_is_refused(built, arch):
    with pytest.raises(elf.ElfError, match="0 bytes of code"):
        elf.check_binary(binary(built, arch), arch, "other_kernel")


def test_garbage_and_truncated_files_are_refused(built):
    with pytest.raises(elf.ElfError, match="not an ELF"):
        elf.check_binary(b"hello" * 100, "sm_90a", "scale_kernel")
    with pytest.raises(elf.ElfError):
        elf.check_binary(binary(built, "gfx942")[:200], "gfx942", "scale_kernel")


SHDR = {"name": (0, "<I"), "type": (4, "<I"), "offset": (24, "<Q"), "size": (32, "<Q"), "link": (40, "<I"),
        "entsize": (56, "<Q")}   # Elf64_Shdr fields: (offset in the header, format)


def section_headers(data: bytes) -> list[int]:
    """File offset of each section header."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, = struct.unpack_from("<H", data, 60)
    return [shoff + 64 * i for i in range(shnum)]


def section_named(data: bytes, name: str) -> int:
    return next(at for at, s in zip(section_headers(data), elf.parse(data).sections) if s.name == name)


def patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def with_section(data: bytes, section: str, **fields) -> bytes:
    at = section_named(data, section)
    for field, value in fields.items():
        offset, fmt = SHDR[field]
        data = patched(data, at + offset, fmt, value)
    return data


def symbol_entry(data: bytes, name: str) -> int:
    """File offset of the .symtab entry of `name`."""
    at = section_named(data, ".symtab")
    off, size = (struct.unpack_from("<Q", data, at + SHDR[f][0])[0] for f in ("offset", "size"))
    index = [s[0] for s in elf.parse(data).symbols].index(name)
    return off + 24 * index


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942"])
@pytest.mark.parametrize("corrupt", [
    dict(link=999), dict(link=0), dict(offset=1 << 40), dict(size=1 << 40), dict(size=25), dict(entsize=0),
    dict(entsize=1), dict(entsize=1 << 60)], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_a_corrupt_symbol_table_is_an_elf_error(built, arch, corrupt):
    with pytest.raises(elf.ElfError):
        elf.check_binary(with_section(binary(built, arch), ".symtab", **corrupt), arch, "scale_kernel")


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942"])
@pytest.mark.parametrize("field, value", [
    ("shnum", 0), ("shnum", 0xFFFF), ("shentsize", 0), ("shentsize", 1), ("shentsize", 0xFFFF),
    ("shoff", 1 << 63), ("shstrndx", 0xFFFF), ("shstrndx", ".symtab")])
def test_a_corrupt_section_table_is_an_elf_error(built, arch, field, value):
    data = binary(built, arch)
    if value == ".symtab":   # a section that is not a string table
        value = [s.name for s in elf.parse(data).sections].index(value)
    at, fmt = {"shoff": (40, "<Q"), "shentsize": (58, "<H"), "shnum": (60, "<H"), "shstrndx": (62, "<H")}[field]
    with pytest.raises(elf.ElfError):
        elf.check_binary(patched(data, at, fmt, value), arch, "scale_kernel")


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942"])
def test_names_outside_their_string_table_are_an_elf_error(built, arch):
    data = binary(built, arch)
    with pytest.raises(elf.ElfError, match="outside its"):
        elf.parse(with_section(data, ".symtab", name=1 << 31))
    with pytest.raises(elf.ElfError, match="outside its"):
        elf.parse(patched(data, symbol_entry(data, "scale_kernel"), "<I", 1 << 31))


@pytest.mark.parametrize("arch, corrupt", [
    ("sm_90a", dict(size=1 << 40)),    # the kernel's code section claims more bytes than the file has
    ("sm_90a", dict(type=8)),          # ... or takes none (SHT_NOBITS)
    ("gfx942", dict(type=8)),          # the section holding the kernel symbol's code takes no bytes
    ("gfx942", dict(size=16)),         # ... or is smaller than the symbol says
])
def test_code_the_file_does_not_hold_does_not_pass_as_a_kernel(built, arch, corrupt):
    data = binary(built, arch)
    text = ".text.scale_kernel" if arch.startswith("sm") else ".text"
    with pytest.raises(elf.ElfError):
        elf.check_binary(with_section(data, text, **corrupt), arch, "scale_kernel")


def test_a_kernel_symbol_outside_any_section_has_no_code(built):
    data = binary(built, "gfx942")
    at = symbol_entry(data, "scale_kernel")
    for field, fmt, value in ((6, "<H", 0xFFF1), (8, "<Q", 1 << 40), (16, "<Q", 1 << 40)):   # shndx, value, size
        with pytest.raises(elf.ElfError, match="0 bytes of code"):
            elf.check_binary(patched(data, at + field, fmt, value), "gfx942", "scale_kernel")


def many_symbol_tables(pairs: int, table_bytes: int) -> bytes:
    """An AMD ELF of `pairs` one-symbol tables, each with its own string table claiming the same
    `table_bytes` bytes, where the symbol's name (at 24, past the symbol itself) has no end."""
    strings = struct.pack("<IBBHQQ", 24, 0, 0, 0, 0, 0) + b"x" * (table_bytes - 24)
    headers = [bytes(64)]
    for i in range(pairs):
        strtab = 2 + 2 * i   # the section after this symbol table
        headers.append(struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, 64, 24, strtab, 0, 8, 24))
        headers.append(struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, 64, table_bytes, 0, 0, 1, 0))
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01\x40" + bytes(8), 3, elf.EM_AMDGPU, 1, 0, 0,
                         64 + table_bytes, 0x4C, 64, 0, 0, 64, len(headers), 0)
    return header + strings + b"".join(headers)


def test_huge_claimed_counts_cost_little(built):
    """Tables claiming the most sections and symbols the format allows are read (or refused) quickly."""
    import time
    data = binary(built, "gfx942")
    start = time.perf_counter()
    for corrupt in (patched(data, 60, "<H", 0xFFFF), with_section(data, ".symtab", size=24 << 30)):
        with pytest.raises(elf.ElfError):
            elf.parse(corrupt)
    with pytest.raises(elf.ElfError, match="0 bytes of code"):
        elf.check_binary(many_symbol_tables(32767, 4 << 20), "gfx942", "scale_kernel")
    assert time.perf_counter() - start < 5   # copying each claimed table would take minutes
