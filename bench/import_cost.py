"""What a recording process's import of a large library costs: a package server's import, as rules/compile/core.py
does it (the recorder installed and started, the device model prepared, then the package imported).

Modes, each a fresh interpreter in a scratch project, with a scratch user cache (XDG_CACHE_HOME: it holds the kept
bytecode):
  source  every module outside the toolchain compiled from its source at every import (kforge before the kept
          bytecode: _from_source with no folder)
  kept    compiled once, then its bytecode taken from the user cache's bytecode/ by the content it was compiled from
  pyc     Python's own .pyc beside the sources allowed (what the guarantee gave up: the reference)
One untimed run of `kept` and of `pyc` first fills the kept bytecode and the __pycache__ folders; then the modes
run alternating, --repeat times each; the medians are printed (and written with --json). The module to import
(or several, comma-separated) and the library's folders come from the command line and PYTHONPATH.

Usage: PYTHONPATH=/tmp/h1/site5 python bench/import_cost.py [--module liger_kernel.ops] [--repeat 7] [--json f]
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

MODES = ("source", "kept", "pyc")


def child(mode: str, module: str, arch: str) -> None:
    import importlib
    import triton  # noqa: F401  (the toolchain: imported before recording, as a compile server does)
    import triton.compiler  # noqa: F401
    from kforge.load import device_model, observe
    with_store = observe._from_source
    if mode == "source":
        observe._from_source = lambda toolchain, store: with_store(toolchain, None)
    elif mode == "pyc":
        observe._from_source = lambda toolchain, store: None
    started, cpu = time.perf_counter(), time.process_time()
    observe.Recorder.install(os.getcwd()).start()
    device_model.serving("bench")
    device_model.prepare(arch, True, ())
    for name in module.split(","):
        importlib.import_module(name)
    print(json.dumps({"import_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
                      "modules": len(sys.modules)}), flush=True)


def run(project: str, mode: str, module: str, arch: str) -> dict:
    # Python's default, writing .pyc files (a dev machine may set PYTHONDONTWRITEBYTECODE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_CACHE_HOME"] = os.path.join(project, "user-cache")   # the kept bytecode: this run's own
    command = [sys.executable, os.path.abspath(__file__), "--child", mode, "--module", module, "--arch", arch]
    proc = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: the import failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def kept_files(project: str) -> int:
    return sum(len(files) for _, _, files in os.walk(os.path.join(project, "user-cache", "kforge", "bytecode")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="liger_kernel.ops", help="a module to import, or several: a,b,c")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--child", choices=MODES)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.module, args.arch)
    project = tempfile.mkdtemp(prefix="import_cost-")
    os.makedirs(os.path.join(project, "out"))
    first = {mode: run(project, mode, args.module, args.arch) for mode in ("kept", "pyc")}   # fill both caches
    print(f"first runs (filling): kept {first['kept']['import_s']:.2f} s ({kept_files(project)} files kept), "
          f"pyc {first['pyc']['import_s']:.2f} s; modules {first['kept']['modules']}", flush=True)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}   # less moved by other processes on a shared host
    for _ in range(args.repeat):
        for mode in MODES:
            found = run(project, mode, args.module, args.arch)
            times[mode].append(found["import_s"])
            cpu[mode].append(found["cpu_s"])
            print(f"{mode:7s} {times[mode][-1]:6.2f} s (cpu {cpu[mode][-1]:6.2f} s)", flush=True)
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    cpu_medians = {mode: statistics.median(t) for mode, t in cpu.items()}
    print("medians: " + ", ".join(f"{mode} {medians[mode]:.2f} s (cpu {cpu_medians[mode]:.2f} s)" for mode in MODES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"module": args.module, "cpus": os.cpu_count(), "first": first, "times": times,
                       "cpu": cpu, "medians": medians, "cpu_medians": cpu_medians}, f, indent=1)


if __name__ == "__main__":
    main()
