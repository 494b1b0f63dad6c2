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


SCALE_KERNEL = '''import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
'''

SCALE_SPEC = '''[kernel]
name = "scale"
source = "tk/scale.py"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
id = "b{{BLOCK}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
BLOCK = [{blocks}]
'''


def scale_project(root: Path, n: int, spec: bool = True) -> Path:
    """A project of one small Triton kernel and, with spec, one TOML spec sweeping n // 2 block sizes for two
    archs (n targets)."""
    (root / "specs").mkdir(parents=True)
    (root / "tk").mkdir()
    (root / "tk" / "__init__.py").write_text("")
    (root / "tk" / "scale.py").write_text(SCALE_KERNEL)
    if spec:
        blocks = ", ".join(str(16 * (i + 1)) for i in range(n // 2))
        (root / "specs" / "scale.toml").write_text(SCALE_SPEC.format(blocks=blocks))
    return root


def fresh_copy(dest: Path, specs: str = "*", source: Path = REPO) -> Path:
    """The kernels, dodo and the specs matching the glob of `source` (a checkout of kforge: by default this one),
    in dest, with an empty out/ (a cold build)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(source / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "specs").mkdir()
    for spec in (source / "specs").glob(f"{specs}.toml"):
        shutil.copy(spec, dest / "specs" / spec.name)
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy(source / name, dest / name)
    return dest


def run_doit(project: Path, *args: str, env: dict | None = None, python: str = sys.executable) -> float:
    """Wall seconds of `python -m doit ARGS` in the project (SystemExit with its output if it fails); `python`:
    the interpreter whose kforge runs it (another checkout's virtualenv, say)."""
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "doit", *args], cwd=project, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {project}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def report_counts(project: Path) -> dict:
    return json.loads((project / "out" / "build-report.json").read_text())["counts"]
