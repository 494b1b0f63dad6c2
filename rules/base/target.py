"""Target: one (kernel, config, arch), the record the catalog, the tasks, the compile and the bundle pass around.
Made by rules/plan/targets.py; a no-op run only loads saved ones, so this imports none of the spec machinery."""
from __future__ import annotations

from typing import NamedTuple

from kforge.base.layout import Layout

FUNCTION_REF = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"


class Target(NamedTuple):
    """One (kernel, config, arch): everything a compile needs, its artifact directory and its action key.
    A NamedTuple, not a dataclass: a no-op run makes thousands from the saved catalog (rules/plan/catalog.py)."""
    kernel: str                 # family name
    config_id: str
    arch: str
    spec_path: str
    toolchain: str
    source: str                 # absolute path of the kernel source
    module: str                 # dotted module name the compiling process imports
    entry: str
    signature: tuple[tuple[str, str], ...]   # resolved: no type variables left
    constexprs: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, int], ...]     # num_warps, num_stages
    divisible_by_16: tuple[str, ...]
    config: tuple[tuple[str, object], ...]   # spec_model.Config: (param, value) in the sweep's key order
    source_digests: tuple[tuple[str, str], ...]
    toolchain_versions: tuple[tuple[str, str], ...]
    layout: Layout              # the project whose out/ holds its artifact: every path below asks it
    key: str
    env: tuple[tuple[str, str], ...] = ()   # the family's [env]: set in the processes that compile it
    # FlyDSL [adapter]: what kforge traces the builder's launcher with, per runtime argument: (name, element
    # type, shape) for a tensor, (name, "scalar", value) otherwise. Empty: the factory returns its own.
    placeholders: tuple[tuple[str, str, object], ...] = ()
    # what `doit info` says beyond the config, (fact, text) pairs (rules/edge/commands.py's NOTES)
    notes: tuple[tuple[str, str], ...] = ()
    device_model: bool = False   # its module is imported as the arch's reference GPU sees it (rules/load/device_model.py)
    setup: tuple[str, ...] = ()  # set-up hooks ("module:function") run before its module is imported
    key_without_sources: str = ""   # the key less its sources' digests (an early cutoff's second chance)
    defaulted: tuple[str, ...] = ()   # Spec.defaulted and Spec.heuristics: checked where it compiles, in no key
    heuristics: tuple[str, ...] | None = None
    recorded_code: tuple[str, ...] = ()   # the source keys its record lines on this arch hold: checked, in no key

    @property
    def name(self) -> str:
        return f"{self.kernel}:{self.config_id}@{self.arch}"

    @property
    def out_dir(self) -> str:
        return self.layout.artifact_path(self.arch, self.kernel, self.config_id)

    @property
    def meta_path(self) -> str:
        return self.layout.meta_path(self.arch, self.kernel, self.config_id)

    @property
    def error_path(self) -> str:
        return self.layout.error_path(self.arch, self.kernel, self.config_id)
