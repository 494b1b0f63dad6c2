"""Where a parallel build's wall goes, read from its out/build-trace.json: the head (before each worker's first
compile), the middle (every worker compiling) and the tail (after most workers have finished: one long target,
the package task).

    python bench/build_tail.py out/build-trace.json [more traces ...]

The summary line of `doit` sums phases over workers, which hides a wall spent by one process while fifteen
wait; this reads the same trace as a timeline. For each trace: the run's wall (first to last slice), when the
load ended, when the workers began their first compile (earliest and latest), when they finished their last
(the median worker and the last), the longest target (its compile, when it started), and the package tasks.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def tail(trace: dict) -> dict:
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    rows = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and "tid" in e
            and e.get("name") == "thread_name"}
    s = lambda us: round(us / 1e6, 2)
    end = max(e["ts"] + e["dur"] for e in slices)
    by_worker: dict[int, list] = defaultdict(list)
    targets: dict[str, dict] = defaultdict(lambda: {"compile": 0, "start": None, "end": 0})
    packages = []
    for e in slices:
        phase, name = e["args"].get("phase"), e["name"]
        if phase == "package" or name.startswith("package:"):
            packages.append({"task": name, "start_s": s(e["ts"]), "seconds": s(e["dur"])})
        elif "target" in e["args"] and str(rows.get(e["tid"], "")).startswith("worker"):
            by_worker[e["tid"]].append(e)
            t = targets[name]
            t["start"] = e["ts"] if t["start"] is None else min(t["start"], e["ts"])
            t["end"] = max(t["end"], e["ts"] + e["dur"])
            if phase == "compile":
                t["compile"] += e["dur"]
    first_compile = [min(e["ts"] for e in es if e["args"].get("phase") == "compile")
                     for es in by_worker.values() if any(e["args"].get("phase") == "compile" for e in es)]
    last_end = [max(e["ts"] + e["dur"] for e in es) for es in by_worker.values()]
    load = [e["ts"] + e["dur"] for e in slices if e["args"].get("phase") == "load"]
    longest_name, longest = max(targets.items(), key=lambda kv: kv[1]["compile"]) if targets else ("", {})
    return {"wall_s": s(end), "load_end_s": s(max(load)) if load else None, "workers": len(by_worker),
            "first_compile_s": [s(min(first_compile)), s(max(first_compile))] if first_compile else None,
            "worker_done_s": {"median": s(statistics.median(last_end)), "last": s(max(last_end))} if last_end else None,
            "longest_target": {"name": longest_name, "compile_s": s(longest.get("compile", 0)),
                               "started_s": s(longest["start"]) if longest else None},
            "packages": packages}


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    for path in argv:
        with open(path) as f:
            print(path, json.dumps(tail(json.load(f))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
