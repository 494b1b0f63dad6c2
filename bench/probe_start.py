"""Loading the catalog of a library that needs a GPU at import, on a CPU, from two checkouts of kforge side by side.

Such a library imports only under kforge's device model, so the catalog load asks one probe child per arch what
the library's @triton.autotune chooses there (rules/load/entry_probe.py); each child imports torch and Triton first.
The scratch project: a library `gpulib` that asserts a GPU at import and picks its autotune configs from the
device's capability, one spec over every arch kforge builds. Each run is `doit list --all` with the saved catalog
removed (the specs are loaded, the children started), alternating A and B; median of --repeat runs each, and B/A.
Each checkout's build system is imported from its own folders (links named `kforge` and `kforge_runtime` to its
rules/ and rules/runtime/ on PYTHONPATH, ahead of an installed kforge), so A can be a `git worktree` of an older
commit; the JSON records each side's commit.

Usage: python bench/probe_start.py A B [--repeat 5] [--json out.json]
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

ARCHS = ["sm_80", "sm_90a", "sm_100a", "gfx90a", "gfx942", "gfx950"]

LIBRARY = {
    "gpulib/__init__.py": '''import torch
import triton

assert torch.cuda.is_available(), "gpulib needs a GPU"
MAJOR, _ = torch.cuda.get_device_capability()
''',
    "gpulib/ops.py": '''import torch
import triton
import triton.language as tl

from gpulib import MAJOR

BLOCKS = (256, 1024) if torch.version.hip else (512, 2048) if MAJOR >= 9 else (512,)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in BLOCKS], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
''',
}

SPEC = f'''[kernel]
name = "gpulib_scale"
module = "gpulib.ops"
entry = "scale_kernel"
toolchain = "triton"
archs = {json.dumps(ARCHS)}

[signature]
x_ptr = "*{{dtype}}"
y_ptr = "*{{dtype}}"
n = "i32"
BLOCK = "constexpr"

[sweep]
dtype = ["fp32", "fp16"]
'''


def project(root: Path) -> Path:
    for name, text in LIBRARY.items():
        (root / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "site" / name).write_text(text)
    (root / "p" / "specs").mkdir(parents=True)
    (root / "p" / "specs" / "gpulib_scale.toml").write_text(SPEC)
    (root / "p" / "dodo.py").write_text("from kforge.dodo import *  # noqa: F401,F403\n")
    return root / "p"


def build_system(checkout: Path, scratch: Path, name: str) -> Path:
    """A folder holding the checkout's two packages as links to the folders kforge's pyproject maps them to."""
    folder = scratch / f"kforge-{name}"
    folder.mkdir()
    (folder / "kforge").symlink_to(checkout.resolve() / "rules")
    (folder / "kforge_runtime").symlink_to(checkout.resolve() / "rules" / "runtime")
    return folder


def commit(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return done.stdout.strip() + (" with uncommitted changes" if dirty else "") if done.returncode == 0 else "?"


def listed(p: Path, path: str) -> tuple[float, list[str]]:
    for saved in (p / "out" / ".kforge").glob("catalog*"):
        if saved.is_file():   # the saved catalog, so that the specs are loaded
            saved.unlink()
    env = dict(os.environ, PYTHONPATH=path)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "list", "--all", "--quiet"], cwd=p, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit list failed in {p} with {path}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds, sorted(t for t in proc.stdout.split() if "@" in t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        p = project(scratch)
        paths = {side: os.pathsep.join([str(build_system(c, scratch, side)), str(scratch / "site")])
                 for side, c in (("A", a.a), ("B", a.b))}
        times: dict[str, list[float]] = {"A": [], "B": []}
        targets: dict[str, list[str]] = {}
        for i in range(a.repeat):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                seconds, names = listed(p, paths[side])
                times[side].append(seconds)
                if targets.setdefault(side, names) != names:
                    raise SystemExit(f"{side} listed other targets on run {i + 1}")
        if targets["A"] != targets["B"] or len(targets["A"]) < len(ARCHS):
            raise SystemExit(f"A and B list different targets: {targets}")
    med = {side: statistics.median(ts) for side, ts in times.items()}
    print(f"catalog load, {len(targets['A'])} targets over {len(ARCHS)} archs, one probe child per arch "
          f"({os.cpu_count()} CPUs), median of {a.repeat}:")
    print("| checkout | seconds | runs |\n|---|---|---|")
    for side, c in (("A", a.a), ("B", a.b)):
        print(f"| {side}: {c} | {med[side]:.2f} | {', '.join(f'{t:.2f}' for t in times[side])} |")
    print(f"B / A: {med['B'] / med['A']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"A": commit(a.a), "B": commit(a.b), "archs": ARCHS, "targets": len(targets["A"]), "cpus": os.cpu_count(),
                                            "seconds": times, "median": med, "ratio": med["B"] / med["A"]},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()
