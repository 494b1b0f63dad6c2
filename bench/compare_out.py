"""Two out/ directories built from the same inputs (two checkouts at different paths, or the code before and
after a refactor): are the artifacts and bundles byte-identical?

Usage: python bench/compare_out.py OUT_A OUT_B
Compares every artifact (its binary and its meta.json, byte for byte) and every bundle wheel in out/dist/,
paired by arch: byte for byte, and when they differ, member by member, so that a change of kforge's runtime
(the wheels' runtime/ files, the manifest's runtime_sha256, and so the version in the wheel's name) is told
apart from a change of what was built. Exits 1 if anything differs, listing the first differences.
"""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path


def compare(a_root: Path, b_root: Path) -> list[str]:
    problems, count = [], 0
    meta_fields: dict[tuple, int] = {}   # the meta.json fields that differ -> how many artifacts
    for a_meta in sorted(a_root.glob("*/*/*/meta.json")):
        rel = a_meta.parent.relative_to(a_root)
        b_meta = b_root / rel / "meta.json"
        if not b_meta.exists():
            problems.append(f"{rel}: only in {a_root}")
            continue
        ma, mb = json.loads(a_meta.read_text()), json.loads(b_meta.read_text())
        count += 1
        if a_meta.read_bytes() != b_meta.read_bytes():
            fields = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
            meta_fields[tuple(fields)] = meta_fields.get(tuple(fields), 0) + 1
        if (a_meta.parent / ma["binary"]).read_bytes() != (b_meta.parent / ma["binary"]).read_bytes():
            problems.append(f"{rel}: different binary bytes")
    problems += [f"{p.parent.relative_to(b_root)}: only in {b_root}" for p in sorted(b_root.glob("*/*/*/meta.json"))
                 if not (a_root / p.relative_to(b_root)).exists()]
    problems += [f"meta.json differs in {list(fields) or 'formatting only'} for {n} artifacts"
                 for fields, n in sorted(meta_fields.items())]
    a_wheels, b_wheels = _wheels(a_root), _wheels(b_root)
    if set(a_wheels) != set(b_wheels):
        problems.append(f"bundles for different archs: {sorted(a_wheels)} vs {sorted(b_wheels)}")
    for arch in sorted(set(a_wheels) & set(b_wheels)):
        a, b = a_wheels[arch], b_wheels[arch]
        if a.name == b.name and a.read_bytes() == b.read_bytes():
            continue
        problems.append(f"dist/{arch}: {a.name} vs {b.name}: " + "; ".join(_member_differences(a, b)))
    print(f"{count} artifacts and {len(a_wheels)} wheels compared; {len(problems)} differences")
    return problems


def _wheels(root: Path) -> dict[str, Path]:
    return {p.name.split("-")[0].removeprefix("kforge_kernels_"): p for p in (root / "dist").glob("*.whl")}


def _member_differences(a: Path, b: Path) -> list[str]:
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ma = {n.split("/", 1)[1]: za.read(n) for n in za.namelist() if ".dist-info/" not in n}
        mb = {n.split("/", 1)[1]: zb.read(n) for n in zb.namelist() if ".dist-info/" not in n}
    found = [f"{n} only in one" for n in sorted(set(ma) ^ set(mb))]
    for name in sorted(set(ma) & set(mb)):
        if ma[name] == mb[name]:
            continue
        if name == "manifest.json":
            ja, jb = json.loads(ma[name]), json.loads(mb[name])
            keys = sorted(k for k in set(ja) | set(jb) if ja.get(k) != jb.get(k))
            found.append(f"manifest.json differs in {keys}")
        else:
            found.append(f"{name} differs")
    return found or ["the same members; the archive bytes differ"]


if __name__ == "__main__":
    found = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    print("\n".join(found[:20]))
    sys.exit(1 if found else 0)
