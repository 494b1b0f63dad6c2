"""The GPU architectures kforge builds for: one table, keyed by the names specs and bundles use. Adding an arch
is one row here (the build, the ELF checks and the loader all read it). Stdlib only: shipped in bundles.
"""
from __future__ import annotations

from typing import NamedTuple


class Arch(NamedTuple):   # NamedTuple, not a dataclass: cheaper to import at every cold start
    name: str                # as written in specs: "sm_90a", "gfx942"
    vendor: str              # "nvidia" | "amd"
    backend: str             # Triton's GPUTarget backend: "cuda" | "hip"
    target_arch: int | str   # Triton's GPUTarget arch: 90 | "gfx942"
    warp_size: int
    binary_ext: str          # "cubin" | "hsaco"
    max_shared: int          # bytes of shared memory (LDS) one block may use
    amdgpu_mach: int | None  # an AMD code object's EF_AMDGPU_MACH_AMDGCN_* value in e_flags (NVIDIA: the SM
                             # in e_flags is read as a number, no table needed)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_80", "nvidia", "cuda", 80, 32, "cubin", 166912, None),
    Arch("sm_90a", "nvidia", "cuda", 90, 32, "cubin", 232448, None),
    Arch("sm_100a", "nvidia", "cuda", 100, 32, "cubin", 232448, None),
    Arch("gfx90a", "amd", "hip", "gfx90a", 64, "hsaco", 65536, 0x3F),
    Arch("gfx942", "amd", "hip", "gfx942", 64, "hsaco", 65536, 0x4C),
    Arch("gfx950", "amd", "hip", "gfx950", 64, "hsaco", 163840, 0x4F),
)}
