"""One timing harness for the multi-GPU benchmarks (ep_bandwidth.py, nvlink_ceiling.py), so that an op and the
ceiling it is held to are timed the same way: every rank starts each sample together (a barrier, then a
synchronize), and one sample gives two clocks around the one call:
- wall: the host's clock from before the launch to after a synchronize (launch and sync latency included);
- events: CUDA events recorded on the stream just before and after the call (GPU time of that one call).
Each is the median over the samples on a rank, then the slowest rank's."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def timed(fn, iters: int) -> dict:
    """{"wall_s", "event_s"} of one call of fn, as above."""
    walls, events = [], []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start = time.perf_counter()
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        events.append(begin.elapsed_time(end) / 1e3)
    t = torch.tensor([statistics.median(walls), statistics.median(events)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"wall_s": t[0].item(), "event_s": t[1].item()}
