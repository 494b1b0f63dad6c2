"""The opt-in fallback: Triton JIT-compiles a kernel from its source when no bundle has it for this GPU."""
from __future__ import annotations

import importlib

from .launch import LaunchError


class JitKernel:
    """Same call as launch.Kernel: (grid, *args, stream=). Pointer arguments must be torch tensors here."""

    def __init__(self, recipe: dict):
        self.entry = recipe
        self.name = recipe["target"]
        if recipe.get("toolchain") != "triton":
            raise LaunchError(f"{self.name}: only Triton kernels can fall back to a JIT compile")
        source = recipe["source"]
        try:
            module = importlib.import_module(source["module"])
        except ImportError as e:
            raise LaunchError(f"{self.name}: the JIT fallback needs triton and {source['module']} importable "
                              f"(put the kforge checkout on PYTHONPATH): {e}") from None
        self.fn = getattr(module, source["entry"])
        options = recipe.get("options", {})
        self.kwargs = {**recipe["constexprs"], **{k: options[k] for k in ("num_warps", "num_stages") if k in options}}

    def __call__(self, grid, *args, stream: int = 0) -> None:
        if not stream:
            self.fn[tuple(grid)](*args, **self.kwargs)
            return
        import torch
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            self.fn[tuple(grid)](*args, **self.kwargs)
