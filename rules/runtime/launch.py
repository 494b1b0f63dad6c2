"""Load a checked binary through the GPU driver (ctypes) and launch it: no compiler, no torch needed.

NVIDIA: libcuda's cuLaunchKernel, or cuLaunchKernelEx for a binary compiled with launch options (launch_pdl,
launch_cooperative_grid, num_ctas), as Triton's launcher would; AMD: libamdhip64's hipModuleLaunchKernel. Arguments
follow the manifest's signature, then Triton 3.6's two scratch pointers: the global one, for a kernel that needs
it (one that makes tensor descriptors on the GPU writes them there), from the allocator set with
triton.set_allocator as Triton's launcher asks it (or set_allocator's, without Triton); the profiler's, null
(kforge refuses artifacts that need it). A tensor descriptor argument is several parameters (tensordesc.py).
"""
from __future__ import annotations

import ctypes
import functools
import struct
import sys
import threading
from typing import Callable

from . import tensordesc
from .archs import ARCHS
from .schema import LAUNCH_RANGES, OPTIONAL_LAUNCH_RANGES, SCRATCH_ALIGN, TRITON_VENDOR_DEFAULTS, is_signature

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CUDA_ERROR_INVALID_CONTEXT = 201   # the call's thread has no current context
POINTER_ATTRIBUTE_DEVICE_POINTER, ERROR_INVALID_VALUE = 3, 1   # cuda.h's and HIP's alike
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14   # clusters of 16 CTAs (H100, B200), as Triton sets it
STATIC_SHARED_LIMIT = 48 * 1024   # CUDA: above this a kernel must opt in to dynamic shared memory
# pointer element type -> torch dtype name, to catch a tensor of the wrong dtype before it is misread
TORCH_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32",
                "fp64": "torch.float64", "i8": "torch.int8", "i16": "torch.int16", "i32": "torch.int32",
                "i64": "torch.int64", "u8": "torch.uint8", "u1": "torch.bool", "fp8e4nv": "torch.float8_e4m3fn",
                "fp8e4b8": "torch.float8_e4m3fnuz", "fp8e5": "torch.float8_e5m2",
                "fp8e5b16": "torch.float8_e5m2fnuz"}


class LaunchError(RuntimeError):
    pass


# CUlaunchAttributeID values (cuda.h) for the compile options that change how a binary must be launched
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1


class LaunchAttributeValue(ctypes.Union):   # CUlaunchAttributeValue: 64 bytes, 8-byte aligned
    _fields_ = [("words", ctypes.c_uint * 16), ("align", ctypes.c_uint64 * 8)]


class LaunchAttribute(ctypes.Structure):   # CUlaunchAttribute: an id, padded to 8 bytes, then the value
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):   # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


DRIVERS = {"nvidia": ("libcuda.so.1", "cu"), "amd": ("libamdhip64.so", "hip")}   # vendor: (library, prefix)


def launch_attributes(options: dict, vendor: str, name: str) -> list[tuple[int, tuple[int, ...]]]:
    """(attribute id, value words) for each launch-changing compile option, as Triton's launcher sets them; a
    LaunchError for one this loader cannot honour (launching without it would run the kernel wrongly)."""
    pdl, cooperative, ctas = (options.get("launch_pdl", False), options.get("launch_cooperative_grid", False),
                              options.get("num_ctas", 1))
    if not (pdl is False or pdl is True) or not (cooperative is False or cooperative is True) \
            or type(ctas) is not int or not 1 <= ctas <= 16:
        raise LaunchError(f"{name}: the manifest's launch options must be launch_pdl / launch_cooperative_grid "
                          f"true or false and num_ctas 1..16, got {repr(options)[:200]}; rebuild the bundle with "
                          f"`doit package`")
    if vendor != "nvidia" and (pdl or cooperative or ctas > 1):
        raise LaunchError(f"{name}: compiled with {options!r}, which this loader launches on NVIDIA only; launch it "
                          f"through Triton on AMD")
    attributes = [(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (1,))] if pdl else []
    attributes += [(CU_LAUNCH_ATTRIBUTE_COOPERATIVE, (1,))] if cooperative else []
    if ctas > 1:
        attributes += [(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (ctas, 1, 1)),
                       (CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                        (CU_CLUSTER_SCHEDULING_POLICY_SPREAD,))]
    return attributes


