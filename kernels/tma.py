"""Kernels over host TMA tensor descriptors (triton.tools.tensor_descriptor.TensorDescriptor): the caller
builds each descriptor on the host (base, shape, strides, block shape); the kernel loads and stores whole
blocks through it, and the hardware clips at the tensor's edge (zero or NaN padding on loads, by the
descriptor's `padding`)."""
import triton
import triton.language as tl


@triton.jit
def tma_scale_kernel(x_desc, y_desc, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = x * scale, one BLOCK_M x BLOCK_N block per program; grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    x = x_desc.load([m, n]).to(tl.float32)
    y_desc.store([m, n], (x * scale).to(y_desc.dtype))


@triton.jit
def tma_matmul_kernel(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N] (fp32 accumulation), one BLOCK_M x BLOCK_N tile per program; grid
    (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). K's tail past the tensor reads as zeros through the descriptors."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@triton.jit
def tma_device_scale_kernel(x_ptr, y_ptr, M, N, stride_m, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[M, N] = x * scale (y contiguous, x rows stride_m apart), the descriptors made in the kernel
    (tl.make_tensor_descriptor): each program writes its own into global scratch memory, which a launch asks of
    the allocator set with triton.set_allocator (Triton's launcher and kforge's alike)."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[stride_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    y_desc.store([m, n], (x_desc.load([m, n]).to(tl.float32) * scale).to(y_desc.dtype))
