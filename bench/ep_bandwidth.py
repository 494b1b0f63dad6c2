"""Dispatch/combine bandwidth and latency: kforge's op vs the all_to_all_single (NCCL) path, one run.

Usage (on a multi-GPU host): python bench/ep_bandwidth.py [--world 4] [--dist out/dist] [--dtype fp8_e4m3]
       [--json out.json]
Per rank: T tokens, H=7168, top-8 of 32 experts per rank, bf16 (or fp8 rows with block scales),
uniform random distinct experts. Each op is timed on every rank between barriers, the slowest rank counts, on the
three clocks bench/nvlink_ceiling.py times the ceiling with (bench/gpu_timing.py: the host's wall clock around the
call and a synchronize; GPU events around the one call; the same with the ranks lined up on the GPUs by a tiny
all_reduce); graph-mode rows also give the GPU time per call over 50 back-to-back replays (CUDA events, no host
synchronize per call; each combine replay is timed alone after the dispatch it serves, the clock of
nvlink_ceiling.py's "each alone after a call" column). Bytes per rank: logical = rows received x row bytes (the
peers' convention), NVLink = only the rows that came from other ranks. The NCCL path is kernels/ep/reference.py
(sort, all_to_all_single of counts and payloads); the op's combine reads expert outputs written in place
(expert_output()).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.ep import reference  # noqa: E402
from kernels.ep.cases import quantize_fp8, routing  # noqa: E402
from kernels.ep.config import EpConfig  # noqa: E402
from kernels.ep.op import EpDispatchCombine  # noqa: E402
from bench.gpu_timing import timed, timed_back_to_back  # noqa: E402

NVLINK_GBS = 450.0   # per direction per GPU, H100/H200 NVLink-4


def problem(tokens: int, rank: int, world: int, dtype: str):
    """(cfg, x, topk_idx, topk_w, x_scales) of the benchmark: H=7168, top-8 of 32 experts per rank."""
    cfg = EpConfig(world_size=world, hidden=7168, experts_per_rank=32, topk=8, max_tokens_per_rank=tokens,
                   dtype=dtype)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, cfg.hidden, generator=g).to(torch.bfloat16).cuda()
    scales = None
    if cfg.num_scales:   # fp8 rows with one f32 scale per 128 elements, sent along
        x, scales = quantize_fp8(x, cfg.scale_block)
    idx = routing("random", tokens, cfg.topk, cfg.experts_per_rank, world, rank, g).cuda()
    w = torch.rand(tokens, cfg.topk, generator=g).cuda()
    return cfg, x, idx, w, scales


def ready_op(cfg, x, idx, w, scales, rank: int, library=None):
    """(op, its first dispatch, rows received from other ranks): one call each way compiles the kernels,
    and combine then reads expert outputs written in place."""
    op = EpDispatchCombine(cfg, library=library)
    d = op.dispatch(x, idx, w, scales)   # combine serves the latest dispatch: callers dispatch again first
    op.expert_output().copy_(d.x)
    op.combine(None, d.handle)
    torch.cuda.synchronize()
    n = int(d.num_recv)
    return op, d, int((d.src[:n] // cfg.max_tokens_per_rank != rank).sum())


def captured(fn):
    """(graph, what fn returned): fn captured in a CUDA graph, whose replay runs the op without Python's launch
    overhead."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def op_calls(op, x, idx, w, scales, graph: bool):
    """(dispatch, combine) as callables; combine serves the dispatch called last (the op's contract), so it is
    timed with a dispatch before each call."""
    if graph:
        dispatch, d = captured(lambda: op.dispatch(x, idx, w, scales))
        combine, _ = captured(lambda: op.combine(None, d.handle))
        return dispatch.replay, combine.replay
    latest = {}
    return (lambda: latest.update(d=op.dispatch(x, idx, w, scales)),
            lambda: op.combine(None, latest["d"].handle))


