"""A Triton op library written for the shared-environment tests (tests/load/test_shared_env.py) and the second
virtualenv bench (bench/second_venv.py): it does at import what libraries users install do, all at once.

    envlib/__init__.py   keeps its import's stack (traceback.format_stack(): the launcher that started the
                         process is on it), reads its version from its dist-info, imports its FlyDSL path and
                         its ops
    envlib/fly.py        uses FlyDSL whenever it is importable, written against a FlyDSL API that kforge's
                         pinned flydsl does not have (ENVLIB_FLY_API)
    envlib/tables.py     a lookup table per GPU at import (torch.tensor(..., device=f"cuda:{g}")) and a torch
                         operator registered at import (torch.library.custom_op)
    envlib/ops.py        kernels under module-level guards (`if has_triton():`, `try:`) and one built by calls
                         (triton.autotune(configs)(triton.heuristics(h)(triton.jit(_scale))))
    envlib/needs_fly.py  imports flydsl unconditionally (a module that cannot import without FlyDSL)
    envlib/newer.py      imports a Triton name that kforge's pinned triton does not have

write(site) writes it with a dist-info into site (a folder to put on PYTHONPATH); write_source(folder) as a
source tree that `pip install --no-build-isolation --no-deps FOLDER` installs into a virtualenv. SPECS: its
kforge specs (TOML) for sm_90a and gfx942.
"""
from __future__ import annotations

from pathlib import Path

from tests.support import write_library_files, write_site_package

# A FlyDSL name written for a FlyDSL other than kforge's pin (made up, so no FlyDSL release will have it)
ENVLIB_FLY_API = "envlib_vector_ops"
TRITON_API = "envlib_future_op"   # the same for Triton

FILES = {
    "envlib/__init__.py": '''
        import importlib.metadata
        import traceback

        import torch  # noqa: F401

        # libraries keep where they were imported from, for their warnings: the stack starts at the launcher
        IMPORTED_FROM = "".join(traceback.format_stack())
        try:
            __version__ = importlib.metadata.version("envlib")   # read from its dist-info in site-packages
        except importlib.metadata.PackageNotFoundError:
            __version__ = "0+unknown"

        from envlib import fly, tables, ops  # noqa: E402,F401
        ''',
    "envlib/fly.py": f'''
        import importlib.util

        # FlyDSL whenever it is importable: this library was written for a FlyDSL with {ENVLIB_FLY_API}
        HAS_FLYDSL = importlib.util.find_spec("flydsl") is not None
        if HAS_FLYDSL:
            from flydsl.expr import {ENVLIB_FLY_API}  # noqa: F401
        ''',
    "envlib/tables.py": '''
        import torch

        # one lookup table per GPU, made at import
        TABLES = [torch.tensor([1, 2, 4, 8], dtype=torch.int8, device=f"cuda:{g}")
                  for g in range(torch.cuda.device_count())]


        @torch.library.custom_op("envlib::scale", mutates_args=())
        def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
            return x * factor


        @scale.register_fake
        def _(x, factor):
            return torch.empty_like(x)
        ''',
    "envlib/ops.py": '''
        import triton
        import triton.language as tl


        def has_triton():
            return True


        if has_triton():
            @triton.jit
            def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)
        else:
            add_kernel = None

        try:
            @triton.jit
            def neg_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(y_ptr + i, -tl.load(x_ptr + i, mask=i < n), mask=i < n)
        except Exception:
            neg_kernel = None


        def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            if EVEN:
                tl.store(y_ptr + i, tl.load(x_ptr + i) * 3)
            else:
                tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3, mask=i < n)


        scale_kernel = triton.autotune([triton.Config({"BLOCK": 128}, num_warps=4),
                                        triton.Config({"BLOCK": 256}, num_warps=4)], key=["n"])(
            triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(triton.jit(_scale)))
        ''',
    "envlib/needs_fly.py": '''
        import flydsl  # noqa: F401
        import triton
        import triton.language as tl


        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
        ''',
    "envlib/newer.py": f'''
        import triton
        import triton.language as tl
        from triton.language import {TRITON_API}  # noqa: F401


        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
        ''',
}

ELEMENTWISE = '''
[kernel]
name = "{name}"
module = "{module}"
entry = "{entry}"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
x_ptr = "*{{dtype}}"
y_ptr = "*{{dtype}}"
n = "i32"
BLOCK = "constexpr"

[sweep]
dtype = ["fp32", "fp16"]
BLOCK = [128, 1024]
'''

SCALE = '''
[kernel]
name = "envlib_scale"
module = "envlib.ops"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
x_ptr = "*{dtype}"
y_ptr = "*{dtype}"
n = "i32"
BLOCK = "constexpr"
EVEN = "constexpr"

[sweep]
dtype = ["fp32", "bf16"]
n = [4096, 1000]
'''


def elementwise(name: str, module: str, entry: str) -> str:
    return ELEMENTWISE.format(name=name, module=module, entry=entry)


SPECS = {"envlib_add": elementwise("envlib_add", "envlib.ops", "add_kernel"),
         "envlib_neg": elementwise("envlib_neg", "envlib.ops", "neg_kernel"),
         "envlib_scale": SCALE}

PYPROJECT = '''
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "envlib"
version = "0.1"
dependencies = ["torch", "triton"]

[tool.setuptools]
packages = ["envlib"]
'''


def write(site: Path) -> Path:
    """The library in site/ (a folder to put on PYTHONPATH), with a dist-info as pip would leave (it requires
    torch, as liger-kernel does)."""
    return write_site_package(site, "envlib", FILES, requires=("torch", "triton"))


def write_source(folder: Path) -> Path:
    """The library as a source tree with its pyproject.toml, for pip to install."""
    write_library_files(folder, FILES)
    (folder / "pyproject.toml").write_text(PYPROJECT.lstrip())
    return folder
