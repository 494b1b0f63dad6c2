"""The runtime loader's Python cost per launch, on the CPU: argument checks and packing up to the driver call.

Usage (no GPU needed; after `doit package` made out/dist): python bench/launch_overhead.py [dist_dir]
       [--target ep_dispatch:bf16-w4-k8-hwtrue@sm_90a] [--calls 20000]
The kernel is the bundle's entry for --target; the driver is replaced by a function that returns success at
once and the tensors by stand-ins with a GPU dtype and address, so what is timed is the loader's own work.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kforge_runtime import launch  # noqa: E402
from kforge_runtime.bundle import Bundle  # noqa: E402


class GpuTensor:
    """A tensor as the loader sees it: a dtype, is_cuda and a 16-byte-aligned address."""

    def __init__(self, dtype):
        self.dtype, self.is_cuda = dtype, True

    def data_ptr(self) -> int:
        return 1 << 20


def driverless_kernel(entry: dict) -> launch.Kernel:
    """A Kernel with what the driver would have set (module, function, launch call) stubbed; a binary compiled
    with launch options (launch_pdl, ...) gets the LaunchConfig Kernel makes for it and a stubbed cuLaunchKernelEx."""
    kernel = object.__new__(launch.Kernel)
    kernel.entry, kernel.name, kernel._func = entry, entry["target"], None
    kernel._launch = lambda *args: 0
    kernel._threads, kernel._shared = entry["threads_per_block"], entry["shared"]
    kernel._arguments, kernel._lock = launch.Arguments(entry), threading.Lock()
    kernel._context, kernel._ctas = None, (entry.get("options") or {}).get("num_ctas", 1)
    kernel._config = None   # as Kernel sets it: a LaunchConfig for a binary that needs cuLaunchKernelEx
    attributes = launch.launch_attributes(entry.get("options") or {}, "nvidia", kernel.name)
    if attributes:
        kernel._attributes = (launch.LaunchAttribute * len(attributes))()
        for slot, (kind, words) in zip(kernel._attributes, attributes):
            slot.id = kind
            slot.value.words[:len(words)] = words
        kernel._config = launch.LaunchConfig(
            blockDimX=kernel._threads, blockDimY=1, blockDimZ=1, sharedMemBytes=kernel._shared,
            attrs=ctypes.cast(kernel._attributes, ctypes.POINTER(launch.LaunchAttribute)), numAttrs=len(attributes))
        kernel._launch_ex = lambda *args: 0
    return kernel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist", nargs="?", default="out/dist")
    ap.add_argument("--target", default="ep_dispatch:bf16-w4-k8-hwtrue@sm_90a")
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    arch = a.target.rsplit("@", 1)[1]
    wheel = next(Path(a.dist).glob(f"kforge_kernels_{arch}-*.whl"))
    entry = next(e for e in Bundle(wheel).artifacts if e["target"] == a.target)
    args = [GpuTensor(getattr(torch, launch.TORCH_DTYPES.get(s["type"][1:], "torch.int64")[len("torch."):]))
            if s["type"].startswith("*") else 7168 for s in entry["signature"]]
    kernel = driverless_kernel(entry)
    kernel((1, 1), *args)   # the first call checks the dtypes
    start = time.perf_counter()
    for _ in range(a.calls):
        kernel((4096, 7), *args)
    per_call = (time.perf_counter() - start) / a.calls
    print(f"{a.target}: {len(args)} arguments, {per_call * 1e6:.1f} us of Python per launch "
          f"(mean of {a.calls}; driver stubbed)")


if __name__ == "__main__":
    main()
