"""Building a recorded suite: how close `doit -n N` comes to the compiler's own time (issue 52).

Usage: python bench/record_build.py RECORD [--lines 100] [--jobs 2] [--archs sm_90a] [--repeat 1] [--cold]
                                    [--revs REV ...] [--hubs fresh kept] [--json f] [--traces DIR]
RECORD is a kforge record (JSON lines; ../shared/data/liger_suite_record-h200.jsonl is liger-kernel's test suite,
which needs liger-kernel installed). Each run: a project holding the first --lines lines as specs/suite.jsonl,
its out/ removed, `doit -n N archs=A` with the local cache off (KFORGE_LOCAL_CACHE=off: nothing installed from an
earlier run), timed as a whole command. Reported per run: wall, the compiles' own seconds summed over targets
(compile_seconds in out/build-report.json), the ratio wall x jobs / compiles (1.0: every worker compiled all
the time; the goal is <= 1.5), and kforge's own breakdown line (compile, import, start, other, queued; the time
before the first target).

--revs A B: paired runs, kforge as of each git revision (its rules/ taken with `git archive` into a scratch
folder put first on PYTHONPATH; `.` is the installed kforge, the working tree; a folder holding kforge/ and
kforge_runtime/ is taken as it is, for a machine without the git history), one run of each per round, the
order flipped every other round, so that a shared machine's load falls on both alike; the median ratio per rev.
Each run records the machine's 1-minute load average just before it (`load_before`): right after a run it still
holds that run's own work (it decays over about a minute; --settle S waits S seconds before each run).
--hubs fresh kept: each run as a project's first build (fresh: its hub imports the toolchain, KFORGE_KEEP_HUB=0;
the default) and/or as its next one (kept: the project's keeper from the build before serves it, as it does from a
project's second build on: rules/load/kept_hub.py; an untimed build first starts it); each in a project folder
of its own. Kept runs leave keepers that end after 120 s idle.
--cold: each run with an empty user cache of its own (XDG_CACHE_HOME), as on a machine that never built the
library: its modules' bytecode, which kforge keeps there for every project (rules/load/observe.py), compiled
again. Without it the user's cache is as it is: after a first run, the library's bytecode is kept.
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


def kforge_at(rev: str, tmp: Path) -> dict:
    """The environment that runs kforge as of `rev` ("." : the installed one): its rules/ as the kforge and
    kforge_runtime packages in a scratch folder first on PYTHONPATH."""
    if rev == ".":
        return dict(os.environ)
    where = Path(rev).resolve() if (Path(rev) / "kforge").is_dir() else tmp / f"kforge-{rev}"   # a folder: as it is
    if not where.exists():
        where.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev, "rules"], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
        (where / "rules").rename(where / "kforge")
        shutil.copytree(where / "kforge" / "runtime", where / "kforge_runtime")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))}


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


def one_build(dest: Path, jobs: int, archs: str, env: dict | None = None) -> dict:
    wall, stdout, report = timed_build(dest, jobs, archs, env)
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
    ap.add_argument("--revs", nargs="+", default=["."], help="git revisions of kforge to pair ('.': installed)")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds to wait before each run")
    ap.add_argument("--cold", action="store_true", help="each run with an empty user cache (no kept bytecode)")
    ap.add_argument("--hubs", nargs="+", choices=["fresh", "kept"], default=["fresh"],
                    help="a project's first build (fresh) and/or its next (kept: a keeper serves it)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--traces", type=Path, help="a folder to keep each run's out/build-trace.json in")
    a = ap.parse_args()
    variants = [f"{rev}/{hub}" if len(a.hubs) > 1 else rev for rev in a.revs for hub in a.hubs]
    runs: dict[str, list] = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory(prefix="kforge-record-build-") as tmp:
        envs = {}
        for rev in a.revs:
            for hub in a.hubs:
                variant = f"{rev}/{hub}" if len(a.hubs) > 1 else rev
                envs[variant] = {**kforge_at(rev, Path(tmp)), "KFORGE_KEEP_HUB": "120" if hub == "kept" else "0"}
                dest = project(Path(tmp) / f"p{variants.index(variant)}", a.record.resolve(), a.lines)
                if hub == "kept":   # the build that starts the keeper, untimed
                    timed_build(dest, a.jobs, a.archs, envs[variant])
        for i in range(a.repeat):
            for variant in (variants if i % 2 == 0 else variants[::-1]):
                rev = variant.rsplit("/", 1)[0] if len(a.hubs) > 1 else variant
                dest = Path(tmp) / f"p{variants.index(variant)}"   # the project as it was: out/ goes, as after
                shutil.rmtree(dest / "out", ignore_errors=True)    # `doit clean` (its dodo.py stays the file it was)
                time.sleep(a.settle)
                env = envs[variant]
                if a.cold:
                    shutil.rmtree(Path(tmp) / "user-cache", ignore_errors=True)
                    env = {**env, "XDG_CACHE_HOME": str(Path(tmp) / "user-cache")}
                load = os.getloadavg()[0]   # the machine's 1-minute load before the run (others' work on it)
                r = {**one_build(dest, a.jobs, a.archs, env), "load_before": load}
                runs[variant].append(r)
                if a.traces:
                    a.traces.mkdir(parents=True, exist_ok=True)
                    named = (Path(rev).name.strip('.') or 'here') + ("-" + variant.rsplit("/", 1)[1] if rev != variant
                                                                      else "")
                    shutil.copy(dest / "out" / "build-trace.json", a.traces / f"trace-{i + 1}-{named}.json")
                print(f"run {i + 1} ({variant}): wall {r['wall_s']} s, {r['built']} built, compiles {r['compile_s']} s, "
                      f"wall x {a.jobs} / compiles = {r['ratio']} (load before {load:.2f})\n  {r['breakdown']}",
                      flush=True)
    for rev, done in runs.items():
        ratios = [r["ratio"] for r in done if r["ratio"]]
        print(f"{rev}: median ratio {statistics.median(ratios)} over {len(ratios)} run(s): {a.lines} lines, "
              f"-n {a.jobs}, archs={a.archs}")
    if a.json:
        a.json.write_text(json.dumps({"record": str(a.record), "lines": a.lines, "jobs": a.jobs, "archs": a.archs,
                                      "user_cache": "empty each run" if a.cold else "as it is",
                                      "hubs": a.hubs,
                                      "runs": runs if len(variants) > 1 else runs[variants[0]]}, indent=1))


if __name__ == "__main__":
    main()
