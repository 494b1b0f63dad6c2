"""kforge.compile.amdgpu_metadata: the kernel ABI read from a real gfx942 code object agrees with what Triton says about
it; the msgpack subset decodes as msgpack does; what is not an ELF file is refused with an ElfError, an ELF file
without the note with a MetadataError, and a truncated or corrupt note with a MetadataError too."""
import struct

import pytest
import triton
import triton.language as tl

from kforge.compile import amdgpu_metadata
from kforge.compile.amdgpu_metadata import MetadataError, kernel_abi, kernel_names, read
from kforge_runtime import elf

SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "alpha": "fp32", "base": "i64", "BLOCK": "constexpr"}
ARG_BYTES = [8, 8, 4, 4, 8]   # the runtime arguments' sizes: two pointers, i32, fp32, i64
NUM_WARPS = 2                 # not Triton's default of 4: the work-group size must come from the compile


@triton.jit
def prefix_kernel(x_ptr, y_ptr, n, alpha, base, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(x_ptr + i, mask=m, other=0.0) * alpha
    tl.store(y_ptr + base + i, tl.cumsum(v, 0), mask=m)   # a scan goes through LDS


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(code object, Triton's metadata) of prefix_kernel compiled for gfx942, as rules/compile/triton_backend.py does."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        src = ASTSource(fn=prefix_kernel, signature=SIGNATURE, constexprs={"BLOCK": 128})
        kernel = triton.compile(src, target=GPUTarget("hip", "gfx942", 64), options={"num_warps": NUM_WARPS})
    return kernel.asm["hsaco"], kernel.metadata


def note(owner: bytes, note_type: int, desc: bytes) -> bytes:
    pad = lambda b: b + b"\0" * (-len(b) % 4)
    return struct.pack("<III", len(owner) + 1, len(desc), note_type) + pad(owner + b"\0") + pad(desc)


def amd_elf(sections: dict[str, bytes]) -> bytes:
    """A minimal 64-bit AMDGPU ELF holding `sections`: header, section table, names, then the sections' contents
    (so cutting the file short cuts the last section's contents, not the table)."""
    names = [*sections, ".shstrtab"]
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    shnum = len(names) + 1
    table, body = [bytes(64)], strtab
    offsets = {".shstrtab": 64 + shnum * 64}
    for name, data in sections.items():
        offsets[name] = offsets[".shstrtab"] + len(body)
        body += data
    for name in names:
        kind = 7 if name.startswith(".note") else 3 if name == ".shstrtab" else 1   # SHT_NOTE, SHT_STRTAB, PROGBITS
        size = len(strtab) if name == ".shstrtab" else len(sections[name])
        name_at = strtab.index(b"\0" + name.encode() + b"\0") + 1
        table.append(struct.pack("<IIQQQQIIQQ", name_at, kind, 0, 0, offsets[name], size, 0, 0, 4, 0))
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01\x40" + bytes(8), 3, elf.EM_AMDGPU, 1, 0, 0,
                         64, 0x4C, 64, 0, 0, 64, shnum, shnum - 1)
    return header + b"".join(table) + body


def metadata_elf(desc: bytes) -> bytes:
    return amd_elf({".note": note(b"AMDGPU", amdgpu_metadata.NT_AMDGPU_METADATA, desc)})


def note_desc(code_object: bytes) -> tuple[int, bytes]:
    """(file offset of the note, its payload) of the AMDGPU metadata note, found without the module under test."""
    for section in elf.parse(code_object).sections:
        pos, end = section.offset, section.offset + section.size
        while section.name == ".note" and pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", code_object, pos)
            owner = code_object[pos + 12:pos + 12 + namesz]
            start = pos + 12 + (namesz + 3) // 4 * 4
            if owner == b"AMDGPU\0" and note_type == 32:
                return pos, code_object[start:start + descsz]
            pos = start + (descsz + 3) // 4 * 4
    raise AssertionError("the code object has no AMDGPU metadata note")


def test_the_kernel_names_are_triton_s_kernel_and_its_symbols(compiled):
    binary, md = compiled
    assert kernel_names(binary) == [md.name] == ["prefix_kernel"]
    symbols = {(name, kind) for name, kind, _ in elf.parse(binary).symbols}
    assert (md.name, elf.STT_FUNC) in symbols and any(name == f"{md.name}.kd" for name, _ in symbols)


def test_the_kernel_abi_agrees_with_triton_s_metadata(compiled):
    binary, md = compiled
    abi = kernel_abi(binary, md.name)
    assert abi["name"] == md.name and abi["symbol"] == f"{md.name}.kd"
    assert abi["wavefront_size"] == md.warp_size == 64
    assert abi["max_flat_workgroup_size"] == md.num_warps * md.warp_size == NUM_WARPS * 64
    # Triton's LDS is dynamic (md.shared is given at launch): the code object's static LDS is none of it
    assert md.shared > 0 and abi["group_segment_fixed_size"] == 0
    assert abi["private_segment_fixed_size"] == 0 and abi["sgpr_count"] > 0 and abi["vgpr_count"] > 0
    assert abi["code_object_version"] == read(binary)["amdhsa.version"] and abi["code_object_version"][0] == 1
    assert set(abi) <= {f[1:] for f in amdgpu_metadata.KERNEL_FIELDS} | {"args", "code_object_version"}


def test_the_kernarg_layout_holds_the_signature_s_arguments_in_order_then_triton_s_own(compiled):
    binary, md = compiled
    abi = kernel_abi(binary, md.name)
    args = abi["args"]
    ours, hidden = args[:len(ARG_BYTES)], args[len(ARG_BYTES):]
    assert [a["size"] for a in ours] == ARG_BYTES
    assert [a["value_kind"] for a in ours] == ["global_buffer"] * 2 + ["by_value"] * 3
    assert [a.get("address_space") for a in ours[:2]] == ["global", "global"]
    assert [a["offset"] for a in ours] == [0, 8, 16, 20, 24]   # each at its natural alignment, none overlapping
    assert all(a["size"] == 8 and a["value_kind"] == "global_buffer" for a in hidden)   # Triton's scratch pointers
    end = args[-1]["offset"] + args[-1]["size"]
    assert all(a["offset"] + a["size"] <= b["offset"] for a, b in zip(args, args[1:]))
    assert abi["kernarg_segment_size"] >= end and abi["kernarg_segment_size"] % abi["kernarg_segment_align"] == 0


def test_the_note_decodes_as_msgpack_decodes_it(compiled):
    msgpack = pytest.importorskip("msgpack")
    binary, _ = compiled
    _, desc = note_desc(binary)
    assert read(binary) == msgpack.unpackb(desc, strict_map_key=False)


def test_every_msgpack_type_a_note_may_hold_decodes_as_msgpack_decodes_it():
    msgpack = pytest.importorskip("msgpack")
    value = {"small": [0, 127, -1, -32], "ints": [128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1],
             "negatives": [-33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63],
             "floats": [0.5, -1.5e3], "flags": [True, False, None], "raw": b"\x00\xff" * 200,
             "str8": "s" * 40, "str16": "m" * 300, "str32": "l" * 70000, "utf8": "gfx942 \u00b5s",
             "array16": list(range(20)), "map16": {f"k{i}": i for i in range(20)}, 7: "an int key"}
    for single in (False, True):   # 32-bit floats too
        packed = msgpack.packb(value, use_single_float=single)
        assert read(metadata_elf(packed)) == msgpack.unpackb(packed, strict_map_key=False)
    big = {"array32": list(range(70000)), "map32": {str(i): i for i in range(70000)}}
    assert read(metadata_elf(msgpack.packb(big))) == big


def test_a_kernel_is_found_by_its_name_or_its_symbol_and_only_the_loader_s_fields_are_kept():
    msgpack = pytest.importorskip("msgpack")
    meta = {"amdhsa.version": [1, 2], "amdhsa.kernels": [
        {".name": "a", ".symbol": "a_impl.kd", ".wavefront_size": 32, ".uniform_work_group_size": 1,
         ".args": [{".offset": 0, ".size": 4, ".value_kind": "by_value", ".type_name": "int"}]},
        {".name": "b", ".symbol": "b.kd", ".reqd_workgroup_size": [64, 1, 1]}]}
    data = metadata_elf(msgpack.packb(meta))
    assert kernel_names(data) == ["a", "b"]
    assert kernel_abi(data, "a") == kernel_abi(data, "a_impl") == {
        "name": "a", "symbol": "a_impl.kd", "wavefront_size": 32, "code_object_version": [1, 2],
        "args": [{"offset": 0, "size": 4, "value_kind": "by_value"}]}
    assert kernel_abi(data, "b") == {"name": "b", "symbol": "b.kd", "reqd_workgroup_size": [64, 1, 1], "args": [],
                                     "code_object_version": [1, 2]}
    with pytest.raises(MetadataError, match=r"kernel 'c' not in the code object's metadata; it has \['a', 'b'\]"):
        kernel_abi(data, "c")


def test_an_unknown_kernel_of_a_real_code_object_is_refused_naming_the_ones_it_has(compiled):
    binary, _ = compiled
    with pytest.raises(MetadataError, match=r"it has \['prefix_kernel'\]"):
        kernel_abi(binary, "scale_kernel")


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"hello" * 100, b"\x7fELF\x01\x01" + bytes(100)],
                         ids=["empty", "magic-only", "text", "32-bit"])
