"""Which block size and warp count move the most bytes: dispatch and combine at 4096 tokens/rank, H=7168,
top-8, 32 experts/rank, bf16, for each (BLOCK_H, num_warps), through Triton's JIT (an experiment that
chooses the values specs/ep_dispatch.toml and ep_combine.toml then build ahead of time).

Usage (on a multi-GPU host with Triton): python bench/ep_blocks.py [--world 4] [--json out.json]
Times: GPU time per call over 50 back-to-back CUDA-graph replays (events), the max over ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ep_bandwidth import (NVLINK_GBS, captured, join_group, problem, ready_op,  # noqa: E402
                                timed_back_to_back)
from kernels.ep import launch  # noqa: E402

VARIANTS = [(512, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8), (2048, 16)]


class WithWarps:
    """A @triton.jit function launched with a fixed num_warps (what the spec's sweep would set)."""

    def __init__(self, fn, num_warps: int):
        self.fn, self.num_warps = fn, num_warps

    def __getitem__(self, grid):
        return lambda *args, **kw: self.fn[grid](*args, num_warps=self.num_warps, **kw)


def worker(rank: int, world: int, port: int, out: str | None) -> None:
    join_group(rank, world, port)
    tokens = 4096
    cfg, x, idx, w, _ = problem(tokens, rank, world, "bf16")
    originals = dict(launch.FAMILIES)
    rows = []
    for block_h, warps in VARIANTS:
        for family in ("ep_dispatch", "ep_combine"):
            launch.CONSTANTS[family] = {**launch.CONSTANTS[family], "BLOCK_H": block_h}
            launch.FAMILIES[family] = WithWarps(originals[family], warps)
        op, d, remote_rows = ready_op(cfg, x, idx, w, None, rank)
        remote = remote_rows * cfg.row_bytes
        graphs = [captured(lambda: op.dispatch(x, idx, w)), captured(lambda: op.combine(None, d.handle))]
        t_d, t_c = timed_back_to_back(graphs[0].replay), timed_back_to_back(graphs[1].replay)
        b = torch.tensor([float(remote)], device="cuda", dtype=torch.float64)
        dist.all_reduce(b, op=dist.ReduceOp.AVG)
        rows.append({"BLOCK_H": block_h, "num_warps": warps, "dispatch_us": t_d * 1e6, "combine_us": t_c * 1e6,
                     "remote_bytes": b.item()})
        graphs.clear()   # the captured graphs hold the op's buffers
        torch.cuda.synchronize()
        dist.barrier()
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, 4096 tokens/rank, H=7168, top-8, bf16\n")
        print("| BLOCK_H | num_warps | dispatch us | dispatch NVLink % | combine us | combine NVLink % |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            pct = lambda us: 100 * r["remote_bytes"] / (us * 1e-6) / 1e9 / NVLINK_GBS
            print(f"| {r['BLOCK_H']} | {r['num_warps']} | {r['dispatch_us']:.1f} | {pct(r['dispatch_us']):.0f}% | "
                  f"{r['combine_us']:.1f} | {pct(r['combine_us']):.0f}% |")
        if out:
            Path(out).write_text(json.dumps({"world": world, "rows": rows}, indent=1))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--json", default=None)
    ap.add_argument("--port", type=int, default=29544)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.world, a.port, a.json), nprocs=a.world)


if __name__ == "__main__":
    main()
