"""Helpers shared by the benchmarks: throw-away copies of the project and timed doit runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_copy(dest: Path, specs: str = "*") -> Path:
    """The project's kernels, dodo and the specs matching the glob, in dest, with an empty out/ (a cold build)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "specs").mkdir()
    for spec in (REPO / "specs").glob(f"{specs}.toml"):
        shutil.copy(spec, dest / "specs" / spec.name)
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy(REPO / name, dest / name)
    return dest


def run_doit(project: Path, *args: str, env: dict | None = None) -> float:
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {project}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def report_counts(project: Path) -> dict:
    return json.loads((project / "out" / "build-report.json").read_text())["counts"]
