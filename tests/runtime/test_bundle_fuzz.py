"""Fuzzing the loader with damaged bundles: every outcome is a result or a documented error, in bounded time.

A minimal valid bundle (manifest.json and an ELF for its arch, made here: no compiler needed) is damaged
byte by byte and value by value, with fixed seeds. Opening it, finding the kernel and reading its binary
must give the binary, BundleError or NoMatchingKernel (NoTunedConfig for a tuning table): never another
exception, never a hang. elf.check_binary alone must give None or ElfError.
"""
import contextlib
import hashlib
import json
import random
import struct
import zipfile

import pytest

from kforge_runtime import Bundle, BundleError, NoMatchingKernel, elf
from kforge_runtime.select import NoTunedConfig
from tests.support import time_limit, write_manifest

CASE_SECONDS = 2
KERNEL, CONFIG_ID, SYMBOL = "scale", "fp16-b256-w4", "scale_kernel"
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 1, 2, 3, 8




def make_elf(machine: int, osabi: int, flags: int, text_name: str, text_addr: int) -> bytes:
    """A 64-bit ELF with a 64-byte function SYMBOL in section text_name, a symbol table and its strings."""
    code = bytes(range(64))
    strtab = b"\0" + SYMBOL.encode() + b"\0"
    names = [text_name, ".nv.shared", ".strtab", ".symtab", ".shstrtab"]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    symtab = bytes(24) + struct.pack("<IBBHQQ", 1, (1 << 4) | elf.STT_FUNC, 0, 1, text_addr, len(code))
    # (type, addr, data, link, entsize) of sections 1..5; section 0 is the null section
    sections = [(SHT_PROGBITS, text_addr, code, 0, 0), (SHT_NOBITS, 0, b"", 0, 0), (SHT_STRTAB, 0, strtab, 0, 0),
                (SHT_SYMTAB, 0, symtab, 3, 24), (SHT_STRTAB, 0, shstrtab, 0, 0)]
    body, headers = b"", [bytes(64)]
    for i, (kind, addr, data, link, entsize) in enumerate(sections):
        offset = 64 + len(body)
        size = 4096 if kind == SHT_NOBITS else len(data)
        name_at = shstrtab.index(b"\0" + names[i].encode() + b"\0") + 1
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, kind, 0, addr, offset, size, link, 0, 8, entsize))
        body += data
    shoff = 64 + len(body)
    header = struct.pack("<4sBBBB8sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, osabi, bytes(8), 2, machine, 1, 0, 0, shoff,
                         flags, 64, 0, 0, 64, len(headers), len(headers) - 1)
    return header + body + b"".join(headers)


BINARIES = {   # arch: (vendor, file name, ELF)
    "sm_90a": ("nvidia", f"{SYMBOL}.cubin", make_elf(elf.EM_CUDA, elf.ELFOSABI_CUDA_V7, 90 | 0x800,
                                                       f".text.{SYMBOL}", 0)),
    "gfx942": ("amd", f"{SYMBOL}.hsaco", make_elf(elf.EM_AMDGPU, 0x40, 0x4C, ".text", 0x1000)),
}


def manifest(arch: str, binary: bytes) -> dict:
    vendor, name, _ = BINARIES[arch]
    common = {"kernel": KERNEL, "config": {"dtype": "fp16", "BLOCK": 256, "num_warps": 4}, "arch": arch,
              "toolchain": "triton", "constexprs": {"BLOCK": 256}, "options": {"num_warps": 4},
              "source": {"module": "tk.scale", "entry": SYMBOL, "digests": {"tk/scale.py": "0" * 64}}}
    artifact = {**common, "target": f"{KERNEL}:{CONFIG_ID}@{arch}", "config_id": CONFIG_ID,
                "binary": f"{KERNEL}/{CONFIG_ID}/{name}", "sha256": hashlib.sha256(binary).hexdigest(),
                "size": len(binary), "symbol": SYMBOL, "threads_per_block": 128, "shared": 0,
                "signature": [{"name": "x_ptr", "type": "*fp16"}, {"name": "n", "type": "i32"}],
                "divisible_by_16": ["x_ptr"]}
    failed = {**common, "target": f"{KERNEL}:fp16-b512-w4@{arch}", "config_id": "fp16-b512-w4",
              "config": {"dtype": "fp16", "BLOCK": 512, "num_warps": 4}, "status": "failed",
              "error": "ptxas: out of registers\nmore"}
    return {"format": "kforge-bundle", "format_version": 1, "arch": arch, "vendor": vendor,
            "artifacts": [artifact], "failed": [failed], "tuned": {}}


