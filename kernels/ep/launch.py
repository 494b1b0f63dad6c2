"""How the op runs its kernels: precompiled, from a kforge bundle (`doit package`: specs/ep_*.toml), or by
Triton's JIT. A bundle that lacks a config is an error unless jit_fallback=True: never a silent compile."""
from __future__ import annotations

import torch

from kernels.ep import triton_kernels as tk

FAMILIES = {"ep_route": tk.route_kernel, "ep_dispatch": tk.dispatch_kernel, "ep_combine": tk.combine_kernel,
            "ep_barrier": tk.barrier_kernel, "ep_exchange_counts": tk.exchange_counts_kernel,
            "ep_dispatch_done": tk.dispatch_done_kernel}
# The same values as [constants] in specs/ep_*.toml (tests/test_ep_launch.py checks): the JIT path uses them.
# ep_dispatch's BLOCK_T must be ep_route's: it finds each token's block of the route.
CONSTANTS = {"ep_route": {"BLOCK_T": 256}, "ep_exchange_counts": {"BLOCKS": 64},
             "ep_dispatch": {"BLOCK_H": 1024, "BLOCK_T": 256}, "ep_combine": {"BLOCK_H": 1024}}


class EpKernels:
    def __init__(self, library=None, jit_fallback: bool = False):
        self.library, self.jit_fallback = library, jit_fallback
        self._loaded: dict[tuple, object] = {}
        self.sources: dict[str, str] = {}   # target-ish name -> "bundle <wheel>" | "triton jit"

    def __call__(self, family: str, config: dict, grid: tuple, *args) -> None:
        key = (family, tuple(sorted(config.items())))
        launch = self._loaded.get(key)
        if launch is None:
            launch = self._loaded[key] = self._load(family, config)
        launch(grid, *args)

    def _load(self, family: str, config: dict):
        name = f"{family}{config}"
        if self.library is not None:
            from kforge_runtime import NoMatchingKernel
            try:
                bundle, entry = self.library.select(family, config)
            except NoMatchingKernel:
                if not self.jit_fallback:
                    raise
            else:
                kernel = bundle.kernel(entry)   # the entry select() picked: no second lookup
                self.sources[name] = f"bundle {bundle.path.name}"
                return lambda grid, *args: kernel(grid, *args, stream=torch.cuda.current_stream().cuda_stream)
        fn = FAMILIES[family]
        constexprs = {**{k: v for k, v in config.items() if k != "dtype"}, **CONSTANTS.get(family, {})}
        self.sources[name] = "triton jit"
        return lambda grid, *args: fn[grid](*args, **constexprs)
