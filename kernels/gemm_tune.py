"""Tuning problems for gemm (specs/gemm.toml [tune]): random A, B of a shape and their product in f32.

Imported only by the tuner and benchmarks, on a GPU machine (it imports torch); the kernel's binaries do
not depend on it.
"""
import torch


def problem(shape: dict, types: dict, device) -> dict:
    m, n, k = shape["M"], shape["N"], shape["K"]
    dtype = types["dtype"]
    # entries ~ N(0, 1/sqrt(K)) keep every output ~ N(0, 1), so one tolerance fits every K
    scale = k ** -0.25
    a = (torch.randn(m, k, device=device) * scale).to(dtype)
    b = (torch.randn(k, n, device=device) * scale).to(dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    return {
        "args": {"a_ptr": a, "b_ptr": b, "c_ptr": c, "M": m, "N": n, "K": k,
                 "stride_am": a.stride(0), "stride_bk": b.stride(0), "stride_cm": c.stride(0)},
        "output": c,
        "reference": lambda: a.float() @ b.float(),
        "atol": 2e-2, "rtol": 2e-2,   # output rounding (bf16: 2^-8 relative) plus f32 summation-order noise
    }


def grid(shape: dict, config: dict) -> tuple:
    tiles_m = -(-shape["M"] // config["BLOCK_M"])
    tiles_n = -(-shape["N"] // config["BLOCK_N"])
    return (tiles_m * tiles_n, config["SPLIT_K"])


def prepare(problem: dict, config: dict) -> None:
    """Split-K adds its partial products into C, so C starts at zero (timed with the kernel)."""
    if config["SPLIT_K"] > 1:
        problem["output"].zero_()