def write_bundle(root, arch: str, manifest_bytes: bytes | None = None, binary: bytes | None = None):
    _, name, good = BINARIES[arch]
    binary = good if binary is None else binary
    (root / KERNEL / CONFIG_ID).mkdir(parents=True, exist_ok=True)
    (root / KERNEL / CONFIG_ID / name).write_bytes(binary)
    if manifest_bytes is None:
        manifest_bytes = json.dumps(manifest(arch, binary)).encode()
    write_manifest(root, manifest_bytes)
    return root


def load(path, what: str) -> str:
    """Open the bundle, find the kernel every way a caller may, read its binary: "ok" or the error's type."""
    try:
        with time_limit(CASE_SECONDS, what):
            bundle = Bundle(path)
            for config in ({"dtype": "fp16"}, None, {"BLOCK": 512}):
                with contextlib.suppress(NoMatchingKernel):
                    bundle.find(KERNEL, config)
            with contextlib.suppress(NoTunedConfig):
                bundle.tuned(KERNEL)
            entry = bundle.find(KERNEL, CONFIG_ID)
            assert bundle.binary(entry) is not None
            return "ok"
    except (BundleError, NoMatchingKernel) as e:
        assert isinstance(e, NoMatchingKernel) or "\n" not in str(e), f"{what}: a BundleError of several lines: {e}"
        return type(e).__name__
    except Exception as e:   # the case, to reproduce it
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e


def mutate_bytes(rng: random.Random, data: bytes, regions=None) -> tuple[bytes, str]:
    """One random flip, delete, insert, overwrite or cut, at a position in one of `regions` ((start, end))."""
    out = bytearray(data)
    start, end = rng.choice(regions or [(0, len(data))])
    at = rng.randrange(start, max(end, start + 1)) if out else 0
    how = rng.choice(["flip", "delete", "insert", "truncate", "overwrite"])
    if how == "flip" and out:
        out[at % len(out)] ^= 1 << rng.randrange(8)
    elif how == "delete":
        del out[at:at + rng.randint(1, 16)]
    elif how == "insert":
        out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif how == "truncate":
        del out[at:]
    else:   # a field set to an extreme: offsets and counts far out of range
        out[at:at + 8] = rng.choice([b"\xff" * 8, bytes(8), struct.pack("<Q", rng.getrandbits(64))])
    return bytes(out), f"{how} at {at}"


@pytest.mark.parametrize("arch", sorted(BINARIES))
def test_the_unmutated_bundle_loads(tmp_path, arch):
    _, _, binary = BINARIES[arch]
    elf.check_binary(binary, arch, SYMBOL)
    assert load(write_bundle(tmp_path, arch), "unmutated") == "ok"


@pytest.mark.parametrize("arch", sorted(BINARIES))
def test_byte_mutations_of_the_manifest(tmp_path, arch):
    rng = random.Random(f"manifest-bytes-{arch}")
    good = json.dumps(manifest(arch, BINARIES[arch][2])).encode()
    write_bundle(tmp_path, arch)
    outcomes = set()
    for case in range(150):
        data, how = mutate_bytes(rng, good)
        write_manifest(tmp_path, data)
        outcomes.add(load(tmp_path, f"{arch} manifest case {case}: {how}"))
    assert {"ok", "BundleError"} <= outcomes   # damage that JSON survives, and damage that it does not


PALETTE = [None, True, False, 0, -1, 1 << 70, 1.5e308, float("nan"), "", "x" * 100_000, "../../etc/passwd",
           "scale/\ud800", "a\nb", [], {}, [[[[]]]], {"a": {"b": {}}}, ["scale"], {"dtype": "fp16"}]
RAW = {"deep array": "[" * 50_000 + "]" * 50_000, "deep object": '{"a":' * 50_000 + "1" + "}" * 50_000,
       "huge int": "9" * 5000, "huge float": "1" + "0" * 400 + ".5", "huge exponent": "1e99999"}
SENTINEL = "\0kforge-fuzz\0"   # replaced by raw JSON text (nesting too deep for json.dumps to write)


def paths(value, here=()):
    """Every path (tuple of keys and indices) into a JSON value."""
    yield here
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from paths(child, here + (key,))


