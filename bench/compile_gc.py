"""Triton compiles in one process, with and without Python's cyclic garbage collector (why kforge's compile
servers run without it: rules/load/isolate.py).

Usage: python bench/compile_gc.py [--targets 100] [--repeat 2] [--json out.json]
Each mode is a fresh process that imports Triton, then compiles the same targets one after another (every
4th sm_90a and gfx942 target of the catalog) as a compile server does:
  on: the collector on (Python's default); off: gc.disable() (kforge's servers);
  contexts kept: the collector on, but every MLIR context Triton creates is kept alive (it tells whether
  freeing those contexts is what slows later compiles).
Columns: CPU s of the process (user + system, ptxas excluded), seconds inside triton.compile, resident MB at
the end. The modes alternate; the ratio is each mode's CPU seconds over those of `on` in the same repetition.
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, fresh_copy  # noqa: E402

MODES = ("on", "off", "contexts kept")


def child(project: Path, mode: str, count: int) -> dict:
    from kforge.compile import core as compile_core
    from kforge.compile.action import DEFAULT_TIMEOUT_S
    from kforge.plan.catalog import load_specs
    from kforge.plan.targets import build_targets
    targets = build_targets(load_specs(project), project, ("sm_90a", "gfx942"))[::4][:count]
    backend = compile_core.backend_of("triton")
    backend.warm(str(project))
    from kforge.load import observe
    observe.Recorder.install(str(project))   # as a compile server does after the compiler's import: each compile
    # records the files it reads (lower_and_check reads the recorder)
    if mode == "off":
        gc.disable()
    if mode == "contexts kept":
        import triton.compiler.compiler as compiler
        kept, ir = [], compiler.ir

        class KeepContexts:   # Triton's `ir` module, except that each new context is also kept here
            def __getattr__(self, name):
                return getattr(ir, name)

            def context(self):
                kept.append(ir.context())
                return kept[-1]
        compiler.ir = KeepContexts()
    compile_s = 0.0
    for target in targets:
        scratch = tempfile.mkdtemp()
        request = (target, scratch, DEFAULT_TIMEOUT_S, None)   # a server's request: no early cutoff
        compile_s += compile_core.lower_and_check(backend, request).result.compile_seconds
        shutil.rmtree(scratch)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"mode": mode, "targets": len(targets), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "compile_s": round(compile_s, 2), "resident_mb": usage.ru_maxrss // 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(Path(a.child[0]), a.child[1], a.targets)))
        return
    project = fresh_copy(Path(tempfile.mkdtemp(prefix="kforge-gc-")) / "p", "[!f]*")
    rows = []
    for rep in range(a.repeat):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            start = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--child", str(project), mode, "--targets", str(a.targets)],
                                 capture_output=True, text=True, check=True, cwd=REPO)
            row = {**json.loads(out.stdout.strip().splitlines()[-1]), "repetition": rep + 1,
                   "wall_s": round(time.perf_counter() - start, 2)}
            rows.append(row)
            print(row, flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))
    print("\n| repetition | mode | targets | CPU s | compiler s | resident MB | CPU s vs `on` |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    for r in rows:
        on = next(o for o in rows if o["repetition"] == r["repetition"] and o["mode"] == "on")
        ratios.setdefault(r["mode"], []).append(r["cpu_s"] / on["cpu_s"])
        print(f"| {r['repetition']} | {r['mode']} | {r['targets']} | {r['cpu_s']} | {r['compile_s']} | "
              f"{r['resident_mb']} | {r['cpu_s'] / on['cpu_s']:.3f} |")
    for mode, values in ratios.items():
        print(f"{mode}: CPU s vs on, mean {statistics.mean(values):.3f}")


if __name__ == "__main__":
    main()
