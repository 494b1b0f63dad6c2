"""ELF checks on real binaries from every arch: machine, arch flags, non-trivial kernel code."""
import struct

import pytest

from kforge_runtime import elf
from kforge.archs import ARCHS
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
