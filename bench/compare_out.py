"""Two out/ directories built from the same inputs (e.g. two checkouts at different paths): are the artifacts
and bundles byte-identical?

Usage: python bench/compare_out.py OUT_A OUT_B
Compares every artifact (binary bytes and meta.json's key) and every wheel in out/dist/ by name and bytes.
Exits 1 if anything differs, listing the first differences.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def compare(a_root: Path, b_root: Path) -> list[str]:
    problems, count = [], 0
    for a_meta in sorted(a_root.glob("*/*/*/meta.json")):
        rel = a_meta.parent.relative_to(a_root)
        b_meta = b_root / rel / "meta.json"
        if not b_meta.exists():
            problems.append(f"{rel}: only in {a_root}")
            continue
        ma, mb = json.loads(a_meta.read_text()), json.loads(b_meta.read_text())
        count += 1
        if ma["key"] != mb["key"]:
            problems.append(f"{rel}: keys differ")
        elif (a_meta.parent / ma["binary"]).read_bytes() != (b_meta.parent / mb["binary"]).read_bytes():
            problems.append(f"{rel}: same key, different binary bytes")
    wheels = sorted(p.name for p in (a_root / "dist").glob("*.whl"))
    if wheels != sorted(p.name for p in (b_root / "dist").glob("*.whl")):
        problems.append("the wheels' names differ")
    else:
        problems += [f"dist/{w}: different bytes" for w in wheels
                     if (a_root / "dist" / w).read_bytes() != (b_root / "dist" / w).read_bytes()]
    print(f"{count} artifacts and {len(wheels)} wheels compared; {len(problems)} differences")
    return problems


if __name__ == "__main__":
    found = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    print("\n".join(found[:20]))
    sys.exit(1 if found else 0)
