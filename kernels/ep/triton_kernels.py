"""Triton kernels of the dispatch/combine op: peers' buffers are reached through tables of symmetric-memory
pointers (int64, one per rank). Cross-GPU ordering uses flags: a release store of an epoch into every
peer's flag slot, then acquire loads until every peer's slot has reached it. The epoch lives on the device,
so eager calls and CUDA-graph replays advance it with no host involvement."""
import triton
import triton.language as tl


@triton.jit
def _peer(table, rank, ty: tl.constexpr):
    # symmetric buffers are allocation-aligned: say so, or every peer store is split into 2-byte pieces
    return tl.multiple_of(tl.load(table + rank).to(tl.pointer_type(ty)), 16)


@triton.jit
def _barrier(flag_table, epoch_ptr, rank, W: tl.constexpr):
    """Every rank signals every rank, then waits for all: one program, called by one thread block. The W
    signals and the W polls go out as one vector each: W sequential NVLink round trips per barrier cost
    microseconds."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    tl.debug_barrier()   # this block's earlier stores are ordered before the release below
    epoch = tl.load(epoch_ptr) + 1
    ps = tl.arange(0, W_POW2)
    live = ps < W
    peers = tl.load(flag_table + ps, mask=live, other=0).to(tl.pointer_type(tl.int32))
    tl.atomic_xchg(peers + rank, tl.full([W_POW2], 0, tl.int32) + epoch, mask=live, sem="release", scope="sys")
    mine = _peer(flag_table, rank, tl.int32) + ps
    behind = 1   # a scalar loop carry: Triton 3.6 fails to compile a tensor one here
    while behind > 0:
        seen = tl.atomic_add(mine, 0, mask=live, sem="acquire", scope="sys")
        behind = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)
    tl.store(epoch_ptr, epoch)
    tl.debug_barrier()


@triton.jit
def barrier_kernel(flag_table, epoch_ptr, rank, W: tl.constexpr):
    _barrier(flag_table, epoch_ptr, rank, W)


@triton.jit
def dispatch_done_kernel(flag_table, epoch_ptr, matrix_ptr, num_recv_ptr, overflow_ptr, rank, R, W: tl.constexpr):
    """The end of dispatch in one launch: the barrier (every rank's rows have landed), then this rank's
    num_recv = min(rows sent here, R) and overflow = rows sent here > R, from the count matrix."""
    _barrier(flag_table, epoch_ptr, rank, W)
    total = tl.zeros([], dtype=tl.int32)
    for s in tl.static_range(W):
        total += tl.load(matrix_ptr + s * W + rank)
    tl.store(num_recv_ptr, tl.minimum(total, R))
    tl.store(overflow_ptr, (total > R).to(tl.uint8))


@triton.jit
def exchange_counts_kernel(block_counts_ptr, block_base_ptr, NB, matrix_table, flag_table, epoch_ptr, rank,
                           W: tl.constexpr, BLOCKS: tl.constexpr):
    """From route_kernel's per-block counts [NB, W]: block_base[b, d] = tokens of blocks before b that go
    to d, and this rank's per-destination totals, stored as row `rank` of every peer's W x W count matrix;
    then a barrier. The counts are read BLOCKS blocks at a time, one 2-D load and a scan each."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    ds = tl.arange(0, W_POW2)
    carry = tl.zeros([W_POW2], dtype=tl.int32)
    for b0 in range(0, NB, BLOCKS):
        bs = b0 + tl.arange(0, BLOCKS)
        at = bs[:, None] * W + ds[None, :]
        live = (bs < NB)[:, None] & (ds < W)[None, :]
        c = tl.load(block_counts_ptr + at, mask=live, other=0)
        tl.store(block_base_ptr + at, carry[None, :] + tl.cumsum(c, axis=0) - c, mask=live)
        carry += tl.sum(c, axis=0)
    for p in tl.static_range(W):
        tl.store(_peer(matrix_table, p, tl.int32) + rank * W + ds, carry, mask=ds < W)
    _barrier(flag_table, epoch_ptr, rank, W)


@triton.jit
def route_kernel(idx_ptr, pos_ptr, block_counts_ptr, T, E, K: tl.constexpr, W: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """Program b, tokens [b * BLOCK_T, (b + 1) * BLOCK_T): for each rank d, pos[t, d] = how many earlier
    tokens of the block go to d (-1: token t does not) and block_counts[b, d] = how many go there in all;
    exchange_counts_kernel adds the blocks before. A token goes to d once however many of its K experts
    live there; ids < 0 or >= E * W go nowhere. Ids are read as one [BLOCK_T, K] tile."""
    K_POW2: tl.constexpr = triton.next_power_of_2(K)
    b = tl.program_id(0)
    ts = b * BLOCK_T + tl.arange(0, BLOCK_T)
    ks = tl.arange(0, K_POW2)
    inside = ts < T
    e = tl.load(idx_ptr + ts.to(tl.int64)[:, None] * K + ks[None, :], mask=inside[:, None] & (ks < K)[None, :],
                other=-1)
    dest = tl.where((e >= 0) & (e < E * W), e // E, W)
    for d in tl.static_range(W):
        hit = tl.max((dest == d).to(tl.int32), axis=1)
        tl.store(pos_ptr + ts.to(tl.int64) * W + d, tl.where(hit > 0, tl.cumsum(hit, axis=0) - hit, -1), mask=inside)
        tl.store(block_counts_ptr + b * W + d, tl.sum(hit, axis=0))


@triton.jit
def _landing_row(pos_ptr, block_base_ptr, matrix_ptr, t, d, rank, R, W: tl.constexpr, BLOCK_T: tl.constexpr):
    """Where token t lands on rank d: after the rows of lower ranks and of this rank's earlier blocks; -1 if
    it is not sent or past capacity."""
    pos = tl.load(pos_ptr + t * W + d)
    before = tl.load(block_base_ptr + (t // BLOCK_T) * W + d)
    for s in tl.static_range(W):
        before += tl.where(s < rank, tl.load(matrix_ptr + s * W + d), 0)
    row = before + pos
    return tl.where((pos >= 0) & (row < R), row, -1).to(tl.int64)


@triton.jit
def dispatch_kernel(x_ptr, idx_ptr, w_ptr, scale_ptr, pos_ptr, block_base_ptr, matrix_ptr, handle_ptr, recv_x_table,
                    recv_idx_table, recv_w_table, recv_scale_table, recv_src_table, rank, H, M, R, S, S_STRIDE,
                    W: tl.constexpr, K: tl.constexpr, HAS_W: tl.constexpr, HAS_SCALES: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr):
    """Program (t, c) sends chunk c (BLOCK_H elements) of token t's row to each rank the token goes to, at
    the row the count matrix gives it there; chunk 0's program also sends the ids, weights, S block scales
    and source id, and records the rows in handle[t, d] for combine. A chunk per program: one sequential
    round of stores, so a few tokens still fill the GPU. The receivers' scale rows are S_STRIDE apart, a
    multiple of 4: 16-byte stores, not S tiny NVLink writes."""
    K_POW2: tl.constexpr = triton.next_power_of_2(K)
    SCALE_CHUNK: tl.constexpr = 64
    t = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    v = tl.load(x_ptr + t * H + hs, mask=hs < H)
    for d in tl.static_range(W):
        row = _landing_row(pos_ptr, block_base_ptr, matrix_ptr, t, d, rank, R, W, BLOCK_T)
        if row >= 0:
            tl.store(_peer(recv_x_table, d, x_ptr.dtype.element_ty) + row * H + hs, v, mask=hs < H)
    if tl.program_id(1) == 0:
        for d in tl.static_range(W):
            row = _landing_row(pos_ptr, block_base_ptr, matrix_ptr, t, d, rank, R, W, BLOCK_T)
            tl.store(handle_ptr + t * W + d, row.to(tl.int32))
            if row >= 0:   # ids and weights as one K-wide store each: K scalar stores would be K tiny NVLink writes
                ks = tl.arange(0, K_POW2)
                tl.store(_peer(recv_idx_table, d, tl.int32) + row * K + ks,
                         tl.load(idx_ptr + t * K + ks, mask=ks < K), mask=ks < K)
                if HAS_W:
                    tl.store(_peer(recv_w_table, d, tl.float32) + row * K + ks,
                             tl.load(w_ptr + t * K + ks, mask=ks < K), mask=ks < K)
                if HAS_SCALES:
                    for s0 in range(0, S, SCALE_CHUNK):
                        ss = s0 + tl.arange(0, SCALE_CHUNK)
                        dst = _peer(recv_scale_table, d, tl.float32) + tl.multiple_of(row * S_STRIDE, 4) + ss
                        tl.store(dst, tl.load(scale_ptr + t * S + ss, mask=ss < S), mask=ss < S)
                tl.store(_peer(recv_src_table, d, tl.int32) + row, (rank * M + t).to(tl.int32))


@triton.jit
def combine_kernel(out_ptr, dest_row_ptr, y_table, H, W: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (t, c): chunk c of out[t] = sum over destinations d (ascending) of y_d[row_d(t)], accumulated
    in f32, rounded once. The W loads are independent: one round trip per program."""
    t = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for d in tl.static_range(W):
        row = tl.load(dest_row_ptr + t * W + d).to(tl.int64)
        src = _peer(y_table, d, out_ptr.dtype.element_ty) + tl.maximum(row, 0) * H + hs
        acc += tl.load(src, mask=(hs < H) & (row >= 0), other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + hs, acc.to(out_ptr.dtype.element_ty), mask=hs < H)
