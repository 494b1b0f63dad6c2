"""No-op rebuild: `doit` with every target up to date, vs bare doit with the same number of trivial tasks.

Usage: python bench/noop.py [--catalog CHECKOUT] [--targets 1000 5000 20000] [--repeat 7] [--json out.json]
--catalog: the real catalog of a checkout whose out/ is built (e.g. after README's build command), run
with that checkout's own interpreter (.venv/bin/python if it has one); the bare project gets as many tasks
as `doit list --all` lists there.
The kforge project is generated: one spec whose sweep gives N targets of a small kernel. Its artifacts are
seeded rather than compiled (one real compile, copied N times with each target's own key in meta.json):
the no-op path reads only meta.json keys, so this measures exactly what an up-to-date run does.
Bare doit: N tasks, each with one file_dep, one target and a python action, sqlite3 backend.
Both are timed as whole `python -m doit` processes, alternating, median of --repeat runs, with Python's
bytecode cache on (its default) for both.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, run_doit, scale_project  # noqa: E402
from kforge.store.artifact import seal  # noqa: E402
from kforge.plan.catalog import load_specs  # noqa: E402
from kforge.plan.targets import build_targets  # noqa: E402

BARE_DODO = '''N = {n}
DOIT_CONFIG = {{"backend": "sqlite3", "dep_file": ".doit.sqlite3", "verbosity": 0}}


def touch(path):
    open(path, "w").close()


def task_t():
    for i in range(N):
        yield {{"name": str(i), "actions": [(touch, ["out/%d" % i])], "file_dep": ["input.txt"],
               "targets": ["out/%d" % i]}}
'''


def kforge_project(root: Path, n: int) -> Path:
    scale_project(root, n)
    shutil.copy(REPO / "dodo.py", root)
    shutil.copy(REPO / "pyproject.toml", root)
    # one real compile per arch, then seed the rest with their own keys
    run_doit(root, "scale:b16@sm_90a", "scale:b16@gfx942")
    for t in build_targets(load_specs(root), root, None):
        src = root / "out" / t.arch / "scale" / "b16"
        dst = Path(t.out_dir)
        if dst == src:
            continue
        dst.mkdir(parents=True, exist_ok=True)
        meta = json.loads((src / "meta.json").read_text())
        shutil.copy(src / meta["binary"], dst / meta["binary"])
        # bound to its own target, as the packager checks (artifact.check_bound)
        seeded = {k: v for k, v in meta.items() if k != "seal"} | {"key": t.key, "target": t.name,
                                                                     "config_id": t.config_id, "config": dict(t.config)}
        (dst / "meta.json").write_text(json.dumps({**seeded, "seal": seal(seeded)}))   # as a build seals it
    return root


def bare_project(root: Path, n: int) -> Path:
    (root / "out").mkdir(parents=True)
    (root / "input.txt").write_text("x")
    (root / "dodo.py").write_text(BARE_DODO.format(n=n))
    run_doit(root)
    return root


def catalog_runner(checkout: Path):
    """(a no-op run of the checkout's catalog -> seconds, its task count)."""
    venv = checkout / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    listed = subprocess.run([python, "-m", "doit", "list", "--all"], cwd=checkout, capture_output=True, text=True,
                            check=True).stdout.splitlines()

    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run([python, "-m", "doit", "-n", "2"], cwd=checkout, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or "built 0," not in proc.stdout:
            raise SystemExit(f"{checkout}: not a no-op (build its out/ first):\n{proc.stdout[-1000:]}{proc.stderr[-1000:]}")
        return seconds
    return run, len(listed)


def compare(name: str, kforge_run, bare: Path, repeat: int) -> dict:
    kforge_run(), run_doit(bare)   # first no-op runs settle doit's DB and the saved catalog
    times = {"kforge": [], "bare": []}
    for i in range(repeat):   # alternating, the order flipped every other round
        for side in (("kforge", "bare") if i % 2 == 0 else ("bare", "kforge")):
            times[side].append(kforge_run() if side == "kforge" else run_doit(bare))
    k, b = statistics.median(times["kforge"]), statistics.median(times["bare"])
    print(f"| {name} | {k:.3f} | {b:.3f} | {k / b:.2f} |", flush=True)
    return {"name": name, "kforge_median_s": round(k, 4), "bare_median_s": round(b, 4), "ratio": round(k / b, 3),
            "kforge_s": [round(x, 4) for x in times["kforge"]], "bare_s": [round(x, 4) for x in times["bare"]]}


def main() -> None:
    # Python's default is to cache bytecode; a PYTHONDONTWRITEBYTECODE=1 environment (this dev machine's)
    # recompiles kforge's rules/ at every start while bare doit's one-file dodo hardly notices.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", type=Path, default=None, help="a checkout whose catalog is built")
    ap.add_argument("--targets", type=int, nargs="*", default=[1000, 5000])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print("| project | kforge no-op s | bare doit no-op s | ratio |")
    print("|---|---|---|---|")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="kforge-noop-"))
    if a.catalog is not None:
        run, tasks = catalog_runner(a.catalog.resolve())
        rows.append(compare(f"catalog of {a.catalog} ({tasks} tasks)", run, bare_project(work / "bare-catalog", tasks),
                            a.repeat))
    for n in a.targets:
        kf, bare = kforge_project(work / f"kforge-{n}", n), bare_project(work / f"bare-{n}", n)
        rows.append(compare(f"generated, {n} targets", lambda: run_doit(kf), bare, a.repeat))
        built = json.loads((kf / "out" / "build-report.json").read_text())["counts"]
        assert built["built"] == 0 and built["up-to-date"] == n, built
    shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"repeat": a.repeat, "rows": rows}, indent=1) + "\n")

if __name__ == "__main__":
    main()
