"""Where a dispatch and a combine spend their GPU time: each kernel's mean duration (torch.profiler, CUPTI)
over dispatch + combine pairs,
at 4096 (or --tokens) tokens/rank, H=7168, top-8, 32 experts/rank, the shapes of bench/ep_bandwidth.py.

Usage (on a multi-GPU host): python bench/ep_profile.py [--world 4] [--dist out/dist] [--dtype fp8_e4m3]
       [--tokens 128]
Barrier kernels' times include waiting for the slowest rank; the table gives the min and max over ranks.
On sm_90 and later dispatch's kernels are programmatic dependent launches: each starts while the one before runs
and waits for it on the GPU, and that wait counts in its duration, so there the per-kernel figures overlap.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ep_bandwidth import join_group, problem, ready_op  # noqa: E402


def kernel_means(fn, calls: int) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel fn launches."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name[:60]] += event.device_time / calls
    return dict(total)


def worker(rank: int, world: int, port: int, dist_dir: str | None, dtype: str, calls: int, tokens: int) -> None:
    library = join_group(rank, world, port, dist_dir)
    cfg, x, idx, w, scales = problem(tokens, rank, world, dtype)
    op, _, _ = ready_op(cfg, x, idx, w, scales, rank, library)
    # combine serves the latest dispatch: the calls are pairs, each kernel named by its family
    tables = {"dispatch + combine": kernel_means(lambda: op.combine(None, op.dispatch(x, idx, w, scales).handle),
                                                 calls)}
    gathered = [None] * world
    dist.all_gather_object(gathered, tables)
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, {tokens} tokens/rank, H=7168, top-8, {dtype}, "
              f"mean of {calls} eager calls\n")
        print("| op | kernel | us, min over ranks | us, max over ranks |")
        print("|---|---|---|---|")
        for op_name in tables:
            for kernel in tables[op_name]:
                times = [g[op_name].get(kernel, 0.0) for g in gathered]
                print(f"| {op_name} | {kernel} | {min(times):.1f} | {max(times):.1f} |")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--port", type=int, default=29566)
    ap.add_argument("--dist", default=None, help="run the op's precompiled kernels from these bundles")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8_e4m3"])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.world, a.port, a.dist, a.dtype, a.calls, a.tokens), nprocs=a.world)


if __name__ == "__main__":
    main()
