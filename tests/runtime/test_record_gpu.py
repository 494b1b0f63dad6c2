"""rules/runtime/record.py on a GPU, under Triton's own autotuner: a kernel that the tuning itself launches is
recorded (tests/runtime/test_record.py holds the same on a CPU, with Triton's driver stubbed)."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

# A library that puts torch's zero_ under a Triton kernel of its own, as flag_gems does; Triton's do_bench clears
# the L2 before each measured call with cache.zero_() on an int32 buffer, so that kernel runs while the tuner runs.
APP = '''
import torch, triton, triton.language as tl

@triton.jit
def zeros_kernel(out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty), mask=i < n)

def zero_(x):
    zeros_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)
    return x

lib = torch.library.Library("aten", "IMPL")
lib.impl("zero_", zero_, "CUDA")

@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"])
@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

x = torch.randn(4096, device="cuda")
y = torch.empty_like(x)
scale[lambda m: (triton.cdiv(4096, m["BLOCK"]),)](x, y, 4096)
torch.cuda.synchronize()
assert torch.equal(y, x * 2)
'''


def test_a_kernel_the_autotuners_benchmark_launches_is_recorded_and_the_candidates_are_not(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    record = tmp_path / "app.jsonl"
    proc = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KFORGE_RECORD": str(record)})
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(t) for t in record.read_text().splitlines()]
    assert sorted((r["kernel"], r["signature"][0][1], "autotune" in r) for r in lines) == [
        ("__main__:scale", "*fp32", True), ("__main__:zeros_kernel", "*i32", False)]
