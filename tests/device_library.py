"""A small Triton library written for the device-model tests (tests/load/test_device_model.py): it asks for a GPU the
way GEMM libraries do, so that on a CPU it imports only under kforge's device model.

    devlib/__init__.py   asserts a GPU at import, reads the capability and Triton's active target there
    devlib/ops.py        scale_kernel: @triton.autotune configs chosen per vendor from an environment variable
                         (DEVLIB_BLOCKS, given per arch by the spec's [arch.<name>.env]) and filtered by the
                         device's shared memory; a @triton.heuristics NUM_SMS from get_device_properties
    devlib/alloc.py      allocates a tensor on the GPU at import and reads its values (needs a real one)
    devlib/tables.py     a lookup table per GPU at import, torch.tensor([...], device=f"cuda:{g}") (the model
                         gives tensors that answer as the GPU's and hold no memory)
    devlib/hooked.py     imports only after a set-up hook configured devlib for the arch (devlib.configure)

write(site) writes it into site (a folder to put on PYTHONPATH); SPECS are its kforge specs.
"""
from __future__ import annotations

from pathlib import Path

from tests.support import write_site_package

FILES = {
    "devlib/__init__.py": '''
        import torch
        import triton

        assert torch.cuda.is_available(), "devlib needs a GPU"
        CAPABILITY = torch.cuda.get_device_capability()
        TARGET = triton.runtime.driver.active.get_current_target()
        IS_HIP = torch.version.hip is not None
        CONFIGURED = None   # the arch configure() was called for


        def configure(arch):
            global CONFIGURED
            CONFIGURED = arch
        ''',
    "devlib/ops.py": '''
        import os

        import torch
        import triton
        import triton.language as tl

        import devlib

        BYTES_PER_ELEMENT = 64   # shared memory one element of a block takes (made up, to filter by the device)


        def _configs():
            smem = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())["max_shared_mem"]
            blocks = [int(b) for b in os.environ.get("DEVLIB_BLOCKS", "128").split(",")]
            warps = 4 if devlib.IS_HIP else 8
            return [triton.Config({"BLOCK": b}, num_warps=warps) for b in blocks if b * BYTES_PER_ELEMENT <= smem]


        def _num_sms(args):
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


        @triton.autotune(configs=_configs(), key=["n"])
        @triton.heuristics({"NUM_SMS": _num_sms})
        @triton.jit
        def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, NUM_SMS: tl.constexpr):
            for start in range(tl.program_id(0) * BLOCK, n, NUM_SMS * BLOCK):
                i = start + tl.arange(0, BLOCK)
                m = i < n
                tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)
        ''',
    "devlib/alloc.py": '''
        import torch
        import triton
        import triton.language as tl

        SCRATCH = torch.zeros(16, device="cuda")
        LIMIT = int(SCRATCH.sum())


        @triton.heuristics({"BLOCK": lambda args: 128})
        @triton.jit
        def fill_kernel(y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, 1.0, mask=i < n)
        ''',
    "devlib/tables.py": '''
        import torch
        import triton
        import triton.language as tl

        TABLES = [torch.tensor([1, 2, 4, 8], dtype=torch.int8, device=f"cuda:{g}")
                  for g in range(torch.cuda.device_count())]
        SCRATCH = torch.empty(1 << 20, device="cuda").to(torch.float16)
        assert TABLES[0].is_cuda and TABLES[0].shape == (4,) and SCRATCH.dtype == torch.float16


        @triton.jit
        def lookup_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)
        ''',
    "devlib/hooked.py": '''
        import triton
        import triton.language as tl

        import devlib

        if devlib.CONFIGURED is None:
            raise ImportError("call devlib.configure(arch) before importing devlib.hooked")


        @triton.heuristics({"WIDE": lambda args: devlib.CONFIGURED.startswith("gfx")})
        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
        ''',
}

# DEVLIB_BLOCKS per arch; the reference GPUs' shared memory then drops 2048 on gfx942 (64 KiB, MI300X) and keeps
# it on sm_90a (227 KiB, H100)
SCALE = '''
[kernel]
name = "devlib_scale"
module = "devlib.ops"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
{kernel}

[signature]
x_ptr = "*{{dtype}}"
y_ptr = "*{{dtype}}"
n = "i32"
BLOCK = "constexpr"
NUM_SMS = "constexpr"

[sweep]
dtype = ["fp32"]

[arch.sm_90a.env]
DEVLIB_BLOCKS = "512,2048"

[arch.gfx942.env]
DEVLIB_BLOCKS = "256,1024,2048"
'''

ALLOC = '''
[kernel]
name = "devlib_alloc"
module = "devlib.alloc"
entry = "fill_kernel"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
num_warps = [4]
'''

TABLES = '''
[kernel]
name = "devlib_tables"
module = "devlib.tables"
entry = "lookup_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
BLOCK = [128]
'''

HOOKED = '''
[kernel]
name = "devlib_hooked"
module = "devlib.hooked"
entry = "copy_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
setup = "tk.hooks:configure"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"
WIDE = "constexpr"

[sweep]
BLOCK = [128]
'''

HOOKS = '''
import devlib


def configure(arch):
    devlib.configure(arch)
'''


def write(site: Path) -> Path:
    """The library in site/ (a folder to put on PYTHONPATH), with a dist-info as pip would leave."""
    return write_site_package(site, "devlib", FILES)


def scale_spec(kernel: str = "") -> str:
    """devlib_scale's spec; `kernel`: more [kernel] lines (device_model = false)."""
    return SCALE.format(kernel=kernel)
