"""Cold builds of the catalog under several doit command lines, in one project directory, alternating.

Usage: python bench/jobs_cap.py [--modes '-n 2' '-n 16'] [--pairs 3] [--specs '*'] [--workdir DIR] [--json F]
Each run deletes out/ and runs `doit <mode>` (the default tasks: every compile and `doit package`) as a whole
process. The modes run in turn, their order reversed every round, all in the same directory, so that a
difference between them is the command line's, not a path's or a warm cache's. Prints each run, then per mode
the median wall time and, per round, its ratio to the first mode.
Made for kforge's cap on parallel compiles (rules/base/cpus.py): on a 2-CPU machine `-n 16` should take what
`-n 2` takes; `'-n 16 max_compiles=16'` runs the 16 workers the cap prevents.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, report_counts, run_doit  # noqa: E402
from kforge.base import cpus  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="+", default=["-n 2", "-n 16"])
    ap.add_argument("--pairs", type=int, default=3, help="rounds; each runs every mode once")
    ap.add_argument("--specs", default="*", help="glob of spec names, e.g. 'fly_fp8_gemm'")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    project = fresh_copy(Path(a.workdir or tempfile.mkdtemp(prefix="kforge-jobs-")) / "project", a.specs)
    runs: dict[str, list[float]] = {m: [] for m in a.modes}
    for round_ in range(a.pairs):
        for mode in (a.modes if round_ % 2 == 0 else a.modes[::-1]):
            shutil.rmtree(project / "out", ignore_errors=True)
            # the local cache off: a cold build compiles (else it installs what the round before compiled)
            seconds = run_doit(project, *mode.split(), env={"KFORGE_LOCAL_CACHE": "off"})
            counts = report_counts(project)
            if counts["failed"]:
                raise SystemExit(f"doit {mode}: {counts['failed']} targets failed")
            runs[mode].append(seconds)
            print(f"round {round_ + 1}: doit {mode}: {seconds:.1f} s, {counts['built']} built", flush=True)
    first = a.modes[0]
    print(f"\n{platform.node()}: {os.cpu_count()} CPUs, {cpus.available()} available to this process, "
          f"python {platform.python_version()}, specs {a.specs!r}")
    print(f"| command | runs, s | median s | ratio to `doit {first}` per round | median ratio |")
    print("|---|---|---|---|---|")
    for mode, values in runs.items():
        ratios = [v / b for v, b in zip(values, runs[first])]
        print(f"| `doit {mode}` | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} | "
              f"{', '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                                            "available": cpus.available(), "specs": a.specs, "runs": runs},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()
