"""Tiled GEMM on the matrix cores (MFMA) in FlyDSL: C[M, N] = A[M, K] @ B[N, K]^T, both inputs K-major.

One block computes a BLOCK_M x BLOCK_N tile of C with WARPS_M x WARPS_N waves; each K step loads the
A and B tiles straight into the MFMA register fragments with buffer loads and issues the MFMAs, with
fp32 accumulation. The fp8 variant multiplies by per-tensor scales before the bf16 store. Shapes are
runtime values; M, N and K must be multiples of the tile sizes.
"""
import flydsl.compiler as flyc
import flydsl.expr as fx

from kernels.flydsl.common import FX_TYPES, WAVE, placeholder

# MFMA atom (m, n, k) per input type: 16x16x16 for 16-bit inputs, 16x16x32 for fp8 (gfx942/gfx950)
MFMA_K = {"fp16": 16, "bf16": 16, "fp8e4nv": 32, "fp8e4b8": 32}
# the fp8 flavour each arch's matrix cores take: OCP e4m3 on gfx950, e4m3fnuz on gfx942
FP8_OF_ARCH = {"gfx942": "fp8e4b8", "gfx950": "fp8e4nv"}


def _make_gemm(in_dtype: str, out_dtype: str, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int,
               WARPS_M: int, WARPS_N: int, scaled: bool):
    a_type, c_type = FX_TYPES[in_dtype], FX_TYPES[out_dtype]
    mfma_k = MFMA_K[in_dtype]
    if BLOCK_M % (16 * WARPS_M) or BLOCK_N % (16 * WARPS_N) or BLOCK_K % mfma_k:
        raise ValueError(f"tile {BLOCK_M}x{BLOCK_N}x{BLOCK_K} does not split over {WARPS_M}x{WARPS_N} waves "
                         f"of 16x16x{mfma_k} MFMAs")
    threads = WAVE * WARPS_M * WARPS_N

    @flyc.kernel
    def gemm_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, scale: fx.Float32):
        tid = fx.thread_idx.x
        bid_m, bid_n, _ = fx.block_idx
        a_tiles = fx.flat_divide(fx.rocdl.make_buffer_tensor(A), (BLOCK_M, BLOCK_K))[None, None, bid_m, None]
        b_tiles = fx.flat_divide(fx.rocdl.make_buffer_tensor(B), (BLOCK_N, BLOCK_K))[None, None, bid_n, None]
        c_tile = fx.flat_divide(fx.rocdl.make_buffer_tensor(C), (BLOCK_M, BLOCK_N))[None, None, bid_m, bid_n]

        mma = fx.make_tiled_mma(fx.make_mma_atom(fx.rocdl.MFMA(16, 16, mfma_k, a_type)),
                                fx.make_layout((WARPS_M, WARPS_N, 1), (1, WARPS_M, 0)))
        my_mma = mma.thr_slice(tid)
        load = fx.make_copy_atom(fx.rocdl.BufferCopy64b(), a_type)
        store = fx.make_copy_atom(fx.rocdl.BufferCopy16b(), c_type)
        copy_a = fx.make_tiled_copy_A(load, mma).get_slice(tid)
        copy_b = fx.make_tiled_copy_B(load, mma).get_slice(tid)
        copy_c = fx.make_tiled_copy_C(store, mma).get_slice(tid)

        a_src, b_src = copy_a.partition_S(a_tiles), copy_b.partition_S(b_tiles)
        a_frag = my_mma.make_fragment_A(a_tiles[None, None, 0])
        b_frag = my_mma.make_fragment_B(b_tiles[None, None, 0])
        acc = my_mma.make_fragment_C(c_tile)
        a_regs, b_regs = copy_a.retile(a_frag), copy_b.retile(b_frag)

        acc.fill(0)
        for k in range(fx.get_scalar(fx.size(a_tiles.shape[2]))):
            fx.copy(load, a_src[None, None, None, k], a_regs)
            fx.copy(load, b_src[None, None, None, k], b_regs)
            fx.gemm(mma, acc, a_frag, b_frag, acc)

        out = fx.make_fragment_like(acc, c_type)
        result = acc.load() * scale if scaled else acc.load()
        out.store(result.to(c_type))
        fx.copy(store, copy_c.retile(out), copy_c.partition_S(c_tile))

    @flyc.jit
    def gemm(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, scale: fx.Float32, stream: fx.Stream = fx.Stream(None)):
        M, _ = A.shape.unpack()
        N, _ = B.shape.unpack()
        gemm_kernel(A, B, C, scale).launch(grid=(M // BLOCK_M, N // BLOCK_N, 1), block=(threads, 1, 1),
                                           stream=stream)

    shape = (2 * BLOCK_M, 2 * BLOCK_K), (2 * BLOCK_N, 2 * BLOCK_K), (2 * BLOCK_M, 2 * BLOCK_N)
    return gemm, (placeholder(in_dtype, *shape[0]), placeholder(in_dtype, *shape[1]),
                  placeholder(out_dtype, *shape[2]), 1.0)


def build_gemm(dtype: str, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, WARPS_M: int, WARPS_N: int):
    """bf16/fp16 in, same type out; `scale` multiplies the result (pass 1.0 for a plain GEMM)."""
    return _make_gemm(dtype, dtype, BLOCK_M, BLOCK_N, BLOCK_K, WARPS_M, WARPS_N, scaled=False)


def build_fp8_gemm(dtype: str, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, WARPS_M: int, WARPS_N: int, arch: str):
    """fp8 e4m3 in (the flavour `arch` computes in), bf16 out: C = (A @ B^T) * scale (scale_a * scale_b)."""
    if FP8_OF_ARCH.get(arch) != dtype:
        raise ValueError(f"{arch} multiplies {FP8_OF_ARCH.get(arch, 'no fp8')}, not {dtype}")
    return _make_gemm(dtype, "bf16", BLOCK_M, BLOCK_N, BLOCK_K, WARPS_M, WARPS_N, scaled=True)
