"""The no-op of a project one of whose families does not load (its library's import raises), vs the same project
without that family: what a broken family costs every run that follows.

Usage: python bench/broken_family.py [--targets 12] [--repeat 7] [--json out.json]
The project: one small kernel swept to --targets targets (power-of-2 blocks for sm_90a and gfx942, built once),
and a family whose module imports torch and then raises, as a library needing what the build machine lacks does
(mamba-ssm's broken family imports transformers too). Both sides are timed as whole `python -m doit` processes that exit 1 (the broken side) or 0,
alternating, median of --repeat runs, after one untimed run each.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, SCALE_SPEC, run_doit, scale_project  # noqa: E402

BROKEN_MODULE = '''import torch  # noqa: F401
import triton
import triton.language as tl

raise RuntimeError("this library needs a GPU at import")


@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass
'''

BROKEN_SPEC = '''[kernel]
name = "broken"
source = "tk/broken.py"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
'''


def noop(project: Path) -> float:
    """Wall seconds of `doit` there; it may exit 1 (the broken family's task fails), never 2 or a traceback."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit"], cwd=project, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1) or "Traceback" in proc.stdout + proc.stderr or "built 0," not in proc.stdout:
        raise SystemExit(f"doit in {project} was not a no-op:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kforge-broken-") as tmp:
        clean = scale_project(Path(tmp) / "clean", args.targets, spec=False)
        blocks = ", ".join(str(16 << i) for i in range(args.targets // 2))   # arange's range: a power of 2
        (clean / "specs" / "scale.toml").write_text(SCALE_SPEC.format(blocks=blocks))
        for f in ("dodo.py", "pyproject.toml"):
            shutil.copy(REPO / f, clean)
        run_doit(clean, "-n", "2")
        broken = Path(tmp) / "broken"
        shutil.copytree(clean, broken)
        (broken / "tk" / "broken.py").write_text(BROKEN_MODULE)
        (broken / "specs" / "broken.toml").write_text(BROKEN_SPEC)
        times: dict[str, list[float]] = {"clean": [], "broken": []}
        noop(clean), noop(broken)   # untimed: the broken side's first load imports its module
        for _ in range(args.repeat):
            times["clean"].append(noop(clean))
            times["broken"].append(noop(broken))
    result = {side: round(statistics.median(t), 3) for side, t in times.items()}
    result["ratio"] = round(result["broken"] / result["clean"], 2)
    print(f"no-op, {args.targets} targets, median of {args.repeat}: without the broken family {result['clean']} s, "
          f"with it {result['broken']} s ({result['ratio']} x)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