def test_what_is_not_a_64_bit_elf_file_is_refused_with_an_elf_error(data):
    with pytest.raises(elf.ElfError) as raised:
        read(data)
    assert isinstance(raised.value, ValueError)


def test_a_code_object_cut_short_anywhere_is_refused_with_an_elf_error(compiled):
    binary, _ = compiled
    for size in range(0, len(binary), 7):
        with pytest.raises(elf.ElfError):
            kernel_names(binary[:size])


def test_an_elf_without_the_amdgpu_metadata_note_is_refused_with_a_metadata_error(compiled):
    binary, _ = compiled
    at, _ = note_desc(binary)
    other_owner = bytearray(binary)
    other_owner[at + 12:at + 18] = b"AMDGPX"
    other_type = bytearray(binary)
    struct.pack_into("<I", other_type, at + 8, 33)
    no_note = amd_elf({".text": b"\x00" * 16})
    other_notes = amd_elf({".note.gnu": note(b"GNU", 1, b"\x01\x02\x03\x04"),
                           ".note": note(b"AMDGPU", 1, b"\x80")})   # same owner, another note type
    for data in (bytes(other_owner), bytes(other_type), no_note, other_notes):
        with pytest.raises(MetadataError, match="no AMDGPU metadata note"):
            read(data)


