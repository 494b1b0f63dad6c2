"""The GPU architectures kforge compiles for, and what Triton needs to know about each.

One table, keyed by the arch name users write in specs and on the command line.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str            # as written in specs: "sm_90a", "gfx942"
    vendor: str          # "nvidia" | "amd"
    backend: str         # Triton's GPUTarget backend: "cuda" | "hip"
    target_arch: int | str  # Triton's GPUTarget arch: 90 | "gfx942"
    warp_size: int
    binary_ext: str      # "cubin" | "hsaco"  (rules/runtime/elf.py tells a binary's arch from its ELF header)
    max_shared: int      # bytes of shared memory (LDS) one block may use

    def check_shared(self, used: int) -> None:
        """A kernel needing more shared memory (LDS) than one block may use could never launch here."""
        if used > self.max_shared:
            raise RuntimeError(f"needs {used} bytes of shared memory (LDS); {self.name} has {self.max_shared}: "
                               f"it could never launch there; add an [[exclude]] for this config")


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_80", "nvidia", "cuda", 80, 32, "cubin", 166912),
    Arch("sm_90a", "nvidia", "cuda", 90, 32, "cubin", 232448),
    Arch("sm_100a", "nvidia", "cuda", 100, 32, "cubin", 232448),
    Arch("gfx90a", "amd", "hip", "gfx90a", 64, "hsaco", 65536),
    Arch("gfx942", "amd", "hip", "gfx942", 64, "hsaco", 65536),
    Arch("gfx950", "amd", "hip", "gfx950", 64, "hsaco", 163840),
)}

DEFAULT_ARCHS = ("sm_90a", "gfx942", "gfx950")


def parse_arch_list(text: str, where: str) -> tuple[str, ...]:
    """'sm_90a,gfx942' -> ('sm_90a', 'gfx942'); unknown names stop with the allowed ones."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ARCHS]
    if unknown or not names:
        raise ValueError(f"{where}: unknown arch {', '.join(unknown) or repr(text)}; "
                         f"allowed: {', '.join(ARCHS)}")
    return names
