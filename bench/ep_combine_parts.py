"""What bounds combine: its kernel against variants that leave parts out, and a plain push of the same bytes.

Usage (on a host with 2 GPUs and Triton): python bench/ep_combine_parts.py [--rounds 3] [--calls 30]
World 2, 4096 tokens a rank, H=7168, top-8 of 32 experts a rank, bf16 (bench/ep_bandwidth.py's problem).
First combine_kernel itself (kernels/ep/triton_kernels.py, as op.combine launches it, NVIDIA's signal); then
variants, each a copy of an earlier combine_kernel with switches, all run through Triton's JIT with the shipped
constants:
- counters (combine until the arrival flags): pushers store each row into its source's buffer, then a release
  add to the source's counter; reducers wait for their counts, reset them and sum;
- 1-D pushers: one [BLOCK_H] row a peer instead of a [W, BLOCK_H] tile (every thread moves data);
- red.release: the count as a PTX reduction (no reply awaited) instead of an atomic;
- flags (combine_kernel's signal; here at world 2 only: one peer, so one flag a token, and without the shipped
  kernel's reads ahead, 5e998df): each row's arrival a release store
  (PTX st.release.sys) of the call's epoch into a per-token flag, no atomic at all;
- no reduce: the reducers return at once (their wait and their sums are what the difference costs);
- release to own counter: the pushers' release goes to this rank's own counter (the fence without the NVLink
  atomic; no reducer could rely on it);
- two rows a pusher (no reduce, flags): each pusher of the grid's first half pushes two rows, then flags both
  behind one release (a fence and two relaxed stores), against a release a row;
- pushes only: the rows alone.
Then the SM push copy of bench/nvlink_ceiling.py moving exactly the bytes combine sends. Clock: CUDA events
around one launch, each after a dispatch, a GPU sleep (about 1 ms: the host has queued the launch by its end)
and a device barrier (the ranks start together), median of --calls, the slowest rank; --rounds rounds
interleave the variants. Variants that sum are checked against combine_kernel's output, byte for byte.
"""
from __future__ import annotations

import argparse
import statistics
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
from bench.gpu_timing import SLEEP_CYCLES  # noqa: E402
from bench.nvlink_ceiling import _copy  # noqa: E402
from kernels.ep.launch import CONSTANTS  # noqa: E402
from kernels.ep.triton_kernels import _peer, combine_kernel  # noqa: E402

WORLD = 2
TOKENS = 4096
# the thread with %tid.x 0 alone issues it: every thread holds the [1] tensor's one element
RED_ASM = tl.constexpr("{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                       "@p red.release.sys.global.add.s32 [$1], 1; mov.u32 $0, 0; }")
FLAG_ASM = tl.constexpr("{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                        "@p st.release.sys.global.s32 [$1], $2; mov.u32 $0, 0; }")
# two flags behind one release: a fence, then two relaxed stores (the pair's second address may repeat the first)
PAIR_FLAG_ASM = tl.constexpr("{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                             "@p fence.acq_rel.sys; @p st.relaxed.sys.global.s32 [$1], $3; "
                             "@p st.relaxed.sys.global.s32 [$2], $3; mov.u32 $0, 0; }")


