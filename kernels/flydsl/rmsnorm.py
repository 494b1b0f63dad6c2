"""RMSNorm in FlyDSL: y = x / sqrt(mean(x^2) + eps) * w over rows of x[M, N]; one block per row.

N is a compile-time value and a multiple of the block's vector tile (threads x 128-bit loads); the row
stays in registers between the reduction and the scaling pass.
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr
from flydsl.expr.typing import ReductionOp

from kernels.flydsl.common import BITS, FX_TYPES, WAVE, block_reduce, placeholder, wave_sum


def build_rmsnorm(dtype: str, N: int, THREADS: int):
    elem = FX_TYPES[dtype]
    vec = 128 // BITS[dtype]
    per_pass = THREADS * vec
    if N % per_pass:
        raise ValueError(f"N={N} must be a multiple of THREADS*{vec}={per_pass}")
    passes, waves = N // per_pass, THREADS // WAVE

    @fx.struct
    class Scratch:
        partials: fx.Array[fx.Float32, waves, 16]

    @flyc.kernel
    def rmsnorm_kernel(X: fx.Tensor, W: fx.Tensor, Y: fx.Tensor, eps: fx.Float32):
        row, tid = fx.block_idx.x, fx.thread_idx.x
        partials = fx.SharedAllocator().allocate(Scratch).peek().partials.view(fx.make_layout(waves, 1))
        vectors = fx.make_layout(vec, 1)
        x_row = fx.logical_divide(fx.slice(fx.rocdl.make_buffer_tensor(X), (row, None)), vectors)
        y_row = fx.logical_divide(fx.slice(fx.rocdl.make_buffer_tensor(Y), (row, None)), vectors)
        w_all = fx.logical_divide(fx.rocdl.make_buffer_tensor(W), vectors)
        atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), BITS[dtype])

        def load(tensor, i):
            regs = fx.make_rmem_tensor(vec, elem)
            fx.copy(atom, fx.slice(tensor, (None, i)), regs)
            return fx.memref_load_vec(regs).to(fx.Float32)

        xs, sum_sq = [], fx.Float32(0.0)
        for p in range_constexpr(passes):
            x = load(x_row, tid + p * THREADS)
            xs.append(x)
            sum_sq = sum_sq + (x * x).reduce(ReductionOp.ADD)
        total = block_reduce(sum_sq, wave_sum, partials, tid, waves, fx.Float32(0.0))
        inv_rms = fx.math.rsqrt(total / float(N) + eps)
        for p in range_constexpr(passes):
            i = tid + p * THREADS
            out = fx.make_rmem_tensor(vec, elem)
            fx.memref_store_vec((xs[p] * inv_rms * load(w_all, i)).to(elem), out)
            fx.copy(atom, out, fx.slice(y_row, (None, i)))

    @flyc.jit
    def rmsnorm(X: fx.Tensor, W: fx.Tensor, Y: fx.Tensor, eps: fx.Float32, stream: fx.Stream = fx.Stream(None)):
        M, _ = X.shape.unpack()
        rmsnorm_kernel(X, W, Y, eps).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)

    return rmsnorm, (placeholder(dtype, 4, N), placeholder(dtype, N), placeholder(dtype, 4, N), 1e-6)
