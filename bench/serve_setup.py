"""What serving costs a process: serve() itself, the time from serve() to the first served kernel's result, and
the whole light application (bench/light_app.py, 20 softmax specializations, all held by the project's bundle)
served vs Triton's JIT with a warm cache and with an empty one. Fresh processes, modes alternating.

GPU (H100; DIST: out/dist of `python3 -m doit -n 16 archs=sm_90a`):
    python bench/serve_setup.py DIST [--rounds 5] [--app-rounds 5] [--out results.json]
  served from a bundle of light_app.py's 20 specializations cut from DIST's sm_90a wheel; set-up, per process (torch, triton and the app's kernels imported, CUDA initialized and inputs allocated
  before the clock starts): serve() lazily and with preload, each with the specializer primed (specializer.py,
  now) and imported the usual way (Triton's code generator and Gluon: before), then the first call's result;
  what serve() imported. Then light_app.py in fresh processes: jit_empty, jit_warm, served (python -m
  kforge_runtime.serve --strict) and served with --preload: time to the first result, to all, and the
  process; the served runs' Triton cache must stay empty and their outputs bit-identical to the JIT's.
CPU (no GPU: Triton's driver answered by a stub, one of light_app.py's specializations held, its launch stood in for):
    python bench/serve_setup.py --cpu [--rounds 20]
  serve() lazily, primed vs the usual way, and what it imported.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HEAVY = ("triton.compiler.code_generator", "triton.experimental.gluon")


def write_manifest(folder: Path, manifest: dict) -> None:
    """A bundle folder's manifest.json and the digest beside it (manifest.sha256) that `doit package` writes and the
    loader requires: a manifest this script makes or cuts stands for one its builder wrote."""
    data = json.dumps(manifest).encode()
    (folder / "manifest.json").write_bytes(data)
    (folder / "manifest.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def child(dist: str, preload: bool, usual: bool, cpu: bool) -> dict:
    """One process's set-up: serve() and the first served result, timed (run with --child)."""
    import torch  # noqa: F401
    import triton  # noqa: F401
    sys.path.insert(0, str(BENCH))
    from kforge_runtime import serve, specializer
    if usual:   # before: what the specializer's first call imports, imported the usual way
        specializer.prime = specializer.usual
    if cpu:
        dist, call = cpu_setup()
    else:
        import light_app
        torch.cuda.init()
        first = light_app.inputs()[0]
        torch.cuda.synchronize()
        call = lambda: (light_app.call(*first), torch.cuda.synchronize())   # noqa: E731
    before = set(sys.modules)
    start = time.perf_counter()
    server = serve.serve(dist, strict=True, preload=preload)
    setup = time.perf_counter() - start
    imported = sorted(set(sys.modules) - before)
    at = time.perf_counter()
    call()
    first_result = time.perf_counter() - at
    return {"serve_ms": round(setup * 1000, 2), "first_result_ms": round(first_result * 1000, 2),
            "serve_to_first_result_ms": round((setup + first_result) * 1000, 2), "served": server.served,
            "compiled": server.compiled, "imported_by_serve": len(imported),
            "heavy_imported": sorted(m for m in set(sys.modules) if m in HEAVY)}


def cpu_setup():
    """A stub sm_90a driver, a bundle holding one of light_app.py's softmax specializations, and that call (its
    launch stood in for: nothing runs on a CPU)."""
    import light_app
    import torch
    from kforge_runtime.bundle import Bundle
    from kforge_runtime.source_key import source_key
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Stub:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device=None: 0)
        get_current_target = staticmethod(lambda: GPUTarget("cuda", 90, 32))

    class Launch:
        def launch_trusted(self, *args):
            pass

        def reaches(self, address):   # the CPU tensors stand in for the GPU's
            return True

    driver.set_active(Stub())
    Bundle.binary = lambda self, entry: b""   # no binary: its proof (sha256, arch) is stood in for with its launch
    Bundle.kernel = lambda self, entry, device=None, binary=None: Launch()
    dist = Path(tempfile.mkdtemp()) / "b"
    dist.mkdir()
    signature = [("x_ptr", "*bf16"), ("y_ptr", "*bf16"), ("N", "i32"), ("stride_x", "i32"), ("stride_y", "i32")]
    write_manifest(dist, {
        "format": "kforge-bundle", "format_version": 1, "arch": "sm_90a", "vendor": "nvidia", "failed": [],
        "artifacts": [{"target": "softmax-bf16-n512-w4", "arch": "sm_90a",
                       "source": {"module": "kernels.softmax", "entry": "softmax_kernel"},
                       "signature": [{"name": n, "type": t} for n, t in signature], "constexprs": {"BLOCK_N": 512},
                       "divisible_by_16": ["x_ptr", "y_ptr", "stride_x", "stride_y"], "options": {"num_warps": 4},
                       "triton_source_key": source_key(light_app.softmax_kernel)}]})
    x = torch.zeros(light_app.ROWS, 512, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return str(dist), lambda: light_app.call(x, y, 509, 512, 4)


def light_bundle(dist: str, work: Path) -> str:
    """A bundle directory holding only light_app.py's 20 specializations, cut from DIST's sm_90a wheel (the
    project's bundle holds 400 and more: preload would load them all)."""
    import zipfile
    wheel = next(Path(dist).glob("kforge_kernels_sm_90a-*.whl"), None)
    if wheel is None:
        raise SystemExit(f"{dist}: no kforge_kernels_sm_90a-*.whl; build it: python3 -m doit -n 16 archs=sm_90a")
    zipfile.ZipFile(wheel).extractall(work / "light")
    manifest = next((work / "light").glob("*/manifest.json"))
    m = json.loads(manifest.read_text())
    m["artifacts"] = [e for e in m["artifacts"] if e.get("kernel") == "softmax" and e["config"].get("dtype") in
                      ("bf16", "fp16") and e["options"].get("num_warps") in (4, 8)]
    write_manifest(manifest.parent, m)   # the cut manifest with its own digest: the wheel's would refuse it
    return str(manifest.parent)


def setup_rounds(dist: str | None, rounds: int, cpu: bool) -> dict:
    modes = {"lazy, primed (now)": ([], False), "lazy, usual imports (before)": (["--usual"], False)}
    if not cpu:
        modes.update({"preload, primed (now)": (["--preload"], True),
                      "preload, usual imports (before)": (["--preload", "--usual"], True)})
    rows: dict[str, list] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            cmd = [sys.executable, __file__, "--child", *(["--cpu"] if cpu else [dist]), *modes[mode][0]]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp()))
            if proc.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            rows[mode].append(json.loads(proc.stdout.splitlines()[-1]))
    return {mode: {**{k: statistics.median(x[k] for x in runs) for k in ("serve_ms", "first_result_ms",
                                                                          "serve_to_first_result_ms")},
                   "imported_by_serve": runs[0]["imported_by_serve"], "heavy_imported": runs[0]["heavy_imported"],
                   "served_compiled": sorted({(x["served"], x["compiled"]) for x in runs})}
            for mode, runs in rows.items()}


