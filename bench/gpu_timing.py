"""One timing harness for the multi-GPU benchmarks (ep_bandwidth.py, nvlink_ceiling.py), so that an op and the
ceiling it is held to are timed the same way. Each sample times one call of fn, every rank at once, on three
clocks (and timed_back_to_back: many calls in a row, the op's graph-replay clock, which the copies get too):
- wall: a barrier and a synchronize, then the host's clock from before the launch to after a synchronize: the
  launch, the sync and the ranks' skew (the host threads leave the barrier microseconds apart) all count;
- events: the same call, CUDA events recorded on the stream just before and after it;
- aligned: the ranks lined up on the GPUs instead of on the hosts: every stream first sleeps (so the host has
  queued everything behind it by the time it wakes), then one tiny all_reduce (it ends on every GPU within
  about a microsecond), then the events and fn. What a collective takes when every rank calls it at once,
  with no host jitter in it; a plain copy, which waits for nobody, gains nothing from it.
Each clock is the median over the samples on a rank, then the slowest rank's. `before`, if given, runs untimed
ahead of each sample (before the ranks line up): what fn needs first, e.g. the dispatch a combine serves."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

SLEEP_CYCLES = 2_000_000   # about 1 ms of GPU clock: longer than any host's queueing of one sample


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def timed(fn, iters: int, before=None) -> dict:
    """{"wall_s", "event_s", "aligned_s"} of one call of fn, as above."""
    walls, events, aligned = [], [], []
    token = torch.zeros(1, device="cuda")
    before = before or (lambda: None)
    for _ in range(iters):
        before()
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = _events()
        start = time.perf_counter()
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        events.append(begin.elapsed_time(end) / 1e3)

        before()
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = _events()
        torch.cuda._sleep(SLEEP_CYCLES)
        dist.all_reduce(token)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        aligned.append(begin.elapsed_time(end) / 1e3)
    t = torch.tensor([statistics.median(s) for s in (walls, events, aligned)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"wall_s": t[0].item(), "event_s": t[1].item(), "aligned_s": t[2].item()}


def timed_back_to_back(fn, calls: int = 50, before=None) -> float:
    """GPU seconds per call of `calls` back-to-back calls (CUDA events, no host sync between): the max over
    ranks. The op's barriers keep the ranks in step (a plain copy needs none); nothing of the host's per-call
    overhead is timed. With `before` (e.g. the dispatch a combine serves) each call is preceded by it and timed
    alone, by events recorded around it."""
    if before:
        before()
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    # the GPU sleeps while the host queues the calls: none is timed waiting for the host to launch it
    torch.cuda._sleep(4 * SLEEP_CYCLES)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(calls if before else 1)]
    if before:
        for begin, end in pairs:
            before()
            begin.record()
            fn()
            end.record()
    else:
        pairs[0][0].record()
        for _ in range(calls):
            fn()
        pairs[0][1].record()
    torch.cuda.synchronize()
    t = torch.tensor([sum(b.elapsed_time(e) for b, e in pairs) / 1e3 / calls], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def rounds_table(results: dict[str, list[float]]) -> str:
    """A markdown table of microseconds, a row per name: each round's figure, then their median."""
    rounds = max(len(times) for times in results.values())
    lines = ["| what | " + " | ".join(f"round {r + 1}, us" for r in range(rounds)) + " | median, us |",
             "|---|" + "---|" * rounds + "---|"]
    lines += [f"| {name} | " + " | ".join(f"{t:.2f}" for t in times) + f" | {statistics.median(times):.2f} |"
              for name, times in results.items()]
    return "\n".join(lines)
