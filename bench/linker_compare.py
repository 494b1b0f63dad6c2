"""FlyDSL's code objects linked by a system ld.lld against the LLD inside Triton's libtriton, section by section.

Usage: python bench/linker_compare.py /usr/lib/llvm-19/bin/ld.lld [--specs 'fly_*'] [--workdir DIR]
Builds the FlyDSL families twice from an empty out/ (KFORGE_LD_LLD=<the given lld>, then KFORGE_LD_LLD=triton)
and compares every ELF section of every .hsaco (contents and addresses). Prints how many differ only in
.comment (where each linker writes its own name) and the names of any other section that differs.
"""
from __future__ import annotations

import argparse
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, run_doit  # noqa: E402


def sections(path: Path) -> dict[str, tuple[bytes, int]]:
    """ELF64 section name -> (contents, address); NOBITS sections have no contents."""
    data = path.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[names_index]
    table = data[names[4]:names[4] + names[5]]
    result = {}
    for name_at, kind, _flags, addr, offset, size, *_ in headers:
        name = table[name_at:table.index(b"\0", name_at)].decode()
        result[name] = (b"" if kind == 8 else data[offset:offset + size], addr)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("system_lld")
    ap.add_argument("--specs", default="fly_*")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kforge-linkers-"))
    builds = {}
    for label, choice in (("system", args.system_lld), ("triton", "triton")):
        project = fresh_copy(work / label, args.specs)
        # the local cache off: each linker links every code object (else the second build installs the first's)
        seconds = run_doit(project, "-n", "2", env={"KFORGE_LD_LLD": choice, "KFORGE_LOCAL_CACHE": "off"})
        builds[label] = project / "out"
        print(f"{label:>6}: KFORGE_LD_LLD={choice}: built in {seconds:.1f} s")
    total, only_comment, differing = 0, 0, set()
    for a in sorted(builds["system"].rglob("*.hsaco")):
        b = builds["triton"] / a.relative_to(builds["system"])
        sa, sb = sections(a), sections(b)
        diff = {name for name in sa.keys() | sb.keys() if sa.get(name) != sb.get(name)}
        total += 1
        only_comment += diff <= {".comment"}
        differing |= diff
    print(f"{total} code objects; {only_comment} differ at most in .comment; "
          f"sections that differ in any: {sorted(differing) or 'none'}")


if __name__ == "__main__":
    main()
