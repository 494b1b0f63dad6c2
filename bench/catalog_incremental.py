"""The catalog loaded family by family: what an edit costs, and what `doit list` / `info` / `prune` cost, on a real
library (liger-kernel, installed in the environment).

The scratch project per checkout: tests/liger_specs (23 families, 4 of them probed: autotuned entries) and a copy
of the installed liger_kernel package on PYTHONPATH, so that its files can be edited. Rows, each timed --repeat
times alternating the checkouts (each in its own project), medians of wall and CPU time:
  full       the saved catalog removed, `doit list` (every family computed, every probe started)
  op edit    a comment appended to liger_kernel/ops/rope.py, `doit list` (liger's __init__ imports every op:
             every probed family read it, and so did liger_rope's source)
  spec edit  a spec's description changed, `doit list` (one family, no probe)
  moved      the project, out/ included, copied to another path (a CI cache restored into another checkout),
             `doit list` there
With --build, each project is built first (`doit -n 2`), and then, for each checkout: a no-op build and `doit list`,
`info` and `prune` with and without archs=, nothing changed.
Each checkout's build system is imported from its own folders (links named `kforge` and `kforge_runtime` to its
rules/ and rules/runtime/ on PYTHONPATH, ahead of the installed kforge), so one can be a `git worktree` of an
older commit.

Usage: python bench/catalog_incremental.py CHECKOUT [CHECKOUT ...] [--repeat 3] [--build] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUIET = [("list",), ("list", "archs=sm_90a"), ("info", "liger_rope"), ("info", "liger_rope", "archs=gfx942"),
         ("prune",), ("prune", "archs=sm_90a,gfx942")]


def project(scratch: Path, checkout: Path) -> tuple[Path, dict]:
    """A liger project for one checkout, and the environment its doit runs in."""
    root = scratch / "project"
    shutil.copytree(REPO / "tests" / "liger_specs", root / "specs")
    (root / "dodo.py").write_text("from kforge.dodo import *  # noqa: F401,F403\n")
    shutil.copy(checkout / "pyproject.toml", root / "pyproject.toml")   # its commands, as it names them
    liger = Path(importlib.util.find_spec("liger_kernel").origin).parent
    shutil.copytree(liger, scratch / "site" / "liger_kernel", ignore=shutil.ignore_patterns("__pycache__"))
    links = scratch / "links"
    links.mkdir()
    (links / "kforge").symlink_to(checkout / "rules")
    (links / "kforge_runtime").symlink_to(checkout / "rules" / "runtime")
    return root, dict(os.environ, PYTHONPATH=os.pathsep.join([str(links), str(scratch / "site")]))


def doit(root: Path, env: dict, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of doit and the processes it waited for: the probe children, not the module
    processes they fork, which are killed with them)."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=env, capture_output=True, text=True)
    took, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} in {root} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return took, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def drop_catalog(root: Path) -> None:
    for path in (root / "out" / ".kforge").glob("catalog*"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def edit_op(root: Path) -> None:
    rope = root.parent / "site" / "liger_kernel" / "ops" / "rope.py"
    rope.write_text(rope.read_text() + f"\n# edited {time.time_ns()}\n")


def edit_spec(root: Path) -> None:
    spec = root / "specs" / "liger_rope.toml"
    spec.write_text(re.sub(r'description = "[^"]*"', f'description = "edited {time.time_ns()}"', spec.read_text()))


def moved(root: Path, n: int) -> Path:
    """A copy of the project, its out/ included, at another path (mtimes kept, as a cache restore keeps them)."""
    copy = root.parent / f"moved-{n}"
    shutil.copytree(root, copy, symlinks=True)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kforge-catalog-incremental-"))
    sides = {}
    for i, checkout in enumerate(args.checkouts):
        (scratch / str(i)).mkdir()
        sides[str(checkout)] = project(scratch / str(i), checkout.resolve())
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}

    def row(name: str, prepare, *command: str, side: str | None = None, where=lambda root: root) -> None:
        for _ in range(args.repeat):
            for checkout, (root, env) in sides.items():
                if side in (None, checkout):
                    prepare(root, env)
                    rows.setdefault(name, {}).setdefault(checkout, []).append(doit(where(root), env, *command))
        print(f"{name:40s} " + "  ".join(f"{statistics.median(w for w, _ in t):6.2f} s wall "
                                          f"{statistics.median(c for _, c in t):6.2f} s CPU" for t in rows[name].values()),
              flush=True)

    for root, env in sides.values():
        doit(root, env, "list")   # each side's catalog saved once
    row("full: no saved catalog, doit list", lambda root, env: drop_catalog(root), "list")
    row("op edit: ops/rope.py, doit list", lambda root, env: edit_op(root), "list")
    row("spec edit: liger_rope.toml, doit list", lambda root, env: edit_spec(root), "list")
    for root, env in sides.values():
        doit(root, env, "list")   # the last edit's catalog saved, so that the copy finds it current
    moves = iter(range(10**6))
    row("moved: the project copied elsewhere, doit list", lambda root, env: None, "list",
        where=lambda root: moved(root, next(moves)))
    if args.build:
        for root, env in sides.values():
            doit(root, env, "-n", "2")
        row("no-op build: doit", lambda root, env: None)
        for command in QUIET:
            row("doit " + " ".join(command), lambda root, env: None, *command)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "repeat": args.repeat}, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
