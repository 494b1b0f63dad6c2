"""Launch sm_90a kernels from the bundle (out/dist) through the runtime loader and compare with torch.

Usage (on an H100/H200, after `doit package` ran anywhere): python bench/gpu_check.py [dist_dir]
Samples configs of every single-GPU kernel family in the bundle (the ep_* dispatch/combine kernels need
several GPUs: `doit verify_dispatch_combine` runs them). Exits non-zero if any is wrong, if Triton was
imported, or if anything was written to the (fresh, empty) Triton cache: nothing may be compiled.
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = CACHE = tempfile.mkdtemp(prefix="triton-cache-")   # must stay empty
import torch  # noqa: E402

from kforge_runtime import Library  # noqa: E402
from kforge_runtime.device import runnable_archs  # noqa: E402

DIST = Path(sys.argv[1] if len(sys.argv) > 1 else "out/dist")
SAMPLES = 12
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
cdiv = lambda a, b: (a + b - 1) // b


def rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check_gemm(k, c: dict):
    M, N, K = 1000, 1536, 512
    a = torch.randn(M, K, device="cuda", dtype=DT[c["dtype"]])
    b = torch.randn(K, N, device="cuda", dtype=DT[c["dtype"]])
    split = c.get("SPLIT_K", 1)   # split-K adds into C: it starts at zero
    out = torch.full((M, N), 0.0 if split > 1 else float("nan"), device="cuda", dtype=a.dtype)
    k((cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"]), split), a, b, out, M, N, K, K, N, N)
    return rel_err(out, a.double() @ b.double()), 1e-2


def check_rowwise(k, c: dict, norm: bool):
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


def check_moe(k, c: dict):
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


class Descriptor:
    """A host tensor descriptor with the fields the loader reads (triton.tools.tensor_descriptor's), so that Triton
    is not imported."""

    def __init__(self, t, block: list[int], padding: str = "zero"):
        self.base, self.shape, self.strides = t, list(t.shape), list(t.stride())
        self.block_shape, self.padding = block, padding


def check_tma_scale(k, c: dict):
    M, N, BM, BN = 300, 264, c["BLOCK_M"], c["BLOCK_N"]   # no multiple of a block: stores clipped at the edges
    x = torch.randn(M, N + 56, device="cuda", dtype=DT[c["dtype"]])[:, :N]   # a strided view
    y = torch.full((M, N), -7.0, device="cuda", dtype=x.dtype)
    k((cdiv(M, BM), cdiv(N, BN)), Descriptor(x, [BM, BN]), Descriptor(y, [BM, BN]), 0.75)
    return rel_err(y, (x.float() * 0.75).to(x.dtype)), 1e-6   # exact, unless an element was not written


def check_tma_matmul(k, c: dict):
    M, N, K, BM, BN, BK = 300, 264, 208, c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]   # K's tail read as zeros
    a = torch.randn(M, K, device="cuda", dtype=DT[c["dtype"]])
    b = torch.randn(K, N, device="cuda", dtype=a.dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=a.dtype)
    k((cdiv(M, BM), cdiv(N, BN)), Descriptor(a, [BM, BK]), Descriptor(b, [BK, BN]), Descriptor(out, [BM, BN]), K)
    return rel_err(out, a.double() @ b.double()), 1e-2


def check_tma_device_scale(k, c: dict):
    """Descriptors made in the kernel: the loader asks its allocator (Triton is not imported) for scratch memory."""
    from kforge_runtime import launch
    launch.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    M, N, BM, BN = 300, 264, c["BLOCK_M"], c["BLOCK_N"]
    x = torch.randn(M, N + 56, device="cuda", dtype=DT[c["dtype"]])[:, :N]   # rows 320 apart
    y = torch.full((M, N), -7.0, device="cuda", dtype=x.dtype)
    k((cdiv(M, BM), cdiv(N, BN)), x, y, M, N, x.stride(0), 0.75)
    return rel_err(y, (x.float() * 0.75).to(x.dtype)), 1e-6


CHECKS = {"gemm": check_gemm, "rmsnorm": lambda k, c: check_rowwise(k, c, True),
          "softmax": lambda k, c: check_rowwise(k, c, False), "moe_gemm": check_moe,
          "tma_scale": check_tma_scale, "tma_matmul": check_tma_matmul, "tma_device_scale": check_tma_device_scale}


def main() -> int:
    torch.manual_seed(0)
    random.seed(0)
    torch.empty(1, device="cuda")   # torch's context: the loader launches into the current one
    lib = Library(DIST)
    bundle = lib.bundles_for(runnable_archs()[1])[0]   # the bundle for this GPU: sm_90a on an H100/H200
    print(f"device: {torch.cuda.get_device_name()}  bundle: {bundle.path.name} ({len(bundle.artifacts)} artifacts)")
    families = sorted({e["kernel"] for e in bundle.artifacts})
    multi_gpu = [f for f in families if f.startswith("ep_")]   # checked by `doit verify_dispatch_combine`
    missing = sorted(set(families) - set(CHECKS) - set(multi_gpu))
    failures = rows = 0
    for family in families:
        if family not in CHECKS:
            continue
        ids = sorted(e["config_id"] for e in bundle.artifacts if e["kernel"] == family)
        for cid in sorted(ids if len(ids) <= SAMPLES else random.sample(ids, SAMPLES)):
            k = lib.load(family, cid)
            err, tol = CHECKS[family](k, k.entry["config"])
            torch.cuda.synchronize()
            ok = err < tol
            failures += not ok
            rows += 1
            print(f"{'ok  ' if ok else 'FAIL'} {k.name:<55} rel_err {err:.2e} (tol {tol:.0e})")
    compiled = sorted(str(p.relative_to(CACHE)) for p in Path(CACHE).rglob("*"))
    triton_loaded = "triton" in sys.modules
    print(f"\n{rows} artifacts launched from the bundle, {failures} wrong; families {families}, "
          f"multi-GPU (verify_dispatch_combine) {multi_gpu}; unchecked {missing}; triton imported: "
          f"{triton_loaded}; files in the Triton cache: {len(compiled)}")
    return 1 if failures or triton_loaded or compiled or missing or rows == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
