"""The local cache (rules/share/local_cache.py) on the catalog: an edit and its revert, then a second clone at another
path, all sharing one cache directory. Whole `doit` runs (compiles and `doit package`), wall times.

Usage: python bench/local_cache.py [--checkouts A B] [--rounds 1] [--jobs 2] [--specs '*']
                                   [--edit kernels/softmax.py] [--cache DIR] [--json out.json]

Per checkout of kforge (--checkouts, default this one; each runs with its own .venv's python, so A = main and
B = a branch compare side by side): a build of a fresh copy of its project (cold with an empty cache; with
--cache pointing at a filled one, mostly installs), then --rounds rounds of: one comment appended to --edit,
build; the edit reverted, build (goal: 0 compiled, <= 2 s), the checkouts' order flipped every round so that a
change in the machine's load hits both alike. Then per checkout a second fresh copy at another path, build
(goal: 0 compiled, <= 10 s), and no-ops in the first copy with the local cache on and off (alternating, median
of 5 each).

Where a revert's time goes, from its out/build-trace.json and build-report.json (times from the process start):
before the run (interpreter, doit, kforge, the catalog, the tasks generated), then the window of the
local-cache installs, then of the packaging, and the end (report, doit's DB). Then one more edit and revert per
checkout, the revert run by a wrapper of doit's main that marks, in the process, when doit and kforge are
imported, the catalog loaded, the tasks made, the first target and the first bundle handed out, the tasks done
and the report written. Apart, median of 3: `doit --version` (the interpreter and doit alone), `doit list`
with the catalog saved, and `doit list` just after the edited file was touched (its identity changed, its
content not: a checkout without kept catalogs loads the specs again).
Exits non-zero if a revert or a second clone compiled anything.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ab_checkouts import python_of  # noqa: E402
from bench.common import REPO, fresh_copy, run_doit  # noqa: E402


def origins(project: Path) -> dict:
    report = json.loads((project / "out" / "build-report.json").read_text())
    return {**report["origins"], "up-to-date": report["counts"]["up-to-date"], "failed": report["counts"]["failed"]}


def breakdown(project: Path, wall: float) -> dict:
    """A run's phases, seconds from its start: see the module's docstring."""
    report = json.loads((project / "out" / "build-report.json").read_text())
    events = [e for e in json.loads((project / "out" / "build-trace.json").read_text())["traceEvents"]
              if e.get("ph") == "X"]
    before = wall - report["wall_seconds"]   # the trace's zero: the reporter's start, once the tasks are made

    def window(selected: list[dict]) -> dict:
        if not selected:
            return {"from": None, "to": None, "worker_s": 0.0}
        return {"from": round(before + min(e["ts"] for e in selected) / 1e6, 3),
                "to": round(before + max(e["ts"] + e["dur"] for e in selected) / 1e6, 3),
                "worker_s": round(sum(e["dur"] for e in selected) / 1e6, 3)}
    installs = window([e for e in events if e["cat"] == "local cache lookup"])
    packaging = window([e for e in events if e["cat"] == "package"])
    last = max([w["to"] for w in (installs, packaging) if w["to"] is not None], default=before)
    return {"before the run": round(before, 3), "installs": installs, "packaging": packaging,
            "end": round(wall - last, 3)}


# `python -c MARKED ARGS`: doit ARGS with the moments above marked (kforge's functions wrapped, nothing changed)
MARKED = r"""
import json, sys, time
start = time.perf_counter()
marks = []
def mark(what):
    if what not in dict(marks):
        marks.append([what, round(time.perf_counter() - start, 3)])
import doit.cmd_base, doit.doit_cmd
mark("doit imported")
from kforge.edge import dodo_tasks as project
from kforge.report import reporter as report
mark("kforge imported")
load, Reporter = project.load_catalog, report.BuildReporter
made, handed, complete = Reporter.__init__, Reporter.execute_task, Reporter.complete_run
def load_catalog(root):
    mark("catalog load begins")
    catalog = load(root)
    mark("catalog loaded")
    return catalog
def init(self, *args):
    mark("tasks made")
    made(self, *args)
def execute_task(self, task):
    mark("first bundle handed out" if task.name.startswith("package:") else "first target handed out")
    handed(self, task)
def complete_run(self):
    mark("tasks done")
    complete(self)
    mark("report written")
project.load_catalog, Reporter.__init__, Reporter.execute_task, Reporter.complete_run = (
    load_catalog, init, execute_task, complete_run)
try:
    code = doit.doit_cmd.DoitMain(doit.cmd_base.DodoTaskLoader()).run(sys.argv[1:])
finally:
    mark("exit")
    sys.stderr.write("MARKS " + json.dumps(marks) + "\n")
