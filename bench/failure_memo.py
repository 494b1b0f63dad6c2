"""A no-op run after a deterministic compile failure, A/B between two checkouts of kforge: is anything compiled?

Usage: python bench/failure_memo.py A B [--runs 5]
Per side: a project (the checkout's dodo.py and pyproject.toml) with two targets of one kernel, one of which
fails to compile (a tl.static_assert), built once; then `doit -n 2` again --runs times, alternating the sides.
Prints each side's wall times (median) and how often a compile server imported the kernel during those runs
(0: nothing was compiled). Each side runs with <checkout>/.venv/bin/python when there is one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = (Path(__file__).resolve().parents[1] / "kernels" / "static_assert.py").read_text()   # counts its imports

SPEC = '''
[kernel]
name = "scale"
source = "tk/scale.py"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a"]
id = "b{BLOCK}"

[signature]
x_ptr = "*fp16"
y_ptr = "*fp16"
n = "i32"
BLOCK = "constexpr"

[sweep]
BLOCK = [256, 512]
'''


def project(checkout: Path, dest: Path) -> Path:
    (dest / "specs").mkdir(parents=True)
    (dest / "tk").mkdir()
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy(checkout / name, dest / name)
    (dest / "specs" / "scale.toml").write_text(SPEC)
    (dest / "tk" / "__init__.py").write_text("")
    (dest / "tk" / "scale.py").write_text(KERNEL)
    return dest


def run(checkout: Path, root: Path, imports: Path) -> float:
    venv = checkout / ".venv" / "bin" / "python"
    env = dict(os.environ, COUNT_IMPORTS_IN=str(imports), KFORGE_LOCAL_CACHE="off")
    start = time.perf_counter()
    proc = subprocess.run([str(venv) if venv.exists() else sys.executable, "-m", "doit", "-n", "2"], cwd=root,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if "failed 1" not in proc.stdout:
        raise SystemExit(f"{root}: expected one failed target:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-memo-"))
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    roots = {s: project(c, work / s) for s, c in sides.items()}
    imports = {s: work / f"{s}-imports.txt" for s in sides}
    for s in sides:
        run(sides[s], roots[s], imports[s])   # the first build: one target built, one failed
        imports[s].write_text("")
    times: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(args.runs):
        for s in ("A", "B") if i % 2 == 0 else ("B", "A"):
            times[s].append(run(sides[s], roots[s], imports[s]))
    for s in sides:
        compiled = len(imports[s].read_text().splitlines())
        print(f"{s} {sides[s]}: no-op after a failure: median {statistics.median(times[s]):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in times[s])}); compile servers that imported the kernel: {compiled}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
