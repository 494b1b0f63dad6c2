"""What this machine's NVLink gives an all-to-all of plain copies: the ceiling the EP kernels are held to.

Usage (on a multi-GPU host with Triton): python bench/nvlink_ceiling.py [--world 4] [--mb 64] [--json out.json]
Every rank sends --mb MiB to every other rank at once, into symmetric memory, in several ways:
- sm-push: a Triton kernel on the sender's SMs stores into the peers' buffers (the EP dispatch's way);
- sm-pull: a Triton kernel on the receiver's SMs loads from the peers' buffers (the EP combine's way);
  it reads back what sm-push stored, which the run checks; both for a few (bytes per program, warps);
- tma-push, tma-pull: the same through the TMA unit (tensor descriptors made on the device);
- copy-engine: copy_() into each peer's buffer, one stream per peer (cudaMemcpy peer-to-peer, no SMs);
- nccl: torch.distributed.all_to_all_single of the same blocks (its own buffers, its own kernels).
GB/s per direction = bytes that crossed NVLink into (or out of) one GPU / time, the slowest rank, median
of --iters, on the three clocks of bench/gpu_timing.py (GPU events around the one call; the host's wall
clock around it and a synchronize; events with the ranks lined up on the GPUs), and per call over 50 calls back
to back (the clock bench/ep_bandwidth.py gives dispatch's graph replays; the copies are plain launches, queued while
the GPU sleeps, so the host's launch cost is not in it), and per call over 50 calls each timed alone right after
another one (combine's back-to-back clock there: each combine is timed alone after the dispatch it serves, so its
start is in the time, where 50 calls in a row hide 49 starts behind the calls before); the percentage is of 450
GB/s (H100/H200 NVLink 4).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import torch.multiprocessing as mp
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gpu_timing import timed, timed_back_to_back  # noqa: E402

NVLINK_GBS = 450.0
SM_VARIANTS = [(2048, 4), (8192, 8), (8192, 16), (32768, 16)]   # (bf16 elements per program, warps)
TMA_VARIANTS = [(16, 4), (64, 4), (64, 8)]   # (256-element rows per program, warps)


@triton.jit
def _copy(local_ptr, table, rank, n, W: tl.constexpr, PUSH: tl.constexpr, BLOCK: tl.constexpr):
    """Program (i, c): chunk c between the local block for peer p = rank + 1 + i (mod W) and this rank's slot
    in p's buffer; PUSH stores into the peer (sender's SMs), else loads from it (receiver's SMs). Axis 0 runs
    over the peers first, so the blocks in flight at any moment spread over every receiver's links."""
    p = (rank + 1 + tl.program_id(0)) % W
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    peer = tl.multiple_of(tl.load(table + p).to(tl.pointer_type(tl.bfloat16)), 16) + rank * n + offs
    here = local_ptr + p * n + offs
    if PUSH:
        tl.store(peer, tl.load(here, mask=offs < n), mask=offs < n)
    else:
        tl.store(here, tl.load(peer, mask=offs < n), mask=offs < n)


@triton.jit
def _tma_copy(local_ptr, table, rank, n, W: tl.constexpr, PUSH: tl.constexpr, ROWS: tl.constexpr):
    """_copy through the TMA unit: each side is an [n / 256, 256] tensor, a program moves ROWS x 256 of it
    (global -> shared memory -> global, one bulk copy each way)."""
    p = (rank + 1 + tl.program_id(0)) % W
    row = tl.program_id(1) * ROWS
    peer = tl.load(table + p).to(tl.pointer_type(tl.bfloat16)) + rank * n
    here = local_ptr + p * n
    peer_tiles = tl.make_tensor_descriptor(peer, [n // 256, 256], [256, 1], [ROWS, 256])
    here_tiles = tl.make_tensor_descriptor(here, [n // 256, 256], [256, 1], [ROWS, 256])
    if PUSH:
        peer_tiles.store([row, 0], here_tiles.load([row, 0]))
    else:
        here_tiles.store([row, 0], peer_tiles.load([row, 0]))


def worker(rank: int, world: int, port: int, mb: int, iters: int, out: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    n = mb * (1 << 20) // 2   # bf16 elements per peer
    local = torch.randn(world, n, device="cuda").to(torch.bfloat16)
    pulled = torch.zeros_like(local)
    shared = symm_mem.empty(world * n, dtype=torch.bfloat16, device="cuda")
    handle = symm_mem.rendezvous(shared, dist.group.WORLD.group_name)
    table = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")
    peers = [p for p in range(world) if p != rank]
    streams = {p: torch.cuda.Stream() for p in peers}
    views = {p: handle.get_buffer(p, (world, n), torch.bfloat16)[rank] for p in peers}

    def copy_engine():
        main = torch.cuda.current_stream()
        for p in peers:
            streams[p].wait_stream(main)
            with torch.cuda.stream(streams[p]):
                views[p].copy_(local[p], non_blocking=True)
        for p in peers:
            main.wait_stream(streams[p])

    def sm(push: bool, block: int, warps: int):
        grid = (world - 1, triton.cdiv(n, block))
        return lambda: _copy[grid](local if push else pulled, table, rank, n, W=world, PUSH=push, BLOCK=block,
                                   num_warps=warps)

    modes = {f"sm-{'push' if push else 'pull'} {block * 2 // 1024} KiB/{warps}w": sm(push, block, warps)
             for push in (True, False) for block, warps in SM_VARIANTS}
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

    def tma(push: bool, rows: int, warps: int):
        grid = (world - 1, triton.cdiv(n // 256, rows))
        return lambda: _tma_copy[grid](local if push else pulled, table, rank, n, W=world, PUSH=push, ROWS=rows,
                                       num_warps=warps)

    modes.update({f"tma-{'push' if push else 'pull'} {rows // 2} KiB/{warps}w": tma(push, rows, warps)
                  for push in (True, False) for rows, warps in TMA_VARIANTS})
    modes["copy-engine"] = copy_engine
    received = torch.empty_like(local)
    modes["nccl all_to_all_single"] = lambda: dist.all_to_all_single(received, local)
    rows = []
    for name, fn in modes.items():
        fn()   # compile / warm up
        torch.cuda.synchronize()
        t = timed(fn, iters)
        b2b = timed_back_to_back(fn)
        alone = timed_back_to_back(fn, before=fn)
        crossed = len(peers) * n * 2
        rows.append({"mode": name, "seconds": t["event_s"], "wall_seconds": t["wall_s"],
                     "aligned_seconds": t["aligned_s"], "b2b_seconds": b2b, "b2b_alone_seconds": alone,
                     "bytes_per_direction": crossed, "gbs": crossed / t["event_s"] / 1e9,
                     "wall_gbs": crossed / t["wall_s"] / 1e9, "aligned_gbs": crossed / t["aligned_s"] / 1e9,
                     "b2b_gbs": crossed / b2b / 1e9, "b2b_alone_gbs": crossed / alone / 1e9})
    # the copies landed where they should: peer p's buffer holds local[p] at this rank's slot (pushed, then
    # copied), and the pull read back from there what this rank had pushed
    dist.barrier()
    torch.cuda.synchronize()
    ok = all(torch.equal(views[p], local[p]) and torch.equal(pulled[p], local[p]) for p in peers)
    flag = torch.tensor([int(ok)], device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, {mb} MiB to each peer, median of {iters}, slowest rank; "
              f"data checked: {bool(flag.item())}\n")
        print("| mode | us (events) | GB/s per direction (events) | % of 450 | us (host wall) | GB/s (host wall) | "
              "us (aligned) | GB/s (aligned) | us (back to back) | GB/s (back to back) | us (each alone after a call) | "
              "GB/s (each alone after a call) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['mode']} | {r['seconds'] * 1e6:.1f} | {r['gbs']:.1f} | {100 * r['gbs'] / NVLINK_GBS:.0f}% | "
                  f"{r['wall_seconds'] * 1e6:.1f} | {r['wall_gbs']:.1f} | {r['aligned_seconds'] * 1e6:.1f} | "
                  f"{r['aligned_gbs']:.1f} | {r['b2b_seconds'] * 1e6:.1f} | {r['b2b_gbs']:.1f} | "
                  f"{r['b2b_alone_seconds'] * 1e6:.1f} | {r['b2b_alone_gbs']:.1f} |")
        if out:
            Path(out).write_text(json.dumps({"world": world, "mb": mb, "checked": bool(flag.item()), "rows": rows},
                                            indent=1))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--port", type=int, default=29555)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.world, a.port, a.mb, a.iters, a.json), nprocs=a.world)


if __name__ == "__main__":
    main()
