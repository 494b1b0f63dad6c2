"""A light application: Triton kernels over torch tensors and nothing else to import (kforge's row softmax,
kernels/softmax.py, at 20 specializations: bf16 and fp16, BLOCK_N 512 to 8192, 4 and 8 warps). Its call sites
are the specializations specs/softmax.toml builds (N not 16-divisible, strides and pointers 16-divisible), so
the project's own bundle (`doit archs=sm_90a`, out/dist) serves every one. Nothing here knows about kforge.

Usage (on a GPU): python bench/light_app.py [--out outputs.pt]   (or under torchrun: each rank on GPU LOCAL_RANK)
Prints one JSON line: seconds to the first kernel's result and to all 20 (after torch import, CUDA init and
input allocation), the seconds of the same calls again (the steady state), the calls, and the largest error
against torch.softmax.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kernels/ (a project file, not installed)
from kernels.softmax import softmax_kernel  # noqa: E402

CALLS = [(dtype, block, warps) for dtype in (torch.bfloat16, torch.float16) for block in (512, 1024, 2048, 4096, 8192)
         for warps in (4, 8)]
ROWS = 64


def inputs() -> list:
    g = torch.Generator(device="cuda").manual_seed(0)
    made = []
    for dtype, block, warps in CALLS:
        n = block - 3   # not 16-divisible, as the spec builds it; the row stride (block) is
        x = torch.randn(ROWS, block, device="cuda", dtype=dtype, generator=g)
        made.append((x, torch.empty_like(x), n, block, warps))
    return made


def call(x, y, n, block, warps) -> None:
    softmax_kernel[(ROWS,)](x, y, n, x.stride(0), y.stride(0), BLOCK_N=block, num_warps=warps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="save every output (torch.save), to compare runs")
    a = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())   # a torchrun rank's GPU
    data = inputs()
    torch.cuda.synchronize()
    start = time.perf_counter()
    first = None
    for args in data:
        call(*args)
        if first is None:
            torch.cuda.synchronize()
            first = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    start = time.perf_counter()
    for args in data:
        call(*args)
    torch.cuda.synchronize()
    again = time.perf_counter() - start
    error = max((y[:, :n].float() - torch.softmax(x[:, :n].float(), dim=1)).abs().max().item()
                for x, y, n, _, _ in data)
    if a.out:
        torch.save({f"softmax-{d}-{b}-w{w}".replace("torch.", ""): [y[:, :n].cpu()]
                    for (d, b, w), (_, y, n, _, _) in zip(CALLS, data)}, a.out)
    print(json.dumps({"first_s": round(first, 4), "all_s": round(total, 4), "again_s": round(again, 4),
                      "calls": len(data), "max_error": error}))


if __name__ == "__main__":
    main()
