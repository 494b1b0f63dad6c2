"""Serving's verify mode: a bundle's binary held against the one Triton's JIT compiles for the same call.

    KFORGE_SERVE=out/dist,verify python app.py        pytest --kforge-bundles out/dist --kforge-verify

The first time a specialization is served, Triton also compiles it (serve.py), and differences() compares
the two binaries. Identical bytes are the usual case only where the JIT's binary carries no file names: a
kforge build names each source file relative to its project or package and gives ptxas a fixed timestamp
(rules/compile/triton_backend.py), where Triton's JIT writes the absolute path and the file's mtime into the
line info. So the bytes are compared section by section: every section but the debug info (the code, its
constants, the kernel's resource and parameter tables) must be identical, and so must what the launch reads
(the kernel's symbol, its shared memory, its warps, its scratch memory). Stdlib only, like the loader.
"""
from __future__ import annotations

from .elf import ElfError, parse

DEBUG_SECTIONS = (".debug", ".nv_debug", ".rela.debug", ".rel.debug")   # line info: names and times of files


def differences(bundled: bytes, compiled: bytes, entry: dict, metadata) -> list[str]:
    """What differs between the bundle's binary (and its manifest entry) and the JIT's (and its metadata):
    [] when the launch and the code are the same, else one short phrase per difference."""
    found = []
    launch = {"symbol": (entry.get("symbol"), getattr(metadata, "name", None)),
              "shared": (entry.get("shared"), getattr(metadata, "shared", None)),
              "threads_per_block": (entry.get("threads_per_block"),
                                    getattr(metadata, "num_warps", 0) * getattr(metadata, "warp_size", 32)),
              "global_scratch_size": (entry.get("global_scratch_size", 0),
                                      getattr(metadata, "global_scratch_size", 0) or 0)}
    found += [f"{field} {ours} in the bundle, {theirs} from the JIT" for field, (ours, theirs) in launch.items()
              if ours != theirs]
    if bundled == compiled:
        return found
    try:
        ours, theirs = _sections(bundled), _sections(compiled)
    except ElfError as e:
        return found + [f"a binary is not a readable ELF file ({e})"]
    code = sorted(n for n in ours.keys() | theirs.keys() if not n.startswith(DEBUG_SECTIONS)
                  and ours.get(n) != theirs.get(n))
    if code:
        shown = ", ".join(code[:6]) + (f" and {len(code) - 6} more" if len(code) > 6 else "")
        found.append(f"sections {shown} differ")
    return found


def _sections(data: bytes) -> dict[str, bytes]:
    elf = parse(data)
    named: dict[str, bytes] = {}
    for s in elf.sections:
        if s.name:
            named[s.name] = b"" if s.type == 8 else data[s.offset:s.offset + s.size]   # SHT_NOBITS: no bytes
    return named
