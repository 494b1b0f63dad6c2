"""What a loaded spec is: the frozen Spec and Tune, config values, and SpecError. Loading: rules/spec.py;
sweeps and config ids: rules/sweep.py (both build on this module, not on each other)."""
from __future__ import annotations

import re
from dataclasses import dataclass

Scalar = int | float | bool | str
Config = tuple[tuple[str, Scalar], ...]   # (param, value) pairs in the sweep's key order

COMPILE_OPTIONS = ("num_warps", "num_stages")
TYPE_VAR_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SpecError(ValueError):
    """A spec that cannot be built; the message says where, what was received and what is allowed."""


@dataclass(frozen=True)
class Tune:
    """[tune]: the problem shapes `doit tune` benchmarks the family's configs on, and how to make them."""
    harness: str                        # module file with problem(shape, types, device) and grid(shape, config)
    shape_args: tuple[str, ...]         # runtime integer arguments that make up a shape, e.g. (M, N, K)
    shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Spec:
    path: str                       # the TOML file, as given (for messages)
    name: str                       # kernel family: doit task basename, out/<arch>/<name>/
    source: str                     # kernel source, relative to the project root
    entry: str                      # the @triton.jit function in it
    toolchain: str
    archs: tuple[str, ...]
    id_template: str
    signature: tuple[tuple[str, str], ...]   # (argument, type | "constexpr"); types may hold {type_var}
    constants: tuple[tuple[str, Scalar], ...]
    divisible_by_16: tuple[str, ...]
    configs: tuple[Config, ...]     # sweep product + extras - excludes that match every arch
    excludes: tuple[tuple[tuple[str, Scalar | tuple[Scalar, ...]], ...], ...]
    description: str = ""
    tune: Tune | None = None

    @property
    def constexprs(self) -> tuple[str, ...]:
        return tuple(a for a, t in self.signature if t == "constexpr")

    @property
    def type_vars(self) -> tuple[str, ...]:
        found: list[str] = []
        for _, t in self.signature:
            found += [v for v in TYPE_VAR_RE.findall(t) if v not in found]
        return tuple(found)
