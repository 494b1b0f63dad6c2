"""The runtime loader on a GPU (pytest -m gpu, on an H100/H200 with out/dist from `doit package`)."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

from kforge_runtime import Library  # noqa: E402

DIST = Path(os.environ.get("KFORGE_DIST", Path(__file__).resolve().parents[1] / "out" / "dist"))
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
