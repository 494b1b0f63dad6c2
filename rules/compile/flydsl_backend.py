"""FlyDSL ahead-of-time compile of one Target, no GPU. Imported only by processes that compile.

A factory, factory(**compile_time_values[, arch]), returns (launcher, placeholders): the @flyc.jit launcher and the
tensors/scalars to trace it with. FlyDSL reads the arch from the environment once per process (a compile server per
arch). FlyDSL's disk cache is off: its key ignores torch.dtype values captured in closures.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
import time

from kforge.compile import amdgpu_metadata, lowering
from kforge.plan import amd_linker
from kforge.base.layout import Layout
from kforge.base.dtypes import canonical_arg_type
from kforge.compile.lowering import Lowered
from kforge_runtime.launch import TORCH_DTYPES
from kforge_runtime.schema import COMPILE_TIME

_state: dict = {}


def warm(root: str) -> None:
    """Once per process, before forking compile servers: FlyDSL's own dirs under out/, then the import."""
    if _state.get("root") == root:
        return
    kforge_dir = Layout.of(root).state
    os.environ["COMPILE_ONLY"] = "1"
    os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"] = "0"
    os.environ["FLYDSL_RUNTIME_CACHE_DIR"] = str(kforge_dir / "flydsl-cache")   # unused while disabled
    os.environ["FLYDSL_DUMP_DIR"] = str(kforge_dir / "flydsl-dump")
    if root not in sys.path:
        sys.path.insert(0, root)
    import torch  # noqa: F401  (FlyDSL's placeholders are torch tensors)
    import flydsl.compiler  # noqa: F401  (~2 s: paid once per build, in its hub)
    import flydsl.expr  # noqa: F401
    _state["root"] = root


def setup(arch: str) -> None:
    """Once in each compile server: this process compiles for `arch` only."""
    os.environ["ARCH"] = arch
    os.environ["FLYDSL_GPU_ARCH"] = arch
    kforge_dir = Layout.of(_state["root"]).state
    linker = amd_linker.find(kforge_dir)   # LinkerMissing fails every FlyDSL target with the fix, not Triton's
    os.environ["ROCM_PATH"] = str(amd_linker.rocm_root_for(linker, kforge_dir / "rocm-shim"))


def lower(target, _scratch: str):
    """In the compile server: trace, lower and link the target with FlyDSL into a Lowered."""
    import flydsl.compiler as flyc

    launcher, placeholders = _build(target)
    start = time.monotonic()
    stderr = _capture_fd2(lambda: flyc.compile(launcher, *placeholders))
    seconds = time.monotonic() - start
    errors = [line for line in stderr.splitlines() if line.lstrip().lower().startswith("error:")]
    if errors:   # FlyDSL can print an error, exit 0 and emit a kernel that is only s_endpgm
        raise RuntimeError("FlyDSL reported errors while compiling (the binary would be wrong): "
                           + " | ".join(errors[:5]))
    binary = _code_object(launcher)
    names = amdgpu_metadata.kernel_names(binary)
    if len(names) != 1:
        raise RuntimeError(f"the launcher compiled to {len(names)} kernels {names}; kforge ships one per target")
    symbol = names[0]
    abi = amdgpu_metadata.kernel_abi(binary, symbol)
    wave = abi.get("wavefront_size", 64)
    threads = (abi.get("reqd_workgroup_size") or [abi.get("max_flat_workgroup_size", 0)])[0]
    return Lowered(binary, f"{symbol}.hsaco", symbol, max(1, threads // wave), wave,
                   abi.get("group_segment_fixed_size", 0), seconds,
                   {"kernel_abi": abi, "launcher": getattr(getattr(launcher, "func", launcher), "__name__", "?")})


def _build(target):
    """Call the spec's factory with this config's compile-time values; check what it returns."""
    factory = getattr(importlib.import_module(target.module), target.entry)
    kwargs = {k: v for k, v in target.constexprs}
    if "arch" in inspect.signature(factory).parameters:
        kwargs["arch"] = target.arch
    built = factory(**kwargs)
    if target.placeholders:   # a library's builder, by the spec's [adapter]: it returns the launcher alone
        return built, [_placeholder(kind, value) for _, kind, value in target.placeholders]
    if not (isinstance(built, tuple) and len(built) == 2):
        raise TypeError(f"{target.module}.{target.entry}() must return (launcher, placeholders), "
                        f"got {type(built).__name__}")
    launcher, placeholders = built
    runtime = [(a, t) for a, t in target.signature if t not in COMPILE_TIME]
    if len(placeholders) != len(runtime):
        raise TypeError(f"{target.entry}() gave {len(placeholders)} placeholders; [signature] declares "
                        f"{len(runtime)} runtime arguments {[a for a, _ in runtime]}")
    for (name, declared), value in zip(runtime, placeholders):
        dtype = getattr(value, "dtype", None)   # None: a scalar or an fx value, nothing to compare
        got = None if dtype is None else canonical_arg_type("*" + str(dtype))
        if got is not None and got != declared:
            raise TypeError(f"placeholder for {name!r} is {got}, [signature] says {declared}")
    return launcher, placeholders


def _placeholder(kind: str, value):
    """A CPU tensor of the element type and shape (FlyDSL takes type and rank from it, never its data), or the
    scalar itself."""
    if kind == "scalar":
        return value
    import torch
    name = {**TORCH_DTYPES, "u1": "torch.bool"}[kind]   # the loader's table, and u1 (it takes no bool pointer)
    return torch.empty(*value, dtype=getattr(torch, name.removeprefix("torch.")))


def _capture_fd2(fn) -> str:
    """Run fn with fd 2 captured (the compiler's C++ side writes there too); echo the text back to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            fn()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
    if text:
        os.write(2, text.encode())
    return text


def _code_object(launcher) -> bytes:
    """The HSACO inside the lowered module FlyDSL keeps in memory (gpu.binary -> #gpu.object)."""
    last = getattr(launcher, "_last_compiled", None)
    if not last:
        raise RuntimeError("FlyDSL produced no compiled module to take the code object from "
                           "(flydsl's internals differ from 0.4.2, the version kforge pins?)")
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    objects = []
    with _create_mlir_context():
        module = ir.Module.parse(last[1]._ir_text)
        for op in module.body.operations:
            if op.operation.name == "gpu.binary":
                objects += [bytes(gpu.ObjectAttr(a).object) for a in ir.ArrayAttr(op.operation.attributes["objects"])]
    if len(objects) != 1:
        raise RuntimeError(f"expected one GPU code object in the compiled module, found {len(objects)}")
    return objects[0]


lowering.BACKENDS["flydsl"] = lowering.Backend(
    lower, warm, setup=setup,
    arch_per_process=True,   # FlyDSL reads ARCH from the environment: one server per arch
    imports_module=True)
