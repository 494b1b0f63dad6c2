"""The local cache (rules/local_cache.py) on the catalog: an edit and its revert, then a second clone at another
path, all sharing one fresh cache directory. Whole `doit` runs (compiles and `doit package`), wall times.

Usage: python bench/local_cache.py [--jobs 2] [--specs '*'] [--edit kernels/softmax.py] [--json out.json]

Runs, in order: a cold build of a fresh copy (fills the cache); one comment appended to --edit, build; the edit
reverted, build (goal: 0 compiled, <= 2 s); a second fresh copy at another path, build (goal: 0 compiled,
<= 10 s); a no-op in the first copy with the local cache on and off (alternating, median of 5 each). Exits
non-zero if the revert or the second clone compiled anything.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, run_doit  # noqa: E402


def origins(project: Path) -> dict:
    report = json.loads((project / "out" / "build-report.json").read_text())
    return {**report["origins"], "up-to-date": report["counts"]["up-to-date"], "failed": report["counts"]["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--specs", default="*")
    ap.add_argument("--edit", default="kernels/softmax.py")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-local-cache-bench-"))
    env = {"KFORGE_LOCAL_CACHE": str(work / "cache")}
    rows = []

    def run(name: str, project: Path, *args: str) -> None:
        seconds = run_doit(project, "-n", str(a.jobs), *args, env=env)
        rows.append({"run": name, "seconds": round(seconds, 3), **origins(project)})
        print(f"{name}: {seconds:.2f} s {rows[-1]}", flush=True)

    first = fresh_copy(work / "first", a.specs)
    run("cold build, empty cache", first)
    edited = first / a.edit
    original = edited.read_text()
    edited.write_text(original + "\n# an edit\n")
    run(f"{a.edit} edited", first)
    edited.write_text(original)
    run("edit reverted", first)
    second = fresh_copy(work / "elsewhere" / "second", a.specs)
    run("second clone at another path", second)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(5):   # alternating, so that a change in the machine's load hits both alike
        for label, extra in (("on", ()), ("off", ("local_cache=off",))):
            times[label].append(run_doit(first, "-n", str(a.jobs), *extra, env=env))
    noop = {label: round(statistics.median(t), 3) for label, t in times.items()}
    print(f"\ndoit -n {a.jobs}, specs {a.specs!r}, cache {work / 'cache'}\n")
    print("| run | wall s | compiled | local cache | remote cache | up to date | failed |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['seconds']:.2f} | {r['compiled']} | {r['local cache']} | {r['remote cache']} | "
              f"{r['up-to-date']} | {r['failed']} |")
    print(f"\nno-op, median of 5: local cache on {noop['on']:.3f} s, off {noop['off']:.3f} s "
          f"({noop['on'] / noop['off']:.2f} x)")
    if a.json:
        Path(a.json).write_text(json.dumps({"jobs": a.jobs, "specs": a.specs, "edit": a.edit, "runs": rows,
                                            "noop_seconds": noop}, indent=1) + "\n")
    if rows[2]["compiled"] or rows[3]["compiled"]:
        raise SystemExit("the revert or the second clone compiled something")


if __name__ == "__main__":
    main()