def test_a_note_that_is_not_a_map_or_holds_an_unsupported_type_is_refused_with_a_metadata_error():
    with pytest.raises(MetadataError, match="not a map"):
        read(metadata_elf(b"\x92\x01\x02"))   # [1, 2]
    with pytest.raises(MetadataError, match="unsupported msgpack type byte 0xd4"):
        read(metadata_elf(b"\x81\xa1k\xd4\x01\x00"))   # {"k": ext 1}
    with pytest.raises(MetadataError, match="0xc1"):
        read(metadata_elf(b"\x81\xa1k\xc1"))   # a byte msgpack never uses


TRUNCATED_OR_CORRUPT = {
    "empty-payload": b"",
    "map-without-its-value": b"\x81\xa3key",
    "map16-length-cut": b"\xde\x00",
    "uint32-cut": b"\x81\xa1k\xce\x00\x01",
    "invalid-utf8-string": b"\x81\xa2\xff\xfe\x01",
    "array-as-map-key": b"\x81\x91\x01\x02",
}


@pytest.mark.parametrize("desc", TRUNCATED_OR_CORRUPT.values(), ids=TRUNCATED_OR_CORRUPT.keys())
def test_a_truncated_or_corrupt_note_is_refused_with_a_metadata_error(desc):
    with pytest.raises(MetadataError):
        read(metadata_elf(desc))


def test_a_string_running_past_the_end_of_the_note_is_refused_with_a_metadata_error():
    with pytest.raises(MetadataError):
        read(metadata_elf(b"\x81\xa1k\xa9abc"))   # {"k": a string of 9 bytes}, 3 of them there


def test_a_real_code_object_whose_note_was_cut_short_is_refused_with_a_metadata_error(compiled):
    binary, _ = compiled
    at, desc = note_desc(binary)
    data = bytearray(binary)
    struct.pack_into("<I", data, at + 4, len(desc) // 2)   # descsz: half the payload
    with pytest.raises(MetadataError):
        read(bytes(data))


def test_a_file_cut_inside_its_note_is_refused_with_a_value_error():
    data = metadata_elf(b"\x82\xa1a\x01\xa1b\xa5hello")
    assert read(data) == {"a": 1, "b": "hello"}
    for cut in (1, 6, 12):   # the section table is whole: only the note's payload is cut
        with pytest.raises(ValueError):   # ElfError: the note section runs past the end of the file
            read(data[:-cut])
