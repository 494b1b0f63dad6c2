"""Tiled GEMM: C[M, N] = A[M, K] @ B[K, N], row-major and contiguous along the last dim, f32 accumulation.

Split-K (SPLIT_K > 1, for small M): program (tile, s) sums the s-th share of K's blocks and adds it into C
atomically, so C must be zero before the launch. Grid: (tiles_m * tiles_n, SPLIT_K).
"""
import triton
import triton.language as tl

from kernels.tiles import grouped_tile


@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                SPLIT_K: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if SPLIT_K == 1:
        k_first = 0
        k_end = K
    else:
        share = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_first = tl.program_id(1) * share
        k_end = min(K, k_first + share)
    # Wrap out-of-range rows/cols onto valid ones for the loads; the store is masked instead. (N is promised
    # 16-divisible, so cols % N keeps 16-element contiguous runs: B's loads stay vectorized.)
    a_ptrs = a_ptr + (rows % M)[:, None] * stride_am + (k_first + ks)[None, :]
    b_ptrs = b_ptr + (k_first + ks)[:, None] * stride_bk + (cols % N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_first, k_end, BLOCK_K):
        k_left = k_end - k0
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :]
    in_c = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_c)
    else:
        tl.atomic_add(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_c, sem="relaxed")
