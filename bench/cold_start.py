"""Cold start: a fresh process's time to its first correct result, from the bundle vs through Triton's JIT.

Usage (on a GPU machine, with a bundle from `doit package`):
    python bench/cold_start.py out/dist [--kernel gemm] [--config bf16-m128n128k64-w8s3-split1] [--repeat 5]

Every run is a new Python process. In it, "setup" (the same in every mode) imports torch, makes the CUDA
context and the inputs; then the timed "kernel part" gets the first correct result:
  bundle          import the installed bundle wheel (pip-installed once, as an application would), open it,
                  check and load the binary, launch, sync, compare to torch
  jit-cold        import the kernel (and Triton), compile into an empty Triton cache, launch, sync, compare
  jit-warm-cache  the same with the Triton cache the previous jit-cold run filled (a second start)
Both paths launch the same kernel and config (the JIT uses the bundle manifest's constexprs and options).
Reported: medians of the kernel part and of the whole process as the parent saw it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZE = 2048
ARCH = "sm_90a"   # H100 / H200


def child(mode: str, dist: str, kernel: str, config: str, site: str) -> None:
    start = time.perf_counter()
    import torch
    recipe = _recipe(dist, kernel, config)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[recipe["config"]["dtype"]]
    torch.manual_seed(0)
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=dtype)
    b = torch.randn(SIZE, SIZE, device="cuda", dtype=dtype)
    c = torch.zeros(SIZE, SIZE, device="cuda", dtype=dtype)
    ref = (a.float() @ b.float())
    check = lambda out: ((out.float() - ref).norm() / ref.norm()).item()
    check(c)   # the comparison's own torch kernels load here, not in the timed part
    torch.cuda.synchronize()
    ready = time.perf_counter()
    if mode == "bundle":
        sys.path.insert(0, site)
        bundle = importlib.import_module(f"kforge_kernels_{recipe['arch']}").bundle()
        k = bundle.load(kernel, config)
    else:
        from kforge_runtime.jit import JitKernel
        k = JitKernel(recipe)
    loaded = time.perf_counter()
    cfg = recipe["config"]
    grid = (-(-SIZE // cfg["BLOCK_M"]) * -(-SIZE // cfg["BLOCK_N"]),)
    k(grid, a, b, c, SIZE, SIZE, SIZE, SIZE, SIZE, SIZE)
    torch.cuda.synchronize()
    ran = time.perf_counter()
    err = check(c)
    done = time.perf_counter()
    cache = os.environ["TRITON_CACHE_DIR"]
    print(json.dumps({"setup_s": ready - start, "kernel_s": done - ready, "load_s": loaded - ready,
                      "first_launch_s": ran - loaded, "check_s": done - ran, "rel_err": err, "ok": err < 1e-2,
                      "triton_imported": "triton" in sys.modules,
                      "cache_files": sum(1 for p in Path(cache).rglob("*") if p.is_file())}))


def _recipe(dist: str, kernel: str, config: str) -> dict:
    """The artifact's manifest entry, read as plain JSON (the runtime's own import is part of the timing)."""
    manifest = Path(dist) / f"kforge_kernels_{ARCH}.manifest.json"
    for entry in json.loads(manifest.read_text())["artifacts"]:
        if entry["kernel"] == kernel and entry["config_id"] == config:
            return entry
    raise SystemExit(f"{manifest}: no {kernel} {config}")


def run(mode: str, a, cache: str, site: str) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", mode, a.dist, "--kernel", a.kernel,
                          "--config", a.config, "--site", site], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "process_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist")
    ap.add_argument("--kernel", default="gemm")
    ap.add_argument("--config", default="bf16-m128n128k64-w8s3-split1")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--child", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--site", default=None)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.dist, a.kernel, a.config, a.site)
    site = tempfile.mkdtemp(prefix="bundle-site-")
    wheel = next(Path(a.dist).glob(f"kforge_kernels_{ARCH}-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", site,
                    str(wheel)], check=True)
    runs: dict[str, list[dict]] = {"bundle": [], "jit-cold": [], "jit-warm-cache": []}
    for _ in range(a.repeat):   # interleaved, so that drift on the machine hits every mode alike
        runs["bundle"].append(run("bundle", a, tempfile.mkdtemp(prefix="tc-bundle-"), site))
        cache = tempfile.mkdtemp(prefix="tc-jit-")
        runs["jit-cold"].append(run("jit-cold", a, cache, site))
        runs["jit-warm-cache"].append(run("jit-warm-cache", a, cache, site))
    med = {m: {k: statistics.median(r[k] for r in rs)
               for k in ("setup_s", "kernel_s", "load_s", "first_launch_s", "check_s", "process_s")}
           for m, rs in runs.items()}
    b = med["bundle"]
    print(f"{a.kernel} {a.config}, {SIZE}x{SIZE}x{SIZE}, {a.repeat} fresh processes per mode, medians\n")
    print("| mode | kernel part ms | x bundle | load / first launch / check ms | whole process s | x bundle | "
          "setup s | all correct | triton imported | Triton cache files after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, rs in runs.items():
        r = med[m]
        parts = " / ".join(f"{r[k] * 1e3:.1f}" for k in ("load_s", "first_launch_s", "check_s"))
        print(f"| {m} | {r['kernel_s'] * 1e3:.1f} | {r['kernel_s'] / b['kernel_s']:.0f} | {parts} | "
              f"{r['process_s']:.2f} | "
              f"{r['process_s'] / b['process_s']:.2f} | {r['setup_s']:.2f} | {all(x['ok'] for x in rs)} | "
              f"{any(x['triton_imported'] for x in rs)} | {max(x['cache_files'] for x in rs)} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"median": med, "runs": runs}, indent=1))
    if not all(x["ok"] for rs in runs.values() for x in rs) or runs["bundle"][0]["cache_files"] \
            or any(x["triton_imported"] for x in runs["bundle"]):
        raise SystemExit("a run gave a wrong result, or the bundle path compiled or imported Triton")


if __name__ == "__main__":
    main()
