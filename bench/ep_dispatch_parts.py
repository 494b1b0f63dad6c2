"""What bounds dispatch, part by part: its route, its data kernel (which holds the count exchange), the same
without the exchange or the metadata, its landing barrier, against a plain push of the same row bytes.

Usage (on a host with 2 GPUs and Triton): python bench/ep_dispatch_parts.py [--rounds 3] [--calls 30]
World 2, 4096 tokens a rank, H=7168, top-8 of 32 experts a rank, bf16 with weights (bench/ep_bandwidth.py's
problem), every kernel through Triton's JIT with the shipped constants. Each part: events around one launch after
a GPU sleep and a device barrier (which also advances the epoch, so every data kernel exchanges afresh), the
median of --calls, the slowest rank; --rounds rounds interleave the parts:
- route (route_kernel);
- the data kernel as shipped (dispatch_kernel): program (0, 0) sends the tagged counts, every program waits for the
  peers' counts, then sends its chunk of a row, and each route block's first program its metadata;
- rows only: the same rows at the same places, the counts read from the last exchange without a wait, no metadata;
- the landing barrier (dispatch_done_kernel);
- the SM push copy of bench/nvlink_ceiling.py moving exactly the row bytes dispatch sends to the other rank.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import torch.multiprocessing as mp
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ep_bandwidth import join_group, problem, ready_op  # noqa: E402
from bench.ep_combine_parts import timed as timed_one  # noqa: E402
from bench.gpu_timing import SLEEP_CYCLES, rounds_table  # noqa: E402
from bench.nvlink_ceiling import _copy  # noqa: E402
from kernels.ep.launch import CONSTANTS  # noqa: E402
from kernels.ep.triton_kernels import (_blocks_before, _count, _landing_row, dispatch_done_kernel,  # noqa: E402
                                       dispatch_kernel, route_kernel)

WORLD = 2
TOKENS = 4096


@triton.jit
def rows_only(x_ptr, pos_ptr, block_counts_ptr, matrix_ptr, recv_x_table, rank, H, R, W: tl.constexpr,
              BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCKS: tl.constexpr):
    """dispatch_kernel's rows alone: the counts of lower ranks read from this rank's matrix as they are (no
    exchange, no wait), no metadata."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    t = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    v = tl.load(x_ptr + t * H + hs, mask=hs < H)
    ds = tl.arange(0, W_POW2)
    live = ds < W
    pos = tl.load(pos_ptr + t * W + ds, mask=live, other=-1)
    lower = tl.zeros([W_POW2], tl.int32)
    for s in tl.static_range(W):
        lower += tl.where(s < rank, _count(tl.load(matrix_ptr + s * W + ds, mask=live, other=0)), 0)
    rows = _landing_row(pos, lower + _blocks_before(block_counts_ptr, t // BLOCK_T, W, BLOCKS), R)
    bases = tl.multiple_of(tl.load(recv_x_table + ds, mask=live, other=0).to(tl.pointer_type(x_ptr.dtype.element_ty)),
                           16)
    tl.store(bases[:, None] + rows[:, None] * H + hs[None, :], v[None, :],
             mask=(rows >= 0)[:, None] & (hs < H)[None, :])


def symmetric(shape, dtype):
    buffer = symm_mem.empty(*shape, dtype=dtype, device="cuda")
    table = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name).buffer_ptrs
    return buffer, torch.tensor(table, dtype=torch.int64, device="cuda")


def worker(rank: int, port: int, rounds: int, calls: int) -> None:
    join_group(rank, WORLD, port)
    cfg, x, idx, w, scales = problem(TOKENS, rank, WORLD, "bf16")
    op, _, remote = ready_op(cfg, x, idx, w, scales, rank)
    W, K, block_t = WORLD, cfg.topk, CONSTANTS["ep_route"]["BLOCK_T"]
    d = CONSTANTS["ep_dispatch"]
    blocks = -(-TOKENS // block_t)
    pos = torch.empty(TOKENS, W, dtype=torch.int32, device="cuda")
    counts = torch.empty(blocks, W, dtype=torch.int32, device="cuda")
    handle = torch.empty(TOKENS, W, dtype=torch.int32, device="cuda")
    chunks = -(-cfg.hidden // d["BLOCK_H"])

    def lined_up():
        torch.cuda._sleep(SLEEP_CYCLES)   # the host queues the timed launch before the GPU gets to it
        op.barrier()   # the ranks start it together

    def route():
        route_kernel[(blocks,)](idx, pos, counts, TOKENS, cfg.experts_per_rank, K=K, W=W, BLOCK_T=block_t, PDL=False)

    def data():
        dispatch_kernel[(TOKENS, chunks)](
            x, idx, w, w, pos, counts, blocks, op._matrix_table, op.epoch, op.num_recv, op.overflow, op.recv_start,
            handle, op._recv_x_table, op._recv_idx_table, op._recv_w_table, op._recv_scale_table,
            op._recv_src_table, rank, TOKENS, cfg.hidden, cfg.max_tokens_per_rank, cfg.capacity, 0, 4, 3, W=W, K=K,
            HAS_W=True, HAS_SCALES=False, BLOCK_H=d["BLOCK_H"], BLOCK_T=block_t, BLOCKS=d["BLOCKS"], PDL=False,
            STORE_SIGNAL=True)

    elems = remote * cfg.hidden   # the copy moves exactly the row bytes dispatch sends to the other rank
    local = torch.randn(W, elems, device="cuda").to(torch.bfloat16)
    shared, table = symmetric((W * elems,), torch.bfloat16)
    copy_grid = (W - 1, triton.cdiv(elems, 8192))
    parts = {
        "route": route,
        "data kernel as shipped: the count exchange, then rows and a route block's metadata a program": data,
        "rows only, the counts of the last exchange read without a wait": lambda: rows_only[(TOKENS, chunks)](
            x, pos, counts, op.matrix, op._recv_x_table, rank, cfg.hidden, cfg.capacity, W=W, BLOCK_H=d["BLOCK_H"],
            BLOCK_T=block_t, BLOCKS=d["BLOCKS"]),
        "landing barrier (dispatch_done)": lambda: dispatch_done_kernel[(1,)](op._flag_table, op.epoch, rank, W=W,
                                                                              STORE_SIGNAL=True, PDL=False),
        "SM push copy of the same row bytes, 16 KiB / 16 warps": lambda: _copy[copy_grid](
            local, table, rank, elems, W=W, PUSH=True, BLOCK=8192, num_warps=16)}
    route()
    for fn in parts.values():
        lined_up()
        fn()   # compiles
    torch.cuda.synchronize()
    dist.barrier()
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, fn in parts.items():
            results.setdefault(name, []).append(timed_one(fn, lined_up, calls))
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(f"{WORLD} x {torch.cuda.get_device_name()}, {TOKENS} tokens a rank, {remote} rows cross NVLink "
              f"({remote * cfg.hidden * 2 / 1e6:.2f} MB of rows). Events around one launch after a sleep and a "
              f"barrier, median of {calls}; slowest rank; {rounds} rounds\n")
        print(rounds_table(results))
    op.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--port", type=int, default=29579)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.port, a.rounds, a.calls), nprocs=WORLD)


if __name__ == "__main__":
    main()
