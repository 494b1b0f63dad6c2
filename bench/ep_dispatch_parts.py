"""What bounds dispatch, part by part: its count exchange three ways, and its data kernel with its metadata sent
three ways and without it, against a plain push of the same row bytes.

Usage (on a host with 2 GPUs and Triton): python bench/ep_dispatch_parts.py [--rounds 3] [--calls 30]
World 2, 4096 tokens a rank, H=7168, top-8 of 32 experts a rank, bf16 with weights (bench/ep_bandwidth.py's
problem), every kernel through Triton's JIT with the shipped constants.
- Count exchange, GPU us per call over a CUDA graph of 64 back-to-back calls, the ranks lined up first:
  - as shipped (exchange_counts_kernel): each count stored with the call's epoch in its upper 32 bits (one 8-byte
    word a cell, a PTX relaxed store, no fence), the receiver polling its own matrix until every row carries the
    epoch;
  - the same words by relaxed atomic exchanges (its AMD path; NVIDIA's before);
  - before (a copy here): the counts stored into every peer's matrix, then the flag barrier, whose release waits
    until those stores have landed before the flags go out.
- Data kernel, events around one launch after a GPU sleep and a device barrier, the median of --calls, the slowest
  rank; --rounds rounds interleave the variants:
  - as shipped (dispatch_kernel itself): rows, and each route block's ids, weights and source as three
    [64-token] stores a peer, by the block's first program;
  - before: each row's ids, weights and source as three stores a peer, by the row's first program;
  - one record: ids, weights and source as one 128-byte record store a peer, by the row's first program;
  - rows only: no metadata;
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
from bench.ep_barrier import graph_of  # noqa: E402
from bench.ep_combine_parts import timed as timed_one  # noqa: E402
from bench.gpu_timing import SLEEP_CYCLES, rounds_table, timed  # noqa: E402
from bench.nvlink_ceiling import _copy  # noqa: E402
from kernels.ep.launch import CONSTANTS  # noqa: E402
from kernels.ep.triton_kernels import (_barrier, _block_bases, _landing_row, _peer,  # noqa: E402
                                       dispatch_kernel, exchange_counts_kernel, route_kernel)

WORLD = 2
TOKENS = 4096
RECORD = 32   # int32 lanes of a metadata record: 128 bytes, room for K ids, K weights and the source up to K = 15


@triton.jit
def exchange_flagged(block_counts_ptr, block_base_ptr, NB, matrix_table, flag_table, epoch_ptr, rank, W: tl.constexpr,
                     BLOCKS: tl.constexpr):
    """The count exchange before the tags: int32 counts into every peer's matrix, then the flag barrier (NVIDIA's
    release stores), whose release first waits for the count stores to land."""
    ds = tl.arange(0, triton.next_power_of_2(W))
    carry = _block_bases(block_counts_ptr, block_base_ptr, NB, W, BLOCKS)
    for p in tl.static_range(W):
        tl.store(_peer(matrix_table, p, tl.int32) + rank * W + ds, carry, mask=ds < W)
    _barrier(flag_table, epoch_ptr, rank, W, True)


@triton.jit
def dispatch_variant(x_ptr, idx_ptr, w_ptr, pos_ptr, block_base_ptr, matrix_ptr, handle_ptr, recv_x_table,
                     recv_idx_table, recv_w_table, recv_src_table, record_table, rank, H, M, R, W: tl.constexpr,
                     K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, META: tl.constexpr,
                     RECORD: tl.constexpr):
    """dispatch_kernel for bf16 rows with weights and no scales, the metadata a row at a time; META: 0 none,
    1 three stores, 2 one record."""
    K_POW2: tl.constexpr = triton.next_power_of_2(K)
    t = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    v = tl.load(x_ptr + t * H + hs, mask=hs < H)
    for d in tl.static_range(W):
        row = _landing_row(pos_ptr, block_base_ptr, matrix_ptr, t, d, rank, R, W, BLOCK_T)
        if row >= 0:
            tl.store(_peer(recv_x_table, d, x_ptr.dtype.element_ty) + row * H + hs, v, mask=hs < H)
    if (tl.program_id(1) == 0) & (META > 0):
        for d in tl.static_range(W):
            row = _landing_row(pos_ptr, block_base_ptr, matrix_ptr, t, d, rank, R, W, BLOCK_T)
            tl.store(handle_ptr + t * W + d, row.to(tl.int32))
            if row >= 0:
                if META == 1:
                    ks = tl.arange(0, K_POW2)
                    tl.store(_peer(recv_idx_table, d, tl.int32) + row * K + ks,
                             tl.load(idx_ptr + t * K + ks, mask=ks < K), mask=ks < K)
                    tl.store(_peer(recv_w_table, d, tl.float32) + row * K + ks,
                             tl.load(w_ptr + t * K + ks, mask=ks < K), mask=ks < K)
                    tl.store(_peer(recv_src_table, d, tl.int32) + row, (rank * M + t).to(tl.int32))
                else:
                    ls = tl.arange(0, RECORD)
                    ids = tl.load(idx_ptr + t * K + ls, mask=ls < K, other=0)
                    ws = tl.load(w_ptr + t * K + (ls - K), mask=(ls >= K) & (ls < 2 * K), other=0.0)
                    lanes = tl.where(ls < K, ids, tl.where(ls < 2 * K, ws.to(tl.int32, bitcast=True),
                                                           (rank * M + t).to(tl.int32)))
                    tl.store(_peer(record_table, d, tl.int32) + row * RECORD + ls, lanes, mask=ls <= 2 * K)


DATA_VARIANTS = {"before: rows, then a row's ids, weights and source as three stores": 1,
                 "rows, then ids, weights and source as one 128-byte record": 2,
                 "rows only": 0}


def symmetric(shape, dtype):
    buffer = symm_mem.empty(*shape, dtype=dtype, device="cuda")
    table = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name).buffer_ptrs
    return buffer, torch.tensor(table, dtype=torch.int64, device="cuda")


def worker(rank: int, port: int, rounds: int, calls: int, launches: int) -> None:
    join_group(rank, WORLD, port)
    cfg, x, idx, w, scales = problem(TOKENS, rank, WORLD, "bf16")
    op, _, remote = ready_op(cfg, x, idx, w, scales, rank)
    W, K, block_t = WORLD, cfg.topk, CONSTANTS["ep_route"]["BLOCK_T"]
    blocks = -(-TOKENS // block_t)
    pos = torch.empty(TOKENS, W, dtype=torch.int32, device="cuda")
    counts = torch.empty(blocks, W, dtype=torch.int32, device="cuda")
    base = torch.empty(blocks, W, dtype=torch.int32, device="cuda")
    handle = torch.empty(TOKENS, W, dtype=torch.int32, device="cuda")
    flagged, flagged_table = symmetric((W, W), torch.int32)
    records, record_table = symmetric((cfg.capacity, RECORD), torch.int32)
    torch.cuda.synchronize()
    dist.barrier()
    route_kernel[(blocks,)](idx, pos, counts, TOKENS, cfg.experts_per_rank, K=K, W=W, BLOCK_T=block_t, PDL=False)
    blocks_at_once = CONSTANTS["ep_exchange_counts"]["BLOCKS"]
    def tagged(store: bool):
        return lambda: exchange_counts_kernel[(1,)](counts, base, blocks, op._matrix_table, op.epoch, op.num_recv,
                                                    op.overflow, op.recv_start, rank, cfg.capacity, 3, W=W,
                                                    BLOCKS=blocks_at_once, PDL=False, STORE_SIGNAL=store)

    exchanges = {
        "count exchange as shipped: epoch and count in one 8-byte word a cell, relaxed stores": tagged(True),
        "the same words by relaxed atomic exchanges": tagged(False),
        "count exchange before: int32 counts, then the flag barrier": lambda: exchange_flagged[(1,)](
            counts, base, blocks, flagged_table, op._flag_table, op.epoch, rank, W=W, BLOCKS=blocks_at_once)}
    graphs = {name: graph_of(fn, launches) for name, fn in exchanges.items()}
    exchanges[next(iter(exchanges))]()   # op.matrix (tagged) and base now hold this call's counts
    torch.cuda.synchronize()
    dist.barrier()

    def lined_up():
        torch.cuda._sleep(SLEEP_CYCLES)   # the host queues the timed launch before the GPU gets to it
        op.barrier()   # the ranks start it together

    chunks = -(-cfg.hidden // CONSTANTS["ep_dispatch"]["BLOCK_H"])

    def data(meta: int):
        return lambda: dispatch_variant[(TOKENS, chunks)](
            x, idx, w, pos, base, op.matrix, handle, op._recv_x_table, op._recv_idx_table, op._recv_w_table,
            op._recv_src_table, record_table, rank, cfg.hidden, cfg.max_tokens_per_rank, cfg.capacity, W=W, K=K,
            BLOCK_H=CONSTANTS["ep_dispatch"]["BLOCK_H"], BLOCK_T=block_t, META=meta, RECORD=RECORD)

    elems = remote * cfg.hidden   # the copy moves exactly the row bytes dispatch sends to the other rank
    local = torch.randn(W, elems, device="cuda").to(torch.bfloat16)
    shared, table = symmetric((W * elems,), torch.bfloat16)
    copy_name = "SM push copy of the same row bytes, 16 KiB / 16 warps"
    copy_grid = (W - 1, triton.cdiv(elems, 8192))
    rows = {"as shipped: rows, and a route block's ids, weights and source as three stores": lambda: dispatch_kernel[
        (TOKENS, chunks)](x, idx, w, w, pos, base, op.matrix, handle, op._recv_x_table, op._recv_idx_table,
                          op._recv_w_table, op._recv_scale_table, op._recv_src_table, rank, cfg.hidden,
                          cfg.max_tokens_per_rank, cfg.capacity, 0, 4, W=W, K=K, HAS_W=True, HAS_SCALES=False,
                          BLOCK_H=CONSTANTS["ep_dispatch"]["BLOCK_H"], BLOCK_T=block_t, PDL=False)}
    rows.update({name: data(meta) for name, meta in DATA_VARIANTS.items()})
    rows[copy_name] = lambda: _copy[copy_grid](local, table, rank, elems, W=W, PUSH=True, BLOCK=8192, num_warps=16)
    for fn in rows.values():
        fn()   # compiles
    torch.cuda.synchronize()
    dist.barrier()
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, graph in graphs.items():
            results.setdefault(name, []).append(timed(graph.replay, 10)["aligned_s"] / launches * 1e6)
        for name, fn in rows.items():
            results.setdefault(name, []).append(timed_one(fn, lined_up, calls))
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        nbytes = remote * cfg.hidden * 2
        print(f"{WORLD} x {torch.cuda.get_device_name()}, {TOKENS} tokens a rank, {remote} rows cross NVLink "
              f"({nbytes / 1e6:.2f} MB of rows). Exchanges: GPU us per call, {launches} in a graph, lined up. Data: "
              f"events around one launch after a sleep and a barrier, median of {calls}; slowest rank; {rounds} "
              f"rounds\n")
        print(rounds_table(results))
    op.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--launches", type=int, default=64)
    ap.add_argument("--port", type=int, default=29579)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.port, a.rounds, a.calls, a.launches), nprocs=WORLD)


if __name__ == "__main__":
    main()
