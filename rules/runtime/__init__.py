"""kforge's runtime: open kernel bundles and launch their precompiled kernels, with no compiler.

Importable without doit, Triton, FlyDSL or torch, and self-contained (relative imports only):
`doit package` copies this package into every bundle wheel, so an application needs only the wheel.

    lib = Library("out/dist")                          # or a wheel, or an installed bundle's directory
    gemm = lib.load("gemm", {"dtype": "bf16", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64})
    gemm(grid, a, b, c, M, N, K, K, N, N, stream=torch.cuda.current_stream().cuda_stream)
"""
from .bundle import Bundle, BundleError, NoMatchingKernel
from .launch import Kernel, LaunchError
from .library import Library

__all__ = ["Bundle", "BundleError", "Kernel", "LaunchError", "Library", "NoMatchingKernel"]
