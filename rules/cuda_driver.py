"""Launch a kforge cubin through the CUDA driver API (ctypes): no Triton, no compile.

A small loader used to verify artifacts on GPUs; it runs in the caller's current CUDA context (e.g. the one
torch made current). Arguments follow meta.json's signature; Triton 3.6 kernels take two trailing scratch
pointers (global, profile), passed as null when meta.json says they need no memory.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from rules import artifact

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_SCALARS = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
            "fp32": ctypes.c_float, "fp64": ctypes.c_double, "i1": ctypes.c_bool}


class CudaError(RuntimeError):
    pass


class Kernel:
    def __init__(self, directory: Path):
        self.meta, binary = artifact.load(directory)   # sha256 + ELF checked before the driver sees it
        if self.meta.get("global_scratch_size") or self.meta.get("profile_scratch_size"):
            raise CudaError(f"{directory}: kernels needing scratch memory are not supported by this loader")
        self._cu = ctypes.CDLL("libcuda.so.1")
        self._check(self._cu.cuInit(0), "cuInit")
        self._module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(binary, len(binary))
        self._check(self._cu.cuModuleLoadData(ctypes.byref(self._module), self._image), "cuModuleLoadData")
        self._func = ctypes.c_void_p()
        self._check(self._cu.cuModuleGetFunction(ctypes.byref(self._func), self._module,
                                                 self.meta["symbol"].encode()), "cuModuleGetFunction")
        if self.meta["shared"] > 48 * 1024:
            self._check(self._cu.cuFuncSetAttribute(self._func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    self.meta["shared"]), "cuFuncSetAttribute")

    def __call__(self, grid: tuple[int, ...], *args, stream: int = 0) -> None:
        sig = self.meta["signature"]
        if len(args) != len(sig):
            raise TypeError(f"{self.meta['target']} takes {[a['name'] for a in sig]}, got {len(args)} arguments")
        values = [self._arg(a, v) for a, v in zip(sig, args)] + [ctypes.c_void_p(0), ctypes.c_void_p(0)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        self._check(self._cu.cuLaunchKernel(self._func, gx, gy, gz, self.meta["threads_per_block"], 1, 1,
                                            self.meta["shared"], ctypes.c_void_p(stream), params, None),
                    "cuLaunchKernel")

    @staticmethod
    def _arg(spec: dict, value):
        if spec["type"].startswith("*"):
            return ctypes.c_void_p(value if isinstance(value, int) else value.data_ptr())
        return _SCALARS[spec["type"]](value)

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(f"{what} failed for {self.meta['target']}: {name.value.decode() if name.value else code}")