def measure(tokens: int, rank: int, world: int, iters: int, graph: bool, library, dtype: str) -> dict:
    cfg, x, idx, w, scales = problem(tokens, rank, world, dtype)
    op, d, remote = ready_op(cfg, x, idx, w, scales, rank, library)
    n = int(d.num_recv)
    run_dispatch, run_combine = op_calls(op, x, idx, w, scales, graph)
    ref = reference.dispatch(x, idx, w, cfg, x_scales=scales)
    y = ref.x.to(op.expert_output().dtype)
    ops = {"op_dispatch": run_dispatch, "op_combine": run_combine,
           "nccl_dispatch": lambda: reference.dispatch(x, idx, w, cfg, x_scales=scales),
           "nccl_combine": lambda: reference.combine(y, ref, tokens, cfg)}
    results = {}
    for name, fn in ops.items():
        t = timed(fn, iters, before=run_dispatch if name == "op_combine" else None)
        results[f"{name}_s"], results[f"{name}_event_s"], results[f"{name}_aligned_s"] = (
            t["wall_s"], t["event_s"], t["aligned_s"])
    if graph:
        results["op_dispatch_b2b_s"] = timed_back_to_back(run_dispatch)
        results["op_combine_b2b_s"] = timed_back_to_back(run_combine, before=run_dispatch)
    per_rank = torch.tensor([n * cfg.row_bytes, remote * cfg.row_bytes, n * cfg.combine_row_bytes,
                             remote * cfg.combine_row_bytes], dtype=torch.float64, device="cuda")
    dist.all_reduce(per_rank, op=dist.ReduceOp.AVG)
    results.update(tokens=tokens, dispatch_logical_bytes=per_rank[0].item(), dispatch_remote_bytes=per_rank[1].item(),
                   combine_logical_bytes=per_rank[2].item(), combine_remote_bytes=per_rank[3].item(), graph=graph)
    return results


def join_group(rank: int, world: int, port: int, dist_dir: str | None = None):
    """This process becomes rank `rank` of a local NCCL group on GPU `rank`; returns the runtime Library of
    dist_dir's bundles (None: the op's kernels run through Triton's JIT)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    if not dist_dir:
        return None
    from kforge_runtime import Library
    return Library(dist_dir)


def worker(rank: int, world: int, port: int, iters: int, out: str | None, dist_dir: str | None, dtype: str) -> None:
    library = join_group(rank, world, port, dist_dir)
    rows = [measure(t, rank, world, iters, graph, library, dtype) for t in (4096, 128) for graph in (False, True)]
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, H=7168, top-8, 32 experts/rank, {dtype} dispatch "
              f"({'bf16 combine, ' if dtype != 'bf16' else ''}bytes incl. scales), median of {iters}; "
              f"kernels: {'bundles in ' + dist_dir if dist_dir else 'Triton JIT'}\n")
        print("| tokens/rank | launch | op | kforge us | NCCL path us | x NCCL | kforge GB/s logical | "
              "kforge GB/s NVLink | NVLink % of 450 | kforge us, one call (events) | kforge us, one call, ranks "
              "aligned (events) | kforge us, back-to-back graph replays (events) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            for op in ("dispatch", "combine"):
                ours, theirs = r[f"op_{op}_s"], r[f"nccl_{op}_s"]
                remote = r[f"{op}_remote_bytes"] / ours / 1e9
                print(f"| {r['tokens']} | {'graph' if r['graph'] else 'eager'} | {op} | {ours * 1e6:.1f} | "
                      f"{theirs * 1e6:.1f} | {theirs / ours:.2f} | {r[f'{op}_logical_bytes'] / ours / 1e9:.1f} | "
                      f"{remote:.1f} | {100 * remote / NVLINK_GBS:.0f}% | {r[f'op_{op}_event_s'] * 1e6:.1f} | "
                      f"{r[f'op_{op}_aligned_s'] * 1e6:.1f} | "
                      + (f"{r[f'op_{op}_b2b_s'] * 1e6:.1f} |" if r["graph"] else "- |"))
        if out:
            Path(out).write_text(json.dumps({"world": world, "dtype": dtype, "rows": rows}, indent=1))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--dist", default=None, help="run the op's precompiled kernels from these bundles")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8_e4m3"], help="what dispatch moves")
    a = ap.parse_args()
    mp.spawn(worker, args=(a.world, a.port, a.iters, a.json, a.dist, a.dtype), nprocs=a.world)


if __name__ == "__main__":
    main()
