"""Triton kernels of the dispatch/combine op: peers' buffers are reached through tables of symmetric-memory
pointers (int64, one per rank). Cross-GPU ordering uses flags: a release store of an epoch into every
peer's flag slot, then acquire reads until every peer's slot has reached it; the count exchange (inside
dispatch_kernel) tags each count with the epoch instead, so the count is its own flag. The epoch lives on the device,
so eager calls and CUDA-graph replays advance it with no host involvement. It is an int64, as are the flags, so no
comparison of it ever wraps (2^63 barriers); a count's tag holds its low 32 bits and is compared for equality, which
holds because a cell carries this call's tag or an earlier call's, never a later one (_poll_counts)."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _peer(table, rank, ty: tl.constexpr):
    # symmetric buffers are allocation-aligned: say so, or every peer store is split into 2-byte pieces
    return tl.multiple_of(tl.load(table + rank).to(tl.pointer_type(ty)), 16)


@triton.jit
def _count(cell):
    """A count-matrix cell's count: its low 32 bits (the high ones hold the epoch of the exchange that wrote it)."""
    return cell.to(tl.int32)


@triton.jit
def _pick(vector, i):
    """vector[i] for a static i, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, vector.shape[0]) == i, vector, 0), axis=0)


@triton.jit
def _chained(PDL: tl.constexpr):
    """Dispatch's kernels run as a chain of programmatic dependent launches where PDL (NVIDIA sm_90 and later, and
    the spec launches them with launch_pdl): the next kernel of the chain is launched while this one runs, and
    waits here, before its first memory access, until the one before it has finished and its writes are visible.
    Launched without PDL, the wait returns at once."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


# NVIDIA's barrier signal (STORE_SIGNAL): threads 0..W-1 each take one peer's flag array from the table and
# release-store the epoch into its slot `rank`, all W at once (one thread's release stores would each wait for the
# one before). 3.46 us a barrier at world 2 on H100 against 3.95 by release exchanges (bench/ep_barrier.py);
# polling by loads instead of atomics changed nothing there and slowed combine's reducers, so polls stay atomics.
_SIGNAL_PEERS = tl.constexpr(
    "{ .reg .pred p; .reg .u32 t; .reg .u64 a, o; mov.u32 t, %tid.x; setp.lt.u32 p, t, $4; mul.wide.u32 o, t, 8; "
    "add.u64 a, $1, o; @p ld.global.u64 a, [a]; mul.wide.u32 o, $2, 8; add.u64 a, a, o; "
    "@p st.release.sys.global.s64 [a], $3; mov.u32 $0, 0; }")


