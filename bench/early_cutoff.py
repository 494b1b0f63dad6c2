"""Early cutoff on a library whose package imports every op (issue 52): one op file edited, what rebuilds.

Usage: python bench/early_cutoff.py RECORD --package liger_kernel --edit liger_kernel/ops/jsd.py [--lines 100]
       [--jobs 2] [--archs sm_90a] [--json f]
A copy of the installed package goes into a temp folder put first on PYTHONPATH (the installed one is not
touched); a fresh project holds the first --lines of RECORD. Built once (`doit -n N archs=A`, local cache off);
then --edit gets a comment line at its end (no kernel's code can change), the build runs again, and once more
(a no-op). Reported: each build's wall and origins (compiled; unchanged: early cutoff; up-to-date), and how
many binaries stayed byte-identical.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.record_build import project, timed_build  # noqa: E402


def build(dest: Path, jobs: int, archs: str, env: dict) -> dict:
    wall, stdout, report = timed_build(dest, jobs, archs, env)
    origins = collections.Counter(t.get("origin", t["status"]) for t in report["tasks"])
    return {"wall_s": round(wall, 2), "origins": dict(origins), "summary": stdout.strip().splitlines()[-1]}


def binaries(dest: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dest)): p.read_bytes() for p in (dest / "out").rglob("*") if p.suffix in (".cubin",
                                                                                                       ".hsaco")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path)
    ap.add_argument("--package", required=True)
    ap.add_argument("--edit", required=True, help="a file of the package, relative to the folder holding it")
    ap.add_argument("--lines", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--archs", default="sm_90a")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    installed = Path(importlib.util.find_spec(a.package).origin).parent
    with tempfile.TemporaryDirectory(prefix="kforge-cutoff-") as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(installed, site / a.package, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
        dest = project(Path(tmp) / "p", a.record.resolve(), a.lines)
        first = build(dest, a.jobs, a.archs, env)
        before = binaries(dest)
        edited = site / a.edit
        edited.write_text(edited.read_text() + "\n# an edit that changes no kernel's code\n")
        second = build(dest, a.jobs, a.archs, env)
        after = binaries(dest)
        same = sum(before[p] == after.get(p) for p in before)
        third = build(dest, a.jobs, a.archs, env)
    result = {"record": str(a.record), "lines": a.lines, "jobs": a.jobs, "edit": a.edit,
              "cold": first, "after_edit": second, "again": third, "binaries_identical": f"{same} of {len(before)}"}
    for name in ("cold", "after_edit", "again"):
        r = result[name]
        print(f"{name}: wall {r['wall_s']} s, {r['origins']}\n  {r['summary']}")
    print(f"binaries identical after the edit: {same} of {len(before)}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
