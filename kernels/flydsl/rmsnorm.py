"""RMSNorm in FlyDSL: y = x / sqrt(mean(x^2) + eps) * w over rows of x[M, N]; one block per row.

N is a compile-time value and a multiple of the block's vector tile (threads x 128-bit loads); the row
stays in registers between the reduction and the scaling pass.
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr
from flydsl.expr.typing import ReductionOp

from kernels.flydsl.common import (block_reduce, partials_view, placeholder, reduction_scratch, row_plan,
                                   row_vectors, vector_copy, wave_sum)


def build_rmsnorm(dtype: str, N: int, THREADS: int):
    plan = row_plan(dtype, N, THREADS)
    elem, vec, passes, waves = plan.elem, plan.vec, plan.passes, plan.waves
    scratch = reduction_scratch(plan)

    @flyc.kernel
    def rmsnorm_kernel(X: fx.Tensor, W: fx.Tensor, Y: fx.Tensor, eps: fx.Float32):
        row, tid = fx.block_idx.x, fx.thread_idx.x
        partials = partials_view(scratch, plan)
        x_row, y_row, w_all = row_vectors(X, row, plan), row_vectors(Y, row, plan), row_vectors(W, None, plan)
        atom = vector_copy(plan)

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
