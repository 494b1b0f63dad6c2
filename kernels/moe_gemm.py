"""Fused-MoE grouped GEMM: for tokens sorted by expert, C[t] = A[t // top_k] @ B[e]^T (x routing weight).

sorted_ids holds token-slot ids (token * top_k + k) grouped by expert, each expert's run padded to a multiple
of BLOCK_M with the value num_slots (out of range = skipped); block_expert[i] is the expert of rows
[i*BLOCK_M, (i+1)*BLOCK_M) of sorted_ids. B is [E, N, K] (K contiguous); C is [num_slots, N].
Grid: (cdiv(padded_len, BLOCK_M) * cdiv(N, BLOCK_N),) with padded_len = len(sorted_ids).
"""
import triton
import triton.language as tl

from kernels.tiles import grouped_tile


@triton.jit
def moe_gemm_kernel(a_ptr, b_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, block_expert_ptr,
                    padded_len, N, K, num_slots, top_k, stride_am, stride_be, stride_bn, stride_cm,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), padded_len, N, BLOCK_M, BLOCK_N, GROUP_M)
    slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < num_slots
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_rows = tl.where(valid, slots // top_k, 0).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + expert * stride_be + (cols % N)[None, :].to(tl.int64) * stride_bn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & (ks[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_w_ptr + slots, mask=valid, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + slots[:, None].to(tl.int64) * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))
