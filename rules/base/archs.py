"""The archs a build targets by default, the command line's arch lists, and the shared-memory check of a
compiled kernel. The arch table itself is kforge_runtime.archs (shipped in bundles: the loader reads it too).
"""
from __future__ import annotations

from kforge_runtime.archs import ARCHS, Arch  # noqa: F401  (the one table; kforge.base.archs re-exports it)


class DoesNotFit(RuntimeError):
    """A config of the library's @triton.autotune list needing more shared memory than the arch has: skipped, as
    the autotuner on a GPU skips it."""


def check_shared(arch: Arch, used: int, tuned: bool = False) -> None:
    """A kernel needing more shared memory (LDS) than a block may use never launches: a RuntimeError, or
    DoesNotFit for a config of the library's autotuner (`tuned`)."""
    if used > arch.max_shared and tuned:
        raise DoesNotFit(f"does not fit {arch.name}: needs {used} bytes of shared memory (LDS), the arch has "
                         f"{arch.max_shared}; Triton's autotuner skips this config there too")
    if used > arch.max_shared:
        raise RuntimeError(f"needs {used} bytes of shared memory (LDS); {arch.name} has {arch.max_shared}: "
                           f"it could never launch there; add an [[exclude]] for this config")


DEFAULT_ARCHS = ("sm_90a", "gfx942", "gfx950")


def parse_arch_list(text: str, where: str) -> tuple[str, ...]:
    """'sm_90a,gfx942' -> ('sm_90a', 'gfx942'); unknown names stop with the allowed ones."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ARCHS]
    if unknown or not names:
        raise ValueError(f"{where}: unknown arch {', '.join(unknown) or repr(text)}; "
                         f"allowed: {', '.join(ARCHS)}")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:   # as a spec's archs list: a typo for another arch may hide there
        raise ValueError(f"{where}: {twice} is listed twice; give each arch once")
    return names
