"""Descriptor kernels on a GPU (pytest -m gpu, on an H100/H200/B200 with the catalog built and packaged:
`python -m doit -n 16 archs=sm_90a`): kernels/tma.py's tma_scale and tma_matmul, taking host
TensorDescriptors, and tma_device_scale, which makes its descriptors on the GPU in global scratch memory,
launched from the bundle by kforge's loader and through serve(), each output compared bit for bit with
Triton's JIT on the same inputs. Builds nothing. Skipped only on a machine without a CUDA GPU
that has TMA (sm_90 and up); a missing bundle, kernel or config fails."""
import os
from pathlib import Path

import pytest
from tests.support import REPO

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None
                                 or torch.cuda.get_device_capability()[0] < 9,
                                 reason="needs an NVIDIA GPU with TMA (sm_90 and up)")]

import triton  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from kernels.tma import tma_device_scale_kernel, tma_matmul_kernel, tma_scale_kernel  # noqa: E402
from kforge_runtime import Library, serve  # noqa: E402

DIST = Path(os.environ.get("KFORGE_DIST", REPO / "out" / "dist"))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
M, N, K = 300, 264, 208   # no multiple of a block: the descriptors clip stores and pad loads at every edge


@pytest.fixture(scope="module")
def lib():
    if not list(DIST.glob("kforge_kernels_sm_*.whl")):
        pytest.fail(f"no NVIDIA bundle in {DIST}: run `python -m doit -n 16 archs=sm_90a` (sm_100a on a B200) "
                    f"in the checkout first, or point KFORGE_DIST at its out/dist")
    torch.empty(1, device="cuda")
    return Library(DIST)


def same_bits(a, b) -> bool:
    """Equal bit for bit (NaNs included)."""
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


def scale_inputs(dtype):
    torch.manual_seed(0)
    x = torch.randn(M, N + 56, device="cuda", dtype=DTYPES[dtype])[:, :N]   # rows 320 apart: a strided view
    return x, torch.full((M, N), -7.0, device="cuda", dtype=DTYPES[dtype])


def matmul_inputs(dtype):
    torch.manual_seed(1)
    a = torch.randn(M, K, device="cuda", dtype=DTYPES[dtype])
    b = torch.randn(K, N, device="cuda", dtype=DTYPES[dtype])
    return a, b, torch.full((M, N), -7.0, device="cuda", dtype=DTYPES[dtype])


def desc(t, block, padding="zero"):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, padding)


def run_scale(launch, dtype, bm, jit: bool):
    x, y = scale_inputs(dtype)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, 64))
    args = (desc(x, [bm, 64]), desc(y, [bm, 64]), 0.75)
    if jit:
        launch[grid](*args, BLOCK_M=bm, BLOCK_N=64, num_warps=4)
    else:
        launch(grid, *args)
    torch.cuda.synchronize()
    return x, y


def run_matmul(launch, dtype, warps, padding, jit: bool):
    a, b, c = matmul_inputs(dtype)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, 128))
    args = (desc(a, [128, 64], padding), desc(b, [64, 128], padding), desc(c, [128, 128]), K)
    if jit:
        launch[grid](*args, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=warps, num_stages=3)
    else:
        launch(grid, *args)
    torch.cuda.synchronize()
    return a, b, c


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("bm", [64, 128])
def test_tma_scale_from_the_bundle_is_bit_identical_to_triton_s_jit(lib, dtype, bm):
    x, y = run_scale(lib.load("tma_scale", f"{dtype}-m{bm}n64-w4"), dtype, bm, jit=False)
    _, y_jit = run_scale(tma_scale_kernel, dtype, bm, jit=True)
    assert same_bits(y, y_jit)
    assert torch.equal(y, (x.float() * 0.75).to(x.dtype))   # every element written: not two untouched buffers


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("warps", [4, 8])
def test_tma_matmul_from_the_bundle_is_bit_identical_to_triton_s_jit(lib, dtype, warps):
    kernel = lib.load("tma_matmul", f"{dtype}-m128n128k64-w{warps}s3")
    a, b, c = run_matmul(kernel, dtype, warps, "zero", jit=False)
    _, _, c_jit = run_matmul(tma_matmul_kernel, dtype, warps, "zero", jit=True)
    assert same_bits(c, c_jit)
    ref = a.float() @ b.float()
    assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2   # K's tail read as zeros
    # "nan" padding: the K tail past the tensors reads as NaN, so every output is NaN, as under the JIT
    _, _, c_nan = run_matmul(kernel, dtype, warps, "nan", jit=False)
    _, _, c_nan_jit = run_matmul(tma_matmul_kernel, dtype, warps, "nan", jit=True)
    assert c_nan.isnan().all() and same_bits(c_nan, c_nan_jit)


