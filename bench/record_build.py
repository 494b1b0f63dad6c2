"""Building a recorded suite: how close `doit -n N` comes to the compiler's own time (issue 52).

Usage: python bench/record_build.py RECORD [--lines 100] [--jobs 2] [--archs sm_90a] [--repeat 1] [--json f]
RECORD is a kforge record (JSON lines; ../shared/data/liger_suite_record-h200.jsonl is liger-kernel's test suite,
which needs liger-kernel installed). Each run: a fresh project holding the first --lines lines as
specs/suite.jsonl, `doit -n N archs=A` with the local cache off (KFORGE_LOCAL_CACHE=off: nothing installed from an
earlier run), timed as a whole command. Reported per run: wall, the compiles' own seconds summed over targets
(compile_seconds in out/build-report.json), the ratio wall x jobs / compiles (1.0: every worker compiled all
the time; the goal is <= 1.5), and kforge's own breakdown line (compile, import, other, queued).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def project(dest: Path, record: Path, lines: int) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "specs").mkdir(parents=True)
    with open(record) as f:
        (dest / "specs" / "suite.jsonl").write_text("".join(line for _, line in zip(range(lines), f)))
    (dest / "dodo.py").write_text("from kforge.dodo import *  # noqa\n")
    (dest / "pyproject.toml").write_text('[tool.kforge]\ncatalog = ["specs"]\n')
    return dest


def timed_build(dest: Path, jobs: int, archs: str, env: dict | None = None) -> tuple[float, str, dict]:
    """`doit -n jobs archs=archs` in dest with the local cache off, as a whole command: (wall, its output, the
    build report); a failed build stops the benchmark with its output."""
    env = {**(env or os.environ), "KFORGE_LOCAL_CACHE": "off"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", str(jobs), f"archs={archs}"], cwd=dest, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"the build failed in {dest}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return wall, proc.stdout, json.loads((dest / "out" / "build-report.json").read_text())


def one_build(dest: Path, jobs: int, archs: str) -> dict:
    wall, stdout, report = timed_build(dest, jobs, archs)
    built = [t for t in report["tasks"] if t["status"] == "built"]
    compiles = sum(t.get("compile_seconds") or 0.0 for t in built)
    breakdown = next((line for line in stdout.splitlines() if line.startswith("kforge: time in targets")), "")
    return {"wall_s": round(wall, 2), "built": len(built), "compile_s": round(compiles, 2),
            "ratio": round(wall * jobs / compiles, 2) if compiles else None, "breakdown": breakdown}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path)
    ap.add_argument("--lines", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--archs", default="sm_90a")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="kforge-record-build-") as tmp:
        for i in range(a.repeat):
            dest = project(Path(tmp) / "p", a.record.resolve(), a.lines)
            runs.append(one_build(dest, a.jobs, a.archs))
            r = runs[-1]
            print(f"run {i + 1}: wall {r['wall_s']} s, {r['built']} built, compiles {r['compile_s']} s, "
                  f"wall x {a.jobs} / compiles = {r['ratio']}\n  {r['breakdown']}", flush=True)
    ratios = [r["ratio"] for r in runs if r["ratio"]]
    print(f"median ratio {statistics.median(ratios)} over {len(ratios)} run(s): {a.lines} lines, -n {a.jobs}, "
          f"archs={a.archs}")
    if a.json:
        a.json.write_text(json.dumps({"record": str(a.record), "lines": a.lines, "jobs": a.jobs, "archs": a.archs,
                                      "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