@triton.jit
def _signal_peers(flag_table, rank, epoch, W: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """Slot `rank` of every peer's flags = epoch, released after this block's earlier stores (the caller's block
    barrier orders them): PTX release stores where STORE_SIGNAL (NVIDIA), else release exchanges (AMD, Triton's
    interpreter)."""
    if STORE_SIGNAL:
        tl.static_assert(W <= 32, "the store signal takes a thread a peer: at most 32 peers, one warp's threads")
        one = tl.full([1], 0, tl.int32)
        tl.inline_asm_elementwise(_SIGNAL_PEERS, "=r,l,r,l,r", [one.to(tl.int64) + flag_table.to(tl.int64),
                                  one + rank, one.to(tl.int64) + epoch, one + W], dtype=tl.int32, is_pure=False,
                                  pack=1)
    else:
        W_POW2: tl.constexpr = triton.next_power_of_2(W)
        ps = tl.arange(0, W_POW2)
        peers = tl.load(flag_table + ps, mask=ps < W, other=0).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(peers + rank, tl.full([W_POW2], 0, tl.int64) + epoch, mask=ps < W, sem="release", scope="sys")


@triton.jit
def _barrier(flag_table, epoch_ptr, rank, W: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """Every rank signals every rank, then waits for all: one program, called by one thread block. The W
    signals go out at once and the W polls are one vector: W sequential NVLink round trips per barrier cost
    microseconds. The signals: PTX release stores where STORE_SIGNAL (NVIDIA), else release exchanges (AMD,
    Triton's interpreter)."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    tl.debug_barrier()   # this block's earlier stores are ordered before the release below
    epoch = tl.load(epoch_ptr) + 1
    ps = tl.arange(0, W_POW2)
    live = ps < W
    mine = _peer(flag_table, rank, tl.int64) + ps   # loaded before the signal: off its path
    _signal_peers(flag_table, rank, epoch, W, STORE_SIGNAL)
    behind = 1   # a scalar loop carry: Triton 3.6 fails to compile a tensor one here
    while behind > 0:
        seen = tl.atomic_add(mine, 0, mask=live, sem="acquire", scope="sys")
        behind = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)
    tl.store(epoch_ptr, epoch)
    tl.debug_barrier()


@triton.jit
def barrier_kernel(flag_table, epoch_ptr, rank, W: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    _barrier(flag_table, epoch_ptr, rank, W, STORE_SIGNAL)


@triton.jit
def dispatch_done_kernel(flag_table, epoch_ptr, rank, W: tl.constexpr, STORE_SIGNAL: tl.constexpr,
                         PDL: tl.constexpr):
    """The end of dispatch: the landing barrier (every rank's rows have landed everywhere), chained after the data
    kernel. What the receiver needs from the counts, the data kernel already wrote; the barrier's epoch is the one the
    data kernel's counts carried."""
    _chained(PDL)
    _barrier(flag_table, epoch_ptr, rank, W, STORE_SIGNAL)


@triton.jit
def _blocks_before(block_counts_ptr, b, W: tl.constexpr, BLOCKS: tl.constexpr):
    """[W_POW2]: tokens of the route's blocks before block b that go to each rank, from its per-block counts
    [NB, W], read BLOCKS blocks at a time (b = NB: this rank's totals)."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    ds = tl.arange(0, W_POW2)
    total = tl.zeros([W_POW2], dtype=tl.int32)
    for b0 in range(0, b, BLOCKS):
        bs = b0 + tl.arange(0, BLOCKS)
        live = (bs < b)[:, None] & (ds < W)[None, :]
        total += tl.sum(tl.load(block_counts_ptr + bs[:, None] * W + ds[None, :], mask=live, other=0), axis=0)
    return total


# NVIDIA's tagged-count store (STORE_SIGNAL): a relaxed system-scope 8-byte store by one thread. Relaxed is enough:
# the word carries its own tag, so nothing has to be ordered before it, and an atomic exchange would wait for a
# reply it does not need (2.48 against 2.95 us an exchange at world 2 on H100, when the exchange was a launch of
# its own: docs/data/ep_dispatch_parts-2xh100-reads_ahead.log).
_STORE_RELAXED_SYS = tl.constexpr("{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, $3; "
                                  "@p st.relaxed.sys.global.b64 [$1], $2; mov.u32 $0, 0; }")
# NVIDIA's poll of the count matrix: acquire loads, not atomics: every program of the data kernel polls, and
# atomics on the same few words from all of them would queue behind each other
_LOAD_ACQUIRE_SYS = tl.constexpr("ld.acquire.sys.global.b64 $0, [$1];")


@triton.jit
def _send_counts(matrix_table, rank, tagged, W: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """Row `rank` of every peer's count matrix = tagged ([W_POW2] 8-byte words): PTX relaxed stores, one thread a
    cell, where STORE_SIGNAL (NVIDIA), else relaxed atomic exchanges (AMD, Triton's interpreter); either way a
    poller reads each word whole."""
    ds = tl.arange(0, triton.next_power_of_2(W))
    for p in tl.static_range(W):
        row = _peer(matrix_table, p, tl.int64) + rank * W
        if STORE_SIGNAL:
            tl.static_assert(W <= 32, "a thread a cell of a peer's row: at most 32 peers")
            one = tl.full([1], 0, tl.int64)
            for d in tl.static_range(W):   # thread d stores cell d (its value is a scalar every thread holds)
                tl.inline_asm_elementwise(_STORE_RELAXED_SYS, "=r,l,l,r", [one + (row + d).to(tl.int64),
                                          one + _pick(tagged, d), one.to(tl.int32) + d], dtype=tl.int32,
                                          is_pure=False, pack=1)
        else:
            tl.atomic_xchg(row + ds, tagged, mask=ds < W, sem="relaxed", scope="sys")


@triton.jit
def _poll_counts(matrix_ptr, epoch, W: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """This rank's count matrix once every row carries `epoch`, as [W_POW2, W_POW2] counts (row s, column d: rows
    rank s sends to rank d; zero outside W x W): acquire loads where STORE_SIGNAL (NVIDIA), else acquire atomics.
    A tag is the low 32 bits of its call's epoch, and the wait is for equality: a peer tags this call's counts only
    after this rank's previous dispatch has passed its landing barrier, so a cell holds an earlier call's tag or this
    one's; equality wraps with the tag, where `<` would fail at 2^31."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    cells = tl.arange(0, W_POW2 * W_POW2)
    live = (cells // W_POW2 < W) & (cells % W_POW2 < W)
    at = matrix_ptr + tl.where(live, (cells // W_POW2) * W + cells % W_POW2, 0)
    seen = tl.zeros([W_POW2 * W_POW2], tl.int64)
    behind = 1   # a scalar loop carry: Triton 3.6 fails to compile a tensor one here
    while behind > 0:
        if STORE_SIGNAL:
            seen = tl.inline_asm_elementwise(_LOAD_ACQUIRE_SYS, "=l,l", [at.to(tl.int64)], dtype=tl.int64,
                                             is_pure=False, pack=1)
        else:
            seen = tl.atomic_add(at, tl.zeros([W_POW2 * W_POW2], tl.int64), mask=live, sem="acquire", scope="sys")
        behind = tl.sum((live & ((seen >> 32).to(tl.int32) != epoch.to(tl.int32))).to(tl.int32), axis=0)
    return tl.reshape(tl.where(live, _count(seen), 0), [W_POW2, W_POW2])


@triton.jit
def route_kernel(idx_ptr, pos_ptr, block_counts_ptr, T, E, K: tl.constexpr, W: tl.constexpr,
                 BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    """Program b, tokens [b * BLOCK_T, (b + 1) * BLOCK_T): for each rank d, pos[t, d] = how many earlier
    tokens of the block go to d (-1: token t does not) and block_counts[b, d] = how many go there in all;
    dispatch_kernel adds the blocks before. A token goes to d once however many of its K experts
    live there; ids < 0 or >= E * W go nowhere. Ids are read as one [BLOCK_T, K] tile."""
    _chained(PDL)
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
def _landing_row(pos, offset, R):
    """Where a token lands on a rank (either may be a vector of them): pos (its place among this rank's tokens of
    its route block going there) after offset (the rows of lower ranks and of this rank's earlier blocks); -1 if
    it is not sent or past capacity."""
    row = offset + pos
    return tl.where((pos >= 0) & (row < R), row, -1).to(tl.int64)


@triton.jit
def _send_metadata(idx_ptr, w_ptr, scale_ptr, pos_ptr, offsets, handle_ptr, recv_idx_table, recv_w_table,
                   recv_scale_table, recv_src_table, b, T, rank, M, R, S, S_STRIDE, W: tl.constexpr, K: tl.constexpr,
                   HAS_W: tl.constexpr, HAS_SCALES: tl.constexpr, BLOCK_T: tl.constexpr):
    """The ids, weights, S block scales and source id of route block b's tokens to every rank they go to, and
    handle[t, d] (their rows there) for combine; offsets[d]: the block's first row on rank d. A block's tokens
    land on consecutive rows of a rank, so each field goes out as one [BLOCK_T, ...] store whose lanes cover a
    contiguous range: a few full NVLink writes where a store per token made many tiny ones. The receivers' scale
    rows are S_STRIDE apart, a multiple of 4: 16-byte stores."""
    K_POW2: tl.constexpr = triton.next_power_of_2(K)
    SCALE_CHUNK: tl.constexpr = 64
    ts = b * BLOCK_T + tl.arange(0, BLOCK_T)
    inside = ts < T
    tc = tl.minimum(ts, T - 1)   # a real token's cells for the lanes past T, whose rows are then -1
    ks = tl.arange(0, K_POW2)
    kin = (ks < K)[None, :]
    ids = tl.load(idx_ptr + tc[:, None] * K + ks[None, :], mask=kin, other=0)
    if HAS_W:
        ws = tl.load(w_ptr + tc[:, None] * K + ks[None, :], mask=kin, other=0.0)
    else:
        ws = tl.zeros([BLOCK_T, K_POW2], tl.float32)
    for d in tl.static_range(W):
        rows = tl.where(inside, _landing_row(tl.load(pos_ptr + tc * W + d), _pick(offsets, d), R), -1)
        tl.store(handle_ptr + tc * W + d, rows.to(tl.int32), mask=inside)
        sent = rows >= 0
        tl.store(_peer(recv_idx_table, d, tl.int32) + rows[:, None] * K + ks[None, :], ids, mask=sent[:, None] & kin)
        if HAS_W:
            tl.store(_peer(recv_w_table, d, tl.float32) + rows[:, None] * K + ks[None, :], ws,
                     mask=sent[:, None] & kin)
        if HAS_SCALES:
            for s0 in range(0, S, SCALE_CHUNK):
                ss = s0 + tl.arange(0, SCALE_CHUNK)
                sin = (ss < S)[None, :]
                dst = _peer(recv_scale_table, d, tl.float32) + tl.multiple_of(rows * S_STRIDE, 4)[:, None] + ss[None, :]
                tl.store(dst, tl.load(scale_ptr + tc[:, None] * S + ss[None, :], mask=sin), mask=sent[:, None] & sin)
        tl.store(_peer(recv_src_table, d, tl.int32) + rows, (rank * M + tc).to(tl.int32), mask=sent)


@triton.jit
def dispatch_kernel(x_ptr, idx_ptr, w_ptr, scale_ptr, pos_ptr, block_counts_ptr, NB, matrix_table, epoch_ptr,
                    num_recv_ptr, overflow_ptr, recv_start_ptr, handle_ptr, recv_x_table, recv_idx_table, recv_w_table,
                    recv_scale_table, recv_src_table, rank, T, H, M, R, S, S_STRIDE, roles, W: tl.constexpr,
                    K: tl.constexpr, HAS_W: tl.constexpr, HAS_SCALES: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """Grid (max(T, 1), chunks), after route_kernel. The count exchange and the rows in one launch:
    - program (0, 0) adds up the route's block counts into this rank's totals per destination and stores them as
      row `rank` of every peer's W x W count matrix, each count tagged with this call's epoch in its upper 32 bits
      (one 8-byte word a cell says both what and when: no flag, no fence);
    - every program reads its inputs, then polls this rank's own matrix until every row carries the epoch (a
      rank's tag also says it has finished its previous combine, by stream order, which is what lets this rank
      write its receive buffers), and sends chunk c (BLOCK_H elements) of token t's row to each rank the token
      goes to, at the row the counts give it there: after the rows of lower ranks and of this rank's earlier
      route blocks;
    - program (b, 0) also sends the metadata of route block b (_send_metadata), so the first programs to run
      carry it; program (0, 0) also writes, from the counts it waited for, num_recv = min(rows sent here, R),
      overflow = rows sent here > R and recv_start[s] = the first row from rank s (recv_start[W]: rows sent
      here), for the receiver and combine.
    No program writes the epoch: dispatch_done_kernel's barrier advances it to this one, so the next call tags its
    counts with the next epoch (_poll_counts says why the tag's low 32 bits suffice). The exchange costs one NVLink
    trip inside this kernel, where a kernel of its own cost a launch and the wait for its end too. A chunk per
    program: one sequential round of stores, so a few tokens fill the GPU.
    roles: 3 on GPUs; the CPU simulation runs every rank's program (0, 0) sending (1), then every rank's grid
    without the send (2)."""
    _chained(PDL)
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    t = tl.program_id(0).to(tl.int64)
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    epoch = tl.load(epoch_ptr) + 1
    if (roles != 2) & first:
        tagged = (epoch << 32) | _blocks_before(block_counts_ptr, NB, W, BLOCKS).to(tl.int64)   # the low 32 bits
        _send_counts(matrix_table, rank, tagged, W, STORE_SIGNAL)
    if roles != 1:
        # what does not depend on the other ranks is read before the wait
        hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        v = tl.load(x_ptr + t * H + hs, mask=(hs < H) & (t < T))
        ds = tl.arange(0, W_POW2)
        live = ds < W
        pos = tl.load(pos_ptr + t * W + ds, mask=live & (t < T), other=-1)
        earlier = _blocks_before(block_counts_ptr, t // BLOCK_T, W, BLOCKS)
        ty = x_ptr.dtype.element_ty
        bases = tl.multiple_of(tl.load(recv_x_table + ds, mask=live, other=0).to(tl.pointer_type(ty)), 16)
        counts = _poll_counts(_peer(matrix_table, rank, tl.int64), epoch, W, STORE_SIGNAL)
        lower = tl.sum(tl.where((ds < rank)[:, None], counts, 0), axis=0)   # [d]: rows lower ranks send to d
        # every rank's row at once, then one [W, BLOCK_H] store: the stores leave one round trip after the wait
        rows = _landing_row(pos, lower + earlier, R)
        tl.store(bases[:, None] + rows[:, None] * H + hs[None, :], v[None, :],
                 mask=(rows >= 0)[:, None] & (hs < H)[None, :])
        if (tl.program_id(1) == 0) & (t * BLOCK_T < T):
            _send_metadata(idx_ptr, w_ptr, scale_ptr, pos_ptr, lower + _blocks_before(block_counts_ptr, t, W, BLOCKS),
                           handle_ptr, recv_idx_table, recv_w_table, recv_scale_table, recv_src_table, t, T, rank, M,
                           R, S, S_STRIDE, W, K, HAS_W, HAS_SCALES, BLOCK_T)
        if first:
            per_source = tl.sum(tl.where((ds == rank)[None, :], counts, 0), axis=1)   # [s]: rows s sends here
            total = tl.sum(per_source, axis=0)
            tl.store(recv_start_ptr + ds, tl.cumsum(per_source, axis=0) - per_source, mask=live)
            tl.store(recv_start_ptr + W, total)
            tl.store(num_recv_ptr, tl.minimum(total, R))
            tl.store(overflow_ptr, (total > R).to(tl.uint8))


# The arrival signal on NVIDIA: a release store (PTX st.release.sys) by the block's first thread (every thread
# holds the [1] tensor's one element). A plain write over NVLink: an atomic there, even a reduction that awaits
# no reply, cost 1 us more a combine at world 2 (bench/ep_combine_parts.py)
_STORE_RELEASE_SYS = tl.constexpr("{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                                  "@p st.release.sys.global.s64 [$1], $2; mov.u32 $0, 0; }")


@triton.jit
def _signal_arrival(flags, at, epoch, STORE_SIGNAL: tl.constexpr):
    """flags[at] = epoch (flags: a peer's arrival flags, an int64 address), released after this block's earlier
    stores (the caller's barrier orders them): as a PTX store where STORE_SIGNAL (NVIDIA), else a release exchange
    (AMD, Triton's interpreter)."""
    if STORE_SIGNAL:
        addr = tl.full([1], 0, tl.int64) + flags + at * 8
        tl.inline_asm_elementwise(_STORE_RELEASE_SYS, "=r,l,l", [addr, tl.full([1], 0, tl.int64) + epoch],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_xchg(flags.to(tl.pointer_type(tl.int64)) + at, epoch, sem="release", scope="sys")


@triton.jit
def combine_kernel(out_ptr, y_ptr, y_rows, handle_ptr, src_ptr, recv_start_ptr, back_table, arrived_table,
                   epoch_ptr, rank, T, H, M, R, roles, W: tl.constexpr, BLOCK_H: tl.constexpr, QB: tl.constexpr,
                   LAG: tl.constexpr, STORE_SIGNAL: tl.constexpr):
    """Push, then sum where the token lives, in one launch. Programs come in groups of 2 * QB: QB pushers, then
    QB reducers.
    - Pusher (group g, j): for every other rank s, the q-th row s sent here (q = g * QB + j), if there is one: y
      of that row is stored into s's back[t, rank] (t: the row's source token); once all are out, s's
      arrived[t, rank] is set to this call's epoch (a release: _signal_arrival). The sources' rows interleave, so
      every peer's rows for token t arrive at about the same time.
    - Reducer (group g, j): token t = (g - LAG) * QB + j of this rank waits until arrived[t, d] holds this call's
      epoch for every other rank d that holds one of its rows, and writes out[t] = the sum over ranks d of y[its
      own row] for d = rank and back[t, d] otherwise, in f32 (one [W, BLOCK_H] tile summed), rounded once.
    The epoch (int64) counts the op's barriers, the same on every rank: earlier calls' flags hold
    smaller ones, and no later call pushes before this rank has passed the next dispatch's barrier, so nothing is
    reset.
    Why this order: a reducer of token t needs the peers' pushers of q <= t, which sit in groups <= t / QB of
    their grids, all started before this reducer's group (blocks start in grid order), so the spin always
    ends; LAG groups of slack let the peers' rows land before their reducer starts spinning.
    roles: 3 on GPUs, grid (groups * 2 * QB); the CPU simulation runs every rank's pushers (roles 1, grid M),
    then every rank's reducers (roles 2, grid T), each program's index its q or t."""
    W_POW2: tl.constexpr = triton.next_power_of_2(W)
    pid = tl.program_id(0)
    if roles == 3:
        g = pid // (2 * QB)
        j = pid % (2 * QB)
    else:
        reducing = (roles == 2).to(tl.int32)
        g = pid // QB + reducing * LAG
        j = pid % QB + reducing * QB
    ty = out_ptr.dtype.element_ty
    ss = tl.arange(0, W_POW2)
    epoch = tl.load(epoch_ptr)
    if j < QB:
        # a row a peer, one [BLOCK_H] step at a time: every thread moves data, and the arrival signal is one
        # scalar per peer (a vector signal's lanes may be replicated over threads)
        for k in tl.static_range(W - 1):
            s = (rank + 1 + k) % W
            i = tl.load(recv_start_ptr + s) + g * QB + j
            here = i < tl.minimum(tl.load(recv_start_ptr + s + 1), R)
            src = y_ptr + i.to(tl.int64) * H
            hs = tl.arange(0, BLOCK_H)
            # what the row's stores need besides the source token is read with it, not after it: the reads overlap
            first = tl.load(src + hs, mask=here & (hs < H) & (i < y_rows), other=0.0)
            back = tl.multiple_of(tl.load(back_table + s).to(tl.pointer_type(ty)), 16)
            flags = tl.load(arrived_table + s)
            tok = tl.load(src_ptr + i, mask=here, other=-1) - s * M
            if (tok >= 0) & (tok < M):   # a token out of range: no write
                dst = back + (tok.to(tl.int64) * W + rank) * H
                tl.store(dst + hs, first, mask=hs < H)
                for h0 in range(BLOCK_H, H, BLOCK_H):
                    hs = h0 + tl.arange(0, BLOCK_H)
                    tl.store(dst + hs, tl.load(src + hs, mask=(hs < H) & (i < y_rows), other=0.0), mask=hs < H)
                tl.debug_barrier()   # every thread's stores come before the release
                _signal_arrival(flags, tok * W + rank, epoch, STORE_SIGNAL)
    else:
        t = ((g - LAG) * QB + (j - QB)).to(tl.int64)
        if (t >= 0) & (t < T):
            rows = tl.load(handle_ptr + t * W + ss, mask=ss < W, other=-1).to(tl.int64)
            own = ss == rank
            expected = (ss < W) & ~own & (rows >= 0)
            flags = _peer(arrived_table, rank, tl.int64) + t * W + ss
            back = _peer(back_table, rank, ty) + t * W * H   # read before the wait: off the path after it
            seen = tl.atomic_add(flags, 0, mask=expected, sem="acquire", scope="sys")
            behind = tl.sum((expected & (seen < epoch)).to(tl.int32), axis=0)
            while (behind > 0) & (roles == 3):   # the simulation's reducers run after all pushers: no wait
                seen = tl.atomic_add(flags, 0, mask=expected, sem="acquire", scope="sys")
                behind = tl.sum((expected & (seen < epoch)).to(tl.int32), axis=0)
            tl.debug_barrier()
            src = tl.where(own, y_ptr + tl.maximum(rows, 0) * H, back + ss * H)[:, None]
            present = ((rows >= 0) & (ss < W) & (~own | (rows < y_rows)))[:, None]
            for h0 in range(0, H, BLOCK_H):
                hs = h0 + tl.arange(0, BLOCK_H)
                v = tl.load(src + hs[None, :], mask=present & (hs < H)[None, :], other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + t * H + hs, tl.sum(v.to(tl.float32), axis=0).to(ty), mask=hs < H)
