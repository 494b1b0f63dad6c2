"""What the FlyDSL kernels share: element types by kforge's canonical names, the row layout of the
one-block-per-row kernels, and block-wide reductions."""
import math
from dataclasses import dataclass

import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, gpu, range_constexpr

WAVE = 64   # CDNA wavefront (gfx90a, gfx942, gfx950)

FX_TYPES = {"fp32": fx.Float32, "fp16": fx.Float16, "bf16": fx.BFloat16,
            "fp8e4nv": fx.Float8E4M3FN, "fp8e4b8": fx.Float8E4M3FNUZ}
TORCH_TYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "fp8e4nv": torch.float8_e4m3fn, "fp8e4b8": torch.float8_e4m3fnuz}
BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8e4nv": 8, "fp8e4b8": 8}


def placeholder(dtype: str, *shape: int) -> torch.Tensor:
    """A CPU tensor to trace with: FlyDSL takes element type and rank from it, never its data."""
    return torch.empty(*shape, dtype=TORCH_TYPES[dtype])


@dataclass(frozen=True)
class RowPlan:
    """How one block of `threads` covers a row of N elements with 128-bit vector loads."""
    dtype: str
    threads: int
    vec: int       # elements per 128-bit load
    passes: int    # vector loads per thread per row
    waves: int

    @property
    def elem(self):
        return FX_TYPES[self.dtype]


def row_plan(dtype: str, N: int, THREADS: int) -> RowPlan:
    vec = 128 // BITS[dtype]
    per_pass = THREADS * vec
    if N % per_pass:
        raise ValueError(f"N={N} must be a multiple of THREADS*{vec}={per_pass}")
    return RowPlan(dtype, THREADS, vec, N // per_pass, THREADS // WAVE)


def reduction_scratch(plan: RowPlan):
    """The LDS struct block_reduce needs: one fp32 partial per wave."""
    @fx.struct
    class Scratch:
        partials: fx.Array[fx.Float32, plan.waves, 16]
    return Scratch


def partials_view(scratch, plan: RowPlan):
    """In the kernel: this block's per-wave partials in LDS."""
    return fx.SharedAllocator().allocate(scratch).peek().partials.view(fx.make_layout(plan.waves, 1))


def row_vectors(tensor, row, plan: RowPlan):
    """In the kernel: row `row` of a 2-D tensor (or the whole 1-D tensor if row is None), as 128-bit vectors."""
    buf = fx.rocdl.make_buffer_tensor(tensor)
    return fx.logical_divide(buf if row is None else fx.slice(buf, (row, None)), fx.make_layout(plan.vec, 1))


def vector_copy(plan: RowPlan):
    return fx.make_copy_atom(fx.rocdl.BufferCopy128b(), BITS[plan.dtype])


def wave_sum(x):
    """Butterfly sum across the 64 lanes of a wave; every lane ends with the total."""
    for step in range_constexpr(int(math.log2(WAVE))):
        x = x + x.shuffle_xor(WAVE >> (step + 1), WAVE)
    return x


def wave_max(x):
    for step in range_constexpr(int(math.log2(WAVE))):
        x = fx.max(x, x.shuffle_xor(WAVE >> (step + 1), WAVE))
    return x


def block_reduce(x, wave_op, partials, tid, waves: int, neutral):
    """Reduce one fp32 per thread over the block: per wave, then across waves through LDS `partials`."""
    x = wave_op(x)
    if const_expr(waves == 1):
        return x
    lane, wave = tid % WAVE, tid // WAVE
    fx.memref_store(x, partials, wave)   # every lane holds its wave's total: same value, no branch needed
    gpu.barrier()
    mine = fx.memref_load(partials, (lane < waves).select(lane, 0))
    total = wave_op((lane < waves).select(mine, neutral))
    gpu.barrier()   # every wave has read the partials before they can be reused
    return total
