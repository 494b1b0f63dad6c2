"""The runtime loader on a GPU (pytest -m gpu, on an H100/H200 with out/dist from `doit package`)."""
import functools
import os
from pathlib import Path

import pytest
from tests.support import REPO

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

from kforge_runtime import Library  # noqa: E402

DIST = Path(os.environ.get("KFORGE_DIST", REPO / "out" / "dist"))
CONFIG = "bf16-m128n128k64-w8s3-split1"


@pytest.fixture(scope="module")
def lib():
    if not list(DIST.glob("*.whl")):
        pytest.skip(f"no bundles in {DIST}: run `doit package` (anywhere) and copy out/dist here")
    torch.empty(1, device="cuda")
    return Library(DIST)


def gemm_inputs(n=512):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return a, b, torch.zeros(n, n, device="cuda", dtype=torch.bfloat16), (a.float() @ b.float())


def rel(x, ref):
    return ((x.float() - ref).norm() / ref.norm()).item()


def test_launch_on_a_side_stream_and_with_raw_pointers(lib):
    gemm = lib.load("gemm", CONFIG)
    n = 512
    a, b, c, ref = gemm_inputs(n)
    grid = ((n // 128) * (n // 128),)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemm(grid, a, b, c, n, n, n, n, n, n, stream=side.cuda_stream)
    side.synchronize()
    assert rel(c, ref) < 1e-2
    c.zero_()
    gemm(grid, a.data_ptr(), b.data_ptr(), c.data_ptr(), n, n, n, n, n, n)
    torch.cuda.synchronize()
    assert rel(c, ref) < 1e-2


def test_wrong_arguments_are_refused_before_launch(lib):
    gemm = lib.load("gemm", CONFIG)
    a, b, c, _ = gemm_inputs(128)
    with pytest.raises(TypeError, match="takes .*got 3 arguments"):
        gemm((1,), a, b, c)
    with pytest.raises(TypeError, match="a_ptr is \\*bf16, got a torch.float16 tensor"):
        gemm((1,), a.half(), b, c, 128, 128, 128, 128, 128, 128)
    with pytest.raises(TypeError, match="CPU tensor"):
        gemm((1,), a.cpu(), b, c, 128, 128, 128, 128, 128, 128)


@functools.cache
def _late_copy_kernel():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, globaltimer

    @triton.jit
    def late_copy_kernel(src, dst, n, NS: tl.constexpr, BLOCK: tl.constexpr):
        gdc_launch_dependents()   # a dependent launched with launch_pdl may start now, before dst is written
        start = globaltimer()
        now = start
        while now - start < NS:
            now = globaltimer()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
    return late_copy_kernel


def late_copy(src, dst, ns: int) -> None:
    """dst = src, written ns nanoseconds after this kernel (Triton's JIT) lets the next launch start."""
    _late_copy_kernel()[(-(-src.numel() // 1024),)](src, dst, src.numel(), NS=ns, BLOCK=1024)


def test_a_binary_built_with_launch_pdl_waits_for_the_kernel_before_it_eagerly_and_in_a_graph(lib):
    """ep_route is compiled with launch_pdl on sm_90 and later: the loader launches it by cuLaunchKernelEx with the
    programmatic-serialization attribute. Right before it, a kernel lets it start at once and only 200 us later
    writes what it reads; it must still read what was written (its griddepcontrol.wait holds it), eagerly and
    under CUDA-graph capture. A route compiled without the wait and launched the same way reads the old input
    (checked by hand on 2 x H100)."""
    from kernels.ep.launch import CONSTANTS
    from kernels.ep.routing import destinations, positions
    route = lib.load("ep_route", "w2-k8")
    if not (route.entry.get("options") or {}).get("launch_pdl"):
        pytest.skip("this device's bundle builds ep_route without launch_pdl (archs before sm_90)")
    assert route._config is not None and route._config.numAttrs == 1
    T, E, W, K, block_t = 3000, 4, 2, 8, CONSTANTS["ep_route"]["BLOCK_T"]
    blocks = -(-T // block_t)
    sources = [torch.randint(-1, E * W + 1, (T, K), device="cuda", dtype=torch.int32) for _ in range(3)]
    idx = sources[2].clone()   # what the route would read if it ran before the late write
    pos = torch.empty(T, W, dtype=torch.int32, device="cuda")
    counts = torch.empty(blocks, W, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()

    def routed(source):
        late_copy(source, idx, 200_000)   # what the route reads, written late
        route((blocks,), idx, pos, counts, T, E, stream=torch.cuda.current_stream().cuda_stream)

    def check(source):
        mask = destinations(source, E, W)
        base = torch.zeros_like(counts)
        base[1:] = torch.cumsum(counts, 0)[:-1]
        landed = torch.where(pos >= 0, pos + base.repeat_interleave(block_t, 0)[:T], -1)
        assert torch.equal(landed, torch.where(mask, positions(mask), -1))

    routed(sources[0])
    torch.cuda.synchronize()
    check(sources[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        routed(sources[1])
    pos.fill_(-9)
    idx.copy_(sources[2])
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    check(sources[1])
