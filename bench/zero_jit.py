"""Zero JIT for an unchanged application: bench/liger_app.py run as Triton's JIT runs it (empty cache, warm
cache) and with its kernels served from a kforge bundle (loaded at each kernel's first launch, or all before
the script starts: --preload), fresh processes, alternating, in one run.

Usage (on a GPU; DIST holds the bundle built from the application's record, e.g. docs/data/liger_app-h100.jsonl
in a project's specs/, `doit archs=sm_90a`): python bench/zero_jit.py DIST [--rounds 3] [--out results.json]
Reports per mode the median time to the first op's result and to all of them (the part after torch import,
CUDA init and input allocation, as liger_app.py measures it), the kernel part (all of them less the same ops
run again in the same process: the steady state, equal in every mode) and the whole process; for the served
runs, the files left in their (fresh, empty) Triton cache, what kforge served and compiled, and the outputs:
every JIT run's (two before the rounds, then each round's) and every served run's, compared by
bench/output_diff.py: a tensor that differs between two JIT runs is the kernel's own nondeterminism (atomics),
reported apart from a difference serving introduced (every JIT run agrees, a served run differs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from output_diff import classify  # noqa: E402

APP = str(Path(__file__).with_name("liger_app.py"))
TUNED_APP = str(Path(__file__).with_name("liger_autotune_app.py"))


def run(mode: str, dist: str, cache: str, out: str, app: str = APP, app_args: tuple = ()) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    cmd = [sys.executable, app, "--out", out, *app_args]
    if mode.startswith("served"):
        cmd = [sys.executable, "-m", "kforge_runtime.serve", "--bundles", dist, "--strict",
               *(["--preload"] if mode == "served_preload" else []), app, "--out", out, *app_args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    process = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    # kforge serve's summary line (Server.summary): its counts, serve()'s own set-up and the bundles' indexing
    counts = re.search(r"(\d+) specializations served, (\d+) compiled, (\d+) autotuned.*; set-up (\d+) ms, "
                       r"bundles indexed in (\d+) ms", proc.stderr)
    if mode.startswith("served") and not counts:
        raise SystemExit(f"{mode}: no 'kforge serve:' summary line in its stderr:\n{proc.stderr[-3000:]}")
    files = sorted(str(p.relative_to(cache)) for p in Path(cache).rglob("*") if p.is_file())
    return {**found, "process_s": round(process, 3), "cache_files": files,
            **({"served": int(counts[1]), "compiled": int(counts[2]), "tuned_from_record": int(counts[3]),
                "serve_setup_s": int(counts[4]) / 1000, "bundles_indexed_s": int(counts[5]) / 1000}
               if counts else {})}


def outputs(paths: list[str]) -> list[dict]:
    import torch
    return [torch.load(p) for p in paths]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--warm-torch", action="store_true",
                    help="every mode warms torch up first with Triton's launches skipped (liger_app.py --warm-torch)")
    ap.add_argument("--autotune-reference", default=None, metavar="JSON",
                    help="output digests of bench/liger_autotune_app.py's recorded run: serve that app too and "
                         "compare")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zero-jit-"))
    warm = str(work / "warm-cache")
    run("jit", a.dist, warm, str(work / "warmup.pt"))   # fills the warm cache
    run("jit", a.dist, str(work / "second-jit"), str(work / "second-jit.pt"))   # the JIT twice before any round
    jit_outputs, served_outputs = [str(work / "warmup.pt"), str(work / "second-jit.pt")], []
    modes = ["jit_empty", "jit_warm", "served", "served_preload"]
    rows: dict[str, list] = {m: [] for m in modes}
    for r in range(a.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            cache = warm if mode == "jit_warm" else str(work / f"{mode}-{r}")
            out = str(work / f"{mode}-{r}.pt")
            rows[mode].append(run(mode if mode.startswith("served") else "jit", a.dist, cache, out,
                                  app_args=("--warm-torch",) if a.warm_torch else ()))
            (served_outputs if mode.startswith("served") else jit_outputs).append(out)
    compared = classify(outputs(jit_outputs), outputs(served_outputs))
    for runs in rows.values():   # what the kernels cost the first pass: all of it less the steady state
        for x in runs:
            x["kernel_part_s"] = round(x["all_s"] - x["again_s"], 4)
    summary = {mode: {k: statistics.median(x[k] for x in runs)
                      for k in ("first_s", "all_s", "again_s", "kernel_part_s", "process_s")}
               for mode, runs in rows.items()}
    served = rows["served"] + rows["served_preload"]
    for mode in ("served", "served_preload"):
        for k in ("serve_setup_s", "bundles_indexed_s"):
            summary[mode][k] = statistics.median(x[k] for x in rows[mode])
    summary["served_cache_files"] = sorted({f for x in served for f in x["cache_files"]})
    summary["served_counts"] = [(x.get("served"), x.get("compiled")) for x in served]
    summary["outputs"] = compared   # serving_differences must be empty; kernel_nondeterminism is the kernels'
    for mode in ("served", "served_preload"):
        for base in ("jit_empty", "jit_warm"):
            for part in ("all", "first", "kernel_part"):
                summary[f"{mode}_{part}_speedup_vs_{base}"] = round(summary[base][f"{part}_s"]
                                                                    / summary[mode][f"{part}_s"], 1)
    ok = True
    if a.autotune_reference:   # an autotuned kernel: the recorded choices served, nothing benchmarked
        tuned = run("served", a.dist, str(work / "tuned-cache"), str(work / "tuned.pt"), TUNED_APP)
        tuned["outputs_bit_identical_to_recorded_run"] = (json.loads((work / "tuned.pt").read_text())
                                                          == json.loads(Path(a.autotune_reference).read_text()))
        summary["autotuned_app_served"] = tuned
        ok = (tuned["outputs_bit_identical_to_recorded_run"] and tuned["compiled"] == 0
              and tuned["configs_benchmarked"] == 0 and not tuned["cache_files"])
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1) + "\n")
    return 0 if ok and not compared["serving_differences"] and all(c == 0 for _, c in summary["served_counts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
