"""kforge's runtime: open kernel bundles and launch their precompiled kernels, with no compiler.

Importable without doit, Triton, FlyDSL or torch, and self-contained (relative imports only):
`doit package` copies this package into every bundle wheel, so an application needs only the wheel.

    lib = Library("out/dist")                          # or a wheel, or an installed bundle's directory
    gemm = lib.load("gemm", "bf16-m128n128k64-w8s3-split1")   # a config id, or a dict of config values
    gemm(grid, a, b, c, M, N, K, K, N, N, stream=torch.cuda.current_stream().cuda_stream)
"""
import importlib

_EXPORTS = {"Bundle": "bundle", "BundleError": "bundle", "NoMatchingKernel": "bundle",
            "Kernel": "launch", "LaunchError": "launch", "Library": "library"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Imported on first use: the build imports only schema, elf and archs and pays for nothing else."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
