"""Where a served process's time goes: bench/liger_app.py's ops run twice in one process with the bundle
served, the first pass (every kernel found, loaded and launched for the first time) and the second (all of it
in place: the steady state) timed, and the first pass's time split among the steps serving adds.

Usage (on a GPU): python bench/serve_breakdown.py DIST [--warm-torch]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
spent: dict[str, float] = defaultdict(float)


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
    setattr(owner, name, wrapper)


def timed_binders(make):
    """A JITFunction's per-device cache factory, timed, whose binder (the argument specializer) is timed too."""
    def factory():
        start = time.perf_counter()
        kernels, keys, target, backend, binder = make()
        spent["triton: create_binder (per kernel and device)"] += time.perf_counter() - start

        def timed_binder(*args, **kwargs):
            at = time.perf_counter()
            try:
                return binder(*args, **kwargs)
            finally:
                spent["triton: binder (specialize the arguments)"] += time.perf_counter() - at
        return kernels, keys, target, backend, timed_binder
    return factory


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist")
    ap.add_argument("--warm-torch", action="store_true")
    a = ap.parse_args()
    import liger_app
    from triton.runtime.jit import JITFunction
    from kforge_runtime import bundle, launch, serve
    torch.cuda.init()
    data = [liger_app.inputs(t, seed=t) for t in (1, 7, 128, 1000)]
    ops = liger_app.ops()
    if a.warm_torch:
        liger_app.without_triton(lambda: [t.detach().cpu() for d in data for op in ops for t in op(d)])
    server = serve.serve(a.dist, strict=True)
    import gc
    import triton.runtime.jit as jit_module
    for fn in [o for o in gc.get_objects() if isinstance(o, JITFunction)]:   # their binders, timed
        fn.device_caches.default_factory = timed_binders(fn.device_caches.default_factory)
    timed(jit_module, "compute_cache_key", "triton: compute_cache_key")
    timed(serve.Served, "run", "kforge: Served.run (load at first launch, launch)")
    timed(JITFunction, "_pack_args", "triton: _pack_args (on a cache miss)")
    timed(serve.Server, "index", "kforge: open the bundle, index its entries")
    timed(serve.Server, "lookup", "kforge: lookup (record line + identity)")
    timed(bundle.Bundle, "binary", "kforge: read + check the binary (sha256, ELF)")
    timed(launch.Kernel, "__init__", "kforge: load the binary (cuModuleLoadData ...)")
    timed(launch.Kernel, "launch_trusted", "kforge: launch")
    timed(JITFunction, "run", "triton: JITFunction.run (all of it)")
    passes, per_op = [], []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for d in data:
            for op in ops:
                at = time.perf_counter()
                [t.detach().cpu() for t in op(d)]
                torch.cuda.synchronize()
                if not passes:
                    per_op.append(round((time.perf_counter() - at) * 1000, 2))
        torch.cuda.synchronize()
        passes.append(round(time.perf_counter() - start, 4))
        if len(passes) == 1:
            first = {k: round(v, 4) for k, v in spent.items()}
    print(json.dumps({"first_pass_s": passes[0], "second_pass_s": passes[1], "first_pass_steps_s": first,
                      "first_pass_ms_per_op": per_op, "served": server.served, "compiled": server.compiled},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