def test_descriptor_kernels_are_served_to_unchanged_call_sites(lib):
    """serve(strict=True): every call with TensorDescriptors is matched to the bundle's specialization and
    launched from it (Triton's cache then holds kforge's Served kernel), 0 compiled, outputs identical."""
    expected = {("scale", dtype): run_scale(tma_scale_kernel, dtype, 128, jit=True)[1] for dtype in DTYPES}
    expected.update({("matmul", dtype): run_matmul(tma_matmul_kernel, dtype, 8, "zero", jit=True)[2]
                     for dtype in ("bf16", "fp16")})
    for fn in (tma_scale_kernel, tma_matmul_kernel):   # forget the JIT's compiles: the calls below must be served
        fn.device_caches.clear()
    server = serve.serve(Library(DIST), strict=True)
    try:
        got = {("scale", dtype): run_scale(tma_scale_kernel, dtype, 128, jit=True)[1] for dtype in DTYPES}
        got.update({("matmul", dtype): run_matmul(tma_matmul_kernel, dtype, 8, "zero", jit=True)[2]
                    for dtype in ("bf16", "fp16")})
        held = [k for fn in (tma_scale_kernel, tma_matmul_kernel) for k in fn.device_caches[0][0].values()]
    finally:
        serve.stop()
        for fn in (tma_scale_kernel, tma_matmul_kernel):
            fn.device_caches.clear()
    assert (server.served, server.compiled, server.misses) == (5, 0, [])
    assert len(held) == 5 and all(isinstance(k, serve.Served) for k in held)
    assert all(same_bits(got[k], expected[k]) for k in expected), [k for k in expected
                                                                   if not same_bits(got[k], expected[k])]


def run_device_scale(launch, dtype, jit: bool):
    """tma_device_scale over a strided x (rows 320 apart) into a contiguous y, 64 x 64 blocks."""
    x, y = scale_inputs(dtype)
    y = y.contiguous()
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    args = (x, y, M, N, x.stride(0), 0.75)
    if jit:
        launch[grid](*args, BLOCK_M=64, BLOCK_N=64, num_warps=4)
    else:
        launch(grid, *args)
    torch.cuda.synchronize()
    return x, y


@pytest.fixture
def allocator():
    """The global scratch memory a launch asks for, from torch (as a library sets it); the sizes asked."""
    asked = []

    def allocate(size, align, stream):
        asked.append((size, align))
        return torch.empty(size, dtype=torch.int8, device="cuda")
    triton.set_allocator(allocate)
    yield asked
    triton.set_allocator(triton.runtime._allocation.NullAllocator())


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_kernel_making_descriptors_on_the_gpu_gets_its_scratch_memory_from_the_bundle_and_served(lib, dtype,
                                                                                                 allocator):
    """The loader asks triton.set_allocator's allocator for the scratch memory, as Triton's launcher does: the
    bundle's launch and a strict serve() of the unchanged call give the JIT's bits."""
    programs = triton.cdiv(M, 64) * triton.cdiv(N, 64)
    x, y = run_device_scale(lib.load("tma_device_scale", f"{dtype}-m64n64-w4"), dtype, jit=False)
    assert allocator and allocator[-1][0] == programs * 256, allocator   # 128 bytes a descriptor, two a program
    _, y_jit = run_device_scale(tma_device_scale_kernel, dtype, jit=True)
    assert same_bits(y, y_jit) and torch.equal(y, (x.float() * 0.75).to(x.dtype))
    tma_device_scale_kernel.device_caches.clear()
    server = serve.serve(Library(DIST), strict=True)
    try:
        _, y_served = run_device_scale(tma_device_scale_kernel, dtype, jit=True)
        held = list(tma_device_scale_kernel.device_caches[0][0].values())
    finally:
        serve.stop()
        tma_device_scale_kernel.device_caches.clear()
    assert (server.served, server.compiled, server.misses) == (1, 0, [])
    assert len(held) == 1 and isinstance(held[0], serve.Served) and same_bits(y_served, y_jit)


def test_an_allocator_that_fails_is_one_launch_error_and_the_next_good_one_gives_the_jits_bits(lib):
    """An allocator that raises, returns None, or a CPU tensor: one line of LaunchError naming the scratch memory;
    then a good one on the same Kernel gives the kernel's result."""
    from kforge_runtime.launch import LaunchError
    kernel = lib.load("tma_device_scale", "bf16-m64n64-w4")

    def raising(size, align, stream):
        raise MemoryError("out of scratch")
    failing = {"raises": raising, "None": lambda size, align, stream: None,
               "a CPU tensor": lambda size, align, stream: torch.empty(size, dtype=torch.int8)}
    try:
        for what, allocate in failing.items():
            triton.set_allocator(allocate)
            with pytest.raises(LaunchError, match="scratch memory") as refused:
                run_device_scale(kernel, "bf16", jit=False)
            assert "\n" not in str(refused.value), (what, str(refused.value))
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        x, y = run_device_scale(kernel, "bf16", jit=False)
    finally:
        triton.set_allocator(triton.runtime._allocation.NullAllocator())
    assert torch.equal(y, (x.float() * 0.75).to(x.dtype))