def app_rounds(dist: str, rounds: int, work: Path) -> dict:
    sys.path.insert(0, str(BENCH))
    from output_diff import classify
    app = str(BENCH / "light_app.py")
    warm = str(work / "warm")
    subprocess.run([sys.executable, app, "--out", str(work / "jit0.pt")], check=True, capture_output=True,
                   env=dict(os.environ, TRITON_CACHE_DIR=warm))   # fills the warm cache
    modes = ["jit_empty", "jit_warm", "served", "served_preload"]
    rows: dict[str, list] = {m: [] for m in modes}
    jit_out, served_out = [str(work / "jit0.pt")], []
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            cache = warm if mode == "jit_warm" else str(work / f"{mode}-{r}")
            out = str(work / f"{mode}-{r}.pt")
            cmd = [sys.executable, app, "--out", out]
            if mode.startswith("served"):
                cmd = [sys.executable, "-m", "kforge_runtime.serve", "--bundles", dist, "--strict",
                       *(["--preload"] if mode == "served_preload" else []), *cmd[1:]]
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TRITON_CACHE_DIR=cache))
            process = time.perf_counter() - start
            if proc.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            found = {**json.loads(proc.stdout.splitlines()[-1]), "process_s": round(process, 3)}
            if mode.startswith("served"):
                found["cache_files"] = sum(1 for p in Path(cache).rglob("*") if p.is_file()) if Path(cache).exists() else 0
                found["report"] = proc.stderr.strip().splitlines()[-1]
            rows[mode].append(found)
            (served_out if mode.startswith("served") else jit_out).append(out)
    import torch
    summary = {mode: {k: statistics.median(x[k] for x in runs) for k in ("first_s", "all_s", "again_s", "process_s")}
               for mode, runs in rows.items()}
    summary["served_reports"] = sorted({x["report"] for m in modes[2:] for x in rows[m]})
    summary["served_cache_files"] = sum(x["cache_files"] for m in modes[2:] for x in rows[m])
    summary["outputs"] = classify([torch.load(p) for p in jit_out], [torch.load(p) for p in served_out])
    for mode in modes[2:]:
        for base in modes[:2]:
            summary[f"{mode}_process_vs_{base}_s"] = round(summary[mode]["process_s"] - summary[base]["process_s"], 3)
    return {"summary": summary, "runs": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist", nargs="?")
    ap.add_argument("--cpu", action="store_true", help="no GPU: a stub driver and a stand-in launch")
    ap.add_argument("--rounds", type=int, default=5, help="set-up rounds (fresh processes per mode)")
    ap.add_argument("--app-rounds", type=int, default=5, help="light_app.py rounds (0: none)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preload", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--usual", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.dist, a.preload, a.usual, a.cpu)))
        return 0
    if not a.cpu and not a.dist:
        ap.error("DIST (a bundle directory or out/dist) is needed on a GPU; --cpu without one")
    work = Path(tempfile.mkdtemp(prefix="serve-setup-"))
    dist = None if a.cpu else light_bundle(a.dist, work)
    result = {"setup": setup_rounds(dist, a.rounds, a.cpu)}
    if dist:
        result["bundle"] = {"path": dist, "specializations": len(json.loads(Path(dist, "manifest.json").read_text())
                                                                  ["artifacts"])}
    if not a.cpu and a.app_rounds:
        result["light_app"] = app_rounds(dist, a.app_rounds, work)
    shown = {k: (v["summary"] if k == "light_app" else v) for k, v in result.items()}
    print(json.dumps(shown, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    app = result.get("light_app", {}).get("summary", {})
    return 1 if app and (app["outputs"]["serving_differences"] or app["served_cache_files"]) else 0


if __name__ == "__main__":
    sys.exit(main())