sys.exit(code)
"""


def marked(project: Path, *args: str, env: dict, python: str) -> tuple[float, list]:
    """(wall s, [[moment, s from the program's start], ...]) of `doit ARGS` run by MARKED."""
    env = dict(os.environ, **env)
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", MARKED, *args], cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {project}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stderr.rsplit("MARKS ", 1)[1])


def start_costs(project: Path, edit: Path, env: dict, python: str) -> dict:
    """Medians of 3: the interpreter and doit alone; loading the saved catalog and making the tasks; the same
    after the edited file was touched (a new identity, the same content)."""
    runs: dict[str, list[float]] = {"doit --version": [], "doit list, catalog saved": [],
                                    "doit list, edited file touched": []}
    for _ in range(3):
        runs["doit --version"].append(run_doit(project, "--version", env=env, python=python))
        runs["doit list, catalog saved"].append(run_doit(project, "list", env=env, python=python))
        os.utime(edit)
        runs["doit list, edited file touched"].append(run_doit(project, "list", env=env, python=python))
        run_doit(project, "-n", "1", env=env, python=python)   # saves the reloaded catalog: the next round's start
    return {k: round(statistics.median(v), 3) for k, v in runs.items()}


def commit_of(checkout: Path) -> str:
    proc = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkouts", nargs="+", type=Path, default=[REPO])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--specs", default="*")
    ap.add_argument("--edit", default="kernels/softmax.py")
    ap.add_argument("--cache", type=Path, default=None, help="the local cache directory (default: a fresh one)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-local-cache-bench-"))
    cache = a.cache.resolve() if a.cache else work / "cache"
    env = {"KFORGE_LOCAL_CACHE": str(cache)}
    sides = {chr(ord("A") + i): c.resolve() for i, c in enumerate(a.checkouts)}
    python = {s: python_of(c) for s, c in sides.items()}
    rows = []
    load = {"start": os.getloadavg()}   # the machine is shared: its load, beside the times

    def run(name: str, side: str, project: Path, *args: str) -> float:
        wall = run_doit(project, "-n", str(a.jobs), *args, env=env, python=python[side])
        rows.append({"run": name, "side": side, "seconds": round(wall, 3), **origins(project)})
        print(f"{side} {name}: {wall:.2f} s {rows[-1]}", flush=True)
        return wall

    first = {s: fresh_copy(work / f"first{s}", a.specs, source=c) for s, c in sides.items()}
    for s in sides:
        run("first build" + (", empty cache" if a.cache is None else f", cache {cache}"), s, first[s])
    phases = []
    for i in range(a.rounds):
        for s in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            edited = first[s] / a.edit
            original = edited.read_text()
            edited.write_text(original + "\n# an edit\n")
            run(f"{a.edit} edited", s, first[s])
            edited.write_text(original)
            wall = run("edit reverted", s, first[s])
            phases.append({"side": s, "round": i + 1, "seconds": round(wall, 3), **breakdown(first[s], wall)})
            print(f"{s} revert, where the time went: {phases[-1]}", flush=True)
    marks = {}
    for s in sides:   # one more edit and revert, the revert marked
        edited = first[s] / a.edit
        original = edited.read_text()
        edited.write_text(original + "\n# an edit\n")
        run_doit(first[s], "-n", str(a.jobs), env=env, python=python[s])
        edited.write_text(original)
        wall, found = marked(first[s], "-n", str(a.jobs), env=env, python=python[s])
        marks[s] = {"seconds": round(wall, 3), "marks": found}
        print(f"{s} marked revert: {wall:.2f} s {found}", flush=True)
    for s, c in sides.items():
        run("second clone at another path", s, fresh_copy(work / "elsewhere" / f"second{s}", a.specs, source=c))
    noop: dict[str, dict[str, float]] = {}
    starts: dict[str, dict[str, float]] = {}
    for s in sides:
        times: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(5):   # alternating, so that a change in the machine's load hits both alike
            for label, extra in (("on", ()), ("off", ("local_cache=off",))):
                times[label].append(run_doit(first[s], "-n", str(a.jobs), *extra, env=env, python=python[s]))
        noop[s] = {label: round(statistics.median(t), 3) for label, t in times.items()}
        starts[s] = start_costs(first[s], first[s] / a.edit, env, python[s])
    load["end"] = os.getloadavg()
    print(f"\ndoit -n {a.jobs}, specs {a.specs!r}, cache {cache}, load average {load}, "
          + ", ".join(f"{s} {c} ({commit_of(c)})" for s, c in sides.items()) + "\n")
    print("| checkout | run | wall s | compiled | unchanged (early cutoff) | local cache | remote cache | up to date "
          "| failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} | {r['run']} | {r['seconds']:.2f} | {r['compiled']} | {r.get('unchanged', 0)} | "
              f"{r['local cache']} | {r['remote cache']} | {r['up-to-date']} | {r['failed']} |")
    print("\n| checkout | round | revert wall s | before the run | installs (worker s) | packaging (worker s) | end |")
    print("|---|---|---|---|---|---|---|")
    span = lambda w: "-" if w["from"] is None else f"{w['from']:.2f}-{w['to']:.2f} ({w['worker_s']:.2f})"
    for p in phases:
        print(f"| {p['side']} | {p['round']} | {p['seconds']:.2f} | 0-{p['before the run']:.2f} | "
              f"{span(p['installs'])} | {span(p['packaging'])} | {p['end']:.2f} |")
    for s in sides:
        print(f"\n{s}: marked revert, {marks[s]['seconds']:.2f} s in all: "
              + ", ".join(f"{what} {at:.2f}" for what, at in marks[s]["marks"]))
    for s in sides:
        print(f"\n{s}: no-op, median of 5: local cache on {noop[s]['on']:.3f} s, off "
              f"{noop[s]['off']:.3f} s ({noop[s]['on'] / noop[s]['off']:.2f} x); start, median of 3: "
              + ", ".join(f"{k} {v:.3f} s" for k, v in starts[s].items()))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "jobs": a.jobs, "specs": a.specs, "edit": a.edit, "rounds": a.rounds, "load_average": load,
            "checkouts": {s: {"path": str(c), "commit": commit_of(c)} for s, c in sides.items()},
            "runs": rows, "revert_phases": phases, "revert_marks": marks, "noop_seconds": noop, "start_seconds": starts}, indent=1) + "\n")
    if any(r["compiled"] for r in rows if r["run"] in ("edit reverted", "second clone at another path")):
        raise SystemExit("a revert or a second clone compiled something")


if __name__ == "__main__":
    main()
