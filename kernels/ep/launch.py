"""How the op runs its kernels: precompiled, from a kforge bundle (`doit package`: specs/ep_*.toml), or by
Triton's JIT. A bundle that lacks a config is an error unless jit_fallback=True, which then takes the
library's JIT fallback (kforge_runtime.Library.load): never a silent compile."""
from __future__ import annotations

import tomllib
from pathlib import Path

import torch

from kernels.ep import triton_kernels as tk

FAMILIES = {"ep_route": tk.route_kernel, "ep_dispatch": tk.dispatch_kernel, "ep_combine": tk.combine_kernel,
            "ep_barrier": tk.barrier_kernel, "ep_dispatch_done": tk.dispatch_done_kernel}
SPECS = Path(__file__).resolve().parents[2] / "specs"


COMPILE_OPTIONS = ("num_warps", "num_stages")


_SPECS = {family: tomllib.loads((SPECS / f"{family}.toml").read_text()) for family in FAMILIES}


def _spec_constants() -> dict[str, dict]:
    """[constants] of specs/ep_*.toml and the compile options their sweeps fix to one value, read from the specs
    themselves: the JIT path (no library) compiles exactly what the bundles hold. ep_dispatch's BLOCK_T must be
    ep_route's: it finds each token's block of the route (tests/kernels/ep/test_launch.py checks)."""
    constants = {}
    for family, spec in _SPECS.items():
        fixed = {k: v[0] for k, v in spec.get("sweep", {}).items() if k in COMPILE_OPTIONS and len(v) == 1}
        constants[family] = {**spec.get("constants", {}), **fixed}
    return constants


CONSTANTS = _spec_constants()
ARCH_CONSTANTS = {family: spec.get("arch", {}) for family, spec in _SPECS.items()}


def arch_constants(family: str, runnable: list[str]) -> dict:
    """The [arch.<name>] values of the family's spec for the first of `runnable` (the device's archs, best first)
    that has such a table: what the bundle of that arch was compiled with."""
    tables = ARCH_CONSTANTS.get(family, {})
    return next(({k: v for k, v in tables[a].items() if k != "env"} for a in runnable if a in tables), {})


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
                # the library's own fallback: the recipe recorded in the bundles, its source checked
                kernel = self.library.load(family, config, jit_fallback=True)
                self.sources[name] = "triton jit (the library's fallback)"
            else:
                kernel = bundle.kernel(entry)   # the entry select() picked: no second lookup
                self.sources[name] = f"bundle {bundle.path.name}"
            return lambda grid, *args: kernel(grid, *args, stream=torch.cuda.current_stream().cuda_stream)
        fn = FAMILIES[family]   # no library: Triton's JIT of the same functions and constants
        from kforge_runtime.device import runnable_archs
        constexprs = {**{k: v for k, v in config.items() if k != "dtype"}, **CONSTANTS.get(family, {}),
                      **arch_constants(family, runnable_archs(torch.cuda.current_device())[1])}
        self.sources[name] = "triton jit"
        return lambda grid, *args: fn[grid](*args, **constexprs)
