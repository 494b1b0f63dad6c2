"""Triton kernels of the dispatch/combine op: peers' buffers are reached through tables of symmetric-memory
pointers (int64, one per rank). Cross-GPU ordering uses flags: a release store of an epoch into every
peer's flag slot, then acquire loads until every peer's slot has reached it. The epoch lives on the device,
so eager calls and CUDA-graph replays advance it with no host involvement."""
import triton
import triton.language as tl


@triton.jit
def _peer(table, rank, ty: tl.constexpr):
    return tl.load(table + rank).to(tl.pointer_type(ty))


@triton.jit
def _barrier(flag_table, epoch_ptr, rank, W: tl.constexpr):
    """Every rank signals every rank, then waits for all: one program, called by one thread block."""
    tl.debug_barrier()   # this block's earlier stores are ordered before the release below
    epoch = tl.load(epoch_ptr) + 1
    mine = _peer(flag_table, rank, tl.int32)
    for p in tl.static_range(W):
        tl.atomic_xchg(_peer(flag_table, p, tl.int32) + rank, epoch, sem="release", scope="sys")
    for p in tl.static_range(W):
        while tl.atomic_add(mine + p, 0, sem="acquire", scope="sys") < epoch:
            pass
    tl.store(epoch_ptr, epoch)
    tl.debug_barrier()


@triton.jit
def barrier_kernel(flag_table, epoch_ptr, rank, W: tl.constexpr):
    _barrier(flag_table, epoch_ptr, rank, W)


@triton.jit
def exchange_counts_kernel(counts_ptr, matrix_table, flag_table, epoch_ptr, rank,
                           W: tl.constexpr, WP: tl.constexpr):
    """Row `rank` of every peer's W x W count matrix := this rank's per-destination counts; then a barrier."""
    offs = tl.arange(0, WP)
    row = tl.load(counts_ptr + offs, mask=offs < W)
    for p in tl.static_range(W):
        tl.store(_peer(matrix_table, p, tl.int32) + rank * W + offs, row, mask=offs < W)
    _barrier(flag_table, epoch_ptr, rank, W)


@triton.jit
def dispatch_kernel(x_ptr, idx_ptr, w_ptr, dest_row_ptr, recv_x_table, recv_idx_table, recv_w_table,
                    recv_src_table, rank, H, M,
                    W: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, HAS_W: tl.constexpr,
                    BLOCK_H: tl.constexpr):
    """Program t sends token t's row (and its ids, weights, source id) to each destination row >= 0."""
    t = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, KP)
    ids = tl.load(idx_ptr + t * K + ks, mask=ks < K)
    if HAS_W:
        ws = tl.load(w_ptr + t * K + ks, mask=ks < K)
    for d in tl.static_range(W):
        row = tl.load(dest_row_ptr + t * W + d).to(tl.int64)
        if row >= 0:
            tl.store(_peer(recv_idx_table, d, tl.int32) + row * K + ks, ids, mask=ks < K)
            if HAS_W:
                tl.store(_peer(recv_w_table, d, tl.float32) + row * K + ks, ws, mask=ks < K)
            tl.store(_peer(recv_src_table, d, tl.int32) + row, (rank * M + t).to(tl.int32))
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        v = tl.load(x_ptr + t * H + hs, mask=hs < H)
        for d in tl.static_range(W):
            row = tl.load(dest_row_ptr + t * W + d).to(tl.int64)
            if row >= 0:
                tl.store(_peer(recv_x_table, d, x_ptr.dtype.element_ty) + row * H + hs, v, mask=hs < H)


@triton.jit
def combine_kernel(out_ptr, dest_row_ptr, y_table, H, W: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum over destinations d (ascending) of y_d[row_d(t)], accumulated in f32, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for d in tl.static_range(W):
            row = tl.load(dest_row_ptr + t * W + d).to(tl.int64)
            src = _peer(y_table, d, out_ptr.dtype.element_ty) + tl.maximum(row, 0) * H + hs
            acc += tl.load(src, mask=(hs < H) & (row >= 0), other=0.0).to(tl.float32)
        tl.store(out_ptr + t * H + hs, acc.to(out_ptr.dtype.element_ty), mask=hs < H)
