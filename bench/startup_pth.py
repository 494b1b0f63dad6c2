"""Python's start-up with kforge's .pth hook installed, the variables unset: is it unchanged?

Two throw-away virtual environments of this Python, equal but for one file: B holds
rules/runtime/kforge-runtime-env.pth in its site-packages, A does not. `python -c pass` runs in each, alternating,
KFORGE_RECORD and KFORGE_SERVE unset; a third mode runs a venv C like B where kforge_runtime is importable, with
KFORGE_SERVE set (the hook imports kforge_runtime.startup and waits for Triton, which never comes: what a
launcher such as torchrun pays).

Usage: python bench/startup_pth.py [--runs 200] [--out results.json]
Prints the median and mean start-up of each mode and B / A (the hook's cost with the variables unset).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PTH = REPO / "rules" / "runtime" / "kforge-runtime-env.pth"


def venv(root: Path, with_pth: bool, importable: bool = False) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if with_pth:
        shutil.copy(PTH, purelib)
    if importable:   # kforge_runtime importable there (the mode with the variable set), as an install makes it
        (root / "pkgs").mkdir()
        (root / "pkgs" / "kforge_runtime").symlink_to(REPO / "rules" / "runtime")
        Path(purelib, "kforge-checkout.pth").write_text(str(root / "pkgs") + "\n")
    return python


def once(python: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="startup-pth-"))
    try:
        without, with_pth, set_ = venv(work / "a", False), venv(work / "b", True), venv(work / "c", True, True)
        unset = {k: v for k, v in os.environ.items() if k not in ("KFORGE_RECORD", "KFORGE_SERVE", "PYTHONPATH")}
        modes = {"A: no .pth": (without, unset), "B: .pth, variables unset": (with_pth, unset),
                 "C: .pth, KFORGE_SERVE set (no Triton import)": (set_, {**unset, "KFORGE_SERVE": str(work)})}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for m, (python, env) in modes.items():   # warm the file cache and the venvs' bytecode
            once(python, env)
        for r in range(a.runs):
            for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                times[m].append(once(*modes[m]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {m: {"median_ms": round(statistics.median(t) * 1000, 2), "mean_ms": round(statistics.mean(t) * 1000, 2),
                   "stdev_ms": round(statistics.stdev(t) * 1000, 2)} for m, t in times.items()}
    a_, b_ = (times[m] for m in list(modes)[:2])
    summary["B/A median"] = round(statistics.median(b_) / statistics.median(a_), 4)
    summary["B/A mean"] = round(statistics.mean(b_) / statistics.mean(a_), 4)
    summary["runs"] = a.runs
    summary["python"] = sys.version.split()[0]
    summary["purelib"] = sysconfig.get_paths()["purelib"]
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": summary, "times_s": times}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
