"""Triton ahead-of-time compile of one Target. Imported only by processes that compile."""
from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from kforge import amdgpu_metadata
from kforge.archs import ARCHS

_root = ""
ARCH_PER_PROCESS = False   # the arch is an argument of each compile: one warm server serves them all
# Each compile server imports Triton itself: on the 16-CPU H100 host, builds were 1.04x and 1.02x as fast that
# way as when the servers inherited the import from the doit master (two runs of 6 and 5 alternating pairs,
# docs/benchmarks.md), though each server then pays the 0.5 s import.
IMPORT_IN = "server"


def warm(root: str) -> None:
    """Once per process, before forking the compile server: import Triton and pay its toolchain hash (triton_key)."""
    global _root
    if _root == root:
        return
    if root not in sys.path:
        sys.path.insert(0, root)
    import triton.compiler  # noqa: F401  (the import itself is part of the warm-up)
    from triton.runtime.cache import triton_key
    triton_key()   # hashes libtriton once; the forked compile server reuses it
    _root = root


def lower(target, scratch: str):
    """In the compile server: compile the target with Triton into a Lowered (checked and written by the core)."""
    os.environ["TRITON_CACHE_DIR"] = scratch   # private: a compile never reads another's cache
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kforge.compile_core import Lowered

    arch = ARCHS[target.arch]
    fn = _entry(target)
    names = [a for a, _ in target.signature]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in target.divisible_by_16}
    kinds = dict(target.signature)   # "dtype" and "function" arguments are constexprs of another kind of value
    signature = {a: "constexpr" if t in ("dtype", "function") else t for a, t in target.signature}
    constexprs = {a: triton.language.str_to_ty(v, None) if kinds[a] == "dtype" else
                  _function(v, target) if kinds[a] == "function" else v for a, v in target.constexprs}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    start = time.monotonic()
    os.chdir(scratch)   # ptxas stamps the line info with the mtime of any source file it finds from its cwd
    try:
        kernel = triton.compile(src, target=GPUTarget(arch.backend, arch.target_arch, arch.warp_size),
                                options=dict(target.options))
    finally:
        os.chdir(_root)
    seconds = time.monotonic() - start
    binary = kernel.asm[arch.binary_ext]
    md = kernel.metadata
    fields = {"num_stages": md.num_stages, "global_scratch_size": getattr(md, "global_scratch_size", 0),
              "profile_scratch_size": getattr(md, "profile_scratch_size", 0),
              "divisible_by_16": list(target.divisible_by_16)}
    if arch.vendor == "amd":
        fields["kernel_abi"] = amdgpu_metadata.kernel_abi(binary, md.name)
    return Lowered(binary, f"{md.name}.{arch.binary_ext}", md.name, md.num_warps, md.warp_size, md.shared,
                   seconds, fields)


def _entry(target):
    from triton.runtime.jit import JITFunction

    from kforge.entry_probe import layers
    module = importlib.import_module(target.module)
    # @triton.autotune, @triton.heuristics (and libraries' wrappers) wrap the @triton.jit function: the spec's
    # config gives the values they would choose at launch, so the function itself is what is compiled
    fn = layers(getattr(module, target.entry, None))[-1]
    if not isinstance(fn, JITFunction):
        raise TypeError(f"{target.module}.{target.entry} is not a @triton.jit function (got {type(fn).__name__})")
    _relative_file_names(JITFunction, target)
    return fn


def _function(ref: str, target):
    """The @triton.jit function a "function" argument names ("module:name"), its file names made relative."""
    from triton.runtime.jit import JITFunction
    module, name = ref.split(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not isinstance(fn, JITFunction):
        raise TypeError(f"{ref} is not a @triton.jit function (got {type(fn).__name__})")
    code = fn.fn.__code__
    base = _module_base_of(sys.modules[module], module)
    if base is not None and code.co_filename.startswith(str(base) + os.sep):
        fn.fn.__code__ = code.replace(co_filename=str(Path(code.co_filename).relative_to(base)))
    return fn


def _module_base_of(module, name: str) -> Path | None:
    from kforge.sources import module_base
    where = getattr(module, "__file__", None)
    return module_base(Path(where), name) if where else None


def _relative_file_names(jit_type, target) -> None:
    """Triton writes the source file name of each function a kernel inlines into the binary's line info. Make
    it a path that does not depend on where things lie, so that two checkouts (and their virtualenvs) at
    different paths build byte-identical binaries: the target's own sources (its kernel module and the
    modules it imports) relative to the project (an installed module's: to its site-packages), Triton's own
    library (tl.cdiv, tl.sum, ...) relative to site-packages (`triton/language/standard.py`). No other module is looked into: reading
    attributes of arbitrary modules runs their module-level __getattr__ (torch's asserted on CUDA)."""
    import triton
    from kforge.sources import module_base
    base, library = module_base(Path(target.source), target.module), Path(triton.__file__).parent
    renames = {str(base / rel): rel for rel, _ in target.source_digests}
    modules = [m for m in list(sys.modules.values()) if (getattr(m, "__file__", None) or "") in renames]
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if (name == "triton" or name.startswith("triton.")) and where.startswith(str(library) + os.sep):
            modules.append(module)
            renames[where] = str(Path("triton") / Path(where).relative_to(library))
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, jit_type):   # a type check: runs no code of the value's
                continue
            code = getattr(value.fn, "__code__", None)
            if code is not None and code.co_filename in renames:
                value.fn.__code__ = code.replace(co_filename=renames[code.co_filename])