def mutate_structure(rng: random.Random, doc: dict) -> tuple[bytes, str]:
    """Replace the value at a random path with another type, or delete it, or nest/inflate it."""
    doc = json.loads(json.dumps(doc))
    path = rng.choice([p for p in paths(doc) if p])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    how, raw = rng.choice(["replace", "replace", "delete", "raw", "wrap"]), None
    if how == "delete":
        del parent[path[-1]]
    elif how == "raw":
        how = raw = rng.choice(sorted(RAW))
        parent[path[-1]] = SENTINEL
    elif how == "wrap":   # the same value, one level deeper
        parent[path[-1]] = rng.choice([[parent[path[-1]]], {"x": parent[path[-1]]}])
    else:
        parent[path[-1]] = rng.choice(PALETTE)
    text = json.dumps(doc)
    if raw:
        text = text.replace(json.dumps(SENTINEL), RAW[raw])
    return text.encode(), f"{how} at {list(path)}"


@pytest.mark.parametrize("arch", sorted(BINARIES))
def test_structural_mutations_of_the_manifest(tmp_path, arch):
    rng = random.Random(f"manifest-structure-{arch}")
    good = manifest(arch, BINARIES[arch][2])
    write_bundle(tmp_path, arch)
    outcomes = set()
    for case in range(150):
        data, how = mutate_structure(rng, good)
        write_manifest(tmp_path, data)
        outcomes.add(load(tmp_path, f"{arch} structure case {case}: {how}"))
    assert {"ok", "BundleError", "NoMatchingKernel"} <= outcomes


def elf_regions(data: bytes) -> dict[str, tuple[int, int]]:
    """Where the header, the section table and each section's bytes lie in a well-formed ELF."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, = struct.unpack_from("<H", data, 60)
    regions = {"header": (0, 64), "section table": (shoff, len(data))}
    for i in range(shnum):
        _, kind, _, _, offset, size, *_ = struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i)
        regions[f"section {i} header"] = (shoff + 64 * i, shoff + 64 * (i + 1))
        if size and kind != SHT_NOBITS:
            regions[f"section {i}"] = (offset, offset + size)
    return regions


@pytest.mark.parametrize("arch", sorted(BINARIES))
def test_byte_mutations_of_the_binary_through_the_bundle(tmp_path, arch):
    """The manifest's sha256 follows each mutation, so the damaged ELF reaches elf.check_binary."""
    rng = random.Random(f"elf-bundle-{arch}")
    good = BINARIES[arch][2]
    regions = elf_regions(good)
    outcomes = set()
    for case in range(150):
        where = rng.choice(sorted(regions))
        data, how = mutate_bytes(rng, good, [regions[where]])
        write_bundle(tmp_path, arch, binary=data)
        outcomes.add(load(tmp_path, f"{arch} ELF case {case}: {how} ({where})"))
    assert {"ok", "BundleError"} <= outcomes


@pytest.mark.parametrize("arch", sorted(BINARIES))
def test_byte_mutations_of_the_binary_checked_directly(arch):
    rng = random.Random(f"elf-direct-{arch}")
    good = BINARIES[arch][2]
    regions = elf_regions(good)
    refused = 0
    for case in range(1500):
        where = rng.choice(sorted(regions))
        data = good
        for _ in range(rng.randint(1, 4)):
            data, how = mutate_bytes(rng, data, [regions[where]])
        what = f"{arch} check_binary case {case}: {how} ({where})"
        with time_limit(CASE_SECONDS, what):
            try:
                elf.check_binary(data, arch, SYMBOL)
            except elf.ElfError:
                refused += 1
            except Exception as e:
                raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
    assert 0 < refused < 1500


def test_byte_mutations_of_a_wheel(tmp_path):
    arch = "gfx942"
    source = write_bundle(tmp_path / "dir", arch)
    wheel = tmp_path / f"kforge_kernels_{arch}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(source.rglob("*")):
            if f.is_file():
                zf.write(f, f"kforge_kernels_{arch}/{f.relative_to(source)}")
    good = wheel.read_bytes()
    rng = random.Random("wheel")
    outcomes = set()
    for case in range(150):
        data, how = mutate_bytes(rng, good)
        wheel.write_bytes(data)
        outcomes.add(load(wheel, f"wheel case {case}: {how}"))
    assert {"ok", "BundleError"} <= outcomes
