"""No-op rebuild: `doit` with every target up to date, vs bare doit with the same number of trivial tasks.

Usage: python bench/noop.py --targets 1000 5000 [--repeat 5]
The kforge project is generated: one spec whose sweep gives N targets of a small kernel. Its artifacts are
seeded rather than compiled (one real compile, copied N times with each target's own key in meta.json):
the no-op path reads only meta.json keys, so this measures exactly what an up-to-date run does.
Bare doit: N tasks, each with one file_dep, one target and a python action, sqlite3 backend.
Both are timed as whole `python -m doit` processes, alternating, median of --repeat runs, with Python's
bytecode cache on (its default) for both.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, run_doit  # noqa: E402
from kforge.project import load_specs  # noqa: E402
from kforge.targets import build_targets  # noqa: E402

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
'''

BARE_DODO = '''N = {n}
DOIT_CONFIG = {{"backend": "sqlite3", "dep_file": ".doit.sqlite3", "verbosity": 0}}


def touch(path):
    open(path, "w").close()


def task_t():
    for i in range(N):
        yield {{"name": str(i), "actions": [(touch, ["out/%d" % i])], "file_dep": ["input.txt"],
               "targets": ["out/%d" % i]}}
'''


def kforge_project(root: Path, n: int) -> Path:
    (root / "specs").mkdir(parents=True)
    (root / "tk").mkdir()
    (root / "tk" / "__init__.py").write_text("")
    (root / "tk" / "scale.py").write_text(KERNEL)
    shutil.copy(REPO / "dodo.py", root)
    shutil.copy(REPO / "pyproject.toml", root)
    blocks = ", ".join(str(16 * (i + 1)) for i in range(n // 2))
    (root / "specs" / "scale.toml").write_text(f'''[kernel]
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
''')
    # one real compile per arch, then seed the rest with their own keys
    run_doit(root, "scale:b16@sm_90a", "scale:b16@gfx942")
    for t in build_targets(load_specs(root), root, None):
        src = root / "out" / t.arch / "scale" / "b16"
        dst = Path(t.out_dir)
        if dst == src:
            continue
        dst.mkdir(parents=True, exist_ok=True)
        meta = json.loads((src / "meta.json").read_text())
        shutil.copy(src / meta["binary"], dst / meta["binary"])
        (dst / "meta.json").write_text(json.dumps({**meta, "key": t.key, "target": t.name}))
    return root


def bare_project(root: Path, n: int) -> Path:
    (root / "out").mkdir(parents=True)
    (root / "input.txt").write_text("x")
    (root / "dodo.py").write_text(BARE_DODO.format(n=n))
    run_doit(root)
    return root


def main() -> None:
    # Python's default is to cache bytecode; a PYTHONDONTWRITEBYTECODE=1 environment (this dev machine's)
    # recompiles kforge's rules/ at every start while bare doit's one-file dodo hardly notices.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print("| targets | kforge no-op s | bare doit no-op s | ratio |")
    print("|---|---|---|---|")
    for n in a.targets:
        work = Path(tempfile.mkdtemp(prefix=f"kforge-noop-{n}-"))
        kf, bare = kforge_project(work / "kforge", n), bare_project(work / "bare", n)
        run_doit(kf), run_doit(bare)   # first no-op runs settle doit's DB
        times = {"kf": [], "bare": []}
        for _ in range(a.repeat):
            times["kf"].append(run_doit(kf))
            times["bare"].append(run_doit(bare))
        built = json.loads((kf / "out" / "build-report.json").read_text())["counts"]
        assert built["built"] == 0 and built["up-to-date"] == n, built
        k, b = statistics.median(times["kf"]), statistics.median(times["bare"])
        print(f"| {n} | {k:.3f} | {b:.3f} | {k / b:.2f} |", flush=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
