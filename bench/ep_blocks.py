"""Which block size and warp count move the most bytes: dispatch and combine at 4096 tokens/rank, H=7168,
top-8, 32 experts/rank, bf16, for each (BLOCK_H, num_warps), through Triton's JIT (an experiment that
chooses the values specs/ep_dispatch.toml and ep_combine.toml then build ahead of time).

Usage (on a multi-GPU host with Triton): python bench/ep_blocks.py [--world 4] [--json out.json]
       [--variants 1024x4,2048x8] [--families ep_combine] [--set ep_combine.QB=16]
--variants: BLOCK_H x num_warps pairs; --families: which families take them (default both); --set: other
constants of a family, applied to every variant.
Times, the max over ranks: GPU time per call over 50 back-to-back CUDA-graph replays (events), and one replay
with the ranks lined up (bench/gpu_timing.py, the median of 20).
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
from bench.ep_bandwidth import NVLINK_GBS, join_group, op_calls, problem, ready_op  # noqa: E402
from bench.gpu_timing import timed, timed_back_to_back  # noqa: E402
from kernels.ep import launch  # noqa: E402

VARIANTS = [(512, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8), (2048, 16)]


def worker(rank: int, world: int, port: int, out: str | None, variants: list, families: list, sets: dict) -> None:
    join_group(rank, world, port)
    tokens = 4096
    cfg, x, idx, w, _ = problem(tokens, rank, world, "bf16")
    rows = []
    for family, values in sets.items():
        launch.CONSTANTS[family] = {**launch.CONSTANTS[family], **values}
    for block_h, warps in variants:
        for family in families:
            launch.CONSTANTS[family] = {**launch.CONSTANTS[family], "BLOCK_H": block_h, "num_warps": warps}
        op, _, remote_rows = ready_op(cfg, x, idx, w, None, rank)
        remote = remote_rows * cfg.row_bytes
        dispatch, combine = op_calls(op, x, idx, w, None, graph=True)
        t_d, t_c = timed_back_to_back(dispatch), timed_back_to_back(combine, before=dispatch)
        a_d, a_c = timed(dispatch, 20)["aligned_s"], timed(combine, 20, before=dispatch)["aligned_s"]
        b = torch.tensor([float(remote)], device="cuda", dtype=torch.float64)
        dist.all_reduce(b, op=dist.ReduceOp.AVG)
        rows.append({"BLOCK_H": block_h, "num_warps": warps, "dispatch_us": t_d * 1e6, "combine_us": t_c * 1e6,
                     "dispatch_aligned_us": a_d * 1e6, "combine_aligned_us": a_c * 1e6, "remote_bytes": b.item()})
        del dispatch, combine   # the captured graphs hold the op's buffers
        torch.cuda.synchronize()
        dist.barrier()
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, 4096 tokens/rank, H=7168, top-8, bf16; variants applied to "
              f"{', '.join(families)}; other constants {sets or 'as the specs have them'}\n")
        print("| BLOCK_H | num_warps | dispatch us | dispatch NVLink % | combine us | combine NVLink % | "
              "dispatch us, lined up | combine us, lined up |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            pct = lambda us: 100 * r["remote_bytes"] / (us * 1e-6) / 1e9 / NVLINK_GBS
            print(f"| {r['BLOCK_H']} | {r['num_warps']} | {r['dispatch_us']:.1f} | {pct(r['dispatch_us']):.0f}% | "
                  f"{r['combine_us']:.1f} | {pct(r['combine_us']):.0f}% | {r['dispatch_aligned_us']:.1f} | "
                  f"{r['combine_aligned_us']:.1f} |")
        if out:
            Path(out).write_text(json.dumps({"world": world, "rows": rows}, indent=1))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--json", default=None)
    ap.add_argument("--port", type=int, default=29544)
    ap.add_argument("--variants", default=",".join(f"{b}x{w}" for b, w in VARIANTS))
    ap.add_argument("--families", default="ep_dispatch,ep_combine")
    ap.add_argument("--set", action="append", default=[], help="FAMILY.NAME=INT, e.g. ep_combine.QB=16")
    a = ap.parse_args()
    variants = [tuple(int(n) for n in v.split("x")) for v in a.variants.split(",")]
    sets: dict = {}
    for item in a.set:
        name, value = item.split("=")
        family, constant = name.split(".")
        sets.setdefault(family, {})[constant] = int(value)
    mp.spawn(worker, args=(a.world, a.port, a.json, variants, a.families.split(","), sets), nprocs=a.world)


if __name__ == "__main__":
    main()
