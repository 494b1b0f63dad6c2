"""Launch saved sm_90a artifacts from out/ through the CUDA driver (no Triton, no compile) and compare with torch.

Usage (on a GPU machine, after the artifacts were built anywhere): python bench/gpu_check.py [out_dir]
Exits non-zero if any sampled config is wrong. Checks that nothing was compiled: Triton is never imported.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from rules.cuda_driver import Kernel

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out") / "sm_90a"
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
cdiv = lambda a, b: (a + b - 1) // b


def rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check_gemm(k: Kernel, c: dict):
    M, N, K = 1000, 1536, 512
    a = torch.randn(M, K, device="cuda", dtype=DT[c["dtype"]])
    b = torch.randn(K, N, device="cuda", dtype=DT[c["dtype"]])
    out = torch.full((M, N), float("nan"), device="cuda", dtype=a.dtype)
    k((cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"]),), a, b, out, M, N, K, K, N, N)
    return rel_err(out, a.double() @ b.double()), 1e-2


def check_rowwise(k: Kernel, c: dict, norm: bool):
    M, N = 333, c["BLOCK_N"] - 48 if c["BLOCK_N"] > 512 else c["BLOCK_N"]   # row stride stays 16-divisible
    x = torch.randn(M, N, device="cuda", dtype=DT[c["dtype"]])
    y = torch.full_like(x, float("nan"))
    if norm:
        w = torch.randn(N, device="cuda", dtype=x.dtype)
        k((M,), x, w, y, N, N, N, 1e-6)
        xd = x.double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    else:
        k((M,), x, y, N, N, N)
        ref = torch.softmax(x.double(), -1)
    return rel_err(y, ref), 1e-2 if c["dtype"] != "fp32" else 1e-5


def check_moe(k: Kernel, c: dict):
    T, E, top_k, N, K, BM = 300, 8, 2, 512, 256, c["BLOCK_M"]
    dt = DT[c["dtype"]]
    a = torch.randn(T, K, device="cuda", dtype=dt)
    b = torch.randn(E, N, K, device="cuda", dtype=dt) / 16
    topk_ids = torch.stack([torch.randperm(E, device="cuda")[:top_k] for _ in range(T)]).int()
    topk_w = torch.rand(T, top_k, device="cuda", dtype=torch.float32)
    slots = T * top_k
    flat = topk_ids.flatten()
    sorted_ids, block_expert = [], []
    for e in range(E):   # each expert's slots, padded to a multiple of BLOCK_M with the out-of-range id
        ids = (flat == e).nonzero().flatten().int().tolist()
        ids += [slots] * ((-len(ids)) % BM)
        sorted_ids += ids
        block_expert += [e] * (len(ids) // BM)
    sorted_t = torch.tensor(sorted_ids, device="cuda", dtype=torch.int32)
    expert_t = torch.tensor(block_expert, device="cuda", dtype=torch.int32)
    out = torch.full((slots, N), float("nan"), device="cuda", dtype=dt)
    padded = len(sorted_ids)
    k((cdiv(padded, BM) * cdiv(N, c["BLOCK_N"]),), a, b, out, topk_w.flatten(), sorted_t, expert_t,
      padded, N, K, slots, top_k, K, N * K, K, N)
    ref = torch.einsum("tk,tnk->tn", a.double().repeat_interleave(top_k, 0), b.double()[flat.long()])
    if c["MUL_ROUTED_WEIGHT"]:
        ref = ref * topk_w.flatten().double()[:, None]
    return rel_err(out, ref), 1e-2


CHECKS = {"gemm": check_gemm, "rmsnorm": lambda k, c: check_rowwise(k, c, True),
          "softmax": lambda k, c: check_rowwise(k, c, False), "moe_gemm": check_moe}


def main() -> int:
    torch.manual_seed(0)
    random.seed(0)
    torch.cuda.init()
    torch.empty(1, device="cuda")   # make torch's primary context current for the driver calls
    failures = rows = 0
    print(f"device: {torch.cuda.get_device_name()}  artifacts: {OUT}")
    for family, check in CHECKS.items():
        dirs = sorted(p.parent for p in (OUT / family).glob("*/meta.json"))
        sample = dirs if len(dirs) <= 12 else random.sample(dirs, 12)
        for d in sorted(sample):
            k = Kernel(d)
            err, tol = check(k, k.meta["config"])
            torch.cuda.synchronize()
            ok = err < tol
            failures += not ok
            rows += 1
            print(f"{'ok  ' if ok else 'FAIL'} {k.meta['target']:<55} rel_err {err:.2e} (tol {tol:.0e})")
    triton_loaded = "triton" in sys.modules
    print(f"\n{rows} artifacts launched, {failures} wrong; triton imported: {triton_loaded}")
    return 1 if failures or triton_loaded or rows == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
