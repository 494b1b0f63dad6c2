"""Steady-state launch cost of a served kernel vs Triton's own launch path for the same kernel, and a served
kernel inside a CUDA graph.

Usage (on a GPU, with the bundle built from the liger application's record, see bench/zero_jit.py):
    python bench/serve_launch.py DIST [--calls 5000] [--rounds 7] [--out results.json]
Each kernel bench/liger_app.py launches first (one launch per JIT function, captured with its arguments) is
called as the application calls it, `kernel[grid](*args, **kwargs)`, through Triton's JITFunction.run: once
with Triton's compiled kernel in Triton's kernel cache (its own launcher), once with kforge's served kernel
there (serve()), alternating in rounds, `--calls` launches per round; the figure is the median microseconds
per call (CPU-bound: the kernels are tiny). Then each served kernel is captured in a CUDA graph, replayed, and
its output compared with an eager served launch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def capture_launches():
    """(JITFunction, args, kwargs, grid) of the first launch of each JIT function bench/liger_app.py runs."""
    from triton.runtime.jit import JITFunction
    import liger_app
    seen, run = {}, JITFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        if not warmup and self not in seen:
            seen[self] = (args, dict(kwargs), grid)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)
    JITFunction.run = spy
    try:
        data = liger_app.inputs(128, seed=128)
        for op in liger_app.ops():
            op(data)
    finally:
        JITFunction.run = run
    torch.cuda.synchronize()
    return [(fn, *call) for fn, call in seen.items()]


def per_call_us(fn, args, kwargs, grid, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn[grid](*args, **kwargs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    from kforge_runtime.serve import Served, serve, stop
    torch.cuda.init()
    launches = capture_launches()
    rows, graphs, served, compiled = [], [], 0, 0
    for fn, args, kwargs, grid in launches:
        cache = next(iter(fn.device_caches.values()))[0]
        cache.clear()
        fn[grid](*args, **kwargs)   # Triton's JIT (its cache is warm): its compiled kernel, alone in the cache
        (key, triton_kernel), = cache.items()
        cache.clear()
        server = serve(a.dist, strict=True)
        fn[grid](*args, **kwargs)   # served: the bundle's kernel goes into the cache under the same key
        served_kernel = cache[key]
        assert isinstance(served_kernel, Served), fn
        times = {"triton": [], "served": []}
        for r in range(a.rounds):
            for mode in (("triton", "served") if r % 2 == 0 else ("served", "triton")):
                cache[key] = triton_kernel if mode == "triton" else served_kernel
                times[mode].append(per_call_us(fn, args, kwargs, grid, a.calls))
        cache[key] = served_kernel
        graphs.append(graph_check(fn, args, kwargs, grid))
        served, compiled = served + server.served, compiled + server.compiled
        stop()
        t, s = statistics.median(times["triton"]), statistics.median(times["served"])
        rows.append({"kernel": f"{fn.fn.__module__}:{fn.fn.__qualname__}", "triton_us": round(t, 2),
                     "served_us": round(s, 2), "served_over_triton": round(s / t, 3), "rounds": times})
    summary = {"kernels": len(rows), "median_served_over_triton": statistics.median(r["served_over_triton"]
                                                                                      for r in rows),
               "max_served_over_triton": max(r["served_over_triton"] for r in rows),
               "served": served, "compiled": compiled,
               "cuda_graph_replays_equal_to_eager": graphs}
    for r in rows:
        print(f"{r['kernel']:<70} triton {r['triton_us']:7.2f} us  served {r['served_us']:7.2f} us  "
              f"x{r['served_over_triton']:.3f}")
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": summary, "kernels": rows}, indent=1) + "\n")
    return 0 if all(graphs) else 1


@torch.no_grad()   # the copies that reset inputs are not autograd's business
def graph_check(fn, args, kwargs, grid) -> bool:
    """The served launch captured in a CUDA graph and replayed writes what an eager launch writes."""
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    before = [x.clone() for x in tensors]
    fn[grid](*args, **kwargs)
    torch.cuda.synchronize()
    eager = [x.clone() for x in tensors]
    for x, b in zip(tensors, before):
        x.copy_(b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            fn[grid](*args, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    for x, b in zip(tensors, before):   # capture ran nothing: start from the same inputs, then replay
        x.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    raw = lambda t: t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)   # NaNs too
    return all(torch.equal(raw(x), raw(e)) for x, e in zip(tensors, eager))


if __name__ == "__main__":
    sys.exit(main())
