"""Two checkouts of kforge side by side (e.g. before and after a refactor): the whole-process no-op rebuild of
the real catalog, and a cold build of some families, alternating A and B, in one run.

Usage: python bench/ab_checkouts.py A B [--noop 7] [--cold 3] [--specs 'rmsnorm'] [--archs sm_90a] [--json f]
Each checkout runs with its own interpreter: <checkout>/.venv/bin/python when it has one, else this one
(an old checkout whose build system is its rules/ folder imports it from the checkout itself).
No-op: `doit -n 2` in the checkout, whose out/ must be built already (every run checks "up to date").
Cold: the checkout's dodo.py, pyproject.toml, kernels/ and the matching specs copied into an empty project,
then `doit -n 2 <families> archs=<archs> local_cache=off` there (the copy imports the build system as its
checkout does; the local cache off, or the build would install what the other side just built).
Reports the median of each side and the ratio B/A.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def python_of(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def timed(checkout: Path, project: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([python_of(checkout), "-m", "doit", *args], cwd=project, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {project}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds, proc.stdout


def cold_copy(checkout: Path, dest: Path, specs: str) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(checkout / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    if (checkout / "rules").is_dir() and not (checkout / ".venv").exists():
        shutil.copytree(checkout / "rules", dest / "rules", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "specs").mkdir()
    for spec in sorted((checkout / "specs").glob(f"{specs}.toml")):
        shutil.copy(spec, dest / "specs" / spec.name)
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy(checkout / name, dest / name)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--noop", type=int, default=7, help="no-op runs per side")
    ap.add_argument("--cold", type=int, default=3, help="cold builds per side")
    ap.add_argument("--specs", default="rmsnorm", help="glob of the specs a cold build compiles")
    ap.add_argument("--archs", default="sm_90a")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sides = {"A": a.a.resolve(), "B": a.b.resolve()}
    times: dict[str, dict[str, list[float]]] = {"noop": {"A": [], "B": []}, "cold": {"A": [], "B": []}}
    for i in range(a.noop):
        for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
            seconds, out = timed(sides[side], sides[side], "-n", "2")
            if "built 0," not in out:
                raise SystemExit(f"{sides[side]}: not a no-op (build its out/ first):\n{out[-500:]}")
            times["noop"][side].append(seconds)
    work = Path(tempfile.mkdtemp(prefix="kforge-ab-"))
    for i in range(a.cold):
        for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
            project = cold_copy(sides[side], work / side, a.specs)
            families = [p.stem for p in sorted((project / "specs").glob("*.toml"))]
            # local_cache=off: a cold build compiles (else the per-user cache would hand back the last side's)
            seconds, out = timed(sides[side], project, "-n", "2", *families, f"archs={a.archs}", "local_cache=off")
            if "built 0," in out or "failed 0" not in out:
                raise SystemExit(f"{project}: not a cold build:\n{out[-500:]}")
            times["cold"][side].append(seconds)
    shutil.rmtree(work, ignore_errors=True)
    rows = {}
    for what, by_side in times.items():
        if not by_side["A"]:
            continue
        ma, mb = statistics.median(by_side["A"]), statistics.median(by_side["B"])
        rows[what] = {"A_median_s": round(ma, 3), "B_median_s": round(mb, 3), "ratio_B_over_A": round(mb / ma, 3),
                      "A_s": [round(s, 3) for s in by_side["A"]], "B_s": [round(s, 3) for s in by_side["B"]]}
        print(f"{what:5} A {ma:7.3f} s  B {mb:7.3f} s  B/A {mb / ma:.3f}  (A {rows[what]['A_s']}, B {rows[what]['B_s']})")
    if a.json:
        Path(a.json).write_text(json.dumps({"a": str(sides["A"]), "b": str(sides["B"]), "specs": a.specs,
                                            "archs": a.archs, **rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