@triton.jit
def combine_variant(out_ptr, y_ptr, y_rows, handle_ptr, src_ptr, recv_start_ptr, back_table, arrived_table,
                    epoch_ptr, rank, T, H, M, R, W: tl.constexpr, BLOCK_H: tl.constexpr, QB: tl.constexpr,
                    LAG: tl.constexpr, SIGNAL: tl.constexpr, REDUCE: tl.constexpr, ONE_D: tl.constexpr,
                    PAIR: tl.constexpr):
    """SIGNAL: 0 none, 1 release add to the source's counter (combine until the flags), 2 release add to this
    rank's own counter, 3 red.release to the source's counter, 4 st.release of the epoch into the source's flag
    (the shipped signal; here 1-D pushers and world 2 only: a flag a token). `arrived` is used from its start, a counter
    or a flag a token, as int32 words in the op's int64 arrival buffer (zeroed between variants; a bench's epochs stay
    far below 2^31). PAIR (with SIGNAL 4, 1-D, no reduce): pusher (g, j) of the grid's first half pushes rows
    2 g QB + j and 2 g QB + QB + j, then flags both behind one release; the second half's pushers do nothing."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    pid = tl.program_id(0)
    g = pid // (2 * QB)
    j = pid % (2 * QB)
    ty = out_ptr.dtype.element_ty
    ss = tl.arange(0, W_POW2)
    tl.static_assert((PAIR == 0) | ((SIGNAL == 4) & (REDUCE == 0) & (ONE_D == 1)), "PAIR: flags, no reduce, 1-D")
    if (j < QB) & (PAIR == 1):
        for k in tl.static_range(W - 1):
            s = (rank + 1 + k) % W
            end = tl.minimum(tl.load(recv_start_ptr + s + 1), R)
            i1 = tl.load(recv_start_ptr + s) + 2 * g * QB + j
            i2 = i1 + QB
            tok1 = tl.load(src_ptr + i1, mask=i1 < end, other=-1) - s * M
            tok2 = tl.load(src_ptr + i2, mask=i2 < end, other=-1) - s * M
            ok1 = (i1 < end) & (tok1 >= 0) & (tok1 < M)
            ok2 = (i2 < end) & (tok2 >= 0) & (tok2 < M)
            back = tl.multiple_of(tl.load(back_table + s).to(tl.pointer_type(ty)), 16)
            for h0 in range(0, H, BLOCK_H):
                hs = h0 + tl.arange(0, BLOCK_H)
                tl.store(back + (tok1.to(tl.int64) * W + rank) * H + hs,
                         tl.load(y_ptr + i1.to(tl.int64) * H + hs, mask=ok1 & (hs < H) & (i1 < y_rows), other=0.0),
                         mask=ok1 & (hs < H))
                tl.store(back + (tok2.to(tl.int64) * W + rank) * H + hs,
                         tl.load(y_ptr + i2.to(tl.int64) * H + hs, mask=ok2 & (hs < H) & (i2 < y_rows), other=0.0),
                         mask=ok2 & (hs < H))
            tl.debug_barrier()
            if ok1:
                flags = tl.load(arrived_table + s)
                a1 = tl.full([1], 0, tl.int64) + flags + tok1.to(tl.int64) * 4
                a2 = tl.full([1], 0, tl.int64) + flags + tl.where(ok2, tok2, tok1).to(tl.int64) * 4
                epoch = tl.full([1], 0, tl.int32) + tl.load(epoch_ptr).to(tl.int32)
                tl.inline_asm_elementwise(PAIR_FLAG_ASM, "=r,l,l,r", [a1, a2, epoch], dtype=tl.int32, is_pure=False,
                                          pack=1)
    elif (j < QB) & (ONE_D == 1):
        for k in tl.static_range(W - 1):
            s = (rank + 1 + k) % W
            i = tl.load(recv_start_ptr + s) + g * QB + j
            end = tl.minimum(tl.load(recv_start_ptr + s + 1), R)
            if i < end:
                tok = tl.load(src_ptr + i) - s * M
                if (tok >= 0) & (tok < M):
                    dst = tl.multiple_of(tl.load(back_table + s).to(tl.pointer_type(ty)), 16) + \
                        (tok.to(tl.int64) * W + rank) * H
                    src = y_ptr + i.to(tl.int64) * H
                    for h0 in range(0, H, BLOCK_H):
                        hs = h0 + tl.arange(0, BLOCK_H)
                        tl.store(dst + hs, tl.load(src + hs, mask=(hs < H) & (i < y_rows), other=0.0), mask=hs < H)
                    tl.debug_barrier()
                    addr = tl.full([1], 0, tl.int64) + tl.load(arrived_table + s) + tok.to(tl.int64) * 4
                    if SIGNAL == 1:
                        tl.atomic_add(tl.load(arrived_table + s).to(tl.pointer_type(tl.int32)) + tok, 1,
                                      sem="release", scope="sys")
                    elif SIGNAL == 3:
                        tl.inline_asm_elementwise(RED_ASM, "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)
                    elif SIGNAL == 4:
                        epoch = tl.full([1], 0, tl.int32) + tl.load(epoch_ptr).to(tl.int32)
                        tl.inline_asm_elementwise(FLAG_ASM, "=r,l,r", [addr, epoch], dtype=tl.int32, is_pure=False,
                                                  pack=1)
    elif j < QB:
        i = tl.load(recv_start_ptr + ss, mask=ss < W, other=0) + g * QB + j
        end = tl.minimum(tl.load(recv_start_ptr + ss + 1, mask=ss < W, other=0), R)
        tok = tl.load(src_ptr + i, mask=(ss < W) & (i < end), other=-1) - ss * M
        live = (ss < W) & (ss != rank) & (i < end) & (tok >= 0) & (tok < M)
        peer = tl.load(back_table + ss, mask=live, other=0).to(tl.pointer_type(ty))
        dst = tl.multiple_of(peer, 16)[:, None] + ((tok.to(tl.int64) * W + rank) * H)[:, None]
        src = y_ptr + (i.to(tl.int64) * H)[:, None]
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + tl.arange(0, BLOCK_H)[None, :]
            moving = live[:, None] & (hs < H)
            tl.store(dst + hs, tl.load(src + hs, mask=moving & (i < y_rows)[:, None], other=0.0), mask=moving)
        if SIGNAL == 1:
            tl.debug_barrier()
            counters = tl.load(arrived_table + ss, mask=live, other=0).to(tl.pointer_type(tl.int32)) + tok
            tl.atomic_add(counters, tl.full([W_POW2], 1, tl.int32), mask=live, sem="release", scope="sys")
        elif SIGNAL == 2:
            tl.debug_barrier()
            mine = _peer(arrived_table, rank, tl.int32) + ss * 0
            tl.atomic_add(mine, tl.full([W_POW2], 0, tl.int32), mask=live, sem="release", scope="sys")
    else:
        t = ((g - LAG) * QB + (j - QB)).to(tl.int64)
        if (REDUCE == 1) & (t >= 0) & (t < T):
            rows = tl.load(handle_ptr + t * W + ss, mask=ss < W, other=-1).to(tl.int64)
            own = ss == rank
            expected = tl.sum(((ss < W) & ~own & (rows >= 0)).to(tl.int32), axis=0)
            mine = _peer(arrived_table, rank, tl.int32) + t
            if SIGNAL == 4:   # the flag holds the epoch of the call whose row landed: no reset
                epoch = tl.load(epoch_ptr).to(tl.int32)
                if expected > 0:
                    seen = tl.atomic_add(mine, 0, sem="acquire", scope="sys")
                    while seen != epoch:
                        seen = tl.atomic_add(mine, 0, sem="acquire", scope="sys")
            else:
                seen = tl.atomic_add(mine, 0, sem="acquire", scope="sys")
                while seen < expected:
                    seen = tl.atomic_add(mine, 0, sem="acquire", scope="sys")
                tl.store(mine, 0)
            tl.debug_barrier()
            back = _peer(back_table, rank, ty) + t * W * H
            src = tl.where(own, y_ptr + tl.maximum(rows, 0) * H, back + ss * H)[:, None]
            present = ((rows >= 0) & (ss < W) & (~own | (rows < y_rows)))[:, None]
            for h0 in range(0, H, BLOCK_H):
                hs = h0 + tl.arange(0, BLOCK_H)
                v = tl.load(src + hs[None, :], mask=present & (hs < H)[None, :], other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + t * H + hs, tl.sum(v.to(tl.float32), axis=0).to(ty), mask=hs < H)


SHIPPED = "combine_kernel as shipped"
VARIANTS = {   # name: (SIGNAL, REDUCE, ONE_D, PAIR); SHIPPED's sums are the reference
    SHIPPED: None,
    "counters (combine until the flags)": (1, 1, 0, 0),
    "counters, 1-D pushers": (1, 1, 1, 0),
    "counters by red.release, 1-D pushers": (3, 1, 1, 0),
    "flags by st.release, 1-D pushers (the shipped signal, before its reads ahead)": (4, 1, 1, 0),
    "no reduce": (1, 0, 0, 0),
    "no reduce, 1-D, red.release": (3, 0, 1, 0),
    "no reduce, 1-D, flags by st.release": (4, 0, 1, 0),
    "no reduce, 1-D, two rows a pusher, their two flags behind one release": (4, 0, 1, 1),
    "no reduce, release to own counter": (2, 0, 0, 0),
    "pushes only": (0, 0, 0, 0),
}


def timed(fn, before, calls: int) -> float:
    """Microseconds of one fn, events around it after before(): the median of calls, the slowest rank."""
    times = []
    for _ in range(calls):
        before()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def worker(rank: int, port: int, rounds: int, calls: int) -> None:
    join_group(rank, WORLD, port)
    cfg, x, idx, w, scales = problem(TOKENS, rank, WORLD, "bf16")
    op, _, remote = ready_op(cfg, x, idx, w, scales, rank)
    c = CONSTANTS["ep_combine"]
    groups = -(-cfg.max_tokens_per_rank // c["QB"]) + c["LAG"]
    latest = {}

    def dispatched():
        latest["d"] = op.dispatch(x, idx, w, scales)
        torch.cuda._sleep(SLEEP_CYCLES)   # the host queues the timed launch before the GPU gets to it
        op.barrier()   # the ranks start it together

    def shipped():
        handle = latest["d"].handle
        out = torch.empty(handle.shape[0], cfg.hidden, dtype=op.y.dtype, device="cuda")
        combine_kernel[(groups * 2 * c["QB"],)](
            out, op.y, op.y.shape[0], handle, op.recv_src, op.recv_start, op._back_table, op._arrived_table, op.epoch,
            rank, handle.shape[0], cfg.hidden, cfg.max_tokens_per_rank, cfg.capacity, 3, W=WORLD,
            BLOCK_H=c["BLOCK_H"], QB=c["QB"], LAG=c["LAG"], STORE_SIGNAL=True, num_warps=c["num_warps"])
        latest["out"] = out

    def variant(signal: int, reduce: int, one_d: int, pair: int):
        def run():
            handle = latest["d"].handle
            out = torch.empty(handle.shape[0], cfg.hidden, dtype=op.y.dtype, device="cuda")
            combine_variant[(groups * 2 * c["QB"],)](
                out, op.y, op.y.shape[0], handle, op.recv_src, op.recv_start, op._back_table, op._arrived_table,
                op.epoch, rank, handle.shape[0], cfg.hidden, cfg.max_tokens_per_rank, cfg.capacity, W=WORLD,
                BLOCK_H=c["BLOCK_H"], QB=c["QB"], LAG=c["LAG"], SIGNAL=signal, REDUCE=reduce, ONE_D=one_d, PAIR=pair,
                num_warps=c["num_warps"])
            latest["out"] = out
        return run

    def settle():   # the counters / flags zeroed with no launch in flight on either rank
        torch.cuda.synchronize()
        dist.barrier()
        op._arrived.zero_()
        torch.cuda.synchronize()
        dist.barrier()

    results: dict[str, list[float]] = {}
    wrong = []
    for _ in range(rounds):
        for name, switches in VARIANTS.items():
            settle()
            results.setdefault(name, []).append(timed(shipped if name == SHIPPED else variant(*switches), dispatched,
                                                      calls))
            if name == SHIPPED:
                reference_out = latest["out"].clone()
            elif switches[1] and not torch.equal(latest["out"], reference_out):
                wrong.append(name)
    settle()
    elems = remote * cfg.hidden   # the copy moves exactly the bytes combine sends
    local = torch.randn(WORLD, elems, device="cuda").to(torch.bfloat16)
    shared = symm_mem.empty(WORLD * elems, dtype=torch.bfloat16, device="cuda")
    table = torch.tensor(symm_mem.rendezvous(shared, dist.group.WORLD.group_name).buffer_ptrs, dtype=torch.int64,
                         device="cuda")
    copy_name = "SM push copy of the same bytes, 16 KiB / 16 warps"
    grid = (WORLD - 1, triton.cdiv(elems, 8192))
    copy = lambda: _copy[grid](local, table, rank, elems, W=WORLD, PUSH=True, BLOCK=8192, num_warps=16)  # noqa: E731
    copy()
    for _ in range(rounds):
        results.setdefault(copy_name, []).append(timed(copy, dispatched, calls))
    said = [None] * WORLD
    dist.all_gather_object(said, wrong)
    if rank == 0:
        nbytes = remote * cfg.hidden * 2
        print(f"{WORLD} x {torch.cuda.get_device_name()}, {TOKENS} tokens a rank, {remote} rows cross NVLink "
              f"({nbytes / 1e6:.2f} MB); events around one launch after a dispatch, a sleep and a barrier, median of "
              f"{calls}, slowest rank; {rounds} rounds\n")
        print("| variant | " + " | ".join(f"round {r + 1}, us" for r in range(rounds)) + " | last round GB/s |")
        print("|---|" + "---|" * rounds + "---|")
        for name, times in results.items():
            print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {nbytes / times[-1] / 1e3:.1f} |")
        print(f"\nsums unlike combine_kernel's: {sorted(set(sum(said, []))) or 'none'}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--port", type=int, default=29577)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.port, a.rounds, a.calls), nprocs=WORLD)


if __name__ == "__main__":
    main()
