"""Row softmax in FlyDSL: y = exp(x - max(x)) / sum(exp(x - max(x))) over rows of x[M, N]; one block per row.

exp is exp2 of x*log2(e) (one hardware instruction, no device library). The row stays in registers across
the max pass, the exp+sum pass and the scaling pass.
"""
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, range_constexpr
from flydsl.expr import math as fmath
from flydsl.expr.typing import ReductionOp

from kernels.flydsl.common import (block_reduce, partials_view, placeholder, reduction_scratch, row_plan,
                                   row_vectors, vector_copy, wave_max, wave_sum)

LOG2E = 1.4426950408889634


def build_softmax(dtype: str, N: int, THREADS: int):
    plan = row_plan(dtype, N, THREADS)
    elem, vec, passes, waves = plan.elem, plan.vec, plan.passes, plan.waves
    scratch = reduction_scratch(plan)

    @flyc.kernel
    def softmax_kernel(X: fx.Tensor, Y: fx.Tensor):
        row, tid = fx.block_idx.x, fx.thread_idx.x
        fast = arith.FastMathFlags.fast
        partials = partials_view(scratch, plan)
        x_row, y_row = row_vectors(X, row, plan), row_vectors(Y, row, plan)
        atom = vector_copy(plan)

        xs, row_max = [], fx.Float32(float("-inf"))
        for p in range_constexpr(passes):
            regs = fx.make_rmem_tensor(vec, elem)
            fx.copy(atom, fx.slice(x_row, (None, tid + p * THREADS)), regs)
            x = fx.memref_load_vec(regs).to(fx.Float32)
            xs.append(x)
            row_max = fx.max(row_max, x.reduce(ReductionOp.MAX))
        row_max = block_reduce(row_max, wave_max, partials, tid, waves, fx.Float32(float("-inf")))

        total = fx.Float32(0.0)
        for p in range_constexpr(passes):
            xs[p] = fmath.exp2((xs[p] - row_max) * LOG2E, fastmath=fast)
            total = total + xs[p].reduce(ReductionOp.ADD, fastmath=fast)
        total = block_reduce(total, wave_sum, partials, tid, waves, fx.Float32(0.0))

        scale = 1.0 / total
        for p in range_constexpr(passes):
            out = fx.make_rmem_tensor(vec, elem)
            fx.memref_store_vec((xs[p] * scale).to(elem), out)
            fx.copy(atom, out, fx.slice(y_row, (None, tid + p * THREADS)))

    @flyc.jit
    def softmax(X: fx.Tensor, Y: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        M, _ = X.shape.unpack()
        softmax_kernel(X, Y).launch(grid=(M, 1, 1), block=(THREADS, 1, 1), stream=stream)

    return softmax, (placeholder(dtype, 4, N), placeholder(dtype, 4, N))