class Driver:
    """The vendor's driver library, loaded once per process (get)."""

    def __init__(self, vendor: str):
        self.vendor = vendor
        if vendor not in DRIVERS:
            raise LaunchError(f"no GPU driver is known for vendor {vendor!r:.40}: nvidia or amd")
        lib, self.prefix = DRIVERS[vendor]
        try:
            self.lib = ctypes.CDLL(lib)
        except OSError as e:
            raise LaunchError(f"cannot load {lib} ({e}): this process has no {vendor} GPU driver") from None
        self.call("Init", 0)
        if vendor == "nvidia":
            self.context()

    @classmethod
    @functools.cache
    def get(cls, vendor: str) -> "Driver":
        return cls(vendor)

    def call(self, name: str, *args) -> None:
        code = getattr(self.lib, self.prefix + name)(*args)
        if code != 0:
            raise LaunchError(f"{self.prefix}{name} failed: {self.error_name(code)}")

    def error_name(self, code: int) -> str:
        if self.vendor == "amd":
            self.lib.hipGetErrorName.restype = ctypes.c_char_p
            return (self.lib.hipGetErrorName(code) or b"").decode() or str(code)
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        return name.value.decode() if name.value else str(code)

    def context(self, device: int | None = None) -> int:
        """The context this thread uses: the current one; in a thread with none (PyTorch's backward threads), the
        primary context of `device` (0 if not given) made current, as torch's own work there would."""
        ctx = ctypes.c_void_p()
        self.call("CtxGetCurrent", ctypes.byref(ctx))
        if not ctx.value:
            dev = ctypes.c_int()
            self.call("DeviceGet", ctypes.byref(dev), device or 0)
            self.call("DevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            self.call("CtxSetCurrent", ctx)
        return ctx.value


_allocator = None   # set_allocator's


def set_allocator(allocator) -> None:
    """Where launches get global scratch memory without Triton imported (with it, triton.set_allocator's is asked
    unless this is set): allocator(size, alignment, stream) -> an object with data_ptr(), as Triton's protocol;
    None unsets it."""
    global _allocator
    _allocator = allocator


def launch_plan(entry: dict, vendor: str) -> tuple["Arguments", dict, list[tuple[int, tuple[int, ...]]]]:
    """What launching a Triton entry on its bundle's vendor needs, known before any driver sees its binary: its
    arguments' layout, its options and launch attributes; LaunchError naming the field this loader refuses,
    whatever the arguments (serve asks it before a call counts as served, the Kernel before it loads)."""
    check_launch_fields(entry)
    name = entry["target"]
    if entry.get("toolchain") != "triton":
        raise LaunchError(f"{name}: launching {str(entry.get('toolchain'))[:40]} artifacts is not supported yet "
                          f"(their kernarg layout is in the manifest's kernel_abi)")
    if entry.get("profile_scratch_size"):
        raise LaunchError(f"{name}: the kernel was compiled with Triton's profiler's instrumentation, whose memory "
                          f"this loader does not allocate")
    if entry.get("global_scratch_size") and vendor != "nvidia":   # Triton 3.6's AMD launcher passes none
        raise LaunchError(f"{name}: the kernel needs global scratch memory, which this loader allocates on NVIDIA "
                          f"GPUs only")
    arguments = Arguments(entry, vendor)   # an argument type it cannot pass
    options = entry.get("options") or {}
    if not isinstance(options, dict):
        raise LaunchError(f"{name}: the manifest's 'options' must be a table; rebuild the bundle")
    attributes = launch_attributes(options, vendor, name)
    # the block is as many threads as the binary was compiled for: the compile's warps (more than the call's with
    # warp specialization: ttg.total-num-warps) times the arch's threads a warp (never the manifest's warp_size)
    arch = ARCHS.get(entry.get("arch")) if isinstance(entry.get("arch"), str) else None
    warp = arch.warp_size if arch is not None else 32 if vendor == "nvidia" else None
    asked = options.get("num_warps", TRITON_VENDOR_DEFAULTS.get(vendor, {}).get("num_warps"))
    warps = entry.get("num_warps", asked)
    if warp is None or type(asked) is not int or type(warps) is not int or warps < asked \
            or entry["threads_per_block"] != warps * warp:
        raise LaunchError(f"{name}: the manifest's threads_per_block {entry['threads_per_block']} is not its num_warps "
                          f"{str(warps)[:20]} times the {warp or 'unknown'} threads a warp of its arch; rebuild the "
                          f"bundle with `doit package`")
    return arguments, options, attributes


class Kernel:
    """One bundle artifact loaded into the current context; call it with (grid, *args, stream=)."""

    def __init__(self, entry: dict, binary: bytes, vendor: str, device: int | None = None):
        """device: where to load it when this thread has no current context."""
        self.entry = entry
        self._arguments, options, attributes = launch_plan(entry, vendor)
        self.name = entry["target"]
        self.driver = Driver.get(vendor)
        if self._arguments.maps:
            self._arguments.encode = tensordesc.TensorMaps(
                tensordesc.ENCODE_TILED(("cuTensorMapEncodeTiled", self.driver.lib)), self.driver.error_name)
        # the module belongs to one context: a launch from a thread with none current makes it current there
        self._context = self.driver.context(device) if vendor == "nvidia" else None
        self._image = ctypes.create_string_buffer(binary, len(binary))   # kept alive with the module
        self._module, self._func = ctypes.c_void_p(), ctypes.c_void_p()
        self.driver.call("ModuleLoadData", ctypes.byref(self._module), self._image)
        self.driver.call("ModuleGetFunction", ctypes.byref(self._func), self._module, entry["symbol"].encode())
        if vendor == "nvidia" and entry["shared"] > STATIC_SHARED_LIMIT:
            self.driver.call("FuncSetAttribute", self._func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             entry["shared"])
        self._launch = self.driver.lib.cuLaunchKernel if vendor == "nvidia" else self.driver.lib.hipModuleLaunchKernel
        # no argtypes: ctypes then passes the grid, block and shared sizes as C ints (which they fit) and the
        # stream wrapped as a pointer, half the cost of converting all 11 arguments by declared types
        self._threads, self._shared = entry["threads_per_block"], entry["shared"]
        self._lock = threading.Lock()   # the argument slots are shared: one launch fills and submits them at a time
        self._ctas = options.get("num_ctas", 1)
        self._config = None   # a LaunchConfig when the binary needs cuLaunchKernelEx
        if attributes:
            self._attributes = (LaunchAttribute * len(attributes))()
            for slot, (kind, words) in zip(self._attributes, attributes):
                slot.id = kind
                slot.value.words[:len(words)] = words
            self._config = LaunchConfig(blockDimX=self._threads, blockDimY=1, blockDimZ=1,
                                        sharedMemBytes=self._shared,
                                        attrs=ctypes.cast(self._attributes, ctypes.POINTER(LaunchAttribute)),
                                        numAttrs=len(attributes))
            self._launch_ex = getattr(self.driver.lib, "cuLaunchKernelEx", None)
            if self._launch_ex is None:
                raise LaunchError(f"{self.name}: compiled with {options!r}, which needs cuLaunchKernelEx (CUDA 12.0 "
                                  f"and later); this driver lacks it")
            if self._ctas == 16:
                self.driver.call("FuncSetAttribute", self._func, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)

    def __call__(self, grid, *args, stream: int = 0) -> None:
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        with self._lock:
            self._submit_in_context(gx, gy, gz, stream, self._arguments.pack(args))

    def reaches(self, address: int) -> bool:
        """Whether the GPU can access `address` (a CPU tensor's cannot, unless pinned), as Triton's launcher asks."""
        found = ctypes.c_uint64()
        return not address or getattr(self.driver.lib, self.driver.prefix + "PointerGetAttribute")(
            ctypes.byref(found), POINTER_ATTRIBUTE_DEVICE_POINTER, ctypes.c_uint64(address)) != ERROR_INVALID_VALUE

    def launch_trusted(self, gx: int, gy: int, gz: int, stream: int, values) -> None:
        """Launch with argument values already matched to this binary (Arguments.pack_trusted)."""
        with self._lock:
            self._submit_in_context(gx, gy, gz, stream, self._arguments.pack_trusted(values))

    def _submit_in_context(self, gx: int, gy: int, gz: int, stream: int, params) -> None:
        """_submit, in the kernel's own context where this thread has none yet."""
        scratch = self._arguments.scratch(gx * gy * gz * self._ctas, stream, self.reaches)   # alive until queued
        code = self._submit(gx, gy, gz, stream, params)
        if code == CUDA_ERROR_INVALID_CONTEXT and self._context:
            self.driver.call("CtxSetCurrent", ctypes.c_void_p(self._context))
            code = self._submit(gx, gy, gz, stream, params)
        del scratch
        if code != 0:
            raise LaunchError(f"launching {self.name} failed: {self.driver.error_name(code)}")

    def _submit(self, gx: int, gy: int, gz: int, stream: int, params) -> int:
        """The driver's launch call (under the lock: the slots and the config are shared); its error code."""
        if self._config is None:
            return self._launch(self._func, gx, gy, gz, self._threads, 1, 1, self._shared, ctypes.c_void_p(stream),
                                params, None)
        if not (0 < gx * self._ctas < 1 << 31 and 0 < gy < 1 << 16 and 0 < gz < 1 << 16):
            # the config's fields are C unsigned ints, which ctypes would wrap silently into a smaller grid
            raise LaunchError(f"launching {self.name}: grid ({gx}, {gy}, {gz}) x {self._ctas} CTAs a cluster is "
                              f"outside CUDA's limits (x < 2^31, y and z < 65536, none 0)")
        config = self._config
        config.gridDimX, config.gridDimY, config.gridDimZ, config.hStream = gx * self._ctas, gy, gz, stream
        return self._launch_ex(ctypes.byref(config), self._func, params, None)


def check_launch_fields(entry: dict) -> None:
    """The manifest fields a launch reads (a bundle is untrusted): LaunchError naming the field, never a TypeError
    or KeyError from inside a launch."""
    name = entry.get("target")
    if not (isinstance(name, str) and name.isprintable() and len(name) <= 512):   # it names the kernel in messages
        raise LaunchError("the manifest's 'target' must be the target's name on one line; rebuild the bundle with "
                          "`doit package`")
    if not is_signature(entry.get("signature")):
        raise LaunchError(f"{name}: the manifest's 'signature' must be a list of {{name, type}} strings; rebuild "
                          f"the bundle with `doit package`")
    promised = entry.get("divisible_by_16") or []
    if not (isinstance(promised, list) and all(isinstance(a, str) for a in promised)):
        raise LaunchError(f"{name}: the manifest's 'divisible_by_16' must be a list of argument names")
    given = [(f, r) for f, r in OPTIONAL_LAUNCH_RANGES.items() if entry.get(f) is not None]
    for field, (low, high) in [*LAUNCH_RANGES.items(), *given]:
        value = entry.get(field)
        if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            raise LaunchError(f"{name}: the manifest's {field!r} must be a whole number in [{low}, {high}]")


class Arguments:
    """A kernel's launch arguments, laid out once (building ctypes objects per call cost 44 us a launch: bench/
    launch_overhead.py): one buffer of 8-byte slots and 128-aligned CUtensorMaps, which the kernelParams array points
    at, filled by one struct.pack_into. pack() first checks what the binary assumes; pack_trusted() does not (for
    serving, whose Triton specialization did)."""

    def __init__(self, entry: dict, vendor: str = "nvidia"):
        check_launch_fields(entry)
        self.name, self.signature = entry["target"], entry["signature"]
        for a in self.signature:
            if not a["type"].startswith("*") and a["type"] not in _SLOT and not tensordesc.is_descriptor(a["type"]):
                raise LaunchError(f"{self.name}: argument {a['name']} has type {a['type']}, which this loader "
                                  f"cannot pass")
        try:
            self._descs = tensordesc.plan(entry, vendor)   # argument position -> Descriptor
        except tensordesc.DescriptorError as e:
            raise LaunchError(str(e)) from None
        params = []   # every kernel parameter in order: "map", "*" or a scalar type
        for i, a in enumerate(self.signature):
            params += self._descs[i].params if i in self._descs else ["*" if a["type"].startswith("*") else a["type"]]
        self.layout = params
        self.maps = params.count("map")
        slots = [p for p in params if p != "map"]
        self._buffer = ctypes.create_string_buffer(tensordesc.MAP_ALIGN + tensordesc.MAP_BYTES * self.maps
                                                   + 8 * (len(slots) + 2))   # the scratch slots: zero (null)
        maps_at = ctypes.addressof(self._buffer) + (-ctypes.addressof(self._buffer) % tensordesc.MAP_ALIGN)
        self._offset = maps_at - ctypes.addressof(self._buffer) + tensordesc.MAP_BYTES * self.maps
        slots_at = ctypes.addressof(self._buffer) + self._offset
        map_slots = iter(range(maps_at, slots_at, tensordesc.MAP_BYTES))
        scalar_slots = iter(range(slots_at, slots_at + 8 * (len(slots) + 2), 8))
        self.params = (ctypes.c_void_p * (len(params) + 2))(*[next(map_slots if p == "map" else scalar_slots)
                                                               for p in params + ["*", "*"]])
        self._scratch_slot = self.params[len(params)]
        self._scratch = entry.get("global_scratch_size") or 0, entry.get("global_scratch_align") or SCRATCH_ALIGN
        self._format = struct.Struct("<" + "".join(_SLOT[p] for p in slots))
        # descriptor position -> its map's slot (the maps lie in the order of the arguments)
        lowered = [i for i in sorted(self._descs) if self._descs[i].meta is not None]
        self._map_slot = {i: maps_at + tensordesc.MAP_BYTES * n for n, i in enumerate(lowered)}
        self.encode = None   # a tensordesc.TensorMaps; the Kernel sets the driver's once it has loaded it
        self._is_pointer = [a["type"].startswith("*") for a in self.signature]
        promised = set(entry.get("divisible_by_16") or ())
        self._promised = [i for i, a in enumerate(self.signature) if a["name"] in promised and i not in self._descs]
        self._dtypes_seen: set[tuple[int, object]] = set()   # (argument index, dtype) already checked

    def pack(self, args) -> ctypes.Array:
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes ({', '.join(a['name'] for a in self.signature)}), got {len(args)} "
                            f"arguments")
        values = [self._pointer(i, v) if self._is_pointer[i] else self._descriptor(i, v) if i in self._descs else v
                  for i, v in enumerate(args)]
        for i in self._promised:
            if (values[i] or 0) % 16:
                spec = self.signature[i]
                what = "address" if spec["type"].startswith("*") else "value"
                raise ValueError(f"{self.name}: argument {spec['name']} must be 16-divisible (the binary was "
                                 f"compiled assuming it); its {what} is {values[i]}")
        return self.pack_trusted(values)

    def pack_trusted(self, values) -> ctypes.Array:
        """Fill the slots with `values` (addresses for pointers, TensorDescriptors for descriptors), unchecked."""
        if self._descs:
            values = self._expand(values)
        try:
            self._format.pack_into(self._buffer, self._offset, *values)
        except struct.error as e:
            raise TypeError(f"{self.name}: an argument does not fit its type "
                            f"({', '.join(a['name'] + ': ' + a['type'] for a in self.signature)}): {e}") from None
        return self.params

    def scratch(self, programs: int, stream: int, reaches: Callable[[int], bool] | None = None):
        """Global scratch memory for a launch of `programs` CTAs (None if the kernel needs none), its address put in
        its slot: asked, as Triton's launcher asks it, of set_allocator's allocator or else triton.set_allocator's
        (Triton's error if none is set, as a LaunchError), and refused, as Triton's launcher refuses it, where its
        address is no whole number, null or not memory the GPU can reach (`reaches`: a CPU tensor). The caller
        keeps it until the launch is queued: an allocator must hand it on only in stream order, as torch's does
        on the stream it is given."""
        size, align = self._scratch
        if not size:
            return None
        allocation = sys.modules.get("triton.runtime._allocation")
        allocate = _allocator or (allocation._allocator.get() if allocation is not None else None)
        if allocate is None:
            raise LaunchError(f"{self.name}: the kernel needs {size} bytes of global scratch memory a program: set "
                              f"an allocator with triton.set_allocator, or without Triton with "
                              f"kforge_runtime.launch.set_allocator")
        try:
            buffer = allocate(programs * size, align, stream)
            address = buffer.data_ptr()
        except Exception as e:   # the application's allocator (Triton's own when none is set says so)
            raise LaunchError(f"{self.name}: the allocator failed to give {programs * size} bytes of global scratch "
                              f"memory: {type(e).__name__}: {e}".splitlines()[0]) from None
        if not (isinstance(address, int) and not isinstance(address, bool) and 0 < address < 1 << 64) or \
                (reaches is not None and not reaches(address)):
            raise LaunchError(f"{self.name}: the allocator's scratch memory (address {address!r}) cannot be accessed "
                              f"by the GPU: it must return GPU memory, e.g. torch.empty(size, dtype=torch.int8, "
                              f"device='cuda')")
        ctypes.c_uint64.from_address(self._scratch_slot).value = address
        return buffer

    def _expand(self, values) -> list:
        if self.encode is None and self._map_slot:
            raise LaunchError(f"{self.name}: no driver loaded to encode its tensor maps (load it with Bundle.kernel)")
        flat = []
        for i, v in enumerate(values):
            if i in self._descs:
                try:
                    flat += self._descs[i].values(v, self._map_slot.get(i, 0), self.encode)
                except tensordesc.DescriptorError as e:
                    raise ValueError(f"{self.name}: {e}") from None
            else:
                flat.append(v)
        return flat

    def _descriptor(self, i: int, value):
        """A TensorDescriptor (any object with its fields) that matches the binary's element type and block."""
        spec, desc = self.signature[i], self._descs[i]
        fields = ("base", "shape", "strides", "block_shape", "padding")
        if not all(hasattr(value, f) for f in fields):
            raise TypeError(f"{self.name}: argument {spec['name']} is {spec['type']}: pass a "
                            f"triton.tools.tensor_descriptor.TensorDescriptor, got {type(value).__name__}")
        if list(value.block_shape) != desc.block:
            raise TypeError(f"{self.name}: argument {spec['name']} is {spec['type']}, got a descriptor with block "
                            f"shape {list(value.block_shape)}")
        if value.padding not in ("zero", "nan"):
            raise ValueError(f"{self.name}: argument {spec['name']}'s padding is {value.padding!r}; Triton's are "
                             f"'zero' and 'nan'")
        base, dtype = value.base, getattr(value.base, "dtype", None)
        expected = TORCH_DTYPES.get(desc.dtype)
        if not isinstance(base, int) and expected and dtype is not None and str(dtype) != expected:
            raise TypeError(f"{self.name}: argument {spec['name']} is {spec['type']}, got a descriptor of a {dtype} "
                            f"tensor")
        if getattr(base, "is_cuda", True) is False:
            raise TypeError(f"{self.name}: argument {spec['name']} describes a CPU tensor; the kernel needs GPU "
                            f"memory")
        return value

    def _pointer(self, i: int, value) -> int:
        if isinstance(value, int):
            return value
        spec, dtype = self.signature[i], getattr(value, "dtype", None)
        if (i, dtype) not in self._dtypes_seen:
            expected = TORCH_DTYPES.get(spec["type"][1:])
            if expected and dtype is not None and str(dtype) != expected:
                raise TypeError(f"{self.name}: argument {spec['name']} is {spec['type']}, got a {dtype} tensor")
            self._dtypes_seen.add((i, dtype))
        if getattr(value, "is_cuda", True) is False:
            raise TypeError(f"{self.name}: argument {spec['name']} is a CPU tensor; the kernel needs GPU memory")
        return value.data_ptr()


# each scalar type's and a pointer's ("*") struct code, padded to its 8-byte slot (little-endian, as every GPU host
# kforge targets; u1: a bool, passed as uint8_t; i1: a descriptor's padding flag, int8_t)
_SLOT = {"*": "Q", "u1": "?7x", "i1": "?7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u8": "B7x",
         "u16": "H6x", "u32": "I4x", "u64": "Q", "fp32": "f4x", "fp64": "d"}
