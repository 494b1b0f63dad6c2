"""Loading a catalog from the specs: the same 1,000-target family declared in TOML and by a Python catalog
(kforge.declare.family), each loaded from the specs and turned into targets in a fresh process, alternating,
median of --repeat runs. This is the cold load a run pays when the saved catalog does not hold (a spec,
a kernel source or kforge changed); a no-op run loads neither (bench/noop.py).

Usage: python bench/catalog_load.py [--targets 1000] [--repeat 11] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, scale_project  # noqa: E402

PYTHON = '''from kforge.declare import family

family(name="scale", source="tk/scale.py", entry="scale_kernel", toolchain="triton", archs=["sm_90a", "gfx942"],
       id="b{{BLOCK}}", signature={{"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}},
       sweep={{"BLOCK": [16 * (i + 1) for i in range({half})]}})
'''

LOAD = '''import sys, time
from pathlib import Path
start = time.perf_counter()
from kforge.plan.catalog import load_specs
from kforge.plan.targets import build_targets
root = Path(sys.argv[1])
n = len(build_targets(load_specs(root), root, None))
print(n, time.perf_counter() - start)
'''


def project(root: Path, kind: str, n: int) -> Path:
    scale_project(root, n, spec=kind == "toml")
    if kind == "python":
        (root / "specs" / "scale.py").write_text(PYTHON.format(half=n // 2))
    return root


def load_once(root: Path) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", LOAD, str(root)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-catalog-load-"))
    roots = {kind: project(work / kind, kind, a.targets) for kind in ("toml", "python")}
    times: dict[str, list[float]] = {"toml": [], "python": []}
    for i in range(a.repeat):   # alternating, the order flipped every other round
        for kind in (("toml", "python") if i % 2 == 0 else ("python", "toml")):
            n, seconds = load_once(roots[kind])
            assert n == a.targets, (kind, n)
            times[kind].append(seconds)
    t, p = statistics.median(times["toml"]), statistics.median(times["python"])
    print("| catalog | targets | load s (median) |")
    print("|---|---|---|")
    print(f"| TOML spec | {a.targets} | {t:.4f} |")
    print(f"| Python catalog (family()) | {a.targets} | {p:.4f} |")
    print(f"ratio Python / TOML: {p / t:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"targets": a.targets, "repeat": a.repeat, "toml_s": times["toml"],
                                            "python_s": times["python"], "ratio": round(p / t, 4)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
