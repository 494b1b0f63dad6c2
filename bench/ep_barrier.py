"""What the op's flag barrier costs, signal by signal, and what its route kernel costs, block size by block size.

Usage (on a host with 2 or more GPUs and Triton): python bench/ep_barrier.py [--world 2] [--rounds 3]
Each row is GPU time per launch over a CUDA graph of --launches back-to-back launches, replayed with the ranks
lined up on the GPUs (bench/gpu_timing.py's aligned clock), the median of --iters, the slowest rank; --rounds
rounds interleave the rows. Barrier variants (kernels/ep/triton_kernels.py's _barrier with two switches, its own
_signal_peers for the signal, on the op's own flags and epoch, so every variant keeps the epoch sequence):
- signal: a vector of release exchanges (atomics, AMD's way) or a release store by each of threads 0..W-1 (PTX);
- poll: acquire atomics (an add of 0) or acquire loads (PTX).
Then the op's own barrier (op.barrier(): the spec's choice for this arch) and a one-program kernel that only
reads and writes a word (what any launch costs here). Route: route_kernel on 4096 tokens a rank
and top-8 of 32 experts a rank (bench/ep_bandwidth.py's problem) at several BLOCK_T.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ep_bandwidth import join_group, problem, ready_op  # noqa: E402
from bench.gpu_timing import rounds_table, timed  # noqa: E402
from kernels.ep.launch import CONSTANTS  # noqa: E402
from kernels.ep.triton_kernels import _peer, _signal_peers, route_kernel  # noqa: E402

TOKENS = 4096


@triton.jit
def barrier_variant(flag_table, epoch_ptr, rank, W: tl.constexpr, STORE: tl.constexpr, LOAD: tl.constexpr):
    """_barrier with its signal (STORE) and its poll (LOAD) chosen apart."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    tl.debug_barrier()
    epoch = tl.load(epoch_ptr) + 1
    ps = tl.arange(0, W_POW2)
    live = ps < W
    mine = _peer(flag_table, rank, tl.int64) + ps
    _signal_peers(flag_table, rank, epoch, W, STORE)
    behind = 1
    while behind > 0:
        if LOAD:   # every lane loads (an asm has no mask): a lane past W reads flag W - 1
            seen = tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l",
                                             [mine.to(tl.int64) + (tl.minimum(ps, W - 1) - ps) * 8],
                                             dtype=tl.int64, is_pure=False, pack=1)
        else:
            seen = tl.atomic_add(mine, 0, mask=live, sem="acquire", scope="sys")
        behind = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)
    tl.store(epoch_ptr, epoch)
    tl.debug_barrier()


@triton.jit
def touch_kernel(word_ptr):
    tl.store(word_ptr, tl.load(word_ptr) + 1)


VARIANTS = {   # name: (STORE, LOAD)
    "signal by atomics, poll by atomics (AMD's; NVIDIA's until this bench)": (False, False),
    "signal by stores, poll by atomics (NVIDIA's now)": (True, False),
    "signal by atomics, poll by loads": (False, True),
    "signal by stores, poll by loads": (True, True),
}
BLOCK_TS = (64, 128, 256, 512, 1024)


def graph_of(fn, launches: int):
    fn()   # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    return graph


def worker(rank: int, world: int, port: int, rounds: int, launches: int, iters: int) -> None:
    join_group(rank, world, port)
    cfg, x, idx, w, scales = problem(TOKENS, rank, world, "bf16")
    op, _, _ = ready_op(cfg, x, idx, w, scales, rank)
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = {f"barrier: {name}": (lambda s=store, l=load: barrier_variant[(1,)](
        op._flag_table, op.epoch, rank, W=world, STORE=s, LOAD=l)) for name, (store, load) in VARIANTS.items()}
    rows["barrier: the op's (op.barrier(), the spec's choice for this arch)"] = op.barrier
    rows["a one-program kernel that touches a word"] = lambda: touch_kernel[(1,)](word)
    pos = torch.empty(TOKENS, world, dtype=torch.int32, device="cuda")
    for block_t in BLOCK_TS:
        blocks = -(-TOKENS // block_t)
        counts = torch.empty(blocks, world, dtype=torch.int32, device="cuda")
        shipped = " (the spec's)" if block_t == CONSTANTS["ep_route"]["BLOCK_T"] else ""
        rows[f"route, BLOCK_T {block_t}{shipped}"] = (lambda b=block_t, n=blocks, c=counts: route_kernel[(n,)](
            idx, pos, c, TOKENS, cfg.experts_per_rank, K=cfg.topk, W=world, BLOCK_T=b, PDL=False))
    graphs = {name: graph_of(fn, launches) for name, fn in rows.items()}
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, graph in graphs.items():
            results.setdefault(name, []).append(timed(graph.replay, iters)["aligned_s"] / launches * 1e6)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}: GPU us per launch, {launches} back-to-back launches in a "
              f"graph, ranks lined up, median of {iters}, slowest rank; {rounds} rounds\n")
        print(rounds_table(results))
    op.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--port", type=int, default=29578)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.world, a.port, a.rounds, a.launches, a.iters), nprocs=a.world)


if __name__ == "__main__":
    main()
